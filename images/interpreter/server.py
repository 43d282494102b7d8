#!/usr/bin/python3
"""HareBox code interpreter: stateful Python (IPython), JavaScript and
TypeScript (Node) and bash contexts over HTTP.

Runs inside the sandbox VM as the unprivileged user and listens on loopback; the
host reaches it through a tunnel. Each Python context is a kernel process
(interpreter_kernel.py, beside this file: IPython's shell); each JavaScript
or TypeScript context one on Node (interpreter_kernel.js), spoken to the same
way; each bash context a bash. Standard library only (the kernels: plus
Debian's IPython, and Node).

  GET    /health                 200 {"ready": true} once the default context is warm, else 503
  GET    /contexts               200 [{"id", "language", "cwd"}, ...]
  POST   /contexts               {"language", "cwd", "env"} -> 201 context
  DELETE /contexts/{id}          204
  POST   /contexts/{id}/restart  200 context (fresh kernel, same id/cwd/env)
  POST   /execute                {"code", "context_id", "language", "env", "timeout_seconds"}
                                 -> 200 application/x-ndjson, chunked, one event per line:
      {"type": "stdout"|"stderr", "text"}      {"type": "count", "count"}
      {"type": "result", "main", "data", "metadata"}
      {"type": "error", "name", "value", "traceback"}
      {"type": "end", "status": "ok"|"error"|"timeout"|"died"}   (always last)

Bash cells report a non-zero exit status as an error named "ExitCode" (value:
the status); "count" is the context's cell number. Errors before streaming
are JSON {"error": "..."} with 400/404/405/411/413/429 (context limit)/500.

Threading model: every context owns one worker thread that does all kernel
work (start, execute, interrupt, stop). HTTP handler threads only queue jobs on
it and relay the events it produces through a small bounded queue, which gives
back-pressure (down to the kernel, whose writes to its socket block).
"""

import argparse
import codecs
import concurrent.futures
import json
import logging
import math
import os
import queue
import re
import secrets
import select
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

log = logging.getLogger("interpreter")

MAX_BODY = 8 << 20
MAX_CONTEXTS = 32
DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 3600.0
START_TIMEOUT = 60.0  # kernel start on a loaded VM can take several seconds
POLL = 0.5  # how often waits look at deadlines, cancellation and liveness
TEXT_CHUNK = 64 << 10  # max characters of one stdout/stderr event
EVENT_QUEUE = 32  # events buffered between a kernel and its HTTP client
MAX_EVENT = 32 << 20  # longest line a kernel may send (a result; the host takes 24 MiB)
IDLE_TIMEOUT = 300.0  # keep-alive connections: longer than Go's idle pool timeout
LANGUAGES = ("python", "bash", "javascript", "typescript")
DEFAULT_IDS = {"python": "default", "bash": "default-bash", "javascript": "default-javascript",
               "typescript": "default-typescript"}
KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interpreter_kernel.py")
JS_KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interpreter_kernel.js")
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
BASH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ApiError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def error_event(name, value, traceback=""):
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def read_machine_id(path):
    try:
        with open(path, "rb") as f:
            return f.read(256).strip()
    except OSError:
        return b""


def kill_group(pid):
    # Kernels and shells lead their own process group (start_new_session), so
    # this also takes the processes the user's code started. Callers forget
    # the pid afterwards: a reused pid must never be signalled.
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


class Job:
    """One execution: what to run, its bounds, and the events for its client."""

    def __init__(self, code="", env=None, timeout=DEFAULT_TIMEOUT, ctx=None):
        self.code, self.env, self.timeout, self.ctx = code, env or {}, timeout, ctx
        self.deadline = time.monotonic() + timeout  # counts time spent queued
        self.events = queue.Queue(maxsize=EVENT_QUEUE)
        self.started = threading.Event()
        self.cancelled = threading.Event()  # the client went away

    def emit(self, event):
        # Blocks while the client is slow (back-pressure); drops once it left.
        while not self.cancelled.is_set():
            try:
                self.events.put(event, timeout=POLL)
                return
            except queue.Full:
                pass

    def stop_reason(self):
        if self.ctx is not None and self.ctx.preempt:
            return "preempted"
        if self.cancelled.is_set():
            return "cancelled"
        if time.monotonic() >= self.deadline:
            return "timeout"
        return None


# Cells the server runs in Python kernels, silently (no history, no count);
# their helper names are deleted so the user's namespace stays clean.

PY_RESEED = """\
import random as __hb_r, sys as __hb_s
__hb_r.seed()
if 'numpy' in __hb_s.modules: __hb_s.modules['numpy'].random.seed()
del __hb_r, __hb_s
"""

# Restore what the previous request set, then apply the new values. The
# originals are kept in the kernel, so changes made by the user's code count.
PY_ENV = """\
def __hb_env(new):
    import os, sys
    saved = sys.__dict__.setdefault('_harebox_env_saved', {})
    for k, v in saved.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
    saved.clear()
    for k, v in new.items():
        saved[k] = os.environ.get(k)
        os.environ[k] = v
__hb_env(%r)
del __hb_env
"""

# importlib binds no names in the user's namespace.
PY_WARM = """\
def __hb_warm():
    import importlib
    for m in %r:
        try: importlib.import_module(m)
        except Exception: pass
__hb_warm()
del __hb_warm
"""


# Backends. run() returns one of: ok, error, timeout, cancelled, stuck (did not
# stop after an interrupt), died, preempted (context deleted/restarted).


class PythonKernel:
    """A Python context's kernel (interpreter_kernel.py), over a socket pair."""

    RESEED = PY_RESEED

    @staticmethod
    def argv(fd):
        return [sys.executable, KERNEL, str(fd)]

    # How many socket pairs the kernel takes: one carries both ways; with
    # two, requests go on the first and events come on the second.
    CHANNELS = 1

    def __init__(self, cwd, env, runtime_dir, grace):
        self.cwd, self.env, self.grace = cwd, env, grace
        self.proc = self.pid = self.sock = self.req = None
        self.buf, self.skipping, self.cell = bytearray(), False, 0

    def start(self):
        env = dict(os.environ, MPLBACKEND=INLINE_BACKEND)  # inline backend -> figures as image/png
        env.update(self.env)
        pairs = [socket.socketpair() for _ in range(self.CHANNELS)]
        theirs = [t.fileno() for _, t in pairs]
        try:
            self.proc = subprocess.Popen(
                self.argv(*theirs), pass_fds=theirs,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd=self.cwd, env=env, start_new_session=True)
        except BaseException:
            for ours, _ in pairs:
                ours.close()
            raise
        finally:
            for _, t in pairs:
                t.close()
        self.req, self.sock, self.pid = pairs[0][0], pairs[-1][0], self.proc.pid
        try:
            end = time.monotonic() + START_TIMEOUT
            while True:
                ev = self._event(min(POLL, max(0.0, end - time.monotonic())))
                if ev is not None and ev.get("type") == "ready":
                    return
                if ev is None and (time.monotonic() >= end or not self.alive()):
                    raise RuntimeError("the kernel did not start" if self.alive() else
                                       f"the kernel exited (exit code {self.proc.poll()})")
        except BaseException:
            self.stop()
            raise

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self):
        return self.proc.poll() if self.proc else None

    def interrupt(self):
        try:
            os.killpg(self.pid, signal.SIGINT)
        except OSError as e:
            log.warning("interrupt failed: %s", e)

    def stop(self):
        for s in {self.req, self.sock} - {None}:
            s.close()
        kill_group(self.pid)
        if self.proc:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.pid = None

    @staticmethod
    def env_code(new):
        return PY_ENV % (new,)

    @staticmethod
    def warm_code(modules):
        return PY_WARM % (modules,)

    def run(self, code, job, silent=False):
        emit = (lambda ev: None) if silent else job.emit
        self.cell += 1
        cell = self.cell
        try:
            self.req.sendall(json.dumps({"cell": cell, "code": code, "silent": silent}).encode() + b"\n")
        except OSError:
            return "died"
        reason, interrupted, last_signal, failed, busy_at, delivered = None, None, 0.0, False, None, False
        while True:
            now = time.monotonic()
            if interrupted is None:
                reason = job.stop_reason()
                if reason == "preempted":
                    return reason
                if reason:
                    interrupted = now
            elif job.ctx is not None and job.ctx.preempt:
                return "preempted"
            elif now - interrupted > self.grace:
                return "stuck"
            # The kernel ignores SIGINT between cells, so one sent before the
            # cell began is lost: repeat until one surely landed.
            if interrupted is not None and not delivered and now - last_signal >= 1:
                self.interrupt()
                last_signal = now
                delivered = busy_at is not None and now - busy_at > 0.2
            try:
                ev = self._event(POLL)
            except EOFError:  # exiting, or a kernel that closed its socket: gone either way
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    kill_group(self.pid)
                    self.proc.wait()
                return "died"
            if ev is None:
                if not self.alive():  # os._exit, OOM kill, segfault...
                    return "died"
                continue
            if ev.get("cell") != cell:
                continue  # late output of an earlier cell
            kind = ev.get("type")
            if kind == "start":
                busy_at = time.monotonic()
            elif kind == "count":
                emit({"type": "count", "count": ev.get("count")})
            elif kind in ("stdout", "stderr"):
                text = ev.get("text")
                text = text if isinstance(text, str) else ""
                for i in range(0, len(text), TEXT_CHUNK):
                    emit({"type": kind, "text": text[i:i + TEXT_CHUNK]})
            elif kind == "result":
                data, metadata = ev.get("data"), ev.get("metadata")
                emit({"type": "result", "main": ev.get("main") is True,
                      "data": data if isinstance(data, dict) else {},
                      "metadata": metadata if isinstance(metadata, dict) else {}})
            elif kind == "error":
                failed = True
                if interrupted is not None:
                    continue  # the KeyboardInterrupt we caused; reported as a timeout
                if silent:
                    log.warning("internal cell failed: %s: %s", ev.get("name"), ev.get("value"))
                tb = ev.get("traceback")
                tb = "\n".join(str(line) for line in tb) if isinstance(tb, list) else ""
                emit(error_event(str(ev.get("name", "")), str(ev.get("value", "")), ANSI.sub("", tb)))
            elif kind == "done":
                failed = failed or ev.get("status") != "ok"
                break
        return reason or ("error" if failed else "ok")

    def _event(self, timeout):
        """The kernel's next event, None after timeout without one; EOFError
        once it closed its end. A line longer than MAX_EVENT is dropped, said
        on the cell's stderr."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                if self.skipping:
                    self.skipping = False
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    log.warning("the kernel sent a line that is not JSON")
                    continue
                if isinstance(ev, dict):
                    return ev
                continue
            if len(self.buf) > MAX_EVENT:
                self.buf.clear()
                if not self.skipping:
                    self.skipping = True
                    return {"cell": self.cell, "type": "stderr",
                            "text": f"[a result of more than {MAX_EVENT >> 20} MiB was dropped]\n"}
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            try:
                data = self.sock.recv(1 << 20)
            except OSError:  # ECONNRESET: it exited with our request unread
                data = b""
            if not data:
                raise EOFError
            self.buf += data
            timeout = 0 if b"\n" not in data else timeout


# Cells the server runs in JavaScript kernels, silently, as PY_ENV and
# PY_RESEED do in Python ones.
JS_ENV = """\
(() => {
  const saved = globalThis[Symbol.for('harebox.env')] ??= {};
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k]; else process.env[k] = v;
    delete saved[k];
  }
  for (const [k, v] of Object.entries(%s)) { saved[k] = process.env[k]; process.env[k] = v; }
})()
"""


class JavaScriptKernel(PythonKernel):
    """A JavaScript context's kernel (interpreter_kernel.js, on Node), over
    two socket pairs, in the Python kernel's protocol."""

    LANGUAGE = "javascript"

    RESEED = "globalThis[Symbol.for('harebox.reseed')]()"
    # (It writes its events synchronously, so their socket must stay
    # blocking while Node reads requests from the other.)
    CHANNELS = 2

    @classmethod
    def argv(cls, req, events):
        # (--expose-internals: the kernel uses Node's REPL rewrite for a
        # top-level await; --experimental-vm-modules: import() in a cell.)
        return [shutil.which("node") or "/usr/bin/node", "--expose-internals", "--experimental-vm-modules",
                JS_KERNEL, str(req), str(events), cls.LANGUAGE]

    @staticmethod
    def env_code(new):
        return JS_ENV % (json.dumps(new),)

    @staticmethod
    def warm_code(modules):
        return "undefined"  # (the warm-up list names Python modules)


class TypeScriptKernel(JavaScriptKernel):
    """A TypeScript context's kernel: the JavaScript one, its cells
    transpiled first."""

    LANGUAGE = "typescript"


class _Cut:
    """Splits one bash pipe into the cell's output and the sentinel line ending it."""

    def __init__(self, name, tag):
        self.name, self.marker = name, b"\n" + tag.encode()
        self.buf, self.done, self.status = b"", False, None
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data):
        if self.done:
            return ""  # late output of background jobs: not this cell's
        self.buf += data
        i = self.buf.find(self.marker)
        if i < 0:  # hold back what could be the start of the marker
            cut = max(0, len(self.buf) - len(self.marker) + 1)
            out, self.buf = self.buf[:cut], self.buf[cut:]
            return self.decoder.decode(out)
        j = self.buf.find(b"\n", i + len(self.marker))
        if j < 0:  # marker seen, its line not complete yet
            out, self.buf = self.buf[:i], self.buf[i:]
            return self.decoder.decode(out)
        rest = self.buf[i + len(self.marker):j].strip()
        self.status = int(rest) if rest.isdigit() else None
        out, self.buf, self.done = self.buf[:i], b"", True
        return self.decoder.decode(out, final=True)


class BashShell:
    RESEED = "RANDOM=$(od -An -N2 -tu2 /dev/urandom)"

    def __init__(self, cwd, env, runtime_dir, grace):
        self.cwd, self.env, self.grace = cwd, env, grace
        self.cell_path = os.path.join(runtime_dir, f"cell-{secrets.token_hex(8)}.sh")
        self.proc = self.pid = None
        self.sel = selectors.DefaultSelector()

    def start(self):
        self.proc = subprocess.Popen(
            [shutil.which("bash") or "/bin/bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=self.cwd, env=dict(os.environ, **self.env), start_new_session=True)
        self.pid = self.proc.pid
        self.sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        self.sel.register(self.proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        outcome = self.run(":", Job(timeout=START_TIMEOUT), silent=True)
        if outcome != "ok":
            self.stop()
            raise RuntimeError(f"bash did not start ({outcome})")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self):
        return self.proc.returncode if self.proc else None

    def stop(self):
        kill_group(self.pid)
        self.pid = None
        if self.proc:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                f.close()
        self.sel.close()
        try:
            os.unlink(self.cell_path)
        except OSError:
            pass

    @staticmethod
    def env_code(new):
        # __hb_old maps each key we set to "1<old value>" or "0" (was unset).
        lines = ["declare -gA __hb_old",
                 'for __hb_k in "${!__hb_old[@]}"; do',
                 '  if [[ ${__hb_old[$__hb_k]} == 1* ]]; then export "$__hb_k=${__hb_old[$__hb_k]#1}";',
                 '  else unset "$__hb_k"; fi',
                 "done", "__hb_old=()", "unset __hb_k"]
        for k, v in new.items():
            if not BASH_NAME.match(k):
                continue  # bash cannot hold such a variable; documented
            lines.append(f'if [[ -v {k} ]]; then __hb_old[{k}]="1${k}"; else __hb_old[{k}]=0; fi; '
                         f"export {k}={shlex.quote(v)}")
        return "\n".join(lines)

    def run(self, code, job, silent=False):
        emit = (lambda ev: None) if silent else job.emit
        with open(self.cell_path, "w", encoding="utf-8", errors="replace") as f:
            f.write(code + "\n")
        self._drain()
        tag = secrets.token_hex(16)
        # Sourcing a file (not piping the code) keeps a syntax error or a stray
        # quote from eating our trailer; </dev/null keeps `cat`/`read` from
        # eating the next command. `return 130` in the INT trap aborts the
        # sourced cell even in builtin loops; re-arming it every cell works
        # around bash 5.2 ignoring the trap after a `return` from it.
        line = (f"trap - INT; trap 'return 130' INT; . {shlex.quote(self.cell_path)} </dev/null; "
                f"__hb_rc=$?; trap '' INT; printf '\\n%s %d\\n' {tag} $__hb_rc; printf '\\n%s\\n' {tag} >&2\n")
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except OSError:
            return "died"
        cuts = {"stdout": _Cut("stdout", tag), "stderr": _Cut("stderr", tag)}
        reason, interrupted, last_signal = None, None, 0.0
        while not (cuts["stdout"].done and cuts["stderr"].done):
            now = time.monotonic()
            reason = reason or job.stop_reason()
            if reason == "preempted":
                return reason
            if reason:
                interrupted = interrupted or now
                if now - interrupted > self.grace:
                    return "stuck"
                if now - last_signal >= POLL:  # repeat: each INT may only pop one function
                    last_signal = now
                    try:
                        os.killpg(self.pid, signal.SIGINT)
                    except OSError:
                        pass
            ready = self.sel.select(POLL)
            if not ready and self.proc.poll() is not None:
                return "died"
            for key, _ in ready:
                data = os.read(key.fd, 65536)
                if not data:  # bash exited or closed its output: unusable either way
                    kill_group(self.pid)
                    self.proc.wait()
                    return "died"
                cut = cuts[key.data]
                text = cut.feed(data)
                if text:
                    emit({"type": cut.name, "text": text})
        if reason:
            return reason
        status = cuts["stdout"].status
        if status:
            if silent:
                log.warning("internal bash cell exited with %s", status)
            emit(error_event("ExitCode", str(status)))
            return "error"
        return "ok"

    def _drain(self):
        # Drop output that background jobs wrote between cells.
        for _ in range(64):
            ready = self.sel.select(0)
            if not ready:
                return
            for key, _ in ready:
                if not os.read(key.fd, 65536):
                    return


class Context:
    def __init__(self, interp, cid, language, cwd, env):
        self.interp, self.id, self.language, self.cwd, self.env = interp, cid, language, cwd, env
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"ctx-{cid}")
        self.backend = None  # only touched by the worker thread
        self.preempt = None  # set by other threads: abort the running cell (deleted/restarted)
        self.dead = None  # KernelDied message while dead
        self.applied_env, self.machine_id, self.cells = {}, b"", 0

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    # Everything below runs on the context's worker thread.

    def start(self):
        cls = {"python": PythonKernel, "bash": BashShell, "javascript": JavaScriptKernel,
               "typescript": TypeScriptKernel}[self.language]
        backend = cls(self.cwd, self.env, self.interp.runtime_dir, self.interp.args.interrupt_grace)
        backend.start()
        self.backend, self.dead, self.applied_env, self.cells = backend, None, {}, 0
        self.machine_id = read_machine_id(self.interp.args.machine_id_file)
        log.info("context %s (%s) started", self.id, self.language)

    def start_lazily(self):
        try:
            self.start()
        except Exception as e:
            log.error("context %s did not start: %s", self.id, e)
            self.dead = f"the context could not start: {e}"

    def restart(self):
        try:
            if self.backend:
                self.backend.stop()
            self.backend = None
            self.start()
        except Exception as e:
            self.dead = f"the context could not be restarted: {e}"
            raise
        finally:
            self.preempt = None

    def close(self):
        if self.backend:
            self.backend.stop()
        self.backend, self.dead = None, "the context was deleted"
        log.info("context %s deleted", self.id)

    def warm(self, modules):
        outcome = self.backend.run(self.backend.warm_code(modules), Job(timeout=120), silent=True)
        log.info("warm-up of %s: %s", ",".join(modules), outcome)

    def execute(self, job):
        job.started.set()
        try:
            self._execute(job)
        except Exception as e:
            log.exception("execution in %s failed", self.id)
            job.emit(error_event("InternalError", str(e)))
            job.emit({"type": "end", "status": "error"})

    def _execute(self, job):
        if job.cancelled.is_set():
            return
        if self.preempt:
            return self._finish(job, "preempted")
        if self.dead is None and not (self.backend and self.backend.alive()):
            self._died()
        if self.dead:
            job.emit(error_event("KernelDied", self.dead))
            return job.emit({"type": "end", "status": "died"})
        outcome = self._prepare(job)
        if outcome == "ok":
            if self.language == "bash":
                self.cells += 1
                job.emit({"type": "count", "count": self.cells})
            outcome = self.backend.run(job.code, job)
        self._finish(job, outcome)

    def _prepare(self, job):
        # Housekeeping cells, silent and only when something changed.
        machine_id = read_machine_id(self.interp.args.machine_id_file)
        if machine_id != self.machine_id:
            # A VM clone shares the userland PRNG state of every kernel.
            outcome = self.backend.run(self.backend.RESEED, job, silent=True)
            if outcome not in ("ok", "error"):
                return outcome
            self.machine_id = machine_id
            log.info("context %s reseeded after a machine-id change", self.id)
        if job.env != self.applied_env:
            outcome = self.backend.run(self.backend.env_code(job.env), job, silent=True)
            if outcome not in ("ok", "error"):
                return outcome
            self.applied_env = dict(job.env)
        return "ok"

    def _finish(self, job, outcome):
        status = outcome
        if outcome == "timeout":
            job.emit(error_event("TimeoutError", f"execution timed out after {job.timeout:g} s"))
        elif outcome == "stuck":  # interrupt ignored: only a fresh kernel gets the context back
            log.warning("context %s did not stop after an interrupt; restarting it", self.id)
            note = "the kernel did not stop after an interrupt and was restarted (state lost)"
            try:
                self.backend.stop()
                self.start()
            except Exception as e:
                self.dead = f"the kernel did not stop after an interrupt and could not be restarted: {e}"
                note = self.dead
            if job.stop_reason() == "timeout":
                job.emit(error_event("TimeoutError", f"execution timed out after {job.timeout:g} s; {note}"))
                status = "timeout"
            else:
                status = "error"
        elif outcome == "died":
            self._died()
            job.emit(error_event("KernelDied", self.dead))
        elif outcome == "preempted":
            job.emit(error_event("KernelDied", f"the context was {self.preempt or 'restarted'} while the cell ran"))
            status = "died"
        elif outcome == "cancelled":
            status = "error"  # nobody listens any more
        job.emit({"type": "end", "status": status})

    def _died(self):
        code = self.backend.exit_code() if self.backend else None
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"exit code {code}"
        else:
            how = f"exit code {code}"
        self.dead = f"the kernel died ({how}); restart the context"
        log.warning("context %s: %s", self.id, self.dead)
        if self.backend:
            self.backend.stop()


class Interpreter:
    def __init__(self, args):
        self.args = args
        self.contexts = {}
        self.lock = threading.Lock()
        self.ready = False
        self.runtime_dir = tempfile.mkdtemp(prefix="harebox-interpreter-")

    def get(self, cid):
        with self.lock:
            ctx = self.contexts.get(cid)
        if ctx is None:
            raise ApiError(404, f"no context {cid!r}")
        return ctx

    def list(self):
        with self.lock:
            return [c.info() for c in self.contexts.values()]

    def default(self, language):
        # Created lazily (and again after a DELETE); exempt from the limit.
        cid = DEFAULT_IDS[language]
        with self.lock:
            ctx = self.contexts.get(cid)
            if ctx is None:
                ctx = self.contexts[cid] = Context(self, cid, language, self.args.cwd, {})
                ctx.submit(ctx.start_lazily)
        return ctx

    def create(self, language, cwd, env):
        with self.lock:
            if len(self.contexts) >= MAX_CONTEXTS:
                raise ApiError(429, f"too many contexts (at most {MAX_CONTEXTS}); delete one first")
            cid = secrets.token_hex(6)
            while cid in self.contexts:
                cid = secrets.token_hex(6)
            ctx = self.contexts[cid] = Context(self, cid, language, cwd, env)
        try:
            ctx.submit(ctx.start).result(timeout=START_TIMEOUT + 15)
        except Exception as e:
            self.forget(ctx)
            ctx.preempt = "deleted"
            ctx.submit(ctx.close)
            ctx.pool.shutdown(wait=False)
            raise ApiError(500, f"could not start the context: {e}") from None
        return ctx

    def forget(self, ctx):
        with self.lock:
            if self.contexts.get(ctx.id) is ctx:
                del self.contexts[ctx.id]

    def delete(self, cid):
        ctx = self.get(cid)
        self.forget(ctx)
        ctx.preempt = "deleted"
        try:
            fut = ctx.submit(ctx.close)
            ctx.pool.shutdown(wait=False)
            fut.result(timeout=20)
        except Exception as e:
            log.warning("deleting %s: %r", cid, e)

    def restart(self, cid):
        ctx = self.get(cid)
        ctx.preempt = "restarted"
        try:
            fut = ctx.submit(ctx.restart)
        except RuntimeError:  # pool shut down: deleted meanwhile
            raise ApiError(404, f"no context {cid!r}") from None
        try:
            fut.result(timeout=START_TIMEOUT + 30)
        except Exception as e:
            raise ApiError(500, f"could not restart the context: {e}") from None
        return ctx

    def kill_all(self):
        with self.lock:
            contexts = list(self.contexts.values())
        for ctx in contexts:
            kill_group(getattr(ctx.backend, "pid", None))
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def check_env(env):
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ApiError(400, "env must be an object of strings")
    for k, v in env.items():
        if not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise ApiError(400, f"invalid env entry {k!r}")
    return env


def check_language(language):
    if language not in LANGUAGES:
        raise ApiError(400, f"unknown language {language!r} (want one of {', '.join(LANGUAGES)})")
    return language


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer is several small writes: with Nagle's algorithm, each after
    # the first waits for the ACK of the one before, which the other end
    # delays (40 ms) on a connection kept alive.
    disable_nagle_algorithm = True
    server_version = "harebox-interpreter"
    timeout = IDLE_TIMEOUT

    ROUTES = [
        (re.compile(r"/health"), {"GET": "health"}),
        (re.compile(r"/contexts"), {"GET": "list_contexts", "POST": "create_context"}),
        (re.compile(r"/contexts/([^/]+)"), {"DELETE": "delete_context"}),
        (re.compile(r"/contexts/([^/]+)/restart"), {"POST": "restart_context"}),
        (re.compile(r"/execute"), {"POST": "execute"}),
    ]

    def __getattr__(self, name):
        # Every method (PUT, PATCH, ...) goes through the router, which answers
        # JSON 404/405 instead of http.server's HTML 501.
        if name.startswith("do_"):
            return self.dispatch
        raise AttributeError(name)

    def log_message(self, fmt, *args):
        pass  # one line per request is too much for the journal

    def dispatch(self):
        path = urlsplit(self.path).path
        self.body_read = False
        try:
            for pattern, methods in self.ROUTES:
                m = pattern.fullmatch(path)
                if m:
                    if self.command not in methods:
                        self.close_connection = True  # the body, if any, is unread
                        raise ApiError(405, f"method {self.command} not allowed on {path}")
                    getattr(self, "api_" + methods[self.command])(*m.groups())
                    if not self.body_read and (self.headers.get("Content-Length", "0") not in ("", "0")
                                               or "Transfer-Encoding" in self.headers):
                        self.close_connection = True  # unread bytes would be parsed as a request
                    return
            self.close_connection = True
            raise ApiError(404, f"no such endpoint {path}")
        except ApiError as e:
            self.send_json(e.status, {"error": str(e)})
        except Exception as e:
            log.exception("%s %s", self.command, path)
            self.close_connection = True
            self.send_json(500, {"error": f"internal error: {e}"})

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_json(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "a Content-Length is required")
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "bad Content-Length") from None
        if n < 0:
            self.close_connection = True
            raise ApiError(400, "bad Content-Length")
        if n > MAX_BODY:
            self.close_connection = True
            self.discard(n)
            raise ApiError(413, f"request body larger than {MAX_BODY} bytes")
        raw = self.rfile.read(n)
        self.body_read = True
        if not raw.strip():
            return {}
        try:
            obj = json.loads(raw)
        except ValueError as e:
            raise ApiError(400, f"bad JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ApiError(400, "the body must be a JSON object")
        return obj

    def discard(self, n):
        # Read (a bounded amount of) an oversized body so the client gets our
        # 413 instead of a connection reset.
        end, left = time.monotonic() + 5, min(n, 64 << 20)
        self.connection.settimeout(1)
        try:
            while left > 0 and time.monotonic() < end:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def api_health(self):
        ready = self.server.interp.ready
        self.send_json(200 if ready else 503, {"ready": ready})

    def api_list_contexts(self):
        self.send_json(200, self.server.interp.list())

    def api_create_context(self):
        body = self.read_json()
        interp = self.server.interp
        language = check_language(body.get("language") or "python")
        cwd = body.get("cwd") or interp.args.cwd
        if not isinstance(cwd, str) or "\0" in cwd:
            raise ApiError(400, "cwd must be a string")
        cwd = os.path.abspath(os.path.join(interp.args.cwd, cwd))
        if not os.path.isdir(cwd):
            raise ApiError(400, f"cwd {cwd!r} is not a directory")
        ctx = interp.create(language, cwd, check_env(body.get("env")))
        self.send_json(201, ctx.info())

    def api_delete_context(self, cid):
        self.server.interp.delete(cid)
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def api_restart_context(self, cid):
        self.send_json(200, self.server.interp.restart(cid).info())

    def api_execute(self):
        body = self.read_json()
        interp = self.server.interp
        code = body.get("code")
        if not isinstance(code, str):
            raise ApiError(400, "code must be a string")
        language = body.get("language")
        if language is not None:
            check_language(language)
        env = check_env(body.get("env"))
        timeout = body.get("timeout_seconds")
        if timeout is None:
            timeout = DEFAULT_TIMEOUT
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise ApiError(400, "timeout_seconds must be a positive number")
        timeout = min(float(timeout), MAX_TIMEOUT)
        cid = body.get("context_id")
        if cid is not None:
            if not isinstance(cid, str):
                raise ApiError(400, "context_id must be a string")
            ctx = interp.get(cid)
            if language is not None and language != ctx.language:
                raise ApiError(400, f"context {cid!r} is {ctx.language}, not {language}")
        else:
            ctx = interp.default(language or "python")
        job = Job(code, env, timeout, ctx)
        try:
            fut = ctx.submit(ctx.execute, job)
        except RuntimeError:  # pool shut down: deleted meanwhile
            raise ApiError(404, "the context was deleted") from None
        finished = False
        self.chunked = self.request_version != "HTTP/1.0"  # else the close ends the body
        try:
            self.connection.settimeout(self.server.interp.args.write_timeout)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            if self.chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.close_connection = True
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.stream(job, fut)
            if self.chunked:
                self.wfile.write(b"0\r\n\r\n")
            finished = True
        except OSError as e:  # client gone, or stopped reading for write_timeout
            log.info("execute client lost (%s); aborting the cell", e.__class__.__name__)
        except Exception:
            log.exception("streaming an execution")
        finally:
            if not finished:  # never leave the worker blocked on a queue nobody reads
                job.cancelled.set()
                fut.cancel()
                self.close_connection = True
            self.connection.settimeout(self.timeout)

    def stream(self, job, fut):
        while True:
            try:
                event = job.events.get(timeout=POLL)
            except queue.Empty:
                if self.client_gone():
                    raise ConnectionAbortedError("client closed the connection")
                if not job.started.is_set() and time.monotonic() >= job.deadline and fut.cancel():
                    event = error_event("TimeoutError", f"execution timed out after {job.timeout:g} s "
                                                        "waiting for the context's previous execution")
                    self.write_event(event)
                    event = {"type": "end", "status": "timeout"}
                elif fut.done() and job.events.empty():  # worker ended without "end"
                    self.write_event(error_event("InternalError", "the execution ended unexpectedly"))
                    event = {"type": "end", "status": "error"}
                else:
                    continue
            self.write_event(event)
            if event["type"] == "end":
                return

    def write_event(self, event):
        # backslashreplace keeps lone surrogates as valid JSON escapes.
        line = (json.dumps(event, ensure_ascii=False, default=str) + "\n").encode("utf-8", "backslashreplace")
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line) if self.chunked else line)

    def client_gone(self):
        # Notice a disconnect even while the cell prints nothing: EOF shows as
        # readable with nothing to read.
        p = select.poll()
        p.register(self.connection, select.POLLIN | select.POLLERR | select.POLLHUP)
        if not p.poll(0):
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the host may open many connections at once


def sd_notify(address, message):
    if not address:
        return
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(address)
        s.sendall(message.encode())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:49999")
    p.add_argument("--cwd", default=os.environ.get("HOME") or os.getcwd())
    p.add_argument("--warm", default="numpy,pandas,matplotlib,matplotlib.pyplot",
                   help="modules the default context imports before READY=1")
    p.add_argument("--machine-id-file", default="/etc/machine-id")
    p.add_argument("--interrupt-grace", type=float, default=10.0,
                   help="seconds a kernel gets to stop after an interrupt before it is restarted")
    p.add_argument("--write-timeout", type=float, default=30.0,
                   help="seconds a stalled client may block a stream before the cell is aborted")
    args = p.parse_args()
    args.cwd = os.path.abspath(args.cwd)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")

    # Kernels must not inherit it: only this process talks to systemd.
    notify_socket = os.environ.pop("NOTIFY_SOCKET", None)
    host, _, port = args.listen.rpartition(":")
    interp = Interpreter(args)

    def terminate(signum, frame):
        interp.kill_all()
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)

    httpd = Server((host.strip("[]") or "127.0.0.1", int(port)), Handler)
    httpd.interp = interp
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log.info("listening on %s", args.listen)

    # /health answers 503 until the default context is warm, so the host
    # snapshots a VM whose kernel already paid for its imports.
    ctx = interp.default("python")
    modules = [m.strip() for m in args.warm.split(",") if m.strip()]
    try:
        if modules:
            ctx.submit(ctx.warm, modules).result(timeout=START_TIMEOUT + 180)
        else:
            ctx.submit(lambda: None).result(timeout=START_TIMEOUT + 30)
    except Exception as e:
        log.error("warm-up failed: %s", e)
    if ctx.dead:
        log.error("the default context did not start; exiting")
        interp.kill_all()
        os._exit(1)
    interp.ready = True
    try:
        sd_notify(notify_socket, "READY=1")
    except OSError as e:
        log.error("sd_notify: %s", e)
    log.info("ready")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
