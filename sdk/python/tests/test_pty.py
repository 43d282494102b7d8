"""The terminal (open_pty, Sandbox.pty) against a small WebSocket server
written here with the standard library: the upgrade, frames both ways,
fragments, pings, the end of a session, what a server must not send, the
errors before the upgrade, and TLS trust. No HareBox server is needed."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import ssl
import struct
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import pytest
from test_tls import OPENSSL, _make_ca, _make_leaf, _server_context

import harebox
from harebox.pty import MAX_MESSAGE

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
KEY = "hbk_pty_test"
EXIT = {"exit_code": 4, "stdout": "", "stderr": "", "duration_ms": 12, "timed_out": False,
        "stdout_truncated": False, "stderr_truncated": False}


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True) -> bytes:
    """A server's frame: never masked."""
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", first, n) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", first, 126, n) + payload
    return struct.pack("!BBQ", first, 127, n) + payload


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack("!H", code) + reason


class Frame(NamedTuple):
    fin: bool
    opcode: int
    payload: bytes  # unmasked
    key: bytes  # the masking key


class Peer:
    """The server's side of one connection, for a test's script."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.request_line = ""
        self.headers: dict[str, str] = {}
        self.frames: list[Frame] = []  # every frame the client sent

    def _recv(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise EOFError("the client closed the connection")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._recv()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read_request(self) -> None:
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, rest = bytes(self.buf).partition(b"\r\n\r\n")
        self.buf = bytearray(rest)
        lines = head.decode().split("\r\n")
        self.request_line = lines[0]
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def accept(self, *, then: bytes = b"", accept: str | None = None, extra: str = "") -> None:
        """Switches protocols; ``then`` goes in the same write."""
        if accept is None:
            accept = base64.b64encode(hashlib.sha1(self.headers["sec-websocket-key"].encode() + GUID).digest()).decode()
        head = ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\n{extra}\r\n")
        self.sock.sendall(head.encode() + then)

    def reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        head = (f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n")
        self.sock.sendall(head.encode() + data)

    def send(self, opcode: int, payload: bytes = b"", *, fin: bool = True) -> None:
        self.sock.sendall(frame(opcode, payload, fin=fin))

    def frame(self) -> Frame:
        """The client's next frame, checked to be masked and unmasked."""
        b0, b1 = self._take(2)
        assert b1 & 0x80, "a client frame without a mask"
        assert not b0 & 0x70, "reserved bits set"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._take(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._take(8))[0]
        key = self._take(4)
        masked = self._take(n)
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(masked)) if n < 4096 else _unmask(key, masked)
        got = Frame(bool(b0 & 0x80), b0 & 0x0F, payload, key)
        self.frames.append(got)
        return got

    def control(self) -> Any:
        """The client's next frame, a final text frame of JSON."""
        got = self.frame()
        assert (got.fin, got.opcode) == (True, TEXT), got
        return json.loads(got.payload)

    def expect_close(self, code: int) -> bytes:
        """The client's close frame (with ``code``), then the end of the
        connection; returns the close reason."""
        got = self.frame()
        assert (got.fin, got.opcode, got.payload[:2]) == (True, CLOSE, struct.pack("!H", code)), got
        self.expect_eof()
        return got.payload[2:]

    def expect_eof(self) -> None:
        try:
            self._recv()
        except (EOFError, ConnectionResetError):
            return
        raise AssertionError(f"more from the client: {bytes(self.buf)!r}")


def _unmask(key: bytes, data: bytes) -> bytes:
    stream = (key * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


Script = Callable[[Peer], None]


class Server:
    """Serves one connection in a thread with ``script`` (after reading
    the request's head), over TLS when ``context`` is set; records what
    the script raised."""

    def __init__(self, script: Script, context: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.port = self.listener.getsockname()[1]
        self.peer: Peer | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sock: socket.socket | None = None
        try:
            sock, _ = self.listener.accept()
            sock.settimeout(10)
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_side=True)
            self.peer = Peer(sock)
            self.peer.read_request()
            self.script(self.peer)
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread
            self.error = e
        finally:
            if sock is not None:
                sock.close()

    def stop(self) -> None:
        self.thread.join(20)
        self.listener.close()
        assert not self.thread.is_alive(), "the server's script did not end"

    def client(self, scheme: str = "http", host: str = "127.0.0.1", **kwargs: Any) -> harebox.Client:
        return harebox.Client(url=f"{scheme}://{host}:{self.port}", api_key=KEY, timeout=10, **kwargs)


@contextmanager
def serve(script: Script, context: ssl.SSLContext | None = None, *, check: bool = True) -> Iterator[Server]:
    """Runs a Server for the block; at its end, raises what the script
    raised (unless ``check`` is False: the test looks at it)."""
    server = Server(script, context)
    try:
        yield server
    except BaseException:
        server.stop()
        raise
    server.stop()
    if check and server.error is not None:
        raise server.error


def read_until_none(pty: harebox.Pty) -> bytes:
    shown = b""
    while (chunk := pty.read(timeout=10)) is not None:
        assert chunk, "nothing within the timeout"
        shown += chunk
    return shown


# --- a session ---------------------------------------------------------------------


def conversation(peer: Peer) -> None:
    # The first output comes in the same write as the 101.
    peer.accept(then=frame(BINARY, b"prompt$ "))
    got = peer.frame()
    assert (got.fin, got.opcode, got.payload) == (True, BINARY, b"hi\n")
    peer.send(BINARY, b"hi\r\n")
    typed = b""
    while len(typed) < 100_000:
        got = peer.frame()
        assert got.fin and got.opcode == BINARY and len(got.payload) <= 64 << 10
        typed += got.payload
    assert typed == bytes(range(100)) * 1000
    peer.send(BINARY, b"got %d" % len(typed))
    assert peer.control() == {"type": "resize", "rows": 40, "cols": 100}
    peer.send(BINARY, b"resized")
    assert peer.control() == {"type": "signal", "signal": 2}
    peer.send(BINARY, b"signalled")
    assert peer.control() == {"type": "eof"}
    # A fragmented message with a ping in its middle.
    peer.send(BINARY, b"frag", fin=False)
    peer.send(PING, b"still there?")
    peer.send(CONT, b"men", fin=False)
    peer.send(CONT, b"ted")
    got = peer.frame()
    assert (got.fin, got.opcode, got.payload) == (True, PONG, b"still there?")
    peer.send(PONG, b"unasked")  # skipped
    peer.send(BINARY, b"")  # skipped
    peer.send(TEXT, b'{"type": "news", "of": "a newer server"}')  # skipped
    last = json.dumps({"type": "exit", "result": EXIT}).encode()
    peer.send(TEXT, last[:10], fin=False)
    peer.send(CONT, last[10:])
    peer.send(CLOSE, close_payload(1000))
    peer.expect_close(1000)


def test_a_session_types_reads_controls_and_ends_with_the_result() -> None:
    with serve(conversation) as server:
        hb = server.client()
        with hb.open_pty("sbx_1", query={"rows": 30, "cols": 90, "cmd": "echo hi; exit 4", "user": None}) as pty:
            assert "terminal of sbx_1" in repr(pty) and KEY not in repr(pty)
            assert pty.read(timeout=5) == b"prompt$ "
            assert pty.read(timeout=0.1) == b""  # nothing more yet
            pty.write(b"hi\n")
            assert pty.read(timeout=5) == b"hi\r\n"
            pty.write(memoryview(bytes(range(100)) * 1000))
            assert pty.read(timeout=5) == b"got 100000"
            pty.resize(40, 100)
            assert pty.read(timeout=5) == b"resized"
            pty.signal(2)
            assert pty.read(timeout=5) == b"signalled"
            pty.eof()
            assert pty.read(timeout=5) == b"fragmented"
            assert (pty.result, pty.ended) == (None, False)
            assert pty.read(timeout=5) is None
            assert (pty.result, pty.error, pty.ended) == (EXIT, None, True)
            assert pty.read() is None
            with pytest.raises(harebox.TransportError, match="closed"):
                pty.write(b"late")
    peer = server.peer
    assert peer is not None
    assert peer.request_line == "GET /v1/sandboxes/sbx_1/pty?rows=30&cols=90&cmd=echo+hi%3B+exit+4 HTTP/1.1"
    h = peer.headers
    assert h["authorization"] == "Bearer " + KEY
    assert (h["upgrade"], h["connection"], h["sec-websocket-version"]) == ("websocket", "Upgrade", "13")
    assert len(base64.b64decode(h["sec-websocket-key"], validate=True)) == 16
    assert "sec-websocket-extensions" not in h and "sec-websocket-protocol" not in h and "origin" not in h
    # Every frame was masked (Peer.frame checks the bit) with a fresh key.
    keys = [f.key for f in peer.frames]
    assert len(keys) > 8 and len(set(keys)) >= len(keys) - 1


def test_each_session_has_its_own_key() -> None:
    keys = []
    for _ in range(2):
        def script(peer: Peer) -> None:
            keys.append(peer.headers["sec-websocket-key"])
            peer.accept()
            peer.expect_close(1000)
        with serve(script) as server:
            server.client().open_pty("sbx_1").close()
    assert keys[0] != keys[1]


def test_sandbox_pty_sends_its_options() -> None:
    def script(peer: Peer) -> None:
        peer.accept()
        peer.send(BINARY, b"top\r\n")
        peer.send(TEXT, json.dumps({"type": "exit", "result": EXIT}).encode())
        peer.send(CLOSE, close_payload(1000))
        peer.expect_close(1000)

    with serve(script) as server:
        box = harebox.Sandbox(server.client(), {"id": "sbx_2", "state": "running"})  # type: ignore[typeddict-item]
        with box.pty("top", rows=50, cols=20, user="root", cwd="/tmp", timeout=60) as pty:
            assert read_until_none(pty) == b"top\r\n"
            assert pty.result == EXIT
    assert server.peer is not None
    assert server.peer.request_line == (
        "GET /v1/sandboxes/sbx_2/pty?cmd=top&rows=50&cols=20&user=root&cwd=%2Ftmp&timeout_seconds=60 HTTP/1.1")


def test_the_controls_are_checked_before_they_go() -> None:
    def script(peer: Peer) -> None:
        peer.accept()
        peer.expect_close(1000)

    with serve(script) as server:
        with server.client().open_pty("sbx_1") as pty:
            for rows, cols in ((0, 80), (24, 1001), (True, 80), (24.0, 80)):
                with pytest.raises(ValueError):
                    pty.resize(rows, cols)  # type: ignore[arg-type]
            for n in (0, 65, "9"):
                with pytest.raises(ValueError):
                    pty.signal(n)  # type: ignore[arg-type]
            pty.write(b"")  # sends nothing
    assert server.peer is not None and [f.opcode for f in server.peer.frames] == [CLOSE]


# --- how a session ends ----------------------------------------------------------------


def test_an_error_message_raises_its_error_once() -> None:
    def script(peer: Peer) -> None:
        peer.accept()
        peer.send(BINARY, b"partial output")
        peer.send(TEXT, json.dumps({"type": "error", "error": {"code": "unavailable", "message": "the agent went away"}}).encode())
        peer.send(CLOSE, close_payload(1000))
        peer.expect_close(1000)

    with serve(script) as server:
        with server.client().open_pty("sbx_1") as pty:
            assert pty.read(timeout=5) == b"partial output"
            with pytest.raises(harebox.Unavailable) as err:
                pty.read(timeout=5)
            assert (err.value.status, err.value.code, err.value.message) == (503, "unavailable", "the agent went away")
            assert pty.error is err.value and pty.result is None and pty.ended
            assert pty.read() is None


def test_a_close_before_the_exit_raises() -> None:
    def script(peer: Peer) -> None:
        peer.accept()
        peer.send(CLOSE, close_payload(1008, b"session ended"))
        peer.expect_close(1008)  # echoed

    with serve(script) as server:
        with server.client().open_pty("sbx_1") as pty:
            with pytest.raises(harebox.TransportError, match=r"closed the session \(1008: session ended\) before it ended"):
                pty.read(timeout=5)
            assert pty.read() is None and pty.result is None


def test_a_connection_that_ends_without_a_close_raises() -> None:
    def script(peer: Peer) -> None:
        peer.accept()
        peer.send(BINARY, b"bye")
        peer.sock.shutdown(socket.SHUT_RDWR)

    with serve(script) as server:
        with server.client().open_pty("sbx_1") as pty:
            assert pty.read(timeout=5) == b"bye"
            with pytest.raises(harebox.TransportError, match="without a close frame"):
                pty.read(timeout=5)
            assert pty.read() is None


def test_close_sends_a_close_frame_and_wakes_a_waiting_read() -> None:
    def script(peer: Peer) -> None:
        peer.accept()
        peer.expect_close(1000)

    with serve(script) as server:
        pty = server.client().open_pty("sbx_1")
        got: list[bytes | None] = []
        reader = threading.Thread(target=lambda: got.append(pty.read()))
        reader.start()
        time.sleep(0.3)
        started = time.monotonic()
        pty.close()
        reader.join(5)
        assert not reader.is_alive() and got == [None]
        assert time.monotonic() - started < 3
        pty.close()  # twice is fine
        assert pty.read() is None and pty.ended
        with pytest.raises(harebox.TransportError, match="closed"):
            pty.eof()


# --- what the server must not send ----------------------------------------------------


def _oversized_fragments(peer: Peer) -> None:
    peer.send(BINARY, b"\0" * (9 << 20), fin=False)
    peer.sock.sendall(struct.pack("!BBQ", CONT, 127, 8 << 20))  # 17 MiB in all: its payload never comes


BAD_FRAMES: dict[str, tuple[Callable[[Peer], None], int, str]] = {
    "a frame over the bound": (lambda p: p.sock.sendall(struct.pack("!BBQ", 0x82, 127, MAX_MESSAGE + 1)), 1009,
                               f"more than {MAX_MESSAGE} bytes"),
    "a 64-bit length with its top bit": (lambda p: p.sock.sendall(struct.pack("!BBQ", 0x82, 127, 1 << 63)), 1009, "more than"),
    "fragments over the bound": (_oversized_fragments, 1009, "more than"),
    "reserved bits": (lambda p: p.sock.sendall(b"\xc2\x01x"), 1002, "reserved bits"),
    "an unknown opcode": (lambda p: p.sock.sendall(b"\x83\x01x"), 1002, "unknown opcode 0x3"),
    "a masked frame": (lambda p: p.sock.sendall(b"\x82\x81abcdx"), 1002, "masked frame"),
    "a fragmented ping": (lambda p: p.send(PING, b"x", fin=False), 1002, "control frame"),
    "a long ping": (lambda p: p.sock.sendall(struct.pack("!BBH", 0x89, 126, 126) + b"x" * 126), 1002, "control frame"),
    "a continuation out of nowhere": (lambda p: p.send(CONT, b"x"), 1002, "continuation frame without"),
    "a new message inside a fragmented one": (lambda p: (p.send(BINARY, b"a", fin=False), p.send(BINARY, b"b")), 1002,
                                              "before the fragmented one ended"),
    "text that is not UTF-8": (lambda p: p.send(TEXT, b"\xff"), 1007, "not UTF-8"),
    "text that is not JSON": (lambda p: p.send(TEXT, b"hello"), 1002, "not JSON"),
    "an exit without a result": (lambda p: p.send(TEXT, b'{"type": "exit"}'), 1002, "no result"),
    "a close of one byte": (lambda p: p.send(CLOSE, b"\x03"), 1002, "one byte"),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_a_server_that_breaks_the_protocol_is_refused(case: str) -> None:
    send, code, why = BAD_FRAMES[case]

    def script(peer: Peer) -> None:
        peer.accept()
        send(peer)
        peer.expect_close(code)

    with serve(script) as server:
        with server.client().open_pty("sbx_1") as pty:
            with pytest.raises(harebox.TransportError, match="broke the WebSocket protocol") as err:
                pty.read(timeout=5)
            assert why in str(err.value)
            assert pty.read() is None and pty.ended
            with pytest.raises(harebox.TransportError):
                pty.write(b"x")


# --- the upgrade ------------------------------------------------------------------


UPGRADES: dict[str, tuple[Callable[[Peer], None], str]] = {
    "a wrong Sec-WebSocket-Accept": (lambda p: p.accept(accept="dGhlIHNhbXBsZSBub25jZQ=="), "Sec-WebSocket-Accept"),
    "no Sec-WebSocket-Accept": (lambda p: p.sock.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"), "Sec-WebSocket-Accept"),
    "an extension": (lambda p: p.accept(extra="Sec-WebSocket-Extensions: permessage-deflate\r\n"), "did not offer"),
    "another upgrade": (lambda p: p.sock.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"), "Upgrade is 'h2c'"),
    "a 200": (lambda p: p.reply(200, {}), "answered 200"),
}


@pytest.mark.parametrize("case", list(UPGRADES))
def test_a_bad_upgrade_is_refused(case: str) -> None:
    answer, why = UPGRADES[case]

    def script(peer: Peer) -> None:
        answer(peer)
        peer.expect_eof()

    with serve(script) as server:
        with pytest.raises(harebox.TransportError, match="not a WebSocket") as err:
            server.client().open_pty("sbx_1")
        assert why in str(err.value) and KEY not in str(err.value)


@pytest.mark.parametrize(
    ("status", "error", "cls"),
    [
        (404, {"code": "not_found", "message": "no sandbox sbx_9"}, harebox.NotFound),
        (403, {"code": "forbidden", "message": "this API key may not openPty"}, harebox.Forbidden),
        (400, {"code": "invalid", "message": "must be 1 to 1000", "field": "rows"}, harebox.InvalidRequest),
        (426, {"code": "invalid", "message": "this is a WebSocket endpoint: ask for Upgrade: websocket"}, harebox.InvalidRequest),
    ],
)
def test_errors_before_the_upgrade_raise_from_open_pty(status: int, error: dict[str, str], cls: type) -> None:
    def script(peer: Peer) -> None:
        peer.reply(status, {"error": error})

    with serve(script) as server:
        with pytest.raises(cls) as err:
            server.client().open_pty("sbx_9", query={"rows": 0})
    assert type(err.value) is cls
    assert (err.value.status, err.value.message, err.value.field) == (status, error["message"], error.get("field"))


def test_a_missing_answer_times_out() -> None:
    def script(peer: Peer) -> None:
        peer.expect_eof()

    with serve(script) as server:
        hb = server.client()
        with pytest.raises(harebox.RequestTimeout):
            hb.open_pty("sbx_1", timeout=0.5)


def test_the_path_parameter_is_escaped() -> None:
    def script(peer: Peer) -> None:
        peer.reply(404, {"error": {"code": "not_found", "message": "no"}})

    with serve(script) as server:
        with pytest.raises(harebox.NotFound):
            server.client().open_pty("../info")
    assert server.peer is not None and server.peer.request_line == "GET /v1/sandboxes/..%2Finfo/pty HTTP/1.1"
    with pytest.raises(ValueError):
        server.client().open_pty("")


# --- TLS ----------------------------------------------------------------------------


class Certs(NamedTuple):
    ca: Path
    cert: Path
    key: Path
    fingerprint: str


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if OPENSSL is None:
        pytest.skip("these tests make certificates with openssl")
    d = tmp_path_factory.mktemp("pty-pki")
    _make_ca(d, "ca")
    fingerprint = _make_leaf(d, "server", "ca", "DNS:localhost,IP:127.0.0.1")
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", fingerprint)


def echo_once(peer: Peer) -> None:
    peer.accept()
    got = peer.frame()
    peer.send(BINARY, got.payload)
    peer.send(TEXT, json.dumps({"type": "exit", "result": EXIT}).encode())
    peer.send(CLOSE, close_payload(1000))
    peer.expect_close(1000)


@pytest.mark.parametrize("trust", ["pin", "ca file"])
def test_a_session_over_tls_trusts_as_the_client_does(certs: Certs, trust: str) -> None:
    ca = "sha256:" + certs.fingerprint if trust == "pin" else str(certs.ca)
    with serve(echo_once, _server_context(certs.cert, certs.key)) as server:
        with server.client("https", "localhost", ca=ca).open_pty("sbx_1") as pty:
            pty.write(b"over tls\n")
            assert read_until_none(pty) == b"over tls\n"
            assert pty.result == EXIT


def test_a_wrong_pin_fails_before_the_upgrade_is_sent(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAREBOX_CA", "sha256:" + "ab" * 32)
    with serve(echo_once, _server_context(certs.cert, certs.key), check=False) as server:
        with pytest.raises(harebox.TransportError, match="did not match the pinned fingerprint") as err:
            server.client("https").open_pty("sbx_1")
        assert type(err.value) is harebox.TransportError and KEY not in str(err.value)
    # The TLS handshake happened, then nothing: no request, no key.
    # (or the server's side of the handshake saw the client go first).
    assert server.peer is None or (server.peer.request_line == "" and not server.peer.buf)
    assert isinstance(server.error, (EOFError, OSError))


def test_another_ca_is_not_trusted(certs: Certs, tmp_path: Path) -> None:
    _make_ca(tmp_path, "other")
    with serve(echo_once, _server_context(certs.cert, certs.key), check=False) as server:
        with pytest.raises(harebox.TransportError, match="certificate was not trusted"):
            server.client("https", ca=str(tmp_path / "other.pem")).open_pty("sbx_1")
    assert server.peer is None  # the handshake failed on the server's side too

