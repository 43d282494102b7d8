"""Pty: an interactive terminal in a sandbox (the API's openPty), over a
WebSocket.

The WebSocket (RFC 6455) is written here with the standard library, only
as much of it as the terminal needs: no extensions (so no compression),
no subprotocol. The upgrade request goes through the Client's own
connection (its TLS trust and certificate pin apply); once the server
switches protocols, Pty owns the socket. Every frame and message the
server sends is bounded (MAX_MESSAGE); one that breaks the protocol fails
the connection with a close frame and TransportError.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import select
import socket
import ssl
import struct
import threading
import time
from typing import Any, Mapping, Self, cast

from . import types as t
from .errors import HareBoxError, RequestTimeout, TransportError, error_from_body

__all__ = ["Pty", "MAX_MESSAGE"]

#: Bounds one message from the server (so one frame, and a fragmented
#: message's fragments together): what the terminal shows comes in far
#: smaller pieces.
MAX_MESSAGE = 16 << 20
#: The server closes the session (1009) on a message over 64 KiB from the
#: client, so write() sends typed bytes in pieces of at most this.
_WRITE_PIECE = 32 << 10
#: The terminal's rows and columns are 1 to this (the server's bound).
_MAX_DIM = 1000
#: How long the end of a session waits for the server's close frame.
_CLOSE_WAIT = 5.0
#: How long one receive may keep the socket from writers when the bytes
#: that made it readable are not yet a whole TLS record.
_RECV_SLICE = 0.5
#: How long one wait for the socket lasts before the Pty looks whether
#: another thread closed it.
_WAIT_SLICE = 1.0
_RECV_SIZE = 64 << 10
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

_CONTINUATION, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_OPCODES = (_CONTINUATION, _TEXT, _BINARY, _CLOSE, _PING, _PONG)

# Close codes.
_NORMAL, _PROTOCOL_ERROR, _BAD_DATA, _TOO_BIG, _NO_STATUS = 1000, 1002, 1007, 1009, 1005


# --- the upgrade ---------------------------------------------------------------


def new_key() -> str:
    """A Sec-WebSocket-Key: 16 random bytes, base64."""
    return base64.b64encode(os.urandom(16)).decode()


def accept_for(key: str) -> str:
    """The Sec-WebSocket-Accept a server must answer ``key`` with."""
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def upgrade_headers(key: str) -> dict[str, str]:
    """The headers that ask for a WebSocket (version 13, no extensions)."""
    return {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}


def check_upgrade(resp: http.client.HTTPResponse, key: str, what: str) -> None:
    """Raises TransportError unless ``resp`` switched to a WebSocket for
    ``key`` with nothing the client did not ask for."""

    def fail(why: str) -> TransportError:
        return TransportError(f"{what}: not a WebSocket: {why}", status=resp.status)

    if resp.status != 101:
        raise fail(f"the server answered {resp.status} {resp.reason}, not 101 Switching Protocols")
    if (resp.getheader("Upgrade") or "").strip().lower() != "websocket":
        raise fail(f"Upgrade is {resp.getheader('Upgrade')!r}, not websocket")
    tokens = [token.strip().lower() for token in (resp.getheader("Connection") or "").split(",")]
    if "upgrade" not in tokens:
        raise fail(f"Connection is {resp.getheader('Connection')!r}, without upgrade")
    if (resp.getheader("Sec-WebSocket-Accept") or "").strip() != accept_for(key):
        raise fail("its Sec-WebSocket-Accept does not answer the request's Sec-WebSocket-Key")
    for header in ("Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol"):
        if resp.getheader(header):
            raise fail(f"it chose {header} {resp.getheader(header)!r}, which the client did not offer")


class _SocketReader:
    """Reads a socket through a buffer of its own, for http.client to read
    the upgrade's reply with (readline, read, readinto, flush and close
    are what HTTPResponse uses): the bytes the server sent after the reply's head
    stay in ``buffer``, for the WebSocket. close() leaves the socket open."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.buffer = bytearray()

    def _fill(self) -> bool:
        chunk = self._sock.recv(_RECV_SIZE)
        self.buffer += chunk
        return bool(chunk)

    def _take(self, n: int) -> bytes:
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def readline(self, limit: int = -1) -> bytes:
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                n = end + 1
                break
            if 0 <= limit <= len(self.buffer) or not self._fill():
                n = len(self.buffer)
                break
        return self._take(n if limit < 0 else min(n, limit))

    def read(self, amt: int | None = None) -> bytes:
        if amt is None or amt < 0:
            while self._fill():
                pass
            return self._take(len(self.buffer))
        while len(self.buffer) < amt and self._fill():
            pass
        return self._take(amt)

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class UpgradeResponse(http.client.HTTPResponse):
    """The reply to an upgrade request, read through a _SocketReader
    (``reader``), so that nothing after its head is lost in http.client's
    buffer."""

    def __init__(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None, url: str | None = None) -> None:
        super().__init__(sock, debuglevel, method, url)
        self.fp.close()  # http.client's buffered reader: never read
        self.reader = _SocketReader(sock)
        self.fp = cast(Any, self.reader)


# --- frames ----------------------------------------------------------------------


def _mask(key: bytes, data: bytes) -> bytes:
    n = len(data)
    if not n:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(n, "little")


def _frame(opcode: int, payload: bytes) -> bytes:
    """One final frame from the client: masked with a random key, as every
    client frame must be."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    key = os.urandom(4)
    return head + key + _mask(key, payload)


def _close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload; empty for a code that may not be sent
    (1005 "no status", 1006, 1015, and codes outside 1000 to 4999)."""
    if not 1000 <= code <= 4999 or code in (1004, 1005, 1006, 1015):
        return b""
    return struct.pack("!H", code) + reason.encode()[:123]


class _LocalClose(Exception):
    """close() ran (in another thread) while a read waited."""


class Pty:
    """An interactive terminal in a sandbox, over a WebSocket: what
    Client.open_pty and Sandbox.pty return.

    ``write(data)`` types bytes into the terminal; ``read(timeout)``
    returns what the terminal shows next, as it comes (bytes; ``b""``
    when nothing came within ``timeout``), then None once the session has
    ended. At the end ``result`` is the command's ExecResult (its
    ``exit_code``; what it wrote went to the terminal, not to the
    result's stdout and stderr), or the server's
    error message raises its HareBoxError from read (and is kept in
    ``error``). ``resize(rows, cols)``, ``signal(n)`` and ``eof()`` send
    the protocol's controls; ``close()`` (or leaving a ``with`` block)
    ends the session, and the command with it.

    Keep reading: the server cuts off a client that does not read what
    the terminal shows for 30 s. One thread may read while another
    writes, resizes, signals or closes; reads take turns.
    """

    def __init__(self, sock: socket.socket, buffered: bytes, *, timeout: float, what: str) -> None:
        self._sock = sock
        self._buf = bytearray(buffered)
        self._timeout = timeout
        self._what = what
        self._io = threading.Lock()  # every use of the socket
        self._reading = threading.Lock()  # one read at a time
        self._fragments: bytearray | None = None
        self._fragmented_opcode = 0
        self._closed = False  # the socket is closed
        self._ended = False  # nothing more to read
        self._final = False  # the exit or error message came
        self._raise: HareBoxError | None = None  # for the next read
        #: The command's ExecResult, once the session has ended with it.
        self.result: t.ExecResult | None = None
        #: The error the session ended with (raised once by read), if any.
        self.error: HareBoxError | None = None

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return f"<Pty {self._what} {state}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An abandoned Pty: close the socket quietly.
        if not getattr(self, "_closed", True):
            self._shutdown()

    @property
    def ended(self) -> bool:
        """Whether the session is over (read returns None)."""
        return self._ended

    # --- to the terminal ---------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview | str) -> None:
        """Types ``data`` into the terminal (a str as UTF-8), in messages
        of at most 32 KiB. Raises TransportError once the session is
        closed, RequestTimeout if a message cannot be sent within the
        timeout of open_pty (the session is then closed)."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        for start in range(0, len(payload), _WRITE_PIECE):
            self._send(_BINARY, payload[start : start + _WRITE_PIECE])

    def resize(self, rows: int, cols: int) -> None:
        """Sets the terminal's size: ``rows`` and ``cols`` 1 to 1000 (else
        ValueError)."""
        for name, value in (("rows", rows), ("cols", cols)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_DIM:
                raise ValueError(f"{name} must be an int from 1 to {_MAX_DIM}, not {value!r}")
        self._control({"type": "resize", "rows": rows, "cols": cols})

    def signal(self, signal: int) -> None:
        """Sends signal number ``signal`` (1 to 64, else ValueError) to the
        terminal's command."""
        if isinstance(signal, bool) or not isinstance(signal, int) or not 1 <= signal <= 64:
            raise ValueError(f"signal must be an int from 1 to 64, not {signal!r}")
        self._control({"type": "signal", "signal": signal})

    def eof(self) -> None:
        """Ends the terminal's input (the guest types ^D into it)."""
        self._control({"type": "eof"})

    def close(self) -> None:
        """Ends the session: sends a close frame (the server then ends the
        command, unless it has ended) and closes the connection. A read
        waiting in another thread returns None. Closing twice is fine."""
        with self._io:
            if self._closed:
                return
            try:
                self._sock.settimeout(min(self._timeout, _CLOSE_WAIT))
                self._sock.sendall(_frame(_CLOSE, _close_payload(_NORMAL)))
            except OSError:
                pass  # the server went first
            self._shutdown()

    def _control(self, message: Mapping[str, Any]) -> None:
        self._send(_TEXT, json.dumps(message, separators=(",", ":")).encode())

    def _send(self, opcode: int, payload: bytes) -> None:
        frame = _frame(opcode, payload)
        with self._io:
            if self._closed:
                raise TransportError(f"{self._what}: the session is closed")
            try:
                self._sock.settimeout(self._timeout)
                self._sock.sendall(frame)
            except TimeoutError:
                self._shutdown()  # part of a frame may have gone
                raise RequestTimeout(f"{self._what}: could not send within {self._timeout:g} s (the server does not read)") from None
            except OSError as e:
                self._shutdown()
                raise TransportError(f"{self._what}: {type(e).__name__}: {e}") from None

    def _shutdown(self) -> None:
        """Closes the socket; a read waiting on it wakes up."""
        self._closed = True
        self._ended = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    # --- from the terminal -----------------------------------------------------

    def read(self, timeout: float | None = None) -> bytes | None:
        """What the terminal shows next: the bytes of the next output
        message. Waits at most ``timeout`` seconds (None: as long as it
        takes) and returns ``b""`` if nothing came. Returns None once the
        session has ended: the exit message came (``result`` has the
        ExecResult) or close() was called. An error message from the
        server raises its HareBoxError (once; then None); a connection
        that breaks, a server that closes the session before its exit
        message or that breaks the protocol raises TransportError (once;
        the connection is then closed)."""
        with self._reading:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while True:
                    if self._ended:
                        err, self._raise = self._raise, None
                        if err is not None:
                            raise err
                        return None
                    message = self._message(deadline)
                    if message is None:
                        if self._ended:
                            continue  # a close frame came
                        return b""
                    opcode, payload = message
                    if opcode == _BINARY:
                        if payload:
                            return payload
                    elif opcode == _TEXT:
                        self._text(payload)
            except _LocalClose:
                return None

    def _text(self, payload: bytes) -> None:
        """A text message: the exit or error that ends the session; others
        (for newer clients) are skipped."""
        try:
            message = json.loads(payload)
        except ValueError:
            raise self._fail(_PROTOCOL_ERROR, "a text message is not JSON") from None
        if not isinstance(message, dict):
            raise self._fail(_PROTOCOL_ERROR, "a text message is not a JSON object")
        kind = message.get("type")
        if kind == "exit":
            result = message.get("result")
            if not isinstance(result, dict):
                raise self._fail(_PROTOCOL_ERROR, "the exit message has no result object")
            self.result = cast(t.ExecResult, result)
        elif kind == "error":
            self.error = self._raise = error_from_body(0, message)
        else:
            return
        self._final = True
        self._finish()

    def _finish(self) -> None:
        """After the last message: waits a little for the server's close
        frame (answered on the way) and closes the connection."""
        deadline = time.monotonic() + _CLOSE_WAIT
        try:
            while not self._ended and self._message(deadline) is not None:
                pass
        except (HareBoxError, _LocalClose):
            pass  # the session has its end already
        finally:
            with self._io:
                if not self._closed:
                    self._shutdown()

    def _message(self, deadline: float | None) -> tuple[int, bytes] | None:
        """The next data message, (opcode, payload), its fragments joined;
        None at the deadline or when a close frame ended the session.
        Pings are answered on the way, pongs skipped."""
        while True:
            frame = self._frame(deadline)
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode == _PING:
                if self._closed:
                    raise _LocalClose
                self._send(_PONG, payload)
                continue
            if opcode == _PONG:
                continue
            if opcode == _CLOSE:
                self._closed_by_server(payload)
                return None
            if opcode == _CONTINUATION:
                if self._fragments is None:
                    raise self._fail(_PROTOCOL_ERROR, "a continuation frame without a message to continue")
                self._fragments += payload
                if not fin:
                    continue
                opcode, payload = self._fragmented_opcode, bytes(self._fragments)
                self._fragments = None
            elif self._fragments is not None:
                raise self._fail(_PROTOCOL_ERROR, "a new message before the fragmented one ended")
            elif not fin:
                self._fragments, self._fragmented_opcode = bytearray(payload), opcode
                continue
            if opcode == _TEXT:
                try:
                    payload.decode("utf-8")
                except UnicodeDecodeError:
                    raise self._fail(_BAD_DATA, "a text message is not UTF-8") from None
            return opcode, payload

    def _frame(self, deadline: float | None) -> tuple[bool, int, bytes] | None:
        """The next whole frame, (fin, opcode, unmasked payload); None at
        the deadline (a partial frame stays buffered)."""
        while True:
            frame = self._parse()
            if frame is not None:
                return frame
            if not self._receive(deadline):
                return None

    def _parse(self) -> tuple[bool, int, bytes] | None:
        """Takes one frame from the buffer, if it holds a whole one; its
        length is checked against the bound before its payload is
        waited for."""
        buf = self._buf
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        fin, opcode = bool(b0 & 0x80), b0 & 0x0F
        if b0 & 0x70:
            raise self._fail(_PROTOCOL_ERROR, "a frame with reserved bits set (no extension was agreed)")
        if opcode not in _OPCODES:
            raise self._fail(_PROTOCOL_ERROR, f"a frame with the unknown opcode {opcode:#x}")
        if b1 & 0x80:
            raise self._fail(_PROTOCOL_ERROR, "a masked frame from the server")
        n, head = b1 & 0x7F, 2
        if opcode >= _CLOSE and (not fin or n > 125):
            raise self._fail(_PROTOCOL_ERROR, "a control frame fragmented or over 125 bytes")
        if n == 126:
            if len(buf) < 4:
                return None
            n, head = struct.unpack_from("!H", buf, 2)[0], 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, head = struct.unpack_from("!Q", buf, 2)[0], 10
        before = len(self._fragments) if opcode == _CONTINUATION and self._fragments is not None else 0
        if before + n > MAX_MESSAGE:
            raise self._fail(_TOO_BIG, f"a message of more than {MAX_MESSAGE} bytes")
        if len(buf) < head + n:
            return None
        payload = bytes(buf[head : head + n])
        del buf[: head + n]
        return fin, opcode, payload

    def _receive(self, deadline: float | None) -> bool:
        """Adds what the socket has to the buffer, waiting for it until the
        deadline (False then). Raises _LocalClose if close() ran."""
        while True:
            if self._closed:
                raise _LocalClose
            pending = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0
            if not pending:
                wait = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, max(0.0, deadline - time.monotonic()))
                try:
                    ready = _readable(self._sock, wait)
                except (OSError, ValueError):
                    if self._closed:
                        raise _LocalClose from None
                    raise
                if not ready:
                    if deadline is not None and time.monotonic() >= deadline:
                        return False
                    continue
            with self._io:
                if self._closed:
                    raise _LocalClose
                try:
                    self._sock.settimeout(_RECV_SLICE)
                    chunk = self._sock.recv(_RECV_SIZE)
                except TimeoutError:
                    continue  # not yet a whole TLS record: wait again
                except OSError as e:
                    self._shutdown()
                    raise TransportError(f"{self._what}: {type(e).__name__}: {e}") from None
                if not chunk:
                    self._shutdown()
                    raise TransportError(f"{self._what}: the connection ended without a close frame")
            self._buf += chunk
            return True

    def _closed_by_server(self, payload: bytes) -> None:
        """A close frame: answers it (with its code) and closes the
        connection. Before the exit message it is an error, for read."""
        if len(payload) == 1:
            raise self._fail(_PROTOCOL_ERROR, "a close frame of one byte")
        code = struct.unpack_from("!H", payload)[0] if payload else _NO_STATUS
        reason = payload[2:].decode("utf-8", errors="replace")
        with self._io:
            if not self._closed:
                try:
                    self._sock.settimeout(min(self._timeout, _CLOSE_WAIT))
                    self._sock.sendall(_frame(_CLOSE, _close_payload(code)))
                except OSError:
                    pass
                self._shutdown()
        if not self._final:
            why = f"{code}: {reason}" if reason else str(code)
            self._raise = TransportError(f"{self._what}: the server closed the session ({why}) before it ended")

    def _fail(self, code: int, why: str) -> TransportError:
        """Fails the connection: a close frame with ``code`` (if it can
        go), the socket closed; returns the error to raise."""
        with self._io:
            if not self._closed:
                try:
                    self._sock.settimeout(min(self._timeout, _CLOSE_WAIT))
                    self._sock.sendall(_frame(_CLOSE, _close_payload(code, why)))
                except OSError:
                    pass
                self._shutdown()
        return TransportError(f"{self._what}: the server broke the WebSocket protocol: {why}")


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether the socket has something to read within ``timeout``
    seconds (poll where there is one: select cannot take a descriptor
    over FD_SETSIZE)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    return bool(select.select([sock], [], [], timeout)[0])
