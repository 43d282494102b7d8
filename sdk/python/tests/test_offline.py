"""Checks that need no server: configuration, secrecy of the key, and that
the client covers the OpenAPI document kept in this repository."""

from __future__ import annotations

import base64
import http.server
import io
import json
import re
import threading
from pathlib import Path
from typing import Any, Iterator, Literal, get_args, get_type_hints

import pytest

import harebox
from harebox import types as t
from harebox.client import _read_sse_event
from harebox.errors import error_from_body, parse_retry_after

from test_api import snake

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


def test_forbidden_and_rate_limited_map_to_classes() -> None:
    err = error_from_body(403, {"error": {"code": "forbidden", "message": "this API key may not createSandbox"}})
    assert isinstance(err, harebox.Forbidden) and not isinstance(err, harebox.Unauthorized)
    assert (err.status, err.code) == (403, "forbidden")
    limited = error_from_body(429, {"error": {"code": "rate_limited", "message": "spent"}}, retry_after=2.0)
    assert isinstance(limited, harebox.RateLimited)
    assert (limited.status, limited.code, limited.retry_after) == (429, "rate_limited", 2.0)
    assert "retry after 2 s" in str(limited) and "retry_after=2.0" in repr(limited)
    # Without an API error body the status still picks the class.
    assert isinstance(error_from_body(403, None), harebox.Forbidden)
    bare = error_from_body(429, None, retry_after=1.0)
    assert isinstance(bare, harebox.RateLimited) and bare.retry_after == 1.0
    assert error_from_body(0, {"error": {"code": "rate_limited", "message": "x"}}).status == 429
    assert error_from_body(0, {"error": {"code": "forbidden", "message": "x"}}).status == 403


def test_budget_exceeded_maps_to_its_class() -> None:
    err = error_from_body(402, {"error": {"code": "budget_exceeded", "message": "budget tiny has 0.00 left"}})
    assert isinstance(err, harebox.BudgetExceeded) and not isinstance(err, harebox.InvalidRequest)
    assert (err.status, err.code, err.message) == (402, "budget_exceeded", "budget tiny has 0.00 left")
    assert isinstance(error_from_body(402, None), harebox.BudgetExceeded)
    assert error_from_body(0, {"error": {"code": "budget_exceeded", "message": "x"}}).status == 402


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, None), ("", None), ("3", 3.0), (" 1 ", 1.0), ("0.5", 0.5), ("-1", None), ("soon", None), ("inf", None),
     ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


def test_client_covers_the_repository_document() -> None:
    """The same check as test_api's against the served document, on the
    document in the repo, so a new route shows up without a server."""
    if not REPO_OPENAPI.is_file():
        pytest.skip("api/openapi.yaml is not beside this SDK")
    documented = set(re.findall(r"^\s*operationId:\s*(\w+)\s*$", REPO_OPENAPI.read_text(), re.M))
    assert documented == set(harebox.Client.operations())
    for operation_id, name in harebox.Client.operations().items():
        assert name == snake(operation_id), operation_id


def test_versions_follow_the_api() -> None:
    """Both clients' versions are the API version the document states."""
    if not REPO_OPENAPI.is_file():
        pytest.skip("api/openapi.yaml is not beside this SDK")
    repo = REPO_OPENAPI.parents[1]
    api = re.search(r"^info:\n(?:  .*\n)*?  version: (\S+)$", REPO_OPENAPI.read_text(), re.M)
    assert api, "no info.version in api/openapi.yaml"
    pyproject = re.search(r'^version = "([^"]+)"$', (repo / "sdk/python/pyproject.toml").read_text(), re.M)
    package = json.loads((repo / "sdk/typescript/package.json").read_text())["version"]
    ts = re.search(r'^export const VERSION = "([^"]+)";$', (repo / "sdk/typescript/src/client.ts").read_text(), re.M)
    assert pyproject and ts
    assert {harebox.__version__, pyproject[1], package, ts[1]} == {api[1]}
    assert harebox.client.USER_AGENT == "harebox-python/" + api[1]


def test_unreachable_server_is_a_transport_error() -> None:
    with pytest.raises(harebox.TransportError):
        harebox.Client(url="http://127.0.0.1:9", api_key="k", timeout=5).get_health()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request from ``replies`` by path (with its query
    first, then without), and records it. A bytes reply is sent as it is
    (give its Content-Type in the headers)."""

    seen: list[tuple[str, str, Any]] = []
    #: The Accept header of each request, in order.
    accepts: list[str] = []
    replies: dict[str, tuple[int, dict[str, str], Any]] = {}

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, body))
        self.accepts.append(self.headers.get("Accept", ""))
        status, headers, reply = self.replies.get(self.path) or self.replies.get(self.path.split("?")[0], (200, {}, {"ok": True}))
        data = reply if isinstance(reply, bytes) else b"" if reply is None else json.dumps(reply).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[harebox.Client, type[_Recorder]]]:
    """A client of a local HTTP server that records what it is sent."""
    handler = type("Recorder", (_Recorder,), {"seen": [], "accepts": [], "replies": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # (shutdown waits for serve_forever's next poll: at the default 0.5 s
    # that was half a second per test.)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield harebox.Client(url=f"http://127.0.0.1:{server.server_address[1]}", api_key="hbk_test"), handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_tenancy_and_key_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/accounts/acme"] = (204, {}, None)
    assert hb.create_account(body={"name": "acme"}) == {"ok": True}
    hb.list_accounts()
    hb.get_account("acme")
    assert hb.delete_account("acme") is None
    hb.create_project(body={"name": "web"}, query={"account": "acme"})
    hb.list_projects(query={"account": "acme"})
    hb.get_project("web")
    hb.delete_project("web", query={"account": "acme"})
    hb.create_fleet("web", body={"name": "workers"}, query={"account": "acme"})
    hb.list_fleets("web")
    hb.get_fleet("web", "workers", query={"account": "acme"})
    hb.delete_fleet("prj_1", "a/b")
    hb.create_key(body={"account_id": "acme", "scope": {"actions": ["sandboxes:read"]}})
    hb.list_keys(query={"account": "acme"})
    hb.get_key("key_1")
    hb.revoke_key("key_1")
    hb.rotate_key("key_1")
    hb.list_sandboxes(query={"project": "web", "fleet": "workers"})
    assert server.seen == [
        ("POST", "/v1/accounts", {"name": "acme"}),
        ("GET", "/v1/accounts", None),
        ("GET", "/v1/accounts/acme", None),
        ("DELETE", "/v1/accounts/acme", None),
        ("POST", "/v1/projects?account=acme", {"name": "web"}),
        ("GET", "/v1/projects?account=acme", None),
        ("GET", "/v1/projects/web", None),
        ("DELETE", "/v1/projects/web?account=acme", None),
        ("POST", "/v1/projects/web/fleets?account=acme", {"name": "workers"}),
        ("GET", "/v1/projects/web/fleets", None),
        ("GET", "/v1/projects/web/fleets/workers?account=acme", None),
        ("DELETE", "/v1/projects/prj_1/fleets/a%2Fb", None),
        ("POST", "/v1/keys", {"account_id": "acme", "scope": {"actions": ["sandboxes:read"]}}),
        ("GET", "/v1/keys?account=acme", None),
        ("GET", "/v1/keys/key_1", None),
        ("DELETE", "/v1/keys/key_1", None),
        ("POST", "/v1/keys/key_1/rotate", None),
        ("GET", "/v1/sandboxes?project=web&fleet=workers", None),
    ]
    with pytest.raises(ValueError):
        hb.get_fleet("web", "")


def test_image_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/images/my%2Fimg"] = (204, {}, None)
    hb.list_images()
    hb.build_image(body={"name": "myimg", "from": "registry:ghcr.io/org/app:1"})
    assert hb.delete_image("my/img") is None
    assert server.seen == [
        ("GET", "/v1/images", None),
        ("POST", "/v1/images", {"name": "myimg", "from": "registry:ghcr.io/org/app:1"}),
        ("DELETE", "/v1/images/my%2Fimg", None),
    ]
    with pytest.raises(ValueError):
        hb.delete_image("")


def test_environment_and_project_update_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/environments/prod"] = (204, {}, None)
    web = {"project": "web", "account": "acme"}
    env: t.EnvironmentRequest = {
        "name": "prod",
        "variables": {"MODE": {"value": "prod"}, "TOKEN": {"value": "v", "secret": True}},
        "files": [{"path": "/etc/app.conf", "content": "token={{TOKEN}}", "template": True}],
        "credentials": [{"secret": "TOKEN", "hosts": ["api.example.com"], "header": "Authorization", "format": "Bearer {value}"}],
    }
    update: t.EnvironmentUpdate = {"set": {"MODE": {"value": "staging"}}, "unset": ["OLD"], "third_party_safe": True}
    hb.update_project("web", body={"third_party_default": True}, query={"account": "acme"})
    hb.create_environment(body=env, query=web)
    hb.list_environments(query={"project": "prj_1"})
    hb.get_environment("env_1")
    hb.update_environment("prod", body=update, query={"project": "web"})
    assert hb.delete_environment("prod") is None
    hb.list_environment_versions("prod", query=web)
    hb.get_environment_version("prod", 2, query={"project": "web"})
    hb.get_environment_version("a/b", "1")
    server.replies["/v1/sandboxes"] = (201, {}, {"id": "sbx_1", "state": "running", "environment": "prod@1", "third_party": True})
    box = hb.create(environment="prod@1", third_party=True, no_env=None)
    assert (box.environment, box.third_party) == ("prod@1", True)
    assert server.seen == [
        ("PATCH", "/v1/projects/web?account=acme", {"third_party_default": True}),
        ("POST", "/v1/environments?project=web&account=acme", env),
        ("GET", "/v1/environments?project=prj_1", None),
        ("GET", "/v1/environments/env_1", None),
        ("PATCH", "/v1/environments/prod?project=web", update),
        ("DELETE", "/v1/environments/prod", None),
        ("GET", "/v1/environments/prod/versions?project=web&account=acme", None),
        ("GET", "/v1/environments/prod/versions/2?project=web", None),
        ("GET", "/v1/environments/a%2Fb/versions/1", None),
        ("POST", "/v1/sandboxes", {"environment": "prod@1", "third_party": True}),
    ]
    with pytest.raises(ValueError):
        hb.get_environment_version("prod", True)
    with pytest.raises(ValueError):
        hb.update_environment("", body={})


def test_sandbox_reports_its_environment() -> None:
    hb = harebox.Client(url="http://127.0.0.1:9", api_key="k")
    data: t.SandboxJSON = {
        "id": "sbx_1", "account_id": "acc_1", "project_id": "prj_1", "project": "default", "state": "running",
        "image": "minimal", "size": {"vcpus": 1, "memory_mb": 512, "disk_gb": 1}, "no_env": False,
        "environment": "prod@2", "third_party": True, "site": {"name": "l", "country": ""}, "created_at": "now",
    }
    box = harebox.Sandbox(hb, data)
    assert (box.environment, box.third_party) == ("prod@2", True)
    assert box.to_dict()["environment"] == "prod@2" and box.to_dict()["third_party"] is True
    del data["environment"], data["third_party"]
    bare = harebox.Sandbox(hb, data)
    assert (bare.environment, bare.third_party) == (None, False)
    assert (bare.mesh_address, bare.mesh_name) == (None, None)


def test_sandbox_reports_its_mesh() -> None:
    hb = harebox.Client(url="http://127.0.0.1:9", api_key="k")
    data: t.SandboxJSON = {
        "id": "sbx_1", "account_id": "acc_1", "project_id": "prj_1", "project": "shop", "state": "running",
        "image": "minimal", "size": {"vcpus": 1, "memory_mb": 512, "disk_gb": 1}, "no_env": False,
        "site": {"name": "l", "country": ""}, "created_at": "now",
        "mesh_address": "10.240.0.1", "mesh_name": "web.shop.internal",
    }
    box = harebox.Sandbox(hb, data)
    assert (box.mesh_address, box.mesh_name) == ("10.240.0.1", "web.shop.internal")
    assert box.to_dict()["mesh_name"] == "web.shop.internal"


def test_history_and_account_update_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    command: t.Command = {
        "id": "cmd_1", "sandbox_id": "sbx_1", "kind": "exec", "cmd": "echo hi", "user": "root", "cwd": "/tmp",
        "started_at": "2026-11-30T12:00:00Z", "ended_at": "2026-11-30T12:00:01Z", "output_purged": False,
        "result": {"exit_code": 0, "stdout": "hi\n", "stderr": "", "duration_ms": 3, "timed_out": False,
                   "stdout_truncated": False, "stderr_truncated": False},
    }
    history: t.CommandList = {"commands": [command]}
    account: t.Account = {"id": "acc_1", "name": "default", "created_at": "2026-11-30T12:00:00Z", "retention": {"output_days": 0}}
    server.replies["/v1/sandboxes/sbx_1/commands"] = (200, {}, history)
    server.replies["/v1/accounts/default"] = (200, {}, account)
    server.replies["/v1/sandboxes"] = (201, {}, {"id": "sbx_2", "state": "running", "monitoring": False, "snapshots": False})
    update: t.AccountUpdate = {"retention": {"history_days": 30, "output_days": 0}}
    assert hb.list_commands("sbx_1") == history
    hb.list_commands("sbx_1", query={"limit": 5})
    hb.list_commands("a/b", query={"limit": None})
    assert hb.update_account("default", body=update) == account
    hb.update_account("acc_2", body={"retention": {}})
    box = hb.create(monitoring=False, snapshots=False, name=None)
    assert (box.monitoring, box.snapshots) == (False, False)
    hb.create(monitoring=True)
    assert server.seen == [
        ("GET", "/v1/sandboxes/sbx_1/commands", None),
        ("GET", "/v1/sandboxes/sbx_1/commands?limit=5", None),
        ("GET", "/v1/sandboxes/a%2Fb/commands", None),
        ("PATCH", "/v1/accounts/default", update),
        ("PATCH", "/v1/accounts/acc_2", {"retention": {}}),
        ("POST", "/v1/sandboxes", {"monitoring": False, "snapshots": False}),
        ("POST", "/v1/sandboxes", {"monitoring": True}),
    ]
    with pytest.raises(ValueError):
        hb.list_commands("")
    with pytest.raises(ValueError):
        hb.update_account("", body={})


def test_sandbox_reports_monitoring_and_snapshots() -> None:
    hb = harebox.Client(url="http://127.0.0.1:9", api_key="k")
    data: t.SandboxJSON = {
        "id": "sbx_1", "account_id": "acc_1", "project_id": "prj_1", "project": "default", "state": "running",
        "image": "minimal", "size": {"vcpus": 1, "memory_mb": 512, "disk_gb": 1}, "no_env": False,
        "monitoring": False, "snapshots": False, "site": {"name": "l", "country": ""}, "created_at": "now",
    }
    box = harebox.Sandbox(hb, data)
    assert (box.monitoring, box.snapshots) == (False, False)
    assert box.to_dict()["monitoring"] is False and box.to_dict()["snapshots"] is False
    data["monitoring"] = True
    assert harebox.Sandbox(hb, data).monitoring is True
    del data["monitoring"], data["snapshots"]
    bare = harebox.Sandbox(hb, data)  # as CreateRequest: both default to True
    assert (bare.monitoring, bare.snapshots) == (True, True)


def _entry(seq: int, outcome: str = "ok") -> t.AuditEntry:
    entry: t.AuditEntry = {
        "seq": seq, "time": "2026-11-30T12:00:00Z", "account_id": "acc_1", "principal": "key_1",
        "source": "127.0.0.1", "action": "createProject", "target": "web", "outcome": "ok",
        "request_id": f"req-{seq}", "prev": f"h{seq - 1}", "hash": f"h{seq}",
    }
    if outcome != "ok":
        entry["outcome"], entry["error"] = "denied", "forbidden"
    return entry


def test_audit_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    page: t.AuditList = {"entries": [_entry(7, "denied")], "next": "7"}
    report: t.AuditReport = {"ok": False, "entries": 9, "checkpoints": 1, "first_bad": 3, "reason": "entry 3 was altered"}
    key: t.AuditKey = {"algorithm": "ed25519", "public_key": "MCowBQYDK2VwAyEA"}
    server.replies["/v1/audit"] = (200, {}, page)
    server.replies["/v1/audit/verify"] = (200, {}, report)
    server.replies["/v1/audit/key"] = (200, {}, key)
    query: t.Query = {
        "from": "2026-11-30T00:00:00Z", "to": "2026-12-01T00:00:00+01:00", "principal": "key_1", "target": "prj_1",
        "action": "createProject", "outcome": "denied", "account": "acme", "after": 6, "limit": 1, "format": "json",
    }
    assert hb.list_audit(query=query) == page
    assert hb.list_audit() == page
    assert hb.verify_audit() == report
    assert hb.get_audit_key() == key
    assert server.seen == [
        ("GET", "/v1/audit?from=2026-11-30T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&principal=key_1"
         "&target=prj_1&action=createProject&outcome=denied&account=acme&after=6&limit=1&format=json", None),
        ("GET", "/v1/audit", None),
        ("GET", "/v1/audit/verify", None),
        ("GET", "/v1/audit/key", None),
    ]
    # JSON Lines are for audit_entries to replace, not for list_audit to parse.
    with pytest.raises(ValueError, match="audit_entries"):
        hb.list_audit(query={"format": "jsonl"})
    assert len(server.seen) == 4


def test_audit_entries_follows_next(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/audit?limit=2&outcome=denied"] = (200, {}, {"entries": [_entry(1), _entry(2)], "next": "2"})
    server.replies["/v1/audit?limit=2&outcome=denied&after=2"] = (200, {}, {"entries": [_entry(5), _entry(6)], "next": "6"})
    server.replies["/v1/audit?limit=2&outcome=denied&after=6"] = (200, {}, {"entries": []})
    entries = hb.audit_entries({"outcome": "denied", "limit": 2})
    assert server.seen == []  # a generator: nothing is sent before the first entry is asked for
    assert [e["seq"] for e in entries] == [1, 2, 5, 6]
    assert [path for _, path, _ in server.seen] == [
        "/v1/audit?limit=2&outcome=denied",
        "/v1/audit?limit=2&outcome=denied&after=2",
        "/v1/audit?limit=2&outcome=denied&after=6",
    ]
    # A page that is not full has no next: the last request. Pages are 1000
    # entries by default, and after= starts past a cursor.
    server.seen.clear()
    server.replies["/v1/audit?limit=1000&after=41"] = (200, {}, {"entries": [_entry(42)]})
    assert [e["seq"] for e in hb.audit_entries(query={"after": 41})] == [42]
    assert [path for _, path, _ in server.seen] == ["/v1/audit?limit=1000&after=41"]
    server.replies["/v1/audit?limit=1000"] = (403, {}, {"error": {"code": "forbidden", "message": "this API key may not listAudit"}})
    with pytest.raises(harebox.Forbidden):
        next(hb.audit_entries())
    with pytest.raises(ValueError):
        next(hb.audit_entries({"format": "jsonl"}))
    # A cursor that does not move would loop for ever.
    server.replies["/v1/audit?limit=1&after=9"] = (200, {}, {"entries": [_entry(10)], "next": "9"})
    with pytest.raises(harebox.TransportError, match="does not move"):
        list(hb.audit_entries({"limit": 1, "after": "9"}))


def test_rate_limited_reply_carries_retry_after(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes"] = (429, {"Retry-After": "2"}, {"error": {"code": "rate_limited", "message": "spent"}})
    server.replies["/v1/keys"] = (403, {}, {"error": {"code": "forbidden", "message": "wider", "field": "scope.actions"}})
    with pytest.raises(harebox.RateLimited) as limited:
        hb.list_sandboxes()
    assert (limited.value.status, limited.value.code, limited.value.retry_after) == (429, "rate_limited", 2.0)
    with pytest.raises(harebox.Forbidden) as forbidden:
        hb.create_key(body={"scope": {"actions": ["*"]}})
    assert (forbidden.value.status, forbidden.value.field) == (403, "scope.actions")


def _event(seq: int, action: str = "budgetReached") -> t.AuditEntry:
    return {"seq": seq, "time": "2026-11-30T12:00:00Z", "account_id": "acc_1", "principal": "budget:bgt_1",
            "action": action, "target": "bgt_1", "outcome": "ok", "prev": f"h{seq - 1}", "hash": f"h{seq}"}


def _sse(*blocks: str) -> bytes:
    return "".join(block + "\n\n" for block in blocks).encode()


STREAM_ERROR = {"error": {"code": "invalid", "message": "no account acme", "field": "account"}}

#: A followed /v1/events stream: a keepalive, two events, an unknown event
#: (for a newer client), then the error that ends it.
EVENTS_STREAM = _sse(
    ": keepalive",
    "event: event\ndata: " + json.dumps(_event(7, "budgetWarning")),
    ": keepalive\r\nevent: event\r\ndata: " + json.dumps(_event(8)) + "\r",
    "event: hello\ndata: {}",
    "event: error\ndata: " + json.dumps(STREAM_ERROR),
)


def test_sse_parser_skips_comments_and_joins_data() -> None:
    stream = io.BytesIO(EVENTS_STREAM + b"event: two\ndata: a\ndata:b\nid: 3\n\n\n\ndata: plain\n\nevent: cut\ndata: x\n")
    read = [_read_sse_event(stream, "test") for _ in range(8)]
    assert read[:2] == [("event", json.dumps(_event(7, "budgetWarning"))), ("event", json.dumps(_event(8)))]
    assert read[2:4] == [("hello", "{}"), ("error", json.dumps(STREAM_ERROR))]
    assert read[4:] == [("two", "a\nb"), ("message", "plain"), None, None]  # an event cut off by the end is dropped
    with pytest.raises(harebox.TransportError, match="test: an event line is too long or cut short"):
        _read_sse_event(io.BytesIO(b"data: no newline"), "test")


def test_events_follow_the_stream(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    stream = {"Content-Type": "text/event-stream"}
    server.replies["/v1/events?account=acme&after=6&follow=true"] = (200, stream, EVENTS_STREAM)
    events = hb.events({"account": "acme", "after": 6, "follow": False}, timeout=5)
    assert server.seen == []  # a generator: nothing is sent before the first event is asked for
    assert next(events) == _event(7, "budgetWarning")
    assert next(events) == _event(8)
    with pytest.raises(harebox.InvalidRequest) as err:
        next(events)  # the unknown event is skipped; the error ends the stream
    assert (err.value.status, err.value.code, err.value.field) == (400, "invalid", "account")
    assert list(events) == []
    assert [path for _, path, _ in server.seen] == ["/v1/events?account=acme&after=6&follow=true"]
    # A stream the server ends without an error is opened again after the
    # last event's seq.
    server.replies["/v1/events?follow=true"] = (200, stream, _sse("event: event\ndata: " + json.dumps(_event(9))))
    server.replies["/v1/events?follow=true&after=9"] = (200, stream, _sse(
        "event: event\ndata: " + json.dumps(_event(10)), "event: error\ndata: " + json.dumps(STREAM_ERROR)))
    followed = hb.events()
    assert next(followed)["seq"] == 9
    assert next(followed)["seq"] == 10
    with pytest.raises(harebox.InvalidRequest):
        next(followed)
    assert [path for _, path, _ in server.seen][-2:] == ["/v1/events?follow=true", "/v1/events?follow=true&after=9"]
    # Errors before the stream are the API's, as for any call.
    server.replies["/v1/events?limit=0&follow=true"] = (
        400, {}, {"error": {"code": "invalid", "message": "must be 1 to 1000", "field": "limit"}})
    with pytest.raises(harebox.InvalidRequest) as bad:
        next(hb.events({"limit": 0}))
    assert bad.value.field == "limit"
    # A data line that is not JSON is not the API talking.
    server.replies["/v1/events?follow=true"] = (200, stream, _sse("event: event\ndata: {oops"))
    with pytest.raises(harebox.TransportError, match="events stream: JSONDecodeError"):
        next(hb.events())


def test_list_events_and_its_pages(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    first: t.EventList = {"events": [_event(3), _event(5)], "next": "6"}
    server.replies["/v1/events"] = (200, {}, first)
    assert hb.list_events() == first
    hb.list_events(query={"account": "acme", "after": "6", "limit": 10})
    with pytest.raises(ValueError, match="events"):
        hb.list_events(query={"follow": True})
    # Without follow, events reads pages until the cursor stands still (a
    # page can be empty of what a key may see and still move it).
    server.replies["/v1/events?limit=2&account=acme"] = (200, {}, first)
    server.replies["/v1/events?limit=2&account=acme&after=6"] = (200, {}, {"events": [], "next": "8"})
    server.replies["/v1/events?limit=2&account=acme&after=8"] = (200, {}, {"events": [_event(9)], "next": "9"})
    server.replies["/v1/events?limit=2&account=acme&after=9"] = (200, {}, {"events": [], "next": "9"})
    server.seen.clear()
    assert [e["seq"] for e in hb.events({"limit": 2, "account": "acme", "follow": True}, follow=False)] == [3, 5, 9]
    assert [path for _, path, _ in server.seen] == [
        "/v1/events?limit=2&account=acme",
        "/v1/events?limit=2&account=acme&after=6",
        "/v1/events?limit=2&account=acme&after=8",
        "/v1/events?limit=2&account=acme&after=9",
    ]
    server.seen.clear()
    server.replies["/v1/events?limit=1000&after=20"] = (200, {}, {"events": [], "next": "20"})
    assert list(hb.events({"after": 20}, follow=False)) == []
    assert [path for _, path, _ in server.seen] == ["/v1/events?limit=1000&after=20"]


def test_exec_stream_reads_its_events(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    """The exec stream shares the parser with the events stream."""
    hb, server = recorder
    result = {"exit_code": 0, "stdout": "", "stderr": "", "duration_ms": 1, "timed_out": False}
    server.replies["/v1/sandboxes/sbx_1/exec/stream"] = (200, {"Content-Type": "text/event-stream"}, _sse(
        'event: stdout\ndata: {"data": "aGk="}', ": keepalive", 'event: stderr\ndata: {"data": "IQ=="}',
        "event: exit\ndata: " + json.dumps(result)))
    events = list(hb.exec_stream("sbx_1", body={"cmd": "echo hi"}))
    assert events == [("stdout", b"hi"), ("stderr", b"!"), ("exit", result)]
    server.replies["/v1/sandboxes/sbx_2/exec/stream"] = (200, {"Content-Type": "text/event-stream"}, _sse(
        'event: stdout\ndata: {"data": "aGk="}'))
    stream = hb.exec_stream("sbx_2", body={"cmd": "echo hi"})
    assert next(stream) == ("stdout", b"hi")
    with pytest.raises(harebox.TransportError, match="exec stream ended before the exit event"):
        next(stream)


PROMETHEUS_TEXT = (
    b'# HELP harebox_sandboxes Live sandboxes by state.\n# TYPE harebox_sandboxes gauge\n'
    b'harebox_sandboxes{state="running"} 1\n# TYPE go_goroutines gauge\ngo_goroutines 12\n'
)


def test_metrics_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    sample: t.MetricSample = {
        "sandbox_id": "sbx_1", "time": "2026-11-30T12:00:15Z", "cpu_seconds": 1.25, "memory_bytes": 104857600,
        "disk_bytes": 52428800, "net_sent_bytes": 0, "net_received_bytes": 1234,
    }
    samples: t.MetricSampleList = {"samples": [sample]}
    server.replies["/v1/sandboxes/sbx_1/metrics"] = (200, {}, samples)
    server.replies["/metrics"] = (200, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}, PROMETHEUS_TEXT)
    assert hb.get_sandbox_metrics("sbx_1") == samples
    hb.get_sandbox_metrics("sbx_1", query={"from": "2026-11-30T12:00:00Z", "to": "2026-12-01T00:00:00+01:00", "limit": 10})
    hb.get_sandbox_metrics("a/b", query={"limit": None})
    text = hb.get_server_metrics()
    assert isinstance(text, str) and text == PROMETHEUS_TEXT.decode()
    assert 'harebox_sandboxes{state="running"} 1' in text.splitlines()
    assert hb.get_server_metrics() == text
    assert server.seen == [
        ("GET", "/v1/sandboxes/sbx_1/metrics", None),
        ("GET", "/v1/sandboxes/sbx_1/metrics?from=2026-11-30T12%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&limit=10", None),
        ("GET", "/v1/sandboxes/a%2Fb/metrics", None),
        ("GET", "/metrics", None),
        ("GET", "/metrics", None),
    ]
    # The Prometheus text is asked for as text; the JSON calls ask for JSON.
    assert server.accepts == ["application/json"] * 3 + ["text/plain"] * 2
    with pytest.raises(ValueError):
        hb.get_sandbox_metrics("")
    # Errors are the API's JSON, as for any call.
    server.replies["/metrics"] = (403, {}, {"error": {"code": "forbidden", "message": "a key needs getServerMetrics"}})
    with pytest.raises(harebox.Forbidden):
        hb.get_server_metrics()
    server.replies["/v1/sandboxes/sbx_1/metrics?limit=0"] = (
        400, {}, {"error": {"code": "invalid", "message": "must be 1 to 10000", "field": "limit"}})
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.get_sandbox_metrics("sbx_1", query={"limit": 0})
    assert bad.value.field == "limit"


def _sandbox_json(state: Literal["running", "stopped", "hibernated"]) -> t.SandboxJSON:
    return {
        "id": "sbx_1", "account_id": "acc_1", "project_id": "prj_1", "project": "default", "state": state,
        "image": "minimal", "size": {"vcpus": 1, "memory_mb": 512, "disk_gb": 1}, "no_env": False,
        "site": {"name": "l", "country": ""}, "created_at": "now",
    }


def test_stop_and_start_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/stop"] = (200, {}, _sandbox_json("stopped"))
    server.replies["/v1/sandboxes/sbx_1/start"] = (200, {}, _sandbox_json("running"))
    assert hb.stop_sandbox("sbx_1")["state"] == "stopped"
    assert hb.start_sandbox("sbx_1")["state"] == "running"
    hb.stop_sandbox("a/b")
    hb.start_sandbox("a/b", timeout=5)
    # The Sandbox's conveniences take the state from the reply.
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    assert box.stop() is box and box.state == "stopped"
    assert box.boot() is box and box.state == "running"
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/stop", None),
        ("POST", "/v1/sandboxes/sbx_1/start", None),
        ("POST", "/v1/sandboxes/a%2Fb/stop", None),
        ("POST", "/v1/sandboxes/a%2Fb/start", None),
        ("POST", "/v1/sandboxes/sbx_1/stop", None),
        ("POST", "/v1/sandboxes/sbx_1/start", None),
    ]
    assert harebox.Client.operations()["stopSandbox"] == "stop_sandbox"
    assert harebox.Client.operations()["startSandbox"] == "start_sandbox"
    with pytest.raises(ValueError):
        hb.stop_sandbox("")
    with pytest.raises(ValueError):
        hb.start_sandbox("")
    assert len(server.seen) == 6


def test_stop_and_start_errors(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/start"] = (
        409, {}, {"error": {"code": "conflict", "message": "sandbox sbx_1 is running; only a stopped sandbox starts"}})
    server.replies["/v1/sandboxes/sbx_1/stop"] = (
        409, {}, {"error": {"code": "conflict", "message": "sandbox sbx_1 is stopped"}})
    server.replies["/v1/sandboxes/sbx_2/start"] = (
        402, {}, {"error": {"code": "budget_exceeded", "message": "budget tiny has 0.00 left"}})
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    with pytest.raises(harebox.Conflict) as started:
        box.boot()
    assert (started.value.status, started.value.code) == (409, "conflict")
    assert box.state == "running"  # a refused call leaves the fields as they were
    with pytest.raises(harebox.Conflict):
        hb.stop_sandbox("sbx_1")
    with pytest.raises(harebox.BudgetExceeded) as refused:
        hb.start_sandbox("sbx_2")
    assert (refused.value.status, refused.value.code, refused.value.message) == (402, "budget_exceeded", "budget tiny has 0.00 left")


def test_hibernate_and_resume_routes(recorder: tuple[harebox.Client, type[_Recorder]], monkeypatch: pytest.MonkeyPatch) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/hibernate"] = (200, {}, _sandbox_json("hibernated"))
    server.replies["/v1/sandboxes/sbx_1/resume"] = (200, {}, _sandbox_json("running"))
    # Both are lifecycle calls: lifecycle_timeout unless the call gives its own.
    timeouts: list[float | None] = []
    send = hb._json

    def spy(*args: Any, **kwargs: Any) -> Any:
        timeouts.append(kwargs.get("timeout"))
        return send(*args, **kwargs)

    monkeypatch.setattr(hb, "_json", spy)
    hb.lifecycle_timeout = 123.0
    hibernated = hb.hibernate_sandbox("sbx_1")
    assert (hibernated["id"], hibernated["state"]) == ("sbx_1", "hibernated")
    assert hb.resume_sandbox("sbx_1")["state"] == "running"
    hb.hibernate_sandbox("a/b", timeout=5)
    assert timeouts == [123.0, 123.0, 5]
    # The Sandbox's conveniences take the state from the reply.
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    assert box.hibernate() is box and box.state == "hibernated"
    assert box.resume() is box and box.state == "running"
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/hibernate", None),
        ("POST", "/v1/sandboxes/sbx_1/resume", None),
        ("POST", "/v1/sandboxes/a%2Fb/hibernate", None),
        ("POST", "/v1/sandboxes/sbx_1/hibernate", None),
        ("POST", "/v1/sandboxes/sbx_1/resume", None),
    ]
    assert harebox.Client.operations()["hibernateSandbox"] == "hibernate_sandbox"
    assert harebox.Client.operations()["resumeSandbox"] == "resume_sandbox"
    with pytest.raises(ValueError):
        hb.hibernate_sandbox("")
    assert len(server.seen) == 5


def test_hibernate_and_resume_errors(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/hibernate"] = (
        400, {}, {"error": {"code": "invalid", "message": "sandbox sbx_1 was created with snapshots off", "field": "snapshots"}})
    server.replies["/v1/sandboxes/sbx_2/resume"] = (
        402, {}, {"error": {"code": "budget_exceeded", "message": "budget tiny has 0.00 left"}})
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    with pytest.raises(harebox.InvalidRequest) as off:
        box.hibernate()
    assert (off.value.status, off.value.field) == (400, "snapshots")
    assert box.state == "running"  # a refused call leaves the fields as they were
    with pytest.raises(harebox.BudgetExceeded) as refused:
        hb.resume_sandbox("sbx_2")
    assert (refused.value.status, refused.value.code) == (402, "budget_exceeded")


def test_sandbox_states_match_the_repository_document() -> None:
    """The SandboxJSON state Literal lists the document's State enum."""
    if not REPO_OPENAPI.is_file():
        pytest.skip("api/openapi.yaml is not beside this SDK")
    found = re.search(r"^    State:\n      type: string\n      enum: \[([^\]]*)\]", REPO_OPENAPI.read_text(), re.M)
    assert found, "no State schema in api/openapi.yaml"
    documented = tuple(re.split(r",\s*", found.group(1).strip()))
    assert "hibernated" in documented
    assert get_args(get_type_hints(t.SandboxJSON)["state"]) == documented


def _snapshot_json(snapshot_id: str = "snap_1") -> t.Snapshot:
    return {
        "id": snapshot_id, "name": "base", "account_id": "acc_1", "project_id": "prj_1", "sandbox_id": "sbx_1",
        "image": "minimal", "size": {"vcpus": 1, "memory_mb": 512, "disk_gb": 1}, "labels": {"role": "web"},
        "bytes": 536870912, "created_at": "2026-11-30T12:00:00Z",
    }


def _clone_json(sandbox_id: str, name: str) -> t.SandboxJSON:
    clone = _sandbox_json("running")
    clone["id"], clone["name"], clone["labels"] = sandbox_id, name, {"role": "web", "fork": "yes"}
    return clone


def test_fork_and_snapshot_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    clones: t.SandboxList = {"sandboxes": [_clone_json("sbx_2", "w-1"), _clone_json("sbx_3", "w-2")]}
    snap = _snapshot_json()
    listed: t.SnapshotList = {"snapshots": [snap, _snapshot_json("snap_2")]}
    server.replies["/v1/sandboxes/sbx_1/fork"] = (201, {}, clones)
    server.replies["/v1/sandboxes/sbx_1/snapshots"] = (201, {}, snap)
    server.replies["/v1/snapshots"] = (200, {}, listed)
    server.replies["/v1/snapshots/snap_1"] = (200, {}, snap)
    server.replies["/v1/snapshots/snap_2"] = (204, {}, None)
    server.replies["/v1/sandboxes"] = (201, {}, _clone_json("sbx_4", "restored"))
    fork: t.ForkRequest = {"count": 2, "name": "w", "labels": {"fork": "yes"}, "ttl_seconds": 600}
    assert hb.fork_sandbox("sbx_1", body=fork) == clones
    hb.fork_sandbox("a/b")
    named: t.SnapshotRequest = {"name": "base"}
    assert hb.create_snapshot("sbx_1", body=named) == snap
    hb.create_snapshot("a/b", timeout=5)
    assert hb.list_snapshots() == listed
    hb.list_snapshots(query={"sandbox": "sbx_1"})
    assert hb.get_snapshot("snap_1") == snap
    hb.get_snapshot("a/b")
    assert hb.delete_snapshot("snap_2") is None
    # The conveniences: the list itself, and a sandbox made from a snapshot.
    assert hb.snapshots() == listed["snapshots"]
    assert [s["id"] for s in hb.snapshots("sbx_1")] == ["snap_1", "snap_2"]
    box = hb.create(snapshot="snap_1", name="restored", image=None, size=None)
    assert isinstance(box, harebox.Sandbox) and (box.id, box.name) == ("sbx_4", "restored")
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/fork", fork),
        ("POST", "/v1/sandboxes/a%2Fb/fork", None),
        ("POST", "/v1/sandboxes/sbx_1/snapshots", {"name": "base"}),
        ("POST", "/v1/sandboxes/a%2Fb/snapshots", None),
        ("GET", "/v1/snapshots", None),
        ("GET", "/v1/snapshots?sandbox=sbx_1", None),
        ("GET", "/v1/snapshots/snap_1", None),
        ("GET", "/v1/snapshots/a%2Fb", None),
        ("DELETE", "/v1/snapshots/snap_2", None),
        ("GET", "/v1/snapshots", None),
        ("GET", "/v1/snapshots?sandbox=sbx_1", None),
        ("POST", "/v1/sandboxes", {"snapshot": "snap_1", "name": "restored"}),
    ]
    operations = harebox.Client.operations()
    assert {op: operations[op] for op in ("forkSandbox", "createSnapshot", "listSnapshots", "getSnapshot", "deleteSnapshot")} == {
        "forkSandbox": "fork_sandbox", "createSnapshot": "create_snapshot", "listSnapshots": "list_snapshots",
        "getSnapshot": "get_snapshot", "deleteSnapshot": "delete_snapshot",
    }
    for call in (hb.fork_sandbox, hb.create_snapshot, hb.get_snapshot, hb.delete_snapshot):
        with pytest.raises(ValueError):
            call("")
    assert len(server.seen) == 12


def test_sandbox_fork_and_snapshot(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/fork"] = (201, {}, {"sandboxes": [_clone_json("sbx_2", "w-1"), _clone_json("sbx_3", "w-2")]})
    server.replies["/v1/sandboxes/sbx_1/snapshots"] = (201, {}, _snapshot_json())
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    clones = box.fork(2, name="w", labels={"fork": "yes"}, ttl_seconds=600)
    assert all(isinstance(c, harebox.Sandbox) and c.client is hb for c in clones)
    assert [(c.id, c.name, c.state, c.labels) for c in clones] == [
        ("sbx_2", "w-1", "running", {"role": "web", "fork": "yes"}),
        ("sbx_3", "w-2", "running", {"role": "web", "fork": "yes"}),
    ]
    assert (box.id, box.state) == ("sbx_1", "running")  # the source is left as it was
    box.fork()
    box.fork(1, name=None)
    snap = box.snapshot("base")
    assert (snap["id"], snap["sandbox_id"], snap["bytes"], snap["size"]["memory_mb"]) == ("snap_1", "sbx_1", 536870912, 512)
    box.snapshot()
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/fork", {"count": 2, "name": "w", "labels": {"fork": "yes"}, "ttl_seconds": 600}),
        ("POST", "/v1/sandboxes/sbx_1/fork", {}),
        ("POST", "/v1/sandboxes/sbx_1/fork", {"count": 1}),
        ("POST", "/v1/sandboxes/sbx_1/snapshots", {"name": "base"}),
        ("POST", "/v1/sandboxes/sbx_1/snapshots", {}),
    ]


def test_fork_and_snapshot_errors(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/fork"] = (400, {}, {"error": {
        "code": "invalid", "message": "sandbox sbx_1 was created with snapshots off", "field": "snapshots"}})
    server.replies["/v1/sandboxes/sbx_1/snapshots"] = (409, {}, {"error": {
        "code": "conflict", "message": "sandbox sbx_1 is stopped: only a running or paused sandbox can be snapshotted"}})
    server.replies["/v1/snapshots/snap_1"] = (409, {}, {"error": {"code": "conflict", "message": "a create from snap_1 is in flight"}})
    server.replies["/v1/snapshots/snap_9"] = (404, {}, {"error": {"code": "not_found", "message": "no snapshot snap_9"}})
    server.replies["/v1/sandboxes"] = (400, {}, {"error": {
        "code": "invalid", "message": "a sandbox made from a snapshot has the snapshot's image and size", "field": "image"}})
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    with pytest.raises(harebox.InvalidRequest) as off:
        box.fork(3)
    assert (off.value.status, off.value.field) == (400, "snapshots")
    with pytest.raises(harebox.Conflict):
        box.snapshot()
    with pytest.raises(harebox.Conflict):
        hb.delete_snapshot("snap_1")
    with pytest.raises(harebox.NotFound):
        hb.get_snapshot("snap_9")
    with pytest.raises(harebox.InvalidRequest) as both:
        hb.create(snapshot="snap_1", image="minimal")
    assert both.value.field == "image"


def _url_json(url_id: str = "url_1", port: int = 8080, token: str | None = None) -> t.URL:
    """A URL of sbx_1 as the server shows it: with ``token`` (and its
    link) as create_url and rotate_url return it, else without."""
    host = f"https://{port}-1.ingress.example/"
    url: t.URL = {
        "id": url_id, "sandbox_id": "sbx_1", "account_id": "acc_1", "project_id": "prj_1", "port": port, "auth": "token",
        "url": host, "path_url": f"https://ingress.example/s/sbx_1/{port}/", "created_at": "2026-11-30T12:00:00Z",
    }
    if token is not None:
        url["token"], url["link"] = token, f"{host}?harebox_token={token}"
        if token != "hburl_first":
            url["rotated_at"] = "2026-11-30T13:00:00Z"
    return url


#: An oidc URL's rule.
_RULE: t.OIDCRule = {"issuer": "https://issuer.example", "audience": "harebox-web",
                     "emails": ["ada@example.com"], "groups": ["eng"]}


def _oidc_url_json(url_id: str = "url_3", port: int = 9000) -> t.URL:
    """An oidc URL of sbx_1 as the server shows it: with its rule, never a
    token or link."""
    url = _url_json(url_id, port)
    url["auth"], url["oidc"] = "oidc", _RULE
    return url


def test_url_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    created = _url_json(token="hburl_first")
    listed: t.URLList = {"urls": [_url_json(), _url_json("url_2", 3000)]}
    rotated = _url_json(token="hburl_second")
    server.replies["/v1/sandboxes/sbx_1/urls"] = (201, {}, created)
    server.replies["/v1/sandboxes/sbx_2/urls"] = (200, {}, listed)
    server.replies["/v1/sandboxes/sbx_1/urls/url_1"] = (200, {}, _url_json())
    server.replies["/v1/sandboxes/sbx_1/urls/url_1/rotate"] = (200, {}, rotated)
    server.replies["/v1/sandboxes/sbx_1/urls/url_9"] = (204, {}, None)
    request: t.URLRequest = {"port": 8080, "auth": "token"}
    url = hb.create_url("sbx_1", body=request)
    assert url == created
    assert (url["id"], url["port"], url["token"]) == ("url_1", 8080, "hburl_first")
    assert url["link"] == "https://8080-1.ingress.example/?harebox_token=hburl_first"
    hb.create_url("a/b", body={"port": 22}, timeout=5)
    urls = hb.list_urls("sbx_2")
    assert urls == listed
    assert [(u["id"], u["port"], "token" in u, "link" in u) for u in urls["urls"]] == [
        ("url_1", 8080, False, False), ("url_2", 3000, False, False)]
    got = hb.get_url("sbx_1", "url_1")
    assert got == _url_json() and "token" not in got
    again = hb.rotate_url("sbx_1", "url_1")
    assert again == rotated
    assert (again["token"], again["rotated_at"]) == ("hburl_second", "2026-11-30T13:00:00Z")
    assert again["link"].endswith("?harebox_token=hburl_second")
    hb.rotate_url("a/b", "url_1")
    assert hb.delete_url("sbx_1", "url_9") is None
    hb.delete_url("sbx_1", "../url_1")
    # An oidc URL: the rule goes in the body and comes back with the URL,
    # which has no token to show or rotate.
    server.replies["/v1/sandboxes/sbx_3/urls"] = (201, {}, _oidc_url_json())
    server.replies["/v1/sandboxes/sbx_3/urls/url_3"] = (200, {}, _oidc_url_json())
    server.replies["/v1/sandboxes/sbx_3/urls/url_3/rotate"] = (400, {}, {"error": {
        "code": "invalid", "message": "URL url_3 has no token to rotate (auth oidc)"}})
    oidc_request: t.URLRequest = {"port": 9000, "auth": "oidc", "oidc": _RULE}
    oidc = hb.create_url("sbx_3", body=oidc_request)
    assert oidc == _oidc_url_json()
    assert (oidc["auth"], oidc["oidc"], "token" in oidc, "link" in oidc) == ("oidc", _RULE, False, False)
    assert hb.get_url("sbx_3", "url_3")["oidc"]["emails"] == ["ada@example.com"]
    with pytest.raises(harebox.InvalidRequest) as no_token:
        hb.rotate_url("sbx_3", "url_3")
    assert no_token.value.status == 400
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/urls", {"port": 8080, "auth": "token"}),
        ("POST", "/v1/sandboxes/a%2Fb/urls", {"port": 22}),
        ("GET", "/v1/sandboxes/sbx_2/urls", None),
        ("GET", "/v1/sandboxes/sbx_1/urls/url_1", None),
        ("POST", "/v1/sandboxes/sbx_1/urls/url_1/rotate", None),
        ("POST", "/v1/sandboxes/a%2Fb/urls/url_1/rotate", None),
        ("DELETE", "/v1/sandboxes/sbx_1/urls/url_9", None),
        ("DELETE", "/v1/sandboxes/sbx_1/urls/..%2Furl_1", None),
        ("POST", "/v1/sandboxes/sbx_3/urls", {"port": 9000, "auth": "oidc", "oidc": {
            "issuer": "https://issuer.example", "audience": "harebox-web",
            "emails": ["ada@example.com"], "groups": ["eng"]}}),
        ("GET", "/v1/sandboxes/sbx_3/urls/url_3", None),
        ("POST", "/v1/sandboxes/sbx_3/urls/url_3/rotate", None),
    ]
    operations = harebox.Client.operations()
    assert {op: operations[op] for op in ("createURL", "listURLs", "getURL", "rotateURL", "deleteURL")} == {
        "createURL": "create_url", "listURLs": "list_urls", "getURL": "get_url", "rotateURL": "rotate_url",
        "deleteURL": "delete_url",
    }
    with pytest.raises(ValueError):
        hb.create_url("", body={"port": 8080})
    with pytest.raises(ValueError):
        hb.list_urls("")
    for call in (hb.get_url, hb.rotate_url, hb.delete_url):
        with pytest.raises(ValueError):
            call("sbx_1", "")
        with pytest.raises(ValueError):
            call("", "url_1")
    assert len(server.seen) == 11


def test_sandbox_urls(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/urls"] = (201, {}, _url_json(token="hburl_first"))
    server.replies["/v1/sandboxes/sbx_1/urls/url_1/rotate"] = (200, {}, _url_json(token="hburl_second"))
    server.replies["/v1/sandboxes/sbx_1/urls/url_1"] = (204, {}, None)
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    url = box.create_url(8080)
    assert (url["port"], url["token"], url["path_url"]) == (8080, "hburl_first", "https://ingress.example/s/sbx_1/8080/")
    box.create_url(8080, auth="token")
    server.replies["/v1/sandboxes/sbx_1/urls"] = (201, {}, _oidc_url_json())
    oidc = box.create_url(9000, auth="oidc", oidc=_RULE)
    assert (oidc["auth"], oidc["oidc"], oidc.get("token"), oidc.get("link")) == ("oidc", _RULE, None, None)
    server.replies["/v1/sandboxes/sbx_1/urls"] = (200, {}, {"urls": [_url_json(), _oidc_url_json()]})
    assert [(u["id"], u["auth"], u.get("oidc")) for u in box.list_urls()["urls"]] == [
        ("url_1", "token", None), ("url_3", "oidc", _RULE)]
    assert box.rotate_url("url_1")["token"] == "hburl_second"
    assert box.delete_url("url_1") is None
    server.replies["/v1/sandboxes/sbx_1/urls/url_1"] = (200, {}, _url_json())
    assert box.get_url("url_1")["url"] == "https://8080-1.ingress.example/"
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/urls", {"port": 8080}),
        ("POST", "/v1/sandboxes/sbx_1/urls", {"port": 8080, "auth": "token"}),
        ("POST", "/v1/sandboxes/sbx_1/urls", {"port": 9000, "auth": "oidc", "oidc": _RULE}),
        ("GET", "/v1/sandboxes/sbx_1/urls", None),
        ("POST", "/v1/sandboxes/sbx_1/urls/url_1/rotate", None),
        ("DELETE", "/v1/sandboxes/sbx_1/urls/url_1", None),
        ("GET", "/v1/sandboxes/sbx_1/urls/url_1", None),
    ]


def test_url_errors(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/sandboxes/sbx_1/urls"] = (409, {}, {"error": {
        "code": "conflict", "message": "port 8080 of sbx_1 is published already", "field": "port"}})
    server.replies["/v1/sandboxes/sbx_2/urls"] = (400, {}, {"error": {
        "code": "invalid", "message": "must be at most 65535", "field": "port"}})
    server.replies["/v1/sandboxes/sbx_3/urls"] = (503, {}, {"error": {
        "code": "unavailable", "message": "this server has no ingress (start hareboxd with --ingress-listen)"}})
    server.replies["/v1/sandboxes/sbx_1/urls/url_9/rotate"] = (404, {}, {"error": {
        "code": "not_found", "message": 'no URL "url_9" on sandbox sbx_1'}})
    with pytest.raises(harebox.Conflict) as taken:
        harebox.Sandbox(hb, _sandbox_json("running")).create_url(8080)
    assert (taken.value.status, taken.value.field) == (409, "port")
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.create_url("sbx_2", body={"port": 65536})
    assert bad.value.field == "port"
    with pytest.raises(harebox.Unavailable):
        hb.create_url("sbx_3", body={"port": 8080})
    with pytest.raises(harebox.NotFound):
        hb.rotate_url("sbx_1", "url_9")


#: A CA certificate, as PEM text (its bytes do not matter here).
_CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBcaCA\n-----END CERTIFICATE-----\n"


def _ca_json(uploaded: bool = False) -> t.URLCA:
    """The URL CA of prj_1 as the server shows it."""
    return {"project_id": "prj_1", "certificate": _CA_PEM, "uploaded": uploaded, "created_at": "2026-11-30T12:00:00Z"}


def _cert_json(serial: str = "0a1b", *, issued: bool = True, key: bool = False, revoked: bool = False) -> t.ClientCert:
    """A client certificate's record as the server shows it: with its PEM
    and key (``key``) as issue_client_cert returns it, else without."""
    cert: t.ClientCert = {"project_id": "prj_1", "serial": serial, "issued": issued, "created_at": "2026-11-30T12:00:00Z"}
    if issued:
        cert["name"], cert["not_after"] = "ada", "2027-02-28T12:00:00Z"
    if key:
        cert["certificate"] = "-----BEGIN CERTIFICATE-----\nMIIBada\n-----END CERTIFICATE-----\n"
        cert["private_key"] = "-----BEGIN PRIVATE KEY-----\nMIGHada\n-----END PRIVATE KEY-----\n"
    if revoked:
        cert["revoked_at"] = "2026-12-01T09:00:00Z"
    return cert


def test_url_ca_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/url-ca"] = (200, {}, _ca_json())
    server.replies["/v1/url-ca?project=old"] = (204, {}, None)
    ca = hb.get_url_ca()
    assert ca == _ca_json()
    assert (ca["certificate"], ca["uploaded"]) == (_CA_PEM, False)
    hb.get_url_ca(project="web", account="acme")
    assert hb.set_url_ca(project="web") == _ca_json()  # no certificate: the server makes a new CA
    server.replies["/v1/url-ca"] = (200, {}, _ca_json(uploaded=True))
    assert hb.set_url_ca(_CA_PEM, project="web", account="acme")["uploaded"] is True
    hb.set_url_ca(certificate=_CA_PEM, timeout=5)
    assert hb.delete_url_ca(project="old") is None
    # Issue: the key is in this reply only.
    issued = _cert_json(key=True)
    server.replies["/v1/url-ca/certs"] = (201, {}, issued)
    cert = hb.issue_client_cert("ada", ttl="720h", project="web")
    assert cert == issued
    assert (cert["serial"], cert["name"], cert["issued"]) == ("0a1b", "ada", True)
    assert cert["private_key"].startswith("-----BEGIN PRIVATE KEY-----")
    hb.issue_client_cert("ada", account="acme")
    # List: the records, without keys, as a list.
    listed: t.ClientCertList = {"certs": [_cert_json(), _cert_json("ff", issued=False, revoked=True)]}
    server.replies["/v1/url-ca/certs"] = (200, {}, listed)
    certs = hb.list_client_certs(project="web")
    assert certs == listed["certs"]
    assert [(c["serial"], c["issued"], c.get("revoked_at"), "private_key" in c) for c in certs] == [
        ("0a1b", True, None, False), ("ff", False, "2026-12-01T09:00:00Z", False)]
    server.replies["/v1/url-ca/certs"] = (200, {}, {"certs": None})
    assert hb.list_client_certs() == []
    server.replies["/v1/url-ca/certs/0a1b/revoke"] = (200, {}, _cert_json(revoked=True))
    revoked = hb.revoke_client_cert("0a1b", project="web", account="acme")
    assert revoked == _cert_json(revoked=True) and revoked["revoked_at"] == "2026-12-01T09:00:00Z"
    hb.revoke_client_cert("0a:1b")
    hb.revoke_client_cert("../0a1b")
    assert server.seen == [
        ("GET", "/v1/url-ca", None),
        ("GET", "/v1/url-ca?project=web&account=acme", None),
        ("PUT", "/v1/url-ca?project=web", {}),
        ("PUT", "/v1/url-ca?project=web&account=acme", {"certificate": _CA_PEM}),
        ("PUT", "/v1/url-ca", {"certificate": _CA_PEM}),
        ("DELETE", "/v1/url-ca?project=old", None),
        ("POST", "/v1/url-ca/certs?project=web", {"name": "ada", "ttl": "720h"}),
        ("POST", "/v1/url-ca/certs?account=acme", {"name": "ada"}),
        ("GET", "/v1/url-ca/certs?project=web", None),
        ("GET", "/v1/url-ca/certs", None),
        ("POST", "/v1/url-ca/certs/0a1b/revoke?project=web&account=acme", None),
        ("POST", "/v1/url-ca/certs/0a%3A1b/revoke", None),
        ("POST", "/v1/url-ca/certs/..%2F0a1b/revoke", None),
    ]
    operations = harebox.Client.operations()
    names = ("getURLCA", "setURLCA", "deleteURLCA", "issueClientCert", "listClientCerts", "revokeClientCert")
    assert {op: operations[op] for op in names} == {
        "getURLCA": "get_url_ca", "setURLCA": "set_url_ca", "deleteURLCA": "delete_url_ca",
        "issueClientCert": "issue_client_cert", "listClientCerts": "list_client_certs",
        "revokeClientCert": "revoke_client_cert",
    }
    # An empty certificate is never sent: the server would take it for
    # none and make a new CA. Nor is an empty serial.
    for bad in ("", " \n"):
        with pytest.raises(ValueError):
            hb.set_url_ca(bad)
    with pytest.raises(ValueError):
        hb.revoke_client_cert("")
    assert len(server.seen) == 13


def test_url_ca_errors(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    server.replies["/v1/url-ca?project=none"] = (404, {}, {"error": {
        "code": "not_found", "message": "project none has no URL CA"}})
    server.replies["/v1/url-ca/certs?project=uploaded"] = (409, {}, {"error": {
        "code": "conflict", "message": "the project's URL CA was uploaded: issue its certificates yourself"}})
    server.replies["/v1/url-ca/certs?project=web"] = (400, {}, {"error": {
        "code": "invalid", "message": "at most 8760h", "field": "ttl"}})
    server.replies["/v1/url-ca/certs/dead/revoke"] = (404, {}, {"error": {
        "code": "not_found", "message": "project default has no URL CA"}})
    with pytest.raises(harebox.NotFound):
        hb.get_url_ca(project="none")
    with pytest.raises(harebox.NotFound):
        hb.delete_url_ca(project="none")
    with pytest.raises(harebox.Conflict) as uploaded:
        hb.issue_client_cert("ada", project="uploaded")
    assert uploaded.value.status == 409
    with pytest.raises(harebox.InvalidRequest) as too_long:
        hb.issue_client_cert("ada", ttl="9000h", project="web")
    assert too_long.value.field == "ttl"
    with pytest.raises(harebox.NotFound):
        hb.revoke_client_cert("dead")


def test_mtls_urls(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    mtls = _url_json("url_4", 8443)
    mtls["auth"] = "mtls"
    server.replies["/v1/sandboxes/sbx_1/urls"] = (201, {}, mtls)
    request: t.URLRequest = {"port": 8443, "auth": "mtls"}
    assert hb.create_url("sbx_1", body=request) == mtls
    url = harebox.Sandbox(hb, _sandbox_json("running")).create_url(8443, auth="mtls")
    assert (url["auth"], url["project_id"]) == ("mtls", "prj_1")
    assert server.seen == [
        ("POST", "/v1/sandboxes/sbx_1/urls", {"port": 8443, "auth": "mtls"}),
        ("POST", "/v1/sandboxes/sbx_1/urls", {"port": 8443, "auth": "mtls"}),
    ]


def test_url_auth_matches_the_repository_document() -> None:
    """The URLRequest auth Literal lists the document's enum."""
    if not REPO_OPENAPI.is_file():
        pytest.skip("api/openapi.yaml is not beside this SDK")
    found = re.search(r"^    URLRequest:\n(?:      .*\n)*?        auth: \{type: string, enum: \[([^\]]*)\]", REPO_OPENAPI.read_text(), re.M)
    assert found, "no URLRequest auth enum in api/openapi.yaml"
    assert get_args(get_type_hints(t.URLRequest)["auth"]) == tuple(re.split(r",\s*", found.group(1).strip()))


def test_budget_actions_match_the_repository_document() -> None:
    """The Budget and BudgetRequest action Literals list the document's enum."""
    if not REPO_OPENAPI.is_file():
        pytest.skip("api/openapi.yaml is not beside this SDK")
    enums = {tuple(re.split(r",\s*", m)) for m in re.findall(r"enum:\s*\[([^\]]*\bdeny_new\b[^\]]*)\]", REPO_OPENAPI.read_text())}
    assert len(enums) == 1, enums
    (documented,) = enums
    assert "stop" in documented
    for typed in (t.BudgetRequest, t.Budget):
        assert get_args(get_type_hints(typed)["action"]) == documented, typed.__name__


def test_ready_returns_a_not_ready_answer(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, handler = recorder
    handler.replies["/ready"] = (200, {}, {"status": "ready", "checks": {"database": "ok", "hypervisor": "ok"}})
    assert hb.get_ready()["status"] == "ready"
    # 503 is an answer here, not an error: it says which part is not ready.
    down = {"status": "not_ready", "checks": {"database": "ok", "hypervisor": "unavailable"}}
    handler.replies["/ready"] = (503, {}, down)
    assert hb.get_ready() == down
    # Any other failure still raises.
    handler.replies["/ready"] = (500, {}, {"code": "internal", "message": "boom"})
    with pytest.raises(harebox.HareBoxError):
        hb.get_ready()
    assert [p for _, p, _ in handler.seen] == ["/ready"] * 3


PROCESS_EXIT = {"exit_code": 5, "stdout": "", "stderr": "", "duration_ms": 1204, "timed_out": False,
                "stdout_truncated": False, "stderr_truncated": False}


def _chunk(name: str, offset: int, data: bytes) -> str:
    return f"event: {name}\ndata: " + json.dumps({"offset": offset, "data": base64.b64encode(data).decode()})


def test_process_output_reads_chunks_offsets_and_exit(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    sse = {"Content-Type": "text/event-stream"}
    # A followed stream from stdout_offset=3: a keepalive, chunks of both
    # streams (stdout skips from 6 to 10: the agent dropped 4 bytes), an
    # event for a newer client, then the exit.
    server.replies["/v1/sandboxes/sbx_1/processes/proc_1/output"] = (200, sse, _sse(
        ": keepalive",
        _chunk("stdout", 3, b"lo\n"),
        _chunk("stderr", 0, b"err\n"),
        _chunk("stdout", 10, b"\xff\x00"),
        "event: hello\ndata: {}",
        "event: exit\ndata: " + json.dumps(PROCESS_EXIT),
    ))
    stream = hb.get_process_output("sbx_1", "proc_1", query={"follow": True, "stdout_offset": 3, "stderr_offset": 0})
    assert (stream.stdout_offset, stream.stderr_offset) == (3, 0)
    events = list(stream)
    assert events == [
        ("stdout", t.OutputChunk(3, b"lo\n")),
        ("stderr", t.OutputChunk(0, b"err\n")),
        ("stdout", t.OutputChunk(10, b"\xff\x00")),
        ("exit", PROCESS_EXIT),
    ]
    assert all(isinstance(e, harebox.ExecEvent) for e in events)
    assert [e.payload.end for e in events[:3]] == [6, 4, 12]
    assert events[2].payload.offset - events[0].payload.end == 4  # the bytes dropped between
    assert (stream.stdout_offset, stream.stderr_offset) == (12, 4)  # where to resume
    assert list(stream) == []  # closed after the exit
    assert server.seen == [("GET", "/v1/sandboxes/sbx_1/processes/proc_1/output?follow=true&stdout_offset=3&stderr_offset=0", None)]
    assert server.accepts == ["text/event-stream"]

    # Path parameters are escaped; query values are encoded as any query's.
    server.replies["/v1/sandboxes/a%2Fb/processes/p%3F1/output"] = (200, sse, b"")
    assert list(hb.get_process_output("a/b", "p?1", query={"follow": False, "stdout_offset": None, "stderr_offset": "7"})) == []
    assert server.seen[-1] == ("GET", "/v1/sandboxes/a%2Fb/processes/p%3F1/output?follow=false&stderr_offset=7", None)
    with pytest.raises(ValueError):
        hb.get_process_output("sbx_1", "")
    assert harebox.Client.operations()["getProcessOutput"] == "get_process_output"


def test_process_output_without_follow_ends_with_what_is_kept(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    sse = {"Content-Type": "text/event-stream"}
    partial = _sse(_chunk("stdout", 0, b"one\n"), _chunk("stderr", 0, b"two\n"))
    server.replies["/v1/sandboxes/sbx_1/processes/proc_1/output"] = (200, sse, partial)
    # Without follow, a stream that ends without an exit is the process
    # still running: a quiet end.
    with hb.get_process_output("sbx_1", "proc_1") as stream:
        assert list(stream) == [("stdout", t.OutputChunk(0, b"one\n")), ("stderr", t.OutputChunk(0, b"two\n"))]
    assert (stream.stdout_offset, stream.stderr_offset) == (4, 4)
    # With follow, only the exit or an error ends it: the end is an error.
    followed = hb.get_process_output("sbx_1", "proc_1", query={"follow": "true"})
    assert next(followed) == ("stdout", t.OutputChunk(0, b"one\n"))
    assert next(followed).name == "stderr"
    with pytest.raises(harebox.TransportError, match="process output: the stream ended before the exit event"):
        next(followed)
    assert list(followed) == []
    # The Sandbox's convenience follows by default and sends only the
    # offsets it is given.
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    with box.process_output("proc_1") as conv:
        with pytest.raises(harebox.TransportError, match="ended before the exit event"):
            list(conv)
    with box.process_output("proc_1", follow=False, stdout_offset=4, stderr_offset=2, timeout=5) as conv:
        assert (conv.stdout_offset, conv.stderr_offset) == (4, 2)
        # A chunk never starts before the offset asked for (the server
        # sends from there on): one that does is not the API talking.
        with pytest.raises(harebox.TransportError, match="a stdout chunk at offset 0 goes back before 4"):
            next(conv)
    assert [path for _, path, _ in server.seen] == [
        "/v1/sandboxes/sbx_1/processes/proc_1/output",
        "/v1/sandboxes/sbx_1/processes/proc_1/output?follow=true",
        "/v1/sandboxes/sbx_1/processes/proc_1/output?follow=true",
        "/v1/sandboxes/sbx_1/processes/proc_1/output?stdout_offset=4&stderr_offset=2",
    ]


def test_process_output_errors(recorder: tuple[harebox.Client, type[_Recorder]], monkeypatch: pytest.MonkeyPatch) -> None:
    hb, server = recorder
    sse = {"Content-Type": "text/event-stream"}
    base = "/v1/sandboxes/sbx_1/processes/proc_1/output"
    # An error after the stream began is an error event: it raises its
    # HareBoxError after the chunks before it.
    server.replies[base] = (200, sse, _sse(
        _chunk("stdout", 0, b"partial\n"),
        'event: error\ndata: {"error": {"code": "unavailable", "message": "the agent went away"}}',
    ))
    stream = hb.get_process_output("sbx_1", "proc_1", query={"follow": True})
    assert next(stream) == ("stdout", t.OutputChunk(0, b"partial\n"))
    with pytest.raises(harebox.Unavailable) as broke:
        next(stream)
    assert (broke.value.status, broke.value.code, broke.value.message) == (503, "unavailable", "the agent went away")
    assert list(stream) == []
    # Errors before the stream are the API's JSON replies, raised by the call.
    server.replies["/v1/sandboxes/sbx_1/processes/proc_9/output"] = (
        404, {}, {"error": {"code": "not_found", "message": "no process proc_9"}})
    with pytest.raises(harebox.NotFound):
        hb.get_process_output("sbx_1", "proc_9")
    server.replies[base + "?stdout_offset=-1"] = (
        400, {}, {"error": {"code": "invalid", "message": "must be a byte offset", "field": "stdout_offset"}})
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.get_process_output("sbx_1", "proc_1", query={"stdout_offset": -1})
    assert bad.value.field == "stdout_offset"
    server.replies[base + "?follow=yes"] = (403, {}, {"error": {"code": "forbidden", "message": "may not getProcessOutput"}})
    with pytest.raises(harebox.Forbidden):
        hb.get_process_output("sbx_1", "proc_1", query={"follow": "yes"})
    # Chunks that are not the API's raise TransportError and close the stream.
    hostile = [
        ('event: stdout\ndata: {"offset": -1, "data": ""}', "offset is not a byte offset"),
        ('event: stdout\ndata: {"offset": true, "data": ""}', "offset is not a byte offset"),
        ('event: stderr\ndata: {"offset": "0", "data": ""}', "offset is not a byte offset"),
        ('event: stdout\ndata: {"data": "aGk="}', "KeyError"),
        ('event: stdout\ndata: {"offset": 0, "data": "not base64!"}', "process output: Error"),
        (_chunk("stdout", 5, b"ab") + "\n\n" + _chunk("stdout", 6, b"c"), "a stdout chunk at offset 6 goes back before 7"),
        ("event: exit\ndata: [1]", "the exit event is not a JSON object"),
        ("event: stdout\ndata: {oops", "JSONDecodeError"),
    ]
    for block, message in hostile:
        server.replies[base] = (200, sse, _sse(block))
        stream = hb.get_process_output("sbx_1", "proc_1", query={"follow": True})
        with pytest.raises(harebox.TransportError, match=message):
            list(stream)
        assert list(stream) == []
    # What is read is bounded as in every stream: an event line past the
    # limit (16 MiB, made small here) raises rather than grows.
    monkeypatch.setattr(harebox.client, "_MAX_EVENT_LINE", 64)
    server.replies[base] = (200, sse, _sse(_chunk("stdout", 0, b"x" * 100)))
    with pytest.raises(harebox.TransportError, match="process output: an event line is too long or cut short"):
        list(hb.get_process_output("sbx_1", "proc_1"))


#: A chart's bytes, as a cell's result carries them (base64 on the wire).
CHART = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x90\x00\x00\x01,\x08\x06\x00\x00\x00"
CHART_RESULT: t.CodeResult = {"is_main_result": False, "text": "<Figure size 400x300 with 1 Axes>",
                              "png": base64.b64encode(CHART).decode(), "width": 400, "height": 300}
MAIN_RESULT: t.CodeResult = {"is_main_result": True, "text": "42", "json": None}
CODE_ERROR: t.CodeError = {"name": "ZeroDivisionError", "value": "division by zero",
                           "traceback": "Traceback (most recent call last):\n  return 1 / 0\nZeroDivisionError: division by zero"}


def _execution(**fields: Any) -> t.CodeExecution:
    x: dict[str, Any] = {"context_id": "default", "execution_count": 3, "status": "ok", "stdout": "", "stderr": "",
                         "results": [], "duration_ms": 12, "stdout_truncated": False, "stderr_truncated": False}
    x.update(fields)
    return x  # type: ignore[return-value]


def test_run_code_returns_the_cell_with_its_results_decoded(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    done = _execution(stdout="plotted\n", results=[CHART_RESULT, MAIN_RESULT], results_dropped=1)
    server.replies["/v1/sandboxes/sbx_1/code"] = (200, {}, done)
    # The operation returns the API's JSON as it is.
    assert hb.run_code("sbx_1", body={"code": "x + 1"}) == done
    assert server.seen[-1] == ("POST", "/v1/sandboxes/sbx_1/code", {"code": "x + 1"})
    assert server.accepts[-1] == "application/json"
    # The Sandbox's run_code sends the fields it is given, and decodes.
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    x = box.run_code("x + 1", context="ctx-1", language="python", env={"A": "1"}, timeout=10)
    assert server.seen[-1] == ("POST", "/v1/sandboxes/sbx_1/code",
                               {"code": "x + 1", "context_id": "ctx-1", "language": "python", "env": {"A": "1"}, "timeout_seconds": 10})
    assert isinstance(x, harebox.Execution)
    assert (x.context_id, x.execution_count, x.status, x.stdout, x.stderr, x.error) == ("default", 3, "ok", "plotted\n", "", None)
    assert (x.duration_ms, x.stdout_truncated, x.stderr_truncated, x.results_dropped) == (12, False, False, 1)
    assert x.text == "42" and x.main_result is x.results[1]
    chart, main = x.results
    assert all(isinstance(r, harebox.Result) for r in x.results)
    assert chart.png == CHART and chart.png.startswith(b"\x89PNG\r\n\x1a\n")
    assert (chart.width, chart.height, chart.is_main_result, chart.jpeg, chart.html) == (400, 300, False, None, None)
    assert chart.formats() == ["text", "png"]
    assert main.formats() == ["text", "json"] and main.json is None  # a null JSON value is still a format
    assert "<" + str(len(CHART)) + " bytes>" in repr(chart) and "IHDR" not in repr(chart)
    assert chart.to_dict() == CHART_RESULT and x.to_dict() == done
    # A context may be given as the CodeContext create_code_context returned.
    box.run_code("1", context={"id": "ctx-2", "language": "python", "cwd": "/home/user"})
    assert server.seen[-1][2] == {"code": "1", "context_id": "ctx-2"}
    # The cell's exception is data, not a raise.
    server.replies["/v1/sandboxes/sbx_1/code"] = (200, {}, _execution(status="error", error=CODE_ERROR))
    failed = box.run_code("f()")
    assert failed.status == "error" and failed.text is None and failed.results == []
    assert failed.error == harebox.ExecutionError("ZeroDivisionError", "division by zero", CODE_ERROR["traceback"])
    assert failed.error.to_dict() == CODE_ERROR
    # The call waits for the cell's timeout, the server's grace and the margin.
    assert hb._code_timeout({"code": "1"}) == 300 + 30 + hb.exec_margin
    assert hb._code_timeout({"code": "1", "timeout_seconds": 5}) == 5 + 30 + hb.exec_margin
    assert harebox.Client.operations()["runCode"] == "run_code"


def _code_events(*events: tuple[str, Any]) -> bytes:
    return _sse(*(f"event: {name}\ndata: " + json.dumps(data) for name, data in events))


def test_run_code_streams_to_the_callbacks_in_order(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    sse = {"Content-Type": "text/event-stream"}
    end = _execution(status="error", error=CODE_ERROR, execution_count=4)
    server.replies["/v1/sandboxes/sbx_1/code"] = (200, sse, _code_events(
        ("stdout", {"text": "a\n"}),
        ("stderr", {"text": "warning\n"}),
        ("result", CHART_RESULT),
        ("hello", {}),  # an event for a newer client
        ("stdout", {"text": "b\n"}),
        ("result", MAIN_RESULT),
        ("exception", CODE_ERROR),
        ("end", end),
    ) + b": keepalive\n\n")
    # The client's stream yields the events as the API sends them.
    with hb.run_code_stream("sbx_1", body={"code": "run()"}) as stream:
        events = list(stream)
    assert events == [("stdout", "a\n"), ("stderr", "warning\n"), ("result", CHART_RESULT), ("stdout", "b\n"),
                      ("result", MAIN_RESULT), ("exception", CODE_ERROR), ("end", end)]
    assert all(isinstance(e, harebox.CodeEvent) for e in events)
    assert server.accepts[-1] == "text/event-stream"
    assert list(stream) == []  # closed after the end
    # The Sandbox's run_code streams when it is given a callback.
    calls: list[tuple[str, Any]] = []
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    x = box.run_code(
        "run()",
        timeout=20,
        on_stdout=lambda text: calls.append(("stdout", text)),
        on_stderr=lambda text: calls.append(("stderr", text)),
        on_result=lambda result: calls.append(("result", result)),
        on_error=lambda error: calls.append(("error", error)),
    )
    assert server.seen[-1] == ("POST", "/v1/sandboxes/sbx_1/code", {"code": "run()", "timeout_seconds": 20})
    assert server.accepts[-1] == "text/event-stream"
    assert [name for name, _ in calls] == ["stdout", "stderr", "result", "stdout", "result", "error"]
    assert [calls[0][1], calls[1][1], calls[3][1]] == ["a\n", "warning\n", "b\n"]
    assert calls[2][1].png == CHART and calls[4][1].text == "42"
    assert calls[5][1] == harebox.ExecutionError("ZeroDivisionError", "division by zero", CODE_ERROR["traceback"])
    # The Execution has what was streamed, and the end's own fields.
    assert (x.stdout, x.stderr, x.status, x.execution_count, x.text) == ("a\nb\n", "warning\n", "error", 4, "42")
    assert x.results == [calls[2][1], calls[4][1]] and x.error == calls[5][1]
    # One callback is enough to stream; the others are left out.
    printed: list[str] = []
    assert box.run_code("run()", on_stdout=printed.append).stdout == "a\nb\n"
    assert printed == ["a\n", "b\n"] and server.accepts[-1] == "text/event-stream"


def test_run_code_stream_errors(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    sse = {"Content-Type": "text/event-stream"}
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    # An error after the stream began is an error event: it raises its
    # HareBoxError after the events before it.
    server.replies["/v1/sandboxes/sbx_1/code"] = (200, sse, _code_events(
        ("stdout", {"text": "partial\n"}),
        ("error", {"error": {"code": "unavailable", "message": "the sandbox's code interpreter answered wrongly"}}),
        ("stdout", {"text": "never read\n"}),
    ))
    stream = hb.run_code_stream("sbx_1", body={"code": "1"})
    assert next(stream) == ("stdout", "partial\n")
    with pytest.raises(harebox.Unavailable) as broke:
        next(stream)
    assert (broke.value.status, broke.value.code) == (503, "unavailable")
    assert list(stream) == []
    printed: list[str] = []
    with pytest.raises(harebox.Unavailable, match="answered wrongly"):
        box.run_code("1", on_stdout=printed.append)
    assert printed == ["partial\n"]
    # A stream that ends before the end event is not a quiet end.
    server.replies["/v1/sandboxes/sbx_1/code"] = (200, sse, _code_events(("stdout", {"text": "a"})))
    with pytest.raises(harebox.TransportError, match="code stream ended before the end event"):
        box.run_code("1", on_stdout=printed.append)
    # Events that are not the API's raise TransportError.
    for block, message in [
        (("stdout", {"text": 5}), "a stdout event's text is not a string"),
        (("result", [1]), "the result event is not a JSON object"),
        (("end", "done"), "the end event is not a JSON object"),
        (("stderr", {}), "KeyError"),
    ]:
        server.replies["/v1/sandboxes/sbx_1/code"] = (200, sse, _code_events(block))
        with pytest.raises(harebox.TransportError, match=message):
            list(hb.run_code_stream("sbx_1", body={"code": "1"}))
    # Errors before the stream are the API's JSON replies, raised by the call.
    server.replies["/v1/sandboxes/sbx_1/code"] = (409, {}, {"error": {
        "code": "conflict", "message": "sandbox sbx_1 has no code interpreter: its image (minimal) has none"}})
    with pytest.raises(harebox.Conflict):
        hb.run_code_stream("sbx_1", body={"code": "1"})
    with pytest.raises(harebox.Conflict):
        box.run_code("1", on_error=print)
    with pytest.raises(harebox.Conflict):
        box.run_code("1")
    server.replies["/v1/sandboxes/sbx_1/code"] = (400, {}, {"error": {
        "code": "invalid", "message": "a context ID is 1 to 64 of [a-z0-9-]", "field": "context_id"}})
    with pytest.raises(harebox.InvalidRequest) as bad:
        box.run_code("1", context="Bad!", on_stdout=print)
    assert bad.value.field == "context_id"


def test_code_context_routes(recorder: tuple[harebox.Client, type[_Recorder]]) -> None:
    hb, server = recorder
    ctx: t.CodeContext = {"id": "c1", "language": "bash", "cwd": "/tmp"}
    default: t.CodeContext = {"id": "default", "language": "python", "cwd": "/home/user"}
    server.replies["/v1/sandboxes/sbx_1/code/contexts"] = (200, {}, {"contexts": [default, ctx]})
    server.replies["/v1/sandboxes/sbx_1/code/contexts/c1/restart"] = (200, {}, ctx)
    server.replies["/v1/sandboxes/sbx_1/code/contexts/c1"] = (204, {}, None)
    server.replies["/v1/sandboxes/a%2Fb/code/contexts/c%3F1"] = (204, {}, None)
    assert hb.list_code_contexts("sbx_1") == {"contexts": [default, ctx]}
    hb.create_code_context("sbx_1", body={"language": "bash", "cwd": "/tmp"})
    hb.create_code_context("sbx_1")
    assert hb.restart_code_context("sbx_1", "c1") == ctx
    assert hb.delete_code_context("sbx_1", "c1") is None
    assert hb.delete_code_context("a/b", "c?1") is None  # path parameters are escaped
    box = harebox.Sandbox(hb, _sandbox_json("running"))
    assert box.code_contexts() == [default, ctx]
    server.replies["/v1/sandboxes/sbx_1/code/contexts"] = (201, {}, ctx)
    assert box.create_code_context(language="bash", cwd="/tmp", env={"A": "1"}) == ctx
    box.create_code_context()
    assert box.restart_code_context("c1") == ctx
    assert box.delete_code_context("c1") is None
    assert server.seen == [
        ("GET", "/v1/sandboxes/sbx_1/code/contexts", None),
        ("POST", "/v1/sandboxes/sbx_1/code/contexts", {"language": "bash", "cwd": "/tmp"}),
        ("POST", "/v1/sandboxes/sbx_1/code/contexts", {}),
        ("POST", "/v1/sandboxes/sbx_1/code/contexts/c1/restart", None),
        ("DELETE", "/v1/sandboxes/sbx_1/code/contexts/c1", None),
        ("DELETE", "/v1/sandboxes/a%2Fb/code/contexts/c%3F1", None),
        ("GET", "/v1/sandboxes/sbx_1/code/contexts", None),
        ("POST", "/v1/sandboxes/sbx_1/code/contexts", {"language": "bash", "cwd": "/tmp", "env": {"A": "1"}}),
        ("POST", "/v1/sandboxes/sbx_1/code/contexts", {}),
        ("POST", "/v1/sandboxes/sbx_1/code/contexts/c1/restart", None),
        ("DELETE", "/v1/sandboxes/sbx_1/code/contexts/c1", None),
    ]
    with pytest.raises(ValueError):
        hb.restart_code_context("sbx_1", "")
    server.replies["/v1/sandboxes/sbx_1/code/contexts/gone"] = (404, {}, {"error": {"code": "not_found", "message": "no context gone"}})
    with pytest.raises(harebox.NotFound):
        box.delete_code_context("gone")
    ops = harebox.Client.operations()
    assert [ops[o] for o in ("listCodeContexts", "createCodeContext", "restartCodeContext", "deleteCodeContext")] == [
        "list_code_contexts", "create_code_context", "restart_code_context", "delete_code_context"]
