"""Commands in the shared sandbox: exec, exec_stream, background processes
and terminals."""

from __future__ import annotations

import base64
import time
import uuid

import pytest

import harebox
from harebox import types as t


def test_exec_reports_stdout_stderr_and_exit_code(hb: harebox.Client, box: harebox.Sandbox) -> None:
    res = hb.exec(box.id, body={"cmd": "echo out; echo err >&2; exit 7"})
    assert (res["exit_code"], res["stdout"], res["stderr"], res["timed_out"]) == (7, "out\n", "err\n", False)
    assert res["duration_ms"] >= 0 and not res["stdout_truncated"]


def test_exec_runs_as_user_unless_root_is_asked(box: harebox.Sandbox) -> None:
    assert box.run("id -u")["stdout"] == "1000\n"
    assert box.run(["id", "-u"], user="root")["stdout"] == "0\n"
    res = box.run("echo $GREETING in $(pwd)", env={"GREETING": "hi"}, cwd="/tmp")
    assert res["stdout"] == "hi in /tmp\n"


def test_exec_timeout_kills_the_command(box: harebox.Sandbox) -> None:
    res = box.run("echo started; sleep 60", timeout=1)
    assert res["timed_out"] is True
    assert res["exit_code"] != 0 and res["stdout"] == "started\n"
    assert res["duration_ms"] < 30_000


def test_exec_feeds_stdin(hb: harebox.Client, box: harebox.Sandbox) -> None:
    data = bytes(range(256)) * 4
    res = hb.exec(box.id, body={"cmd": "wc -c", "stdin": base64.b64encode(data).decode()})
    assert res["stdout"].strip() == str(len(data))
    assert box.run(["cat"], stdin="text stdin")["stdout"] == "text stdin"


def test_exec_stream_yields_output_in_order_then_exit(hb: harebox.Client, box: harebox.Sandbox) -> None:
    body = {"cmd": "echo one; sleep 0.2; echo two >&2; sleep 0.2; printf '\\377\\000'; exit 3"}
    events = list(hb.exec_stream(box.id, body=body))
    assert events[-1].name == "exit" and [e.name for e in events].count("exit") == 1
    result = events[-1].payload
    assert result["exit_code"] == 3 and result["stdout"] == ""
    output = [(name, payload) for name, payload in events[:-1]]
    assert all(isinstance(p, bytes) for _, p in output)
    assert b"".join(p for n, p in output if n == "stdout") == b"one\n\xff\x00"
    assert b"".join(p for n, p in output if n == "stderr") == b"two\n"
    names = [n for n, _ in output]
    assert names.index("stderr") > names.index("stdout")  # "one" came before "two"
    assert names[-1] == "stdout"  # and the binary bytes after "two"


def test_exec_stream_can_be_closed_early(box: harebox.Sandbox) -> None:
    with box.stream("echo first; sleep 30", timeout=40) as stream:
        name, payload = next(stream)
        assert (name, payload) == ("stdout", b"first\n")
    assert list(stream) == []


def test_exec_stream_bad_request_raises_before_streaming(hb: harebox.Client, box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.InvalidRequest):
        hb.exec_stream(box.id, body={"cmd": "true", "argv": ["true"]})


def test_background_process_start_get_wait_list(hb: harebox.Client, box: harebox.Sandbox) -> None:
    proc = hb.start_process(box.id, body={"cmd": "sleep 0.5; echo done"})
    assert proc["id"] and proc["sandbox_id"] == box.id and proc["running"] is True
    assert proc["id"] in [p["id"] for p in hb.list_processes(box.id)["processes"]]
    assert hb.get_process(box.id, proc["id"])["id"] == proc["id"]
    waited = hb.get_process(box.id, proc["id"], query={"wait": True, "timeout_seconds": 60})
    assert waited["running"] is False
    assert (waited["result"]["exit_code"], waited["result"]["stdout"]) == (0, "done\n")


def test_background_process_kill(hb: harebox.Client, box: harebox.Sandbox) -> None:
    proc = box.start("sleep 600")
    still = hb.get_process(box.id, proc["id"], query={"wait": True, "timeout_seconds": 0.5})
    assert still["running"] is True  # the wait ended, the process did not
    # Its stdin was not kept open (E2B's process service keeps it): input is refused.
    with pytest.raises(harebox.HareBoxError) as e:
        hb.send_process_input(box.id, proc["id"], stdin=b"x")
    assert e.value.status == 409
    with pytest.raises(harebox.HareBoxError) as e:
        hb.send_process_input(box.id, proc["id"])
    assert e.value.status == 400
    # Kept open: input, then its end.
    reader = hb.start_process(box.id, body={"argv": ["cat"], "keep_stdin": True, "tag": "reader"})
    assert reader["tag"] == "reader"
    hb.send_process_input(box.id, reader["id"], stdin="ping\n")
    hb.send_process_input(box.id, reader["id"], eof=True)
    read = hb.get_process(box.id, reader["id"], query={"wait": True, "timeout_seconds": 30})
    assert read["result"]["stdout"] == "ping\n"
    assert hb.kill_process(box.id, proc["id"], body={"signal": 15}) is None
    ended = hb.get_process(box.id, proc["id"], query={"wait": True, "timeout_seconds": 30})
    assert ended["running"] is False and ended["result"].get("signal") == 15

    other = box.start(["sleep", "600"])
    hb.kill_process(box.id, other["id"])  # no body: SIGKILL
    ended = hb.get_process(box.id, other["id"], query={"wait": True, "timeout_seconds": 30})
    assert ended["result"].get("signal") == 9


def _split(events: list[harebox.ExecEvent], offsets: tuple[int, int] = (0, 0)) -> tuple[bytes, bytes, list[t.ExecResult]]:
    """Joins a process output stream's chunks per stream, checking that
    each starts where the one before ended (nothing dropped), from
    ``offsets``; and lists its exit events."""
    joined = {"stdout": b"", "stderr": b""}
    at = dict(zip(("stdout", "stderr"), offsets))
    for name, payload in events:
        if name in joined:
            assert isinstance(payload, t.OutputChunk) and payload.offset == at[name], (name, payload, at)
            joined[name] += payload.data
            at[name] = payload.end
    return joined["stdout"], joined["stderr"], [p for n, p in events if n == "exit"]


def test_background_process_output_from_offsets(hb: harebox.Client, box: harebox.Sandbox) -> None:
    go = f"/tmp/harebox-output-{uuid.uuid4().hex[:8]}"
    proc = box.start(f"echo one; echo two >&2; while [ ! -e {go} ]; do sleep 0.1; done; echo three; sleep 0.5; echo four >&2; exit 5")
    # Without follow: what the agent keeps so far, and no exit (the
    # process waits for the file). Asked until the first lines are there.
    deadline = time.monotonic() + 30
    while True:
        with hb.get_process_output(box.id, proc["id"]) as first:
            out, err, exits = _split(list(first))
        if (out, err) == (b"one\n", b"two\n") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (out, err, exits) == (b"one\n", b"two\n", [])
    assert (first.stdout_offset, first.stderr_offset) == (4, 4)
    assert hb.get_process(box.id, proc["id"])["running"] is True

    # Following from those offsets: only the rest, then the exit.
    hb.start_process(box.id, body={"cmd": f"sleep 1; touch {go}"})
    rest = box.process_output(proc["id"], stdout_offset=first.stdout_offset, stderr_offset=first.stderr_offset)
    events = list(rest)
    out, err, exits = _split(events, (4, 4))
    assert (out, err) == (b"three\n", b"four\n")
    assert events[-1].name == "exit" and len(exits) == 1
    assert (exits[0]["exit_code"], exits[0]["stdout"], exits[0]["stderr"], exits[0]["timed_out"]) == (5, "", "", False)
    assert (rest.stdout_offset, rest.stderr_offset) == (10, 9)

    # After the end, from 0: everything and the exit, with follow or without.
    for follow in (False, True):
        out, err, exits = _split(list(box.process_output(proc["id"], follow=follow)))
        assert (out, err) == (b"one\nthree\n", b"two\nfour\n")
        assert [r["exit_code"] for r in exits] == [5]
    assert hb.get_process(box.id, proc["id"])["running"] is False
    box.run(["rm", "-f", go])


def test_process_output_errors_before_the_stream(hb: harebox.Client, box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.NotFound):
        hb.get_process_output(box.id, "proc_missing")
    proc = box.start("true")
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.get_process_output(box.id, proc["id"], query={"stdout_offset": -1})
    assert bad.value.field == "stdout_offset"


def test_missing_process_is_not_found(hb: harebox.Client, box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.NotFound):
        hb.get_process(box.id, "proc_missing")


def test_a_command_that_cannot_start_says_why(box: harebox.Sandbox) -> None:
    res = box.run(["/no/such/program"])
    assert res["exit_code"] != 0 and "no such file" in res.get("error", "")


# --- terminals ------------------------------------------------------------------


def _shown_until(pty: harebox.Pty, want: bytes, seconds: float = 60) -> bytes:
    """What the terminal shows until ``want`` is in it."""
    shown = b""
    deadline = time.monotonic() + seconds
    while want not in shown:
        left = deadline - time.monotonic()
        assert left > 0, f"no {want!r} within {seconds:g} s: {shown!r}"
        chunk = pty.read(timeout=left)
        assert chunk is not None, f"the session ended before {want!r}: {shown!r}"
        shown += chunk
    return shown


def _shown_to_the_end(pty: harebox.Pty, seconds: float = 60) -> bytes:
    shown = b""
    deadline = time.monotonic() + seconds
    while (chunk := pty.read(timeout=max(0.0, deadline - time.monotonic()))) is not None:
        assert time.monotonic() < deadline, f"the session did not end within {seconds:g} s: {shown!r}"
        shown += chunk
    return shown


def test_pty_runs_a_command_on_a_sized_terminal(hb: harebox.Client, box: harebox.Sandbox) -> None:
    query = {"cmd": "stty size; read x; echo got-$x; exit 4", "rows": 30, "cols": 90}
    with hb.open_pty(box.id, query=query) as pty:
        _shown_until(pty, b"30 90")
        pty.write(b"hi\n")
        _shown_until(pty, b"got-hi")
        _shown_to_the_end(pty)
        assert pty.ended and pty.error is None
    assert pty.result is not None and pty.result["exit_code"] == 4


def test_pty_resize_shows_in_stty(box: harebox.Sandbox) -> None:
    with box.pty("stty size; while read x; do stty size; done", rows=24, cols=80) as pty:
        _shown_until(pty, b"24 80")
        pty.resize(50, 120)
        # The new size and the typed lines travel apart: ask until it shows.
        shown = b""
        deadline = time.monotonic() + 60
        while b"50 120" not in shown:
            assert time.monotonic() < deadline, f"no 50 120: {shown!r}"
            pty.write(b"\n")
            while chunk := pty.read(timeout=1):  # until a second passes without output
                shown += chunk
            assert chunk is not None, f"the session ended: {shown!r}"
        pty.eof()  # ends the loop's read
        _shown_to_the_end(pty)
    assert pty.result is not None and pty.result["exit_code"] == 0


def test_pty_of_a_missing_sandbox_is_not_found(hb: harebox.Client) -> None:
    with pytest.raises(harebox.NotFound):
        hb.open_pty("sbx_" + "0" * 26)
