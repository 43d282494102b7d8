#!/usr/bin/python3
"""HareBox code interpreter kernel: the state of one Python context.

The server (interpreter.py) starts one per Python context and talks to it over
the socket whose descriptor is this program's argument, one JSON object a line:

  server -> kernel  {"cell": N, "code": "...", "silent": false}      one at a time
  kernel -> server  {"cell": 0, "type": "ready"}                     once started
                    {"cell": N, "type": "start"}                     the cell began
                    {"cell": N, "type": "count", "count": C}         (not when silent)
                    {"cell": N, "type": "stdout"|"stderr", "text"}
                    {"cell": N, "type": "result", "main", "data", "metadata"}
                    {"cell": N, "type": "error", "name", "value", "traceback": [...]}
                    {"cell": N, "type": "done", "status": "ok"|"error"}

It is IPython's shell (magics, `!` commands, rich display through the
formatters, the inline Matplotlib backend) without ipykernel's messaging: a
cell costs a tenth of the CPU that ipykernel and jupyter_client spend on it,
which under software emulation is most of a cell's round trip. Output written
to descriptors 1 and 2 (subprocesses, C code) is captured as the cell's too.
SIGINT interrupts a running cell and is ignored between cells; a stdin read
gets end of file. Standard library plus Debian's IPython only.
"""

import codecs
import io
import json
import os
import select
import signal
import socket
import sys
import threading
import time

import interpreter_charts  # (beside this file, which Python put first on sys.path)

# A cell imports from its working directory first, as in Jupyter; not from
# this program's.
if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = ""

CHUNK = 64 << 10  # most characters in one stdout/stderr event
FLUSH_AFTER = 0.05  # how long printed text may wait before it is sent


class Channel:
    """The socket to the server. Events go from any thread, each one whole line."""

    def __init__(self, fd):
        os.set_inheritable(fd, False)  # a cell's subprocesses get no say in the protocol
        self.sock = socket.socket(fileno=fd)
        self.lock = threading.Lock()
        self.cell = 0
        self.executing = False  # a cell runs: SIGINT interrupts it
        self.main_sending = False  # the main thread is in send: SIGINT waits
        self.pending = False  # SIGINT came during such a send

    def send(self, ev):
        ev["cell"] = self.cell
        line = (json.dumps(ev, default=str) + "\n").encode()
        main = threading.current_thread() is threading.main_thread()
        with self.lock:
            if main:
                self.main_sending = True
            try:
                self.sock.sendall(line)
            finally:
                if main:
                    self.main_sending = False
        # An interrupt held back so that no line is cut in two lands now.
        if main and self.pending and self.executing:
            self.pending = False
            raise KeyboardInterrupt

    def on_sigint(self, signum, frame):
        if not self.executing:
            return  # between cells: the server repeats it until a cell runs
        if self.main_sending:
            self.pending = True
            return
        raise KeyboardInterrupt

    def requests(self):
        for line in self.sock.makefile("rb"):
            yield json.loads(line)


class Stream(io.TextIOBase):
    """sys.stdout or sys.stderr: text kept until CHUNK characters, FLUSH_AFTER
    seconds, a result or the cell's end, then sent as the cell's."""

    def __init__(self, channel, name, fd, wake):
        self.channel, self.name, self.fd, self.wake = channel, name, fd, wake
        self.parts, self.size = [], 0
        self.lock = threading.Lock()  # parts and size
        self.sending = threading.Lock()  # chunks leave in the order written

    encoding = "utf-8"
    errors = "strict"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self.fd  # captured as well (see capture)

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        with self.lock:
            if not self.parts:
                self.wake.set()
            self.parts.append(s)
            self.size += len(s)
            full = self.size >= CHUNK
        if full:
            self.flush()
        return len(s)

    def flush(self):
        with self.sending:
            with self.lock:
                text, self.parts, self.size = "".join(self.parts), [], 0
            for i in range(0, len(text), CHUNK):
                self.channel.send({"type": self.name, "text": text[i:i + CHUNK]})


class Capture:
    """What is written to stream's descriptor (by subprocesses, C code), read
    from a pipe put in its place and written to stream, in order with what
    Python printed."""

    def __init__(self, stream):
        self.stream = stream
        self.r, w = os.pipe()
        os.dup2(w, stream.fd)
        os.close(w)
        os.set_blocking(self.r, False)
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.lock = threading.Lock()  # held from a read to its write
        threading.Thread(target=self.pump, name=f"capture-{stream.name}", daemon=True).start()

    def pump(self):
        while True:
            select.select([self.r], [], [])
            with self.lock:
                if not self.drain():
                    return

    def drain(self):
        """Passes on what the pipe holds now; False once no writer is left."""
        while True:
            try:
                data = os.read(self.r, CHUNK)
            except BlockingIOError:
                return True
            if not data:
                return False
            text = self.decoder.decode(data)
            if text:
                self.stream.write(text)

    def settle(self):
        """Passes on, before the cell ends, what the cell wrote: it is in the
        pipe, or a pump read it and writes it before letting go of the lock."""
        with self.lock:
            self.drain()


def make_shell(channel, streams):
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    def flush():
        for s in streams:
            s.flush()

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            flush()
            channel.send({"type": "result", "main": False, "data": data, "metadata": metadata or {}})

        def clear_output(self, wait=False):
            pass  # nothing is drawn: the caller gets every result

    class Hook(DisplayHook):
        # The value of a cell's last expression, as ipykernel's execute_result.
        def start_displayhook(self):
            self.format = None

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.format = (format_dict, md_dict or {})

        def finish_displayhook(self):
            if self.format is not None:
                flush()
                data, metadata = self.format
                channel.send({"type": "result", "main": True, "data": data, "metadata": metadata})
            self.format = None

    class Shell(InteractiveShell):
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)

        def enable_gui(self, gui=None):
            if gui not in (None, "inline"):
                raise UsageError(f"no {gui} event loop in a sandbox: figures are inline only")

        def ask_exit(self):  # exit() or quit()
            self.exit_now = True

        def _showtraceback(self, etype, evalue, stb):
            flush()
            channel.send({"type": "error", "name": etype.__name__, "value": str(evalue), "traceback": list(stb)})

    c = Config()
    c.HistoryManager.enabled = False  # in memory only: no sqlite file shared by the kernels
    c.InteractiveShell.colors = "NoColor"
    shell = Shell.instance(config=c)
    try:
        interpreter_charts.install(shell)
    except Exception as e:  # figures still come back as images
        print(f"harebox: no charts: {e!r}", file=sys.__stderr__)
    return shell


def main():
    channel = Channel(int(sys.argv[1]))
    # Neither a cell's stdin read nor its output reaches the server's.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    wake = threading.Event()
    streams = [Stream(channel, "stdout", 1, wake), Stream(channel, "stderr", 2, wake)]
    captures = [Capture(s) for s in streams]
    sys.stdout, sys.stderr = streams

    def flusher():
        while True:
            wake.wait()
            time.sleep(FLUSH_AFTER)
            wake.clear()
            for s in streams:
                s.flush()

    threading.Thread(target=flusher, name="flusher", daemon=True).start()
    shell = make_shell(channel, streams)
    signal.signal(signal.SIGINT, channel.on_sigint)
    channel.send({"type": "ready"})

    for req in channel.requests():
        channel.cell = req["cell"]
        silent = bool(req.get("silent"))
        ok = False
        try:
            channel.send({"type": "start"})
            if not silent:
                channel.send({"type": "count", "count": shell.execution_count})
            channel.executing = True
            ok = shell.run_cell(req["code"], store_history=not silent, silent=silent).success
        except KeyboardInterrupt:
            # Outside the user's code (IPython reports it there itself).
            channel.executing = False
            channel.send({"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": []})
        finally:
            channel.executing = channel.pending = False
        for c in captures:
            c.settle()
        for s in streams:
            s.flush()
        channel.send({"type": "done", "status": "ok" if ok else "error"})
        if shell.exit_now:  # exit() or quit(): the context's kernel is gone
            os._exit(0)


if __name__ == "__main__":
    main()
