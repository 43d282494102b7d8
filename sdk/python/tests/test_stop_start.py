"""Stop and start, on one sandbox of its own.

The sandbox runs a background ``sleep`` and is stopped: it keeps its
record (state ``stopped``) and refuses commands and a second stop. It is
started again: it runs commands, refuses a second start, and the sleep
that ran before the stop is gone.

Whether files survive needs an image whose root is on its disk: the
minimal image's root is in memory, so it keeps nothing across a boot.
With HAREBOX_TEST_DEFAULT_IMAGE_NAME set (e.g. ``default``, the Debian
image) the one sandbox boots that image instead of HAREBOX_TEST_IMAGE and
a file written before the stop is read back after the start; without it
only that test skips. The sandbox is deleted at the end, even when a test
fails. The tests run in this file's order. They need a hypervisor backend
that can boot a sandbox again on its disk (qemu; not Cloud Hypervisor).
"""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest

import harebox

from conftest import delete_quietly

#: The image whose root is on its disk, for the file test; none: it skips.
PERSISTENT_IMAGE = os.environ.get("HAREBOX_TEST_DEFAULT_IMAGE_NAME", "")
KEPT_FILE = "/home/user/kept-across-stop.txt"
KEPT_DATA = f"written before the stop {uuid.uuid4().hex}\n"
#: The background command, with a duration no other test uses.
SLEEPER = ["sleep", "613"]
#: Counts the processes whose command line is SLEEPER (the pattern does
#: not match this shell's own command line). One grep reads every
#: command line, a line each behind its file's name: a tr per process took
#: 5 s on the Debian image, 11 s just after its boot, under emulation.
COUNT_SLEEPERS = "grep -asH '' /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c '^/proc/[0-9]*/cmdline:sleep 61[3] $'"


@pytest.fixture(scope="module")
def cycle_box(hb: harebox.Client, test_image: str, run_label: str) -> Iterator[harebox.Sandbox]:
    """The one sandbox of this file, deleted at the end."""
    sandbox = hb.create(
        image=PERSISTENT_IMAGE or test_image, ttl_seconds=1800,
        labels={"sdk-python-test": run_label, "role": "stop-start"},
    )
    try:
        yield sandbox
    finally:
        delete_quietly(hb, sandbox.id)


def sleepers(box: harebox.Sandbox) -> int:
    res = box.run(COUNT_SLEEPERS)
    assert res["stdout"].strip().isdigit(), res
    return int(res["stdout"])


def test_stop_keeps_the_sandbox(hb: harebox.Client, cycle_box: harebox.Sandbox, run_label: str) -> None:
    box = cycle_box
    assert box.state == "running"
    if PERSISTENT_IMAGE:
        box.write_file(KEPT_FILE, KEPT_DATA)
        assert box.read_file(KEPT_FILE) == KEPT_DATA.encode()
    proc = box.start(SLEEPER)
    assert proc["running"] is True
    assert sleepers(box) == 1

    assert box.stop() is box and box.state == "stopped"
    got = hb.get_sandbox(box.id)
    assert (got["id"], got["state"], got["image"]) == (box.id, "stopped", box.image)
    assert not got.get("error")  # stopped by the call, not on its own
    stopped = hb.list_sandboxes(query={"state": "stopped", "label": f"sdk-python-test={run_label}"})["sandboxes"]
    assert box.id in [b["id"] for b in stopped]


def test_a_stopped_sandbox_refuses_commands_and_a_second_stop(hb: harebox.Client, cycle_box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.Conflict) as ran:
        cycle_box.run("echo no")
    assert (ran.value.status, ran.value.code) == (409, "conflict")
    with pytest.raises(harebox.Conflict):
        hb.exec(cycle_box.id, body={"cmd": "true"})
    with pytest.raises(harebox.Conflict):
        cycle_box.stop()
    with pytest.raises(harebox.Conflict):
        hb.stop_sandbox(cycle_box.id)
    assert cycle_box.refresh().state == "stopped"


def test_start_boots_it_again(hb: harebox.Client, cycle_box: harebox.Sandbox) -> None:
    box = cycle_box
    assert box.boot() is box and box.state == "running"
    assert hb.get_sandbox(box.id)["state"] == "running"
    assert box.run("echo back")["stdout"] == "back\n"
    with pytest.raises(harebox.Conflict) as again:
        hb.start_sandbox(box.id)  # only a stopped sandbox starts
    assert (again.value.status, again.value.code) == (409, "conflict")
    assert box.refresh().state == "running"


def test_processes_do_not_survive(hb: harebox.Client, cycle_box: harebox.Sandbox) -> None:
    assert sleepers(cycle_box) == 0
    assert not [p for p in hb.list_processes(cycle_box.id)["processes"] if p["running"]]


def test_files_survive(cycle_box: harebox.Sandbox) -> None:
    if not PERSISTENT_IMAGE:
        pytest.skip("set HAREBOX_TEST_DEFAULT_IMAGE_NAME to an image whose root is on its disk (the minimal image keeps no files across a boot)")
    assert cycle_box.read_file(KEPT_FILE) == KEPT_DATA.encode()
