"""Checks that need no server: configuration, secrecy of the key, and that
the client covers the OpenAPI document kept in this repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import harebox
from harebox.errors import error_from_body

REPO_OPENAPI = Path(__file__).resolve().parents[3] / "api" / "openapi.yaml"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com", "127.0.0.1:7070", "unix:/run/harebox.sock"])
def test_refuses_non_http_urls(url: str) -> None:
    with pytest.raises(ValueError, match="http"):
        harebox.Client(url=url, api_key="k")


@pytest.mark.parametrize("url", ["http://user:s3cret@127.0.0.1:7070", "http://user:s3cret@"])
def test_refuses_credentials_in_the_url_without_echoing_them(url: str) -> None:
    with pytest.raises(ValueError, match="credentials") as err:
        harebox.Client(url=url, api_key="k")
    assert "s3cret" not in str(err.value)


def test_never_shows_the_key() -> None:
    key = "hbk_do_not_print_me"
    hb = harebox.Client(url="http://127.0.0.1:7070", api_key=key)
    assert key not in repr(hb) and key not in str(vars(hb).get("url"))
    with pytest.raises(ValueError) as bad:
        harebox.Client(url="http://127.0.0.1:7070", api_key=key + "\r\nX-Injected: 1")
    assert key not in str(bad.value)


def test_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAREBOX_URL", "https://harebox.example:8443/base/")
    monkeypatch.setenv("HAREBOX_API_KEY", "hbk_env")
    hb = harebox.Client()
    assert hb.url == "https://harebox.example:8443/base"
    assert "hbk_env" not in repr(hb)


def test_error_codes_map_to_classes() -> None:
    err = error_from_body(400, {"error": {"code": "invalid", "message": "bad", "field": "size.preset"}})
    assert isinstance(err, harebox.InvalidRequest)
    assert (err.status, err.code, err.message, err.field) == (400, "invalid", "bad", "size.preset")
    assert isinstance(error_from_body(0, {"error": {"code": "not_found", "message": "x"}}), harebox.NotFound)
    assert error_from_body(0, {"error": {"code": "conflict", "message": "x"}}).status == 409
    assert isinstance(error_from_body(502, None), harebox.TransportError)


def test_client_covers_the_repository_document() -> None:
    """The same check as test_api's against the served document, on the
    document in the repo, so a new route shows up without a server."""
    if not REPO_OPENAPI.is_file():
        pytest.skip("api/openapi.yaml is not beside this SDK")
    documented = set(re.findall(r"^\s*operationId:\s*(\w+)\s*$", REPO_OPENAPI.read_text(), re.M))
    assert documented == set(harebox.Client.operations())


def test_unreachable_server_is_a_transport_error() -> None:
    with pytest.raises(harebox.TransportError):
        harebox.Client(url="http://127.0.0.1:9", api_key="k", timeout=5).get_health()
