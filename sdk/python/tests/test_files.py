"""Files in the shared sandbox: write/read round trips, stat, list, mkdir, remove."""

from __future__ import annotations

import io
import os

import pytest

import harebox

DIR = "/tmp/sdk-python"


def test_write_and_read_binary_round_trip(hb: harebox.Client, box: harebox.Sandbox) -> None:
    data = bytes(range(256)) + os.urandom(300_000)
    info = hb.write_file(box.id, query={"path": f"{DIR}/blob.bin", "make_parents": True}, body=data)
    assert (info["path"], info["type"], info["size"]) == (f"{DIR}/blob.bin", "file", len(data))
    assert hb.read_file(box.id, query={"path": f"{DIR}/blob.bin"}) == data


def test_write_streams_a_file_object(box: harebox.Sandbox) -> None:
    data = os.urandom(70_000)
    box.write_file(f"{DIR}/streamed.bin", io.BytesIO(data), make_parents=True)
    assert box.read_file(f"{DIR}/streamed.bin") == data


def test_write_with_mode_and_stat(hb: harebox.Client, box: harebox.Sandbox) -> None:
    box.write_file(f"{DIR}/run.sh", "#!/bin/sh\necho ran\n", mode=0o750, make_parents=True)
    st = hb.stat_file(box.id, query={"path": f"{DIR}/run.sh"})
    assert (st["type"], st["mode"] & 0o7777, st["uid"], st["name"]) == ("file", 0o750, 1000, "run.sh")
    assert box.run(f"{DIR}/run.sh")["stdout"] == "ran\n"


def test_mkdir_list_and_remove(hb: harebox.Client, box: harebox.Sandbox) -> None:
    made = hb.mkdir(box.id, query={"path": f"{DIR}/tree/a/b", "mode": "0700"})
    assert made["type"] == "dir" and made["mode"] & 0o777 == 0o700
    box.write_file(f"{DIR}/tree/a/file.txt", b"x")
    listing = hb.list_files(box.id, query={"path": f"{DIR}/tree/a"})
    assert listing["truncated"] is False
    assert sorted((e["name"], e["type"]) for e in listing["entries"]) == [("b", "dir"), ("file.txt", "file")]

    assert hb.remove_file(box.id, query={"path": f"{DIR}/tree/a/file.txt"}) is None
    with pytest.raises(harebox.HareBoxError):
        hb.remove_file(box.id, query={"path": f"{DIR}/tree"})  # not empty
    hb.remove_file(box.id, query={"path": f"{DIR}/tree", "recursive": True})
    with pytest.raises(harebox.NotFound):
        hb.stat_file(box.id, query={"path": f"{DIR}/tree"})


def test_file_errors(hb: harebox.Client, box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.NotFound):
        box.read_file("/no/such/file")
    with pytest.raises(harebox.InvalidRequest) as err:
        hb.read_file(box.id, query={"path": "relative/path"})
    assert err.value.field == "path"
    with pytest.raises(harebox.InvalidRequest) as err:
        box.write_file(f"{DIR}/bad-mode", b"", mode="999")
    assert err.value.field == "mode"
