"""Command history and the account's retention, on one sandbox of its own.

The sandbox (created with monitoring on, as by default) runs a command
that is kept with its output; then the default account's retention is
lowered to ``{"output_days": 0}`` and the next command is kept without
it. The retention is set back to ``{}`` (keep forever) at the end, even
when a test fails, since other tests share the server; the sandbox is
deleted. The tests run in this file's order. They need the root key (the
default account's retention is the operator's).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Iterator

import pytest

import harebox
from harebox import types as t

from conftest import delete_quietly


@pytest.fixture(scope="module")
def history_box(hb: harebox.Client, test_image: str, run_label: str) -> Iterator[harebox.Sandbox]:
    """The one sandbox of this file; the retention is kept forever again at the end."""
    sandbox = hb.create(
        image=test_image, ttl_seconds=1800, monitoring=True, snapshots=True,
        labels={"sdk-python-test": run_label, "role": "history"},
    )
    try:
        yield sandbox
    finally:
        try:
            hb.update_account("default", body={"retention": {}})
        finally:
            delete_quietly(hb, sandbox.id)


def entry(hb: harebox.Client, box: harebox.Sandbox, cmd: str) -> t.Command:
    """The one history entry of the sandbox with this command."""
    found = [c for c in hb.list_commands(box.id)["commands"] if c.get("cmd") == cmd]
    assert len(found) == 1, f"entries for {cmd!r}: {found}"
    return found[0]


def test_the_sandbox_reports_monitoring_and_snapshots(hb: harebox.Client, history_box: harebox.Sandbox) -> None:
    assert (history_box.monitoring, history_box.snapshots) == (True, True)
    got = hb.get_sandbox(history_box.id)
    assert (got.get("monitoring"), got.get("snapshots")) == (True, True)
    assert history_box.to_dict()["monitoring"] is True


def test_an_exec_is_kept_with_its_output(hb: harebox.Client, history_box: harebox.Sandbox) -> None:
    hb.update_account("default", body={"retention": {}})  # keep forever, whatever an earlier run left
    tag = uuid.uuid4().hex
    cmd = f"echo {tag} | rev"
    r = history_box.run(cmd, user="root", cwd="/tmp")
    assert (r["exit_code"], r["stdout"]) == (0, tag[::-1] + "\n"), r
    e = entry(hb, history_box, cmd)
    assert (e["kind"], e["sandbox_id"], e.get("user"), e.get("cwd"), e["output_purged"]) == ("exec", history_box.id, "root", "/tmp", False)
    assert e["id"] and datetime.fromisoformat(e["started_at"]) <= datetime.fromisoformat(e["ended_at"]), e
    result = e.get("result") or {}
    assert (result.get("exit_code"), result.get("stdout"), result.get("stdout_truncated")) == (0, tag[::-1] + "\n", False), e
    # Oldest first; limit keeps the newest.
    assert hb.list_commands(history_box.id, query={"limit": 1})["commands"] == [e]
    assert hb.list_commands(history_box.id)["commands"][-1] == e


def test_output_days_zero_keeps_entries_without_output(hb: harebox.Client, history_box: harebox.Sandbox) -> None:
    account = hb.update_account("default", body={"retention": {"output_days": 0}})
    assert (account["name"], account["retention"]) == ("default", {"output_days": 0})
    assert hb.get_account("default")["retention"] == {"output_days": 0}
    tag = uuid.uuid4().hex
    cmd = f"echo {tag} | rev"
    assert history_box.run(cmd)["stdout"] == tag[::-1] + "\n"  # the caller still gets it
    e = entry(hb, history_box, cmd)
    assert (e["kind"], e["output_purged"]) == ("exec", True), e
    assert not (e.get("result") or {}).get("stdout"), e
    commands = hb.list_commands(history_box.id)["commands"]
    assert tag[::-1] not in json.dumps(commands)
    # Lowered: the output kept before goes too.
    assert all(c["output_purged"] and not (c.get("result") or {}).get("stdout") for c in commands), commands


def test_bad_requests_are_refused_with_their_field(hb: harebox.Client, history_box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.update_account("default", body={"retention": {"history_days": -1}})
    assert bad.value.field == "retention.history_days"
    assert hb.get_account("default")["retention"] == {"output_days": 0}  # unchanged
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.list_commands(history_box.id, query={"limit": 0})
    assert bad.value.field == "limit"
    with pytest.raises(harebox.NotFound):
        hb.list_commands("sbx_" + "0" * 26)


def test_back_to_keep_forever(hb: harebox.Client, history_box: harebox.Sandbox) -> None:
    account = hb.update_account("default", body={"retention": {}})
    assert account["retention"] == {}
    assert hb.get_account("default")["retention"] == {}
    cmd = "echo kept again"
    history_box.run(cmd)
    e = entry(hb, history_box, cmd)
    assert (e["output_purged"], (e.get("result") or {}).get("stdout")) == (False, "kept again\n"), e
