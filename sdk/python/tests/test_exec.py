"""Commands in the shared sandbox: exec, exec_stream and background processes."""

from __future__ import annotations

import base64

import pytest

import harebox


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
    assert hb.kill_process(box.id, proc["id"], body={"signal": 15}) is None
    ended = hb.get_process(box.id, proc["id"], query={"wait": True, "timeout_seconds": 30})
    assert ended["running"] is False and ended["result"].get("signal") == 15

    other = box.start(["sleep", "600"])
    hb.kill_process(box.id, other["id"])  # no body: SIGKILL
    ended = hb.get_process(box.id, other["id"], query={"wait": True, "timeout_seconds": 30})
    assert ended["result"].get("signal") == 9


def test_missing_process_is_not_found(hb: harebox.Client, box: harebox.Sandbox) -> None:
    with pytest.raises(harebox.NotFound):
        hb.get_process(box.id, "proc_missing")


def test_a_command_that_cannot_start_says_why(box: harebox.Sandbox) -> None:
    res = box.run(["/no/such/program"])
    assert res["exit_code"] != 0 and "no such file" in res.get("error", "")
