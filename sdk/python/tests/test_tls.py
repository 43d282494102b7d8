"""TLS trust (``ca=`` and HAREBOX_CA) against a local HTTPS server, with
certificates made for the run by /usr/bin/openssl. No HareBox server is
needed."""

from __future__ import annotations

import http.server
import io
import json
import shutil
import socket
import ssl
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest

import harebox

OPENSSL = shutil.which("openssl", path="/usr/bin") or shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="these tests make certificates with openssl")

HEALTH = {"status": "ok"}
EXIT = {"exit_code": 0, "stdout": "", "stderr": "", "duration_ms": 1, "timed_out": False}
STREAM = b'event: stdout\ndata: {"data": "aGk="}\n\nevent: exit\ndata: ' + json.dumps(EXIT).encode() + b"\n\n"


class PKI(NamedTuple):
    ca: Path  # the CA that signed the server's certificates
    other_ca: Path  # a CA that signed nothing here
    cert: Path  # the server's certificate: localhost and 127.0.0.1
    key: Path
    misnamed_cert: Path  # signed by ca, for another host name only
    misnamed_key: Path
    fingerprint: str  # of cert, as openssl prints it: "AB:CD:..."
    misnamed_fingerprint: str


def _openssl(cwd: Path, *args: str) -> str:
    assert OPENSSL is not None
    done = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _make_ca(cwd: Path, name: str) -> None:
    _openssl(cwd, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1", "-subj", f"/CN=HareBox test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def _make_leaf(cwd: Path, name: str, ca: str, san: str) -> str:
    """A server certificate signed by ``ca``; returns its fingerprint."""
    _openssl(cwd, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=HareBox test server")
    (cwd / f"{name}.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    _openssl(cwd, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-set_serial", "2",
             "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    printed = _openssl(cwd, "x509", "-in", f"{name}.pem", "-noout", "-fingerprint", "-sha256")
    return printed.strip().split("=", 1)[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other")
    fingerprint = _make_leaf(d, "server", "ca", "DNS:localhost,IP:127.0.0.1")
    misnamed = _make_leaf(d, "misnamed", "ca", "DNS:elsewhere.example")
    return PKI(d / "ca.pem", d / "other.pem", d / "server.pem", d / "server.key",
               d / "misnamed.pem", d / "misnamed.key", fingerprint, misnamed)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Records each request's method and path, and answers /health with
    HEALTH, an exec stream with STREAM, anything else with {}."""

    seen: list[tuple[str, str]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path))
        if self.path.endswith("/exec/stream"):
            data, kind = STREAM, "text/event-stream"
        else:
            data, kind = json.dumps(HEALTH if self.path == "/health" else {}).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    """An HTTP server that speaks TLS with ``context`` when it is set; the
    context is read at each connection, so a test can change the
    certificate between two requests."""

    context: ssl.SSLContext | None = None
    handshakes = 0

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self.context is None:
            return sock, addr
        self.handshakes += 1
        # A client that refuses the certificate fails the handshake here:
        # the OSError makes the server drop that connection.
        return self.context.wrap_socket(sock, server_side=True), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up after a pin mismatch is expected


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # as hareboxd
    ctx.load_cert_chain(cert, key)
    return ctx


class Served(NamedTuple):
    server: _Server
    seen: list[tuple[str, str]]

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def https(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@contextmanager
def _serve(context: ssl.SSLContext | None) -> Iterator[Served]:
    handler = type("Handler", (_Handler,), {"seen": []})
    server = _Server(("127.0.0.1", 0), handler)
    server.context = context
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Served(server, handler.seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def tls(pki: PKI) -> Iterator[Served]:
    """A local HTTPS server presenting pki.cert."""
    with _serve(_server_context(pki.cert, pki.key)) as served:
        yield served


@pytest.fixture
def plain() -> Iterator[Served]:
    """A local plain HTTP server."""
    with _serve(None) as served:
        yield served


@pytest.fixture(autouse=True)
def no_env_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAREBOX_CA", raising=False)


def _client(url: str, **kwargs: Any) -> harebox.Client:
    return harebox.Client(url=url, api_key="hbk_tls_test", timeout=10, **kwargs)


def _hex(fingerprint: str) -> str:
    return fingerprint.replace(":", "")


# --- a CA file -------------------------------------------------------------


def test_ca_file_is_trusted(pki: PKI, tls: Served) -> None:
    hb = _client(tls.https, ca=str(pki.ca))
    assert hb.get_health() == HEALTH
    assert hb.get_health() == HEALTH
    assert tls.seen == [("GET", "/health"), ("GET", "/health")]
    assert f"ca={str(pki.ca)!r}" in repr(hb) and "hbk_tls_test" not in repr(hb)


def test_localhost_is_verified_against_the_ca_file(pki: PKI, tls: Served) -> None:
    assert _client(f"https://localhost:{tls.port}", ca=str(pki.ca)).get_health() == HEALTH


def test_another_ca_is_not_trusted(pki: PKI, tls: Served) -> None:
    with pytest.raises(harebox.TransportError, match="certificate was not trusted") as err:
        _client(tls.https, ca=str(pki.other_ca)).get_health()
    assert type(err.value) is harebox.TransportError and str(pki.other_ca) in str(err.value)
    assert tls.seen == []  # the request, and its key, never left


def test_the_ca_file_replaces_the_system_store(pki: PKI, tls: Served) -> None:
    """Without ca the system's CAs are the roots, and they do not know the
    test CA."""
    with pytest.raises(harebox.TransportError, match="certificate was not trusted.*system's CAs"):
        _client(tls.https).get_health()
    assert tls.seen == []


def test_ca_file_checks_the_host_name(pki: PKI) -> None:
    with _serve(_server_context(pki.misnamed_cert, pki.misnamed_key)) as served:
        with pytest.raises(harebox.TransportError, match="certificate was not trusted.*127.0.0.1"):
            _client(served.https, ca=str(pki.ca)).get_health()
        assert served.seen == []


def test_a_bundle_of_cas_is_read_whole(pki: PKI, tls: Served, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.other_ca.read_bytes() + pki.ca.read_bytes())
    assert _client(tls.https, ca=str(bundle)).get_health() == HEALTH


# --- a fingerprint -------------------------------------------------------------


@pytest.mark.parametrize("form", ["colons upper", "hex upper", "hex lower"])
def test_pinned_fingerprint_is_trusted(pki: PKI, tls: Served, form: str) -> None:
    fp = {"colons upper": pki.fingerprint, "hex upper": _hex(pki.fingerprint), "hex lower": _hex(pki.fingerprint).lower()}[form]
    assert fp != fp.lower() or form == "hex lower"
    hb = _client(tls.https, ca="sha256:" + fp)
    assert hb.get_health() == HEALTH
    assert tls.seen == [("GET", "/health")]
    assert "hbk_tls_test" not in repr(hb)


def test_the_fingerprint_is_the_certificates_sha256(pki: PKI) -> None:
    import hashlib

    der = ssl.PEM_cert_to_DER_cert(pki.cert.read_text())
    assert hashlib.sha256(der).hexdigest() == _hex(pki.fingerprint).lower()


def test_a_pin_needs_neither_a_known_ca_nor_the_host_name(pki: PKI) -> None:
    with _serve(_server_context(pki.misnamed_cert, pki.misnamed_key)) as served:
        assert _client(served.https, ca="sha256:" + pki.misnamed_fingerprint).get_health() == HEALTH


def test_wrong_pin_fails_before_the_request(pki: PKI, tls: Served) -> None:
    wrong = "sha256:" + "ab" * 32
    with pytest.raises(harebox.TransportError) as err:
        _client(tls.https, ca=wrong).get_health()
    message = str(err.value)
    assert type(err.value) is harebox.TransportError
    assert "certificate was not trusted" in message and "did not match the pinned fingerprint" in message
    assert "sha256:" + "ab" * 32 in message and "sha256:" + _hex(pki.fingerprint).lower() in message
    assert "GET /health" in message and "hbk_tls_test" not in message
    assert tls.server.handshakes == 1 and tls.seen == []  # the TLS handshake, then nothing


def test_the_pin_is_checked_on_every_connection(pki: PKI, tls: Served) -> None:
    hb = _client(tls.https, ca="sha256:" + pki.fingerprint)
    assert hb.get_health() == HEALTH
    tls.server.context = _server_context(pki.misnamed_cert, pki.misnamed_key)  # the same CA, another certificate
    with pytest.raises(harebox.TransportError, match="did not match the pinned fingerprint"):
        hb.get_health()
    tls.server.context = _server_context(pki.cert, pki.key)
    assert hb.get_health() == HEALTH
    assert tls.seen == [("GET", "/health"), ("GET", "/health")]


def test_streams_and_transfers_check_the_pin(pki: PKI, tls: Served) -> None:
    good = _client(tls.https, ca="sha256:" + pki.fingerprint)
    with good.exec_stream("sbx_1", body={"cmd": "echo hi"}) as stream:
        assert list(stream) == [("stdout", b"hi"), ("exit", EXIT)]
    assert good.read_file("sbx_1", query={"path": "/x"}) == b"{}"
    tls.seen.clear()

    bad = _client(tls.https, ca="sha256:" + "00" * 32)
    pinned = "did not match the pinned fingerprint"
    with pytest.raises(harebox.TransportError, match=pinned):
        bad.exec_stream("sbx_1", body={"cmd": "echo hi"})
    with pytest.raises(harebox.TransportError, match=pinned):
        bad.get_process_output("sbx_1", "proc_1", query={"follow": True})
    events = bad.events({"after": 1})
    with pytest.raises(harebox.TransportError, match=pinned):
        next(events)
    events.close()
    with pytest.raises(harebox.TransportError, match=pinned):
        bad.write_file("sbx_1", query={"path": "/x"}, body=io.BytesIO(b"data"))
    with pytest.raises(harebox.TransportError, match=pinned):
        bad.read_file("sbx_1", query={"path": "/x"})
    with pytest.raises(harebox.TransportError, match=pinned):
        bad.get_server_metrics()
    assert tls.seen == []


# --- where the value comes from ---------------------------------------------------


def test_reads_harebox_ca(pki: PKI, tls: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAREBOX_CA", str(pki.ca))
    assert _client(tls.https).get_health() == HEALTH
    monkeypatch.setenv("HAREBOX_CA", "sha256:" + pki.fingerprint)
    assert _client(tls.https).get_health() == HEALTH
    monkeypatch.setenv("HAREBOX_CA", str(pki.other_ca))
    with pytest.raises(harebox.TransportError, match="not trusted.*HAREBOX_CA"):
        _client(tls.https).get_health()
    monkeypatch.setenv("HAREBOX_CA", "sha256:" + "11" * 32)
    with pytest.raises(harebox.TransportError, match=r"pinned fingerprint .* \(HAREBOX_CA\)"):
        _client(tls.https).get_health()


def test_the_option_wins_over_harebox_ca(pki: PKI, tls: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAREBOX_CA", str(pki.other_ca))
    assert _client(tls.https, ca=str(pki.ca)).get_health() == HEALTH
    assert _client(tls.https, ca="sha256:" + pki.fingerprint).get_health() == HEALTH
    monkeypatch.setenv("HAREBOX_CA", str(pki.ca))
    with pytest.raises(harebox.TransportError, match=r"pinned fingerprint .* \(ca\)"):
        _client(tls.https, ca="sha256:" + "22" * 32).get_health()
    # An empty option is the system's store, whatever HAREBOX_CA says.
    with pytest.raises(harebox.TransportError, match="system's CAs"):
        _client(tls.https, ca="").get_health()
    # A bad HAREBOX_CA does not matter when the option is given.
    monkeypatch.setenv("HAREBOX_CA", "sha256:nope")
    assert _client(tls.https, ca=str(pki.ca)).get_health() == HEALTH


def test_empty_harebox_ca_is_unset(tls: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAREBOX_CA", "")
    hb = _client(tls.https)
    assert "ca=" not in repr(hb)
    with pytest.raises(harebox.TransportError, match="system's CAs"):
        hb.get_health()


# --- bad values -------------------------------------------------------------------


def _bad_values(pki: PKI, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Each bad value and what its error says."""
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    return {
        "missing file": (str(tmp_path / "nope.pem"), "cannot read the CA file"),
        "a directory": (str(tmp_path), "cannot read the CA file"),
        "empty file": (str(empty), "no PEM certificate"),
        "a key, not a certificate": (str(pki.key), "no PEM certificate"),
        "garbled certificate": (str(garbled), "not a usable PEM certificate"),
        "short pin": ("sha256:" + "ab" * 31, "64 hex digits"),
        "long pin": ("sha256:" + "ab" * 33, "64 hex digits"),
        "not hex": ("sha256:" + "zz" * 32, "64 hex digits"),
        "empty pin": ("sha256:", "64 hex digits"),
    }


@pytest.mark.parametrize(
    "case", ["missing file", "a directory", "empty file", "a key, not a certificate", "garbled certificate",
             "short pin", "long pin", "not hex", "empty pin"])
def test_bad_values_fail_at_construction(pki: PKI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    value, why = _bad_values(pki, tmp_path)[case]
    with pytest.raises(ValueError, match=why) as err:
        _client("https://127.0.0.1:9", ca=value)
    assert str(err.value).startswith("ca")
    monkeypatch.setenv("HAREBOX_CA", value)
    with pytest.raises(ValueError, match=why) as err:
        _client("https://127.0.0.1:9")
    assert str(err.value).startswith("HAREBOX_CA")


def test_the_key_file_content_is_never_in_the_error(pki: PKI) -> None:
    with pytest.raises(ValueError) as err:
        _client("https://127.0.0.1:9", ca=str(pki.key))
    assert "PRIVATE" not in str(err.value) and pki.key.read_text().splitlines()[1] not in str(err.value)


# --- http:// ----------------------------------------------------------------------


def test_http_urls_ignore_it(plain: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    hb = _client(f"http://127.0.0.1:{plain.port}", ca="/no/such/ca.pem")
    assert "ca=" not in repr(hb)
    assert hb.get_health() == HEALTH
    monkeypatch.setenv("HAREBOX_CA", "sha256:bad")
    assert _client(f"http://127.0.0.1:{plain.port}").get_health() == HEALTH
    assert _client(f"http://127.0.0.1:{plain.port}", ca="sha256:" + "ab" * 32).get_health() == HEALTH
    assert plain.seen == [("GET", "/health")] * 3
