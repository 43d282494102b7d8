"""The HareBox REST client: one method per OpenAPI operation.

Each operation method is named after its operationId in snake_case, takes
the path parameters positionally and the query string and body as the
``query=`` and ``body=`` keywords, so the OpenAPI document doubles as the
reference for this client. The URL CA methods (get_url_ca, set_url_ca,
delete_url_ca, issue_client_cert, list_client_certs, revoke_client_cert)
take their few query parameters and body fields as keywords instead.
``Client.create`` and the ``Sandbox`` object are the conveniences on top.

It speaks HTTP with http.client directly, not urllib: no redirects to
follow (a redirect would carry the API key to another host), no proxy
settings picked up from the environment, and full control of timeouts
and of the event stream.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import socket
import time
import ssl
from typing import IO, Any, Callable, Generic, Iterator, Mapping, NamedTuple, Protocol, Self, TypeVar, Union, cast
from urllib.parse import quote, urlencode, urlsplit

from . import types as t
from .errors import HareBoxError, RequestTimeout, TransportError, error_from_body, parse_retry_after
from .pty import Pty, UpgradeResponse, check_upgrade, new_key, upgrade_headers
from .sandbox import Sandbox

__all__ = ["Client", "CodeEvent", "CodeStream", "ExecEvent", "ExecStream", "ProcessOutputStream", "Pty", "DEFAULT_URL"]

#: Where the client goes when neither ``url`` nor HAREBOX_URL says.
DEFAULT_URL = "http://127.0.0.1:7070"

USER_AGENT = "harebox-python/1.0.0"

#: The server's default command timeout (ExecRequest.timeout_seconds).
_DEFAULT_EXEC_SECONDS = 300.0
#: The server's default cell timeout (CodeRequest.timeout_seconds).
_DEFAULT_CODE_SECONDS = 300.0
#: How long past a cell's timeout the server waits for the code
#: interpreter to say it interrupted the cell.
_CODE_GRACE_SECONDS = 30.0
#: The server's default wait for get_process(wait=true).
_DEFAULT_WAIT_SECONDS = 60.0
#: Bounds one server-sent-event line; output arrives in far smaller pieces.
_MAX_EVENT_LINE = 16 << 20
#: Bounds how much of a non-API error reply is kept for the message.
_MAX_ERROR_BODY = 64 << 10

#: What write_file accepts: bytes, text (sent as UTF-8) or a binary file.
FileData = Union[bytes, bytearray, memoryview, str, IO[bytes]]

F = TypeVar("F", bound=Callable[..., Any])
#: The events a stream yields.
E = TypeVar("E")


def operation(operation_id: str) -> Callable[[F], F]:
    """Marks a method as the client of one OpenAPI operation, so a test can
    check that the client and the document list the same operations."""

    def mark(method: F) -> F:
        setattr(method, "operation_id", operation_id)
        return method

    return mark


class ExecEvent(NamedTuple):
    """One event of exec_stream: ``("stdout", bytes)``, ``("stderr",
    bytes)`` or, last, ``("exit", ExecResult)``; of get_process_output:
    the same with an OutputChunk (offset, data) in place of the bytes."""

    name: str
    payload: Any


class CodeEvent(NamedTuple):
    """One event of run_code_stream: ``("stdout", str)`` and ``("stderr",
    str)`` as the cell writes, ``("result", CodeResult)`` for each rich
    result, ``("exception", CodeError)`` for the exception the cell
    raised, then, last, ``("end", CodeExecution)`` (its stdout, stderr
    and results empty: they were streamed)."""

    name: str
    payload: Any


class Client:
    """A client of one HareBox server.

    ``url`` and ``api_key`` default to $HAREBOX_URL and $HAREBOX_API_KEY.
    Every request has a timeout: ``timeout`` for quick calls,
    ``lifecycle_timeout`` for calls that boot, stop, hibernate or freeze a
    VM, start or restart a code context, move a whole file or verify the
    whole audit log, for exec the command's own timeout plus
    ``exec_margin``, and for run_code the cell's own timeout plus the 30 s
    the server gives the interpreter to interrupt it plus ``exec_margin``.
    Each operation also takes ``timeout=`` to override it for one call.

    ``ca`` (default $HAREBOX_CA) sets whom an https:// server is trusted
    as; it is ignored for http:// URLs. It is either the path of a PEM
    file of CA certificates, which then are the only roots trusted (the
    host name is still verified), or ``"sha256:"`` and the SHA-256
    fingerprint of the server's certificate (64 hex digits, any case,
    ``:`` between bytes allowed), which the certificate must match on
    every connection; the chain and host name are then not checked.
    Unset or empty, the system's trust store is used. A bad value raises
    ValueError here; a server that is not trusted fails its request with
    TransportError, before the request (and its API key) is sent.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        lifecycle_timeout: float = 600.0,
        exec_margin: float = 30.0,
        ca: str | None = None,
    ) -> None:
        url = url or os.environ.get("HAREBOX_URL") or DEFAULT_URL
        api_key = api_key if api_key is not None else os.environ.get("HAREBOX_API_KEY")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"HareBox URL must be http:// or https://, not {parts.scheme or 'no scheme'!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            # Credentials go in api_key, never in a URL that gets printed.
            raise ValueError("HareBox URL must not carry credentials, a query or a fragment")
        if not parts.hostname:
            raise ValueError(f"HareBox URL {url!r} has no host")
        if api_key is not None and (not api_key or not api_key.isascii() or not api_key.isprintable() or " " in api_key):
            # Checked here so http.client never echoes the key in its error.
            raise ValueError("HareBox API key must be non-empty printable ASCII without spaces")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout
        self.lifecycle_timeout = lifecycle_timeout
        self.exec_margin = exec_margin
        self._ca: str | None = None  # the trust in force, for repr and errors
        self._ca_name = "ca"
        self._pin: bytes | None = None
        self._tls: ssl.SSLContext | None = None
        if self._https:
            self._ca_name = "ca" if ca is not None else "HAREBOX_CA"
            self._ca = (ca if ca is not None else os.environ.get("HAREBOX_CA")) or None
            self._tls, self._pin = _trust(self._ca, self._ca_name)

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs and tracebacks. The CA file
        # or fingerprint is no secret.
        ca = f", ca={self._ca!r}" if self._ca else ""
        return f"Client(url={self.url!r}, api_key={'<set>' if self._api_key else None}{ca})"

    @classmethod
    def operations(cls) -> dict[str, str]:
        """Maps every operationId this client implements to its method name."""
        found: dict[str, str] = {}
        for name in dir(cls):
            op = getattr(getattr(cls, name), "operation_id", None)
            if isinstance(op, str):
                found[op] = name
        return found

    # --- conveniences -------------------------------------------------

    def create(self, *, timeout: float | None = None, **fields: Any) -> Sandbox:
        """Creates a sandbox from keyword fields of CreateRequest (name,
        size, image, ttl_seconds, labels, account_id, project, fleet,
        firewall, monitoring, snapshots, snapshot, environment,
        third_party, no_env, mesh, site, country, env); None means unset. Returns once the
        sandbox runs. ``snapshot="snap_..."`` makes it from that snapshot
        (memory, processes and disk as they were) instead of booting the
        image: image and size come from the snapshot (give neither), and
        project, fleet, environment pin, firewall policy, labels and the
        source's own env default to the source's."""
        body = {k: v for k, v in fields.items() if v is not None}
        return Sandbox(self, self.create_sandbox(body=body, timeout=timeout))

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """Fetches an existing sandbox as a Sandbox object."""
        return Sandbox(self, self.get_sandbox(sandbox_id))

    def snapshots(self, sandbox: str | None = None, *, timeout: float | None = None) -> list[t.Snapshot]:
        """The snapshots the caller sees, oldest first (list_snapshots);
        with ``sandbox`` (an ID), only that source sandbox's."""
        return self.list_snapshots(query={"sandbox": sandbox}, timeout=timeout)["snapshots"]

    # --- server -------------------------------------------------------

    @operation("getHealth")
    def get_health(self, *, timeout: float | None = None) -> t.Health:
        """GET /health: liveness; needs no key."""
        return cast(t.Health, self._json("GET", "/health", timeout=timeout))

    @operation("getReady")
    def get_ready(self, *, timeout: float | None = None) -> t.Readiness:
        """GET /ready: whether the server can serve now; needs no key.
        ``status`` is ``ready`` or ``not_ready`` (the server answered 503),
        and ``checks`` gives each part (``database``, ``hypervisor``, and
        ``network`` where the server has a sandbox network) as ``ok`` or
        ``unavailable``."""
        return cast(t.Readiness, self._json("GET", "/ready", timeout=timeout, ok=(503,)))

    @operation("getOpenAPI")
    def get_open_api(self, *, timeout: float | None = None) -> dict[str, Any]:
        """GET /openapi.json: the API's contract; needs no key."""
        return cast("dict[str, Any]", self._json("GET", "/openapi.json", timeout=timeout))

    @operation("getInfo")
    def get_info(self, *, timeout: float | None = None) -> t.Info:
        """GET /v1/info: server version, hypervisor backend and site."""
        return cast(t.Info, self._json("GET", "/v1/info", timeout=timeout))

    # --- sandboxes ----------------------------------------------------

    @operation("createSandbox")
    def create_sandbox(self, *, body: t.Body, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes: boots a VM; returns once its agent answers."""
        return cast(t.SandboxJSON, self._json("POST", "/v1/sandboxes", body=body, timeout=timeout or self.lifecycle_timeout))

    @operation("listSandboxes")
    def list_sandboxes(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.SandboxList:
        """GET /v1/sandboxes: oldest first; query ``state``, ``label``
        (a list of "key=value", all required), ``project`` and ``fleet``
        (IDs or names)."""
        return cast(t.SandboxList, self._json("GET", "/v1/sandboxes", query=query, timeout=timeout))

    @operation("getSandbox")
    def get_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """GET /v1/sandboxes/{id}: deleted sandboxes too."""
        return cast(t.SandboxJSON, self._json("GET", _path("/v1/sandboxes/{}", sandbox_id), timeout=timeout))

    @operation("deleteSandbox")
    def delete_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """DELETE /v1/sandboxes/{id}: destroys the sandbox's data key first
        (its disk, console log, env and command history are encrypted under
        it, unless the server runs with --plaintext-disks), then its VM,
        files and network."""
        return cast(
            t.SandboxJSON,
            self._json("DELETE", _path("/v1/sandboxes/{}", sandbox_id), timeout=timeout or self.lifecycle_timeout),
        )

    @operation("pauseSandbox")
    def pause_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes/{id}/pause: freezes a running sandbox."""
        return cast(
            t.SandboxJSON,
            self._json("POST", _path("/v1/sandboxes/{}/pause", sandbox_id), timeout=timeout or self.lifecycle_timeout),
        )

    @operation("resumeSandbox")
    def resume_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes/{id}/resume: continues a paused sandbox, or
        restores a hibernated one from its files (admitted again as a
        create is: host capacity, budgets)."""
        return cast(
            t.SandboxJSON,
            self._json("POST", _path("/v1/sandboxes/{}/resume", sandbox_id), timeout=timeout or self.lifecycle_timeout),
        )

    @operation("stopSandbox")
    def stop_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes/{id}/stop: shuts a running or paused sandbox
        down, keeping its disk, data key and record (state ``stopped``);
        start_sandbox boots it again on that disk. What ran in it is gone.
        A stopped sandbox holds no host capacity and is charged for its
        disk only."""
        return cast(
            t.SandboxJSON,
            self._json("POST", _path("/v1/sandboxes/{}/stop", sandbox_id), timeout=timeout or self.lifecycle_timeout),
        )

    @operation("startSandbox")
    def start_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes/{id}/start: boots a stopped sandbox again on
        its disk; admitted as a create is (host capacity, budgets:
        BudgetExceeded). Conflict for a sandbox that is not stopped, or
        that stopped on its own (its VM exited: its disk is gone)."""
        return cast(
            t.SandboxJSON,
            self._json("POST", _path("/v1/sandboxes/{}/start", sandbox_id), timeout=timeout or self.lifecycle_timeout),
        )

    @operation("hibernateSandbox")
    def hibernate_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes/{id}/hibernate: writes a running or paused
        sandbox's memory, device state and disk to encrypted files on the
        host's disk (under its data key), stops its VMM and gives up its
        network (state ``hibernated``): it holds no host RAM and is charged
        for its disk only. resume_sandbox restores it, also after hareboxd
        restarts or the host reboots. Refused for a sandbox created with
        ``snapshots=False``."""
        return cast(
            t.SandboxJSON,
            self._json("POST", _path("/v1/sandboxes/{}/hibernate", sandbox_id), timeout=timeout or self.lifecycle_timeout),
        )

    # --- forks and snapshots --------------------------------------------
    # A sandbox created with ``snapshots=False`` refuses both.

    @operation("setSandboxTimeout")
    def set_sandbox_timeout(self, sandbox_id: str, ttl_seconds: int, *, timeout: float | None = None) -> t.SandboxJSON:
        """POST /v1/sandboxes/{id}/timeout: the sandbox expires
        ``ttl_seconds`` from now (the TTL reaper deletes it then), or never
        for 0; it replaces the TTL it had, shorter or longer."""
        path = _path("/v1/sandboxes/{}/timeout", sandbox_id)
        return cast(
            t.SandboxJSON,
            self._json("POST", path, body={"ttl_seconds": ttl_seconds}, timeout=timeout or self.lifecycle_timeout),
        )

    @operation("moveSandbox")
    def move_sandbox(self, sandbox_id: str, to: str, *, timeout: float | None = None) -> t.MoveResult:
        """POST /v1/sandboxes/{id}/move (the operator only): moves a
        running, paused, hibernated or stopped sandbox to host ``to`` of
        the deployment, as it was (its processes run on; a stopped one's
        disk goes); returns it (on its
        new host), ``from``, ``to`` and ``paused_ms``, how long it did not
        run. Refused before anything happens when the host is down, lacks
        the same image build or has no room, and for a sandbox with
        volumes."""
        path = _path("/v1/sandboxes/{}/move", sandbox_id)
        return cast(t.MoveResult, self._json("POST", path, body={"to": to}, timeout=timeout or self.lifecycle_timeout))

    @operation("forkSandbox")
    def fork_sandbox(self, sandbox_id: str, *, body: t.Body | None = None, timeout: float | None = None) -> t.SandboxList:
        """POST /v1/sandboxes/{id}/fork: makes ``count`` new sandboxes
        (default 1) from a running or paused sandbox. It is paused only
        while one snapshot is written, then each clone is restored from it
        with its own ID, data key, machine-id, fresh kernel entropy,
        network (the source's firewall policy copied), placeholders and CA.
        Every clone is made or none is; the reply lists them, running.
        ``body`` (optional): ``count``, ``name`` (the clones are named
        NAME-1 ... NAME-count), ``labels`` (added to the source's) and
        ``ttl_seconds``; see ForkRequest."""
        path = _path("/v1/sandboxes/{}/fork", sandbox_id)
        return cast(t.SandboxList, self._json("POST", path, body=body, timeout=timeout or self.lifecycle_timeout))

    @operation("createSnapshot")
    def create_snapshot(self, sandbox_id: str, *, body: t.Body | None = None, timeout: float | None = None) -> t.Snapshot:
        """POST /v1/sandboxes/{id}/snapshots: snapshots a running or paused
        sandbox (memory, device state, its disk's writes); it is paused
        only while the snapshot is written. ``body={"name": ...}`` (unique
        in the account) is optional. The snapshot is written under a random
        key of its own (the sandbox's key does not open it) and outlives
        the sandbox; ``create(snapshot=ID)`` makes a sandbox from it."""
        path = _path("/v1/sandboxes/{}/snapshots", sandbox_id)
        return cast(t.Snapshot, self._json("POST", path, body=body, timeout=timeout or self.lifecycle_timeout))

    @operation("listSnapshots")
    def list_snapshots(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.SnapshotList:
        """GET /v1/snapshots: the snapshots the caller sees, oldest first;
        query ``sandbox`` keeps only that source sandbox's."""
        return cast(t.SnapshotList, self._json("GET", "/v1/snapshots", query=query, timeout=timeout))

    @operation("getSnapshot")
    def get_snapshot(self, snapshot_id: str, *, timeout: float | None = None) -> t.Snapshot:
        """GET /v1/snapshots/{snapshot}: a snapshot (snap_...)."""
        return cast(t.Snapshot, self._json("GET", _path("/v1/snapshots/{}", snapshot_id), timeout=timeout))

    @operation("deleteSnapshot")
    def delete_snapshot(self, snapshot_id: str, *, timeout: float | None = None) -> None:
        """DELETE /v1/snapshots/{snapshot}: erases the snapshot's key, then
        removes its files. Sandboxes made from it keep running (they need
        nothing of it); a create from it in flight makes this fail
        (Conflict)."""
        self._json("DELETE", _path("/v1/snapshots/{}", snapshot_id), timeout=timeout)

    # --- hosts ---------------------------------------------------------------

    @operation("listHosts")
    def list_hosts(self, *, timeout: float | None = None) -> t.HostList:
        """GET /v1/hosts (the operator only): the hosts of the deployment
        (hareboxd that share a PostgreSQL store), up or down, with what they
        run and their leases."""
        return cast(t.HostList, self._json("GET", "/v1/hosts", timeout=timeout))

    @operation("deleteHost")
    def delete_host(self, name: str, *, timeout: float | None = None) -> t.HostRemoval:
        """DELETE /v1/hosts/{name} (the operator only): takes a host that is
        down out of the deployment for good; its sandboxes that are not
        deleted become deleted (data keys erased) and snapshots of them go.
        Conflict while the host is up or its lease has not lapsed."""
        return cast(t.HostRemoval, self._json("DELETE", _path("/v1/hosts/{}", name), timeout=timeout))

    @operation("rotateMeshKey")
    def rotate_mesh_key(self, name: str, *, timeout: float | None = None) -> t.HostName:
        """POST /v1/hosts/{name}/mesh-key (the operator only): has the host
        make a new key for its end of the mesh's tunnels; the other hosts
        take its new public key. Conflict for a host without a mesh tunnel."""
        return cast(t.HostName, self._json("POST", _path("/v1/hosts/{}/mesh-key", name), timeout=timeout))

    @operation("drainHost")
    def drain_host(self, name: str, *, timeout: float | None = 3600) -> t.DrainReport:
        """POST /v1/hosts/{name}/drain (the operator only): the host takes
        no new sandbox, and its running, paused, hibernated and stopped
        sandboxes move one by one to the hosts placement picks; returns
        what moved where (``moved``) and what stayed, with why
        (``stayed``). It stays draining until undrain_host."""
        return cast(t.DrainReport, self._json("POST", _path("/v1/hosts/{}/drain", name), timeout=timeout))

    @operation("undrainHost")
    def undrain_host(self, name: str, *, timeout: float | None = None) -> t.HostName:
        """POST /v1/hosts/{name}/undrain (the operator only): new sandboxes
        may go to the host again."""
        return cast(t.HostName, self._json("POST", _path("/v1/hosts/{}/undrain", name), timeout=timeout))

    # --- the warm pool ---------------------------------------------------------

    @operation("getPool")
    def get_pool(self, *, timeout: float | None = None) -> t.Pool:
        """GET /v1/pool (the operator only): the warm pool as the host that
        answers keeps it: ``pool`` (``"IMAGE:PRESET"`` -> idle sandboxes
        kept), ``source`` (``"deployment"`` or ``"host"``: its own hareboxd
        --pool) and ``idle`` (how many it holds now)."""
        return cast(t.Pool, self._json("GET", "/v1/pool", timeout=timeout))

    @operation("setPool")
    def set_pool(self, pool: dict[str, int], *, timeout: float | None = None) -> t.Pool:
        """PUT /v1/pool (the operator only): makes ``pool`` (for example
        ``{"default:small": 2}``; ``{}`` keeps none) the warm pool of every
        host of the deployment, in place of each host's hareboxd --pool.
        Invalid for an image the answering host does not have."""
        return cast(t.Pool, self._json("PUT", "/v1/pool", body=cast(t.Body, {"pool": pool}), timeout=timeout))

    @operation("resetPool")
    def reset_pool(self, *, timeout: float | None = None) -> t.Pool:
        """DELETE /v1/pool (the operator only): removes the deployment's
        pool; each host keeps its own hareboxd --pool again."""
        return cast(t.Pool, self._json("DELETE", "/v1/pool", timeout=timeout))

    # --- images --------------------------------------------------------------

    @operation("listImages")
    def list_images(self, *, timeout: float | None = None) -> t.ImageList:
        """GET /v1/images: the images sandboxes can be created from (each
        name's newest build), by name."""
        return cast(t.ImageList, self._json("GET", "/v1/images", timeout=timeout))

    @operation("buildImage")
    def build_image(self, *, body: t.ImageBuildRequest, timeout: float | None = None) -> t.Image:
        """POST /v1/images (the operator only): builds an image from an OCI
        image in a registry, ``body={"name": "myimg", "from":
        "registry:REF"}``, and returns it once built (minutes for a large
        image; the default timeout is 30 minutes)."""
        return cast(t.Image, self._json("POST", "/v1/images", body=cast(t.Body, body), timeout=timeout or 1800))

    @operation("deleteImage")
    def delete_image(self, name: str, *, timeout: float | None = None) -> None:
        """DELETE /v1/images/{name} (the operator only): removes every build
        of an image; Conflict while a sandbox or snapshot uses it, and for
        the built-in images."""
        self._json("DELETE", _path("/v1/images/{}", name), timeout=timeout)

    # --- published ports (URLs) ------------------------------------------
    # A port is published on the server's ingress behind a token (``hburl_...``),
    # which a client sends in the ``X-HareBox-Token`` header or as
    # ``Authorization: Bearer``, or gets as a cookie by visiting the URL's
    # ``link``; or behind OpenID Connect (auth "oidc"): an ID token its rule
    # allows, as ``Authorization: Bearer``; or behind client certificates
    # (auth "mtls"): a TLS client certificate signed by the project's URL CA
    # and not revoked. The ingress takes a token or ID token off every
    # request before it reaches the guest. The token is in the create_url
    # and rotate_url replies only.

    @operation("createURL")
    def create_url(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> t.URL:
        """POST /v1/sandboxes/{id}/urls: publishes a TCP port of the sandbox
        as a URL on the server's ingress (``body={"port": 8080}``, 1 to
        65535; see URLRequest). The guest's port is reached only through the
        ingress. ``"auth": "token"`` (the default) puts it behind a token:
        the URL is returned with its ``token`` and ``link``, shown only here
        and by rotate_url. ``"auth": "oidc"`` with ``"oidc": {"issuer",
        "audience", "subjects", "emails", "groups"}`` (an https issuer and
        at least one of the last three; see OIDCRule) puts it behind
        OpenID Connect: the ingress takes an ID token as ``Authorization:
        Bearer`` (an invalid one is refused with 401, one the rule does not
        allow with 403, and 503 when the issuer cannot be reached); the URL
        has no token and no link. A rule without auth oidc, or a missing or
        bad one with it, is InvalidRequest. ``"auth": "mtls"`` puts it
        behind TLS client certificates: the ingress takes one signed by the
        project's URL CA (set_url_ca) and not revoked; host form only, so
        the ingress's host must be a name. A port published already is
        Conflict; a server without an ingress answers Unavailable."""
        path = _path("/v1/sandboxes/{}/urls", sandbox_id)
        return cast(t.URL, self._json("POST", path, body=body, timeout=timeout))

    @operation("listURLs")
    def list_urls(self, sandbox_id: str, *, timeout: float | None = None) -> t.URLList:
        """GET /v1/sandboxes/{id}/urls: the sandbox's URLs, oldest first
        (without tokens)."""
        return cast(t.URLList, self._json("GET", _path("/v1/sandboxes/{}/urls", sandbox_id), timeout=timeout))

    @operation("getURL")
    def get_url(self, sandbox_id: str, url_id: str, *, timeout: float | None = None) -> t.URL:
        """GET /v1/sandboxes/{id}/urls/{url_id}: a URL (url_...), without its token."""
        return cast(t.URL, self._json("GET", _path("/v1/sandboxes/{}/urls/{}", sandbox_id, url_id), timeout=timeout))

    @operation("rotateURL")
    def rotate_url(self, sandbox_id: str, url_id: str, *, timeout: float | None = None) -> t.URL:
        """POST /v1/sandboxes/{id}/urls/{url_id}/rotate: gives a token URL a
        new token, atomically: when this returns, the new token works, every
        request sent with the old one is refused, and requests, event
        streams, WebSockets and HTTP/1.1 keep-alive connections opened with the old
        one are cut. Returns the URL with its new ``token`` and ``link``. An
        oidc URL has no token: InvalidRequest (400)."""
        path = _path("/v1/sandboxes/{}/urls/{}/rotate", sandbox_id, url_id)
        return cast(t.URL, self._json("POST", path, timeout=timeout))

    @operation("deleteURL")
    def delete_url(self, sandbox_id: str, url_id: str, *, timeout: float | None = None) -> None:
        """DELETE /v1/sandboxes/{id}/urls/{url_id}: unpublishes the URL: its
        port is closed to the ingress again, and requests, streams and
        WebSockets its token opened are cut."""
        self._json("DELETE", _path("/v1/sandboxes/{}/urls/{}", sandbox_id, url_id), timeout=timeout)

    # --- the URL certificate authority and client certificates ----------
    # An ``mtls`` URL takes a TLS client certificate signed by its project's
    # URL CA and not revoked. These methods name the project and, for the
    # operator, the account as keywords (sent as the query's ``project``
    # and ``account``; None: the account's default project, and the default
    # account or the key's own), and the body's fields as arguments.

    @operation("getURLCA")
    def get_url_ca(self, *, project: str | None = None, account: str | None = None, timeout: float | None = None) -> t.URLCA:
        """GET /v1/url-ca: the project's URL certificate authority, the CA
        its mtls URLs check client certificates against: its
        ``certificate`` (PEM) and whether it was ``uploaded``. NotFound
        when the project has none."""
        return cast(t.URLCA, self._json("GET", "/v1/url-ca", query=_project_query(project, account), timeout=timeout))

    @operation("setURLCA")
    def set_url_ca(
        self,
        certificate: str | None = None,
        *,
        project: str | None = None,
        account: str | None = None,
        timeout: float | None = None,
    ) -> t.URLCA:
        """PUT /v1/url-ca: sets the project's URL certificate authority.
        ``certificate`` (a CA certificate, PEM) uploads it: you issue its
        client certificates yourself. None sends no certificate: the server
        makes a new CA (ECDSA P-256, its key sealed in the server's secret
        store) that issue_client_cert issues from. The old CA's
        certificates stop working unless the new CA has its key, and
        requests and connections they opened are cut; revocations stay. An empty ``certificate`` raises
        ValueError, so that it is never taken for none. Returns the CA."""
        body: dict[str, Any] = {}
        if certificate is not None:
            if not isinstance(certificate, str) or not certificate.strip():
                raise ValueError("set_url_ca: certificate must be a CA certificate (PEM text), or None for the server to make a new CA")
            body["certificate"] = certificate
        query = _project_query(project, account)
        return cast(t.URLCA, self._json("PUT", "/v1/url-ca", query=query, body=body, timeout=timeout))

    @operation("deleteURLCA")
    def delete_url_ca(self, *, project: str | None = None, account: str | None = None, timeout: float | None = None) -> None:
        """DELETE /v1/url-ca: deletes the project's URL certificate
        authority and its key: its mtls URLs refuse every client until a
        new one is set. Revocations stay."""
        self._json("DELETE", "/v1/url-ca", query=_project_query(project, account), timeout=timeout)

    @operation("issueClientCert")
    def issue_client_cert(
        self,
        name: str,
        *,
        ttl: str | None = None,
        project: str | None = None,
        account: str | None = None,
        timeout: float | None = None,
    ) -> t.ClientCert:
        """POST /v1/url-ca/certs: issues a client certificate (ECDSA P-256,
        extended key usage clientAuth) from the project's CA, which the
        server made (an uploaded CA: Conflict). ``name`` is its
        subject's common name (up to 64 characters), ``ttl`` how long it is
        valid, a Go duration such as ``"720h"`` (None: the server's
        default, 2160h; at most 8760h). Returns it with its ``serial``,
        ``certificate`` and ``private_key`` (PEM, PKCS#8): the key is in
        this reply only, the server does not keep it."""
        body: dict[str, Any] = {"name": name}
        if ttl is not None:
            body["ttl"] = ttl
        query = _project_query(project, account)
        return cast(t.ClientCert, self._json("POST", "/v1/url-ca/certs", query=query, body=body, timeout=timeout))

    @operation("listClientCerts")
    def list_client_certs(
        self, *, project: str | None = None, account: str | None = None, timeout: float | None = None
    ) -> list[t.ClientCert]:
        """GET /v1/url-ca/certs: the certificates the project issued and
        the serials it revoked, oldest first, without keys (the list under
        the reply's ``certs``; empty when there are none)."""
        query = _project_query(project, account)
        reply = cast(t.ClientCertList, self._json("GET", "/v1/url-ca/certs", query=query, timeout=timeout))
        return reply.get("certs") or []

    @operation("revokeClientCert")
    def revoke_client_cert(
        self, serial: str, *, project: str | None = None, account: str | None = None, timeout: float | None = None
    ) -> t.ClientCert:
        """POST /v1/url-ca/certs/{serial}/revoke: revokes a client
        certificate by its serial number (hex, issued here or by an
        uploaded CA): when this returns, the project's mtls URLs refuse it,
        and requests, streams, WebSockets and HTTP/1.1 connections it
        opened are cut. Returns the revoked certificate's record."""
        path = _path("/v1/url-ca/certs/{}/revoke", serial)
        return cast(t.ClientCert, self._json("POST", path, query=_project_query(project, account), timeout=timeout))

    # --- exec and processes --------------------------------------------

    @operation("exec")
    def exec(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> t.ExecResult:
        """POST /v1/sandboxes/{id}/exec: runs a command (``cmd`` or ``argv``)
        and waits for it. ``body["stdin"]`` is base64 text."""
        return cast(
            t.ExecResult,
            self._json("POST", _path("/v1/sandboxes/{}/exec", sandbox_id), body=body, timeout=timeout or self._exec_timeout(body)),
        )

    @operation("execStream")
    def exec_stream(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> ExecStream:
        """POST /v1/sandboxes/{id}/exec/stream: runs a command and yields its
        output as it comes, as ExecEvent(name, payload) tuples: ``stdout``
        and ``stderr`` with bytes, then ``exit`` with the ExecResult. An
        ``error`` event raises. Errors before the stream (no such sandbox,
        a bad request) raise here, not on the first iteration."""
        deadline = timeout or self._exec_timeout(body)
        conn, resp = self._send("POST", _path("/v1/sandboxes/{}/exec/stream", sandbox_id), body=body, timeout=deadline)
        return ExecStream(conn, resp)

    @operation("startProcess")
    def start_process(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> t.Process:
        """POST /v1/sandboxes/{id}/processes: starts a command in the
        background; ``body["keep_stdin"]`` keeps its stdin open for
        send_process_input, ``body["tag"]`` names it in lists."""
        return cast(t.Process, self._json("POST", _path("/v1/sandboxes/{}/processes", sandbox_id), body=body, timeout=timeout))

    @operation("listProcesses")
    def list_processes(self, sandbox_id: str, *, timeout: float | None = None) -> t.ProcessList:
        """GET /v1/sandboxes/{id}/processes: the background processes."""
        return cast(t.ProcessList, self._json("GET", _path("/v1/sandboxes/{}/processes", sandbox_id), timeout=timeout))

    @operation("getProcess")
    def get_process(
        self, sandbox_id: str, process_id: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Process:
        """GET /v1/sandboxes/{id}/processes/{pid}; with query ``wait`` true it
        waits up to ``timeout_seconds`` (default 60) for the process to exit."""
        if timeout is None and query and query.get("wait"):
            timeout = _seconds(query.get("timeout_seconds"), _DEFAULT_WAIT_SECONDS) + self.exec_margin
        path = _path("/v1/sandboxes/{}/processes/{}", sandbox_id, process_id)
        return cast(t.Process, self._json("GET", path, query=query, timeout=timeout))

    @operation("getProcessOutput")
    def get_process_output(
        self, sandbox_id: str, process_id: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> ProcessOutputStream:
        """GET /v1/sandboxes/{id}/processes/{pid}/output: a background
        process's output as the guest's agent keeps it (the last 4 MiB of
        each stream), from query ``stdout_offset`` and ``stderr_offset``
        (bytes already seen, default 0) on. Yields ExecEvent(name,
        payload) tuples: ``stdout`` and ``stderr`` with an OutputChunk
        (offset, data), then ``exit`` with the ExecResult (stdout and
        stderr empty) once the process has ended. An ``error`` event
        raises its HareBoxError. Without query ``follow`` the stream ends
        when what is kept has been sent (no ``exit`` while the process
        runs); with ``follow`` true it goes on until the process ends, and
        a stream that ends before the ``exit`` raises TransportError
        (resume from the stream's ``stdout_offset`` and
        ``stderr_offset``). ``timeout`` (default the client's) bounds each
        wait for a byte; while following, the server sends a keepalive
        every 15 s. Errors before the stream (no such sandbox or process,
        a bad offset) raise here, not on the first iteration."""
        q = query or {}
        path = _path("/v1/sandboxes/{}/processes/{}/output", sandbox_id, process_id)
        conn, resp = self._send("GET", path, query=query, accept="text/event-stream", timeout=timeout)
        offsets = (_offset(q.get("stdout_offset")), _offset(q.get("stderr_offset")))
        return ProcessOutputStream(conn, resp, follow=_query_true(q.get("follow")), offsets=offsets)

    @operation("openPty")
    def open_pty(self, sandbox_id: str, *, query: t.Query | None = None, timeout: float | None = None) -> Pty:
        """GET /v1/sandboxes/{id}/pty: an interactive terminal in the
        sandbox, over a WebSocket: the user's login shell, or query
        ``cmd`` (a shell string), on a pseudo-terminal of query ``rows``
        by ``cols`` (1 to 1000; default 24 by 80); also ``user``, ``cwd``
        and ``timeout_seconds`` (ends the session after that long; default
        none). Returns a Pty to write to and read from (see Pty). Errors
        before the session (no such sandbox, a bad size, a key that may
        not) raise here. ``timeout`` (default the client's) bounds
        connecting, the server's answer to the upgrade and each later
        write; reads wait as Pty.read says."""
        path = _path("/v1/sandboxes/{}/pty", sandbox_id)
        deadline = timeout or self.timeout
        key = new_key()
        conn, resp = self._send(
            "GET", path, query=query, timeout=deadline, extra_headers=upgrade_headers(key), response_class=UpgradeResponse
        )
        try:
            check_upgrade(resp, key, f"GET {path}")
        except HareBoxError:
            _close(conn, resp)
            raise
        # The WebSocket owns the socket now, with what came after the reply.
        sock = cast(socket.socket, conn.sock)
        conn.sock = None
        buffered = bytes(cast(UpgradeResponse, resp).reader.buffer)
        resp.close()
        return Pty(sock, buffered, timeout=deadline, what=f"terminal of {sandbox_id}")

    @operation("killProcess")
    def kill_process(
        self, sandbox_id: str, process_id: str, *, body: t.Body | None = None, timeout: float | None = None
    ) -> None:
        """POST /v1/sandboxes/{id}/processes/{pid}/kill: signals the process
        group; ``body={"signal": 15}``, SIGKILL without a body."""
        path = _path("/v1/sandboxes/{}/processes/{}/kill", sandbox_id, process_id)
        self._json("POST", path, body=body, timeout=timeout)

    @operation("sendProcessInput")
    def send_process_input(
        self,
        sandbox_id: str,
        process_id: str,
        *,
        stdin: bytes | str | None = None,
        eof: bool = False,
        rows: int | None = None,
        cols: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """POST /v1/sandboxes/{id}/processes/{pid}/input: gives a running
        background process (its stdin kept open at its start) a terminal
        size (``rows`` with ``cols``), then ``stdin`` bytes (a str is
        UTF-8; at most 1 MiB), then, with ``eof``, their end."""
        body: dict[str, object] = {}
        if stdin is not None:
            raw = stdin.encode() if isinstance(stdin, str) else stdin
            body["stdin"] = base64.b64encode(raw).decode()
        if eof:
            body["eof"] = True
        if rows is not None or cols is not None:
            body["rows"], body["cols"] = rows, cols
        path = _path("/v1/sandboxes/{}/processes/{}/input", sandbox_id, process_id)
        self._json("POST", path, body=body, timeout=timeout)

    # --- code interpreter -----------------------------------------------
    # A sandbox made from an image with a code interpreter (code-interpreter)
    # runs cells of code in contexts: kernels whose state lasts from one
    # cell to the next. Any other sandbox answers Conflict.

    @operation("runCode")
    def run_code(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> t.CodeExecution:
        """POST /v1/sandboxes/{id}/code: runs a cell (``body["code"]``; see
        CodeRequest) and waits for it. It runs in the context
        ``context_id``, else in the default one of ``language`` (python's
        is "default", bash's "default-bash", javascript's
        "default-javascript", typescript's "default-typescript"). The
        cell's own exception is
        the CodeExecution's ``error`` (``status`` "error"), not a raise;
        ``timeout_seconds`` (default 300) interrupts the cell and leaves
        the context usable (``status`` "timeout"); a kernel that died
        answers ``status`` "died" until restart_code_context."""
        path = _path("/v1/sandboxes/{}/code", sandbox_id)
        return cast(t.CodeExecution, self._json("POST", path, body=body, timeout=timeout or self._code_timeout(body)))

    def run_code_stream(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> CodeStream:
        """POST /v1/sandboxes/{id}/code as server-sent events (run_code's
        operation, asked for with ``Accept: text/event-stream``): runs a
        cell and yields what it makes as it comes, as CodeEvent(name,
        payload) tuples: ``stdout`` and ``stderr`` with text, ``result``
        with a CodeResult, ``exception`` with the cell's CodeError, then
        ``end`` with the CodeExecution (its stdout, stderr and results
        empty). An ``error`` event raises its HareBoxError. Errors before
        the stream (no such sandbox, a sandbox without a code interpreter,
        a bad request) raise here, not on the first iteration."""
        deadline = timeout or self._code_timeout(body)
        path = _path("/v1/sandboxes/{}/code", sandbox_id)
        conn, resp = self._send("POST", path, body=body, accept="text/event-stream", timeout=deadline)
        return CodeStream(conn, resp)

    @operation("listCodeContexts")
    def list_code_contexts(self, sandbox_id: str, *, timeout: float | None = None) -> t.CodeContextList:
        """GET /v1/sandboxes/{id}/code/contexts: the code interpreter's contexts."""
        path = _path("/v1/sandboxes/{}/code/contexts", sandbox_id)
        return cast(t.CodeContextList, self._json("GET", path, timeout=timeout))

    @operation("createCodeContext")
    def create_code_context(
        self, sandbox_id: str, *, body: t.Body | None = None, timeout: float | None = None
    ) -> t.CodeContext:
        """POST /v1/sandboxes/{id}/code/contexts: starts a context, a kernel
        of its own that shares only the filesystem with the others.
        ``body`` (optional): ``language`` ("python", the default,
        "javascript", "typescript" or "bash"), ``cwd`` and ``env``; see CodeContextRequest. Run cells in
        it with ``body["context_id"]`` set to its ``id``."""
        path = _path("/v1/sandboxes/{}/code/contexts", sandbox_id)
        return cast(t.CodeContext, self._json("POST", path, body=body or {}, timeout=timeout or self.lifecycle_timeout))

    @operation("restartCodeContext")
    def restart_code_context(self, sandbox_id: str, context_id: str, *, timeout: float | None = None) -> t.CodeContext:
        """POST /v1/sandboxes/{id}/code/contexts/{context_id}/restart: gives
        the context a fresh kernel; its state is lost, and a kernel that
        died comes back."""
        path = _path("/v1/sandboxes/{}/code/contexts/{}/restart", sandbox_id, context_id)
        return cast(t.CodeContext, self._json("POST", path, timeout=timeout or self.lifecycle_timeout))

    @operation("deleteCodeContext")
    def delete_code_context(self, sandbox_id: str, context_id: str, *, timeout: float | None = None) -> None:
        """DELETE /v1/sandboxes/{id}/code/contexts/{context_id}: shuts the
        context's kernel down."""
        self._json("DELETE", _path("/v1/sandboxes/{}/code/contexts/{}", sandbox_id, context_id), timeout=timeout)

    # --- files ----------------------------------------------------------

    @operation("writeFile")
    def write_file(self, sandbox_id: str, *, query: t.Query, body: FileData, timeout: float | None = None) -> t.FileInfo:
        """PUT /v1/sandboxes/{id}/files: writes raw bytes to ``query["path"]``
        (also ``mode`` "0644", ``owner``, ``make_parents``); the file
        appears whole or not at all. A file object is streamed."""
        data: bytes | IO[bytes]
        if isinstance(body, str):
            data = body.encode()
        elif isinstance(body, (bytearray, memoryview)):
            data = bytes(body)
        else:
            data = body
        path = _path("/v1/sandboxes/{}/files", sandbox_id)
        return cast(t.FileInfo, self._json("PUT", path, query=query, raw=data, timeout=timeout or self.lifecycle_timeout))

    @operation("readFile")
    def read_file(self, sandbox_id: str, *, query: t.Query, timeout: float | None = None) -> bytes:
        """GET /v1/sandboxes/{id}/files: the bytes of ``query["path"]``."""
        path = _path("/v1/sandboxes/{}/files", sandbox_id)
        conn, resp = self._send("GET", path, query=query, timeout=timeout or self.lifecycle_timeout)
        try:
            return _read(resp)
        finally:
            conn.close()

    @operation("removeFile")
    def remove_file(self, sandbox_id: str, *, query: t.Query, timeout: float | None = None) -> None:
        """DELETE /v1/sandboxes/{id}/files: removes ``query["path"]``
        (a non-empty directory needs ``recursive``)."""
        self._json("DELETE", _path("/v1/sandboxes/{}/files", sandbox_id), query=query, timeout=timeout)

    @operation("statFile")
    def stat_file(self, sandbox_id: str, *, query: t.Query, timeout: float | None = None) -> t.FileInfo:
        """GET /v1/sandboxes/{id}/files/stat: describes ``query["path"]``."""
        return cast(t.FileInfo, self._json("GET", _path("/v1/sandboxes/{}/files/stat", sandbox_id), query=query, timeout=timeout))

    @operation("listFiles")
    def list_files(self, sandbox_id: str, *, query: t.Query, timeout: float | None = None) -> t.FileList:
        """GET /v1/sandboxes/{id}/files/list: the entries of directory ``query["path"]``."""
        return cast(t.FileList, self._json("GET", _path("/v1/sandboxes/{}/files/list", sandbox_id), query=query, timeout=timeout))

    @operation("mkdir")
    def mkdir(self, sandbox_id: str, *, query: t.Query, timeout: float | None = None) -> t.FileInfo:
        """POST /v1/sandboxes/{id}/files/mkdir: ``query["path"]`` and its parents."""
        return cast(t.FileInfo, self._json("POST", _path("/v1/sandboxes/{}/files/mkdir", sandbox_id), query=query, timeout=timeout))

    @operation("moveFile")
    def move_file(self, sandbox_id: str, *, query: t.Query, timeout: float | None = None) -> t.FileInfo:
        """POST /v1/sandboxes/{id}/files/move: renames ``query["from"]`` to
        ``query["to"]`` (within one file system)."""
        return cast(t.FileInfo, self._json("POST", _path("/v1/sandboxes/{}/files/move", sandbox_id), query=query, timeout=timeout))

    # --- command history ----------------------------------------------

    @operation("listCommands")
    def list_commands(self, sandbox_id: str, *, query: t.Query | None = None, timeout: float | None = None) -> t.CommandList:
        """GET /v1/sandboxes/{id}/commands: the sandbox's command history,
        oldest first (exec, exec_stream and start_process commands, with
        their output bounded and kept as the account's retention says);
        query ``limit`` keeps the newest N (1 to 10000, default all). A
        sandbox created with ``monitoring=False`` has none."""
        path = _path("/v1/sandboxes/{}/commands", sandbox_id)
        return cast(t.CommandList, self._json("GET", path, query=query, timeout=timeout))

    # --- monitoring -----------------------------------------------------

    @operation("getSandboxMetrics")
    def get_sandbox_metrics(
        self, sandbox_id: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.MetricSampleList:
        """GET /v1/sandboxes/{id}/metrics: the sandbox's monitoring samples,
        oldest first: its VMM's CPU time and resident memory, its disk
        files' size and its link's traffic, measured on the host every
        15 s (hareboxd --metrics-interval) while it runs or is paused.
        Query ``from`` (at or after) and ``to`` (before), RFC 3339, and
        ``limit`` (1 to 10000, default 1000). A sandbox created with
        ``monitoring=False`` has none. Kept as the account's
        ``history_days`` says, after the sandbox is deleted too."""
        path = _path("/v1/sandboxes/{}/metrics", sandbox_id)
        return cast(t.MetricSampleList, self._json("GET", path, query=query, timeout=timeout))

    @operation("getServerMetrics")
    def get_server_metrics(self, *, timeout: float | None = None) -> str:
        """GET /metrics: the server's metrics in the Prometheus text format
        (sandboxes by state, what admission reserved and allows, the
        process and the Go runtime), as text. They are the host's, across
        accounts: the root key, or a key whose scope's actions name
        ``getServerMetrics`` or ``metrics:read`` (else Forbidden)."""
        conn, resp = self._send("GET", "/metrics", accept="text/plain", timeout=timeout)
        try:
            data = _read(resp)
        finally:
            conn.close()
        return data.decode("utf-8", errors="replace")

    # --- firewall -------------------------------------------------------

    @operation("getFirewall")
    def get_firewall(self, sandbox_id: str, *, timeout: float | None = None) -> t.FirewallPolicy:
        """GET /v1/sandboxes/{id}/firewall: the policy in force."""
        return cast(t.FirewallPolicy, self._json("GET", _path("/v1/sandboxes/{}/firewall", sandbox_id), timeout=timeout))

    @operation("setFirewall")
    def set_firewall(self, sandbox_id: str, *, body: t.Body, timeout: float | None = None) -> t.FirewallPolicy:
        """PUT /v1/sandboxes/{id}/firewall: replaces the policy atomically
        (outbound rules in order, first match wins)."""
        path = _path("/v1/sandboxes/{}/firewall", sandbox_id)
        return cast(t.FirewallPolicy, self._json("PUT", path, body=body, timeout=timeout))

    # --- accounts -------------------------------------------------------

    @operation("createAccount")
    def create_account(self, *, body: t.Body, timeout: float | None = None) -> t.Account:
        """POST /v1/accounts: an account (``body={"name": ...}``) with its
        default project; the operator (root key) only."""
        return cast(t.Account, self._json("POST", "/v1/accounts", body=body, timeout=timeout))

    @operation("listAccounts")
    def list_accounts(self, *, timeout: float | None = None) -> t.AccountList:
        """GET /v1/accounts: every account for the operator, its own for a key."""
        return cast(t.AccountList, self._json("GET", "/v1/accounts", timeout=timeout))

    @operation("getAccount")
    def get_account(self, account: str, *, timeout: float | None = None) -> t.Account:
        """GET /v1/accounts/{account}: by ID (acc_...) or name."""
        return cast(t.Account, self._json("GET", _path("/v1/accounts/{}", account), timeout=timeout))

    @operation("updateAccount")
    def update_account(self, account: str, *, body: t.Body, timeout: float | None = None) -> t.Account:
        """PATCH /v1/accounts/{account}: changes its settings:
        ``body={"retention": {"history_days": 30, "output_days": 7}}``
        replaces the command-history retention (days; a field left out
        keeps forever, 0 keeps nothing, ``{}`` keeps everything). Lowering
        it purges at once."""
        return cast(t.Account, self._json("PATCH", _path("/v1/accounts/{}", account), body=body, timeout=timeout))

    @operation("deleteAccount")
    def delete_account(self, account: str, *, timeout: float | None = None) -> None:
        """DELETE /v1/accounts/{account}: an account without live sandboxes;
        its projects and fleets go and its keys are revoked (the operator only)."""
        self._json("DELETE", _path("/v1/accounts/{}", account), timeout=timeout)

    # --- projects and fleets ----------------------------------------------
    # The operator names the account with query ``account`` (ID or name;
    # default the default account); a key always acts in its own.

    @operation("createProject")
    def create_project(self, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None) -> t.Project:
        """POST /v1/projects: a project (``body={"name": ...}``)."""
        return cast(t.Project, self._json("POST", "/v1/projects", query=query, body=body, timeout=timeout))

    @operation("listProjects")
    def list_projects(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.ProjectList:
        """GET /v1/projects: an account's projects."""
        return cast(t.ProjectList, self._json("GET", "/v1/projects", query=query, timeout=timeout))

    @operation("getProject")
    def get_project(self, project: str, *, query: t.Query | None = None, timeout: float | None = None) -> t.Project:
        """GET /v1/projects/{project}: by ID (prj_...) or name."""
        return cast(t.Project, self._json("GET", _path("/v1/projects/{}", project), query=query, timeout=timeout))

    @operation("updateProject")
    def update_project(
        self, project: str, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Project:
        """PATCH /v1/projects/{project}: changes its settings
        (``body={"third_party_default": True}`` makes every new sandbox of
        the project third-party)."""
        return cast(t.Project, self._json("PATCH", _path("/v1/projects/{}", project), query=query, body=body, timeout=timeout))

    @operation("deleteProject")
    def delete_project(self, project: str, *, query: t.Query | None = None, timeout: float | None = None) -> None:
        """DELETE /v1/projects/{project}: a project without live sandboxes,
        and its fleets (not the default project)."""
        self._json("DELETE", _path("/v1/projects/{}", project), query=query, timeout=timeout)

    @operation("createFleet")
    def create_fleet(
        self, project: str, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Fleet:
        """POST /v1/projects/{project}/fleets: a fleet (``body={"name": ...}``)."""
        path = _path("/v1/projects/{}/fleets", project)
        return cast(t.Fleet, self._json("POST", path, query=query, body=body, timeout=timeout))

    @operation("listFleets")
    def list_fleets(self, project: str, *, query: t.Query | None = None, timeout: float | None = None) -> t.FleetList:
        """GET /v1/projects/{project}/fleets: a project's fleets."""
        return cast(t.FleetList, self._json("GET", _path("/v1/projects/{}/fleets", project), query=query, timeout=timeout))

    @operation("getFleet")
    def get_fleet(
        self, project: str, fleet: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Fleet:
        """GET /v1/projects/{project}/fleets/{fleet}: by ID (flt_...) or name."""
        path = _path("/v1/projects/{}/fleets/{}", project, fleet)
        return cast(t.Fleet, self._json("GET", path, query=query, timeout=timeout))

    @operation("deleteFleet")
    def delete_fleet(
        self, project: str, fleet: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> None:
        """DELETE /v1/projects/{project}/fleets/{fleet}: a fleet without live sandboxes."""
        self._json("DELETE", _path("/v1/projects/{}/fleets/{}", project, fleet), query=query, timeout=timeout)

    # --- API keys -----------------------------------------------------------

    @operation("createKey")
    def create_key(self, *, body: t.Body, timeout: float | None = None) -> t.KeyWithSecret:
        """POST /v1/keys: a scoped key (``scope``, ``description``,
        ``ttl_seconds``, ``format``: "harebox" or "e2b"; ``account_id`` for
        the operator). Its ``secret`` (hbk_..., or e2b_ and hex digits) is
        in this reply only. A key creates keys no wider than itself."""
        return cast(t.KeyWithSecret, self._json("POST", "/v1/keys", body=body, timeout=timeout))

    @operation("listKeys")
    def list_keys(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.KeyList:
        """GET /v1/keys: the keys the caller sees (a key: itself and the keys
        it created); query ``account`` narrows the operator's list."""
        return cast(t.KeyList, self._json("GET", "/v1/keys", query=query, timeout=timeout))

    @operation("getKey")
    def get_key(self, key_id: str, *, timeout: float | None = None) -> t.Key:
        """GET /v1/keys/{key}: a key, never its secret."""
        return cast(t.Key, self._json("GET", _path("/v1/keys/{}", key_id), timeout=timeout))

    @operation("revokeKey")
    def revoke_key(self, key_id: str, *, timeout: float | None = None) -> t.Key:
        """DELETE /v1/keys/{key}: revokes the key and every key it created,
        at once and for good; returns it, revoked."""
        return cast(t.Key, self._json("DELETE", _path("/v1/keys/{}", key_id), timeout=timeout))

    @operation("rotateKey")
    def rotate_key(self, key_id: str, *, timeout: float | None = None) -> t.KeyWithSecret:
        """POST /v1/keys/{key}/rotate: a new secret; the old one stops
        working when this returns."""
        return cast(t.KeyWithSecret, self._json("POST", _path("/v1/keys/{}/rotate", key_id), timeout=timeout))

    # --- environments -----------------------------------------------------
    # Query ``project`` (ID or name; default the default project) and, for
    # the operator, ``account``. Secret values are never in an answer: a
    # secret variable shows as ``{"secret": True}``.

    @operation("createEnvironment")
    def create_environment(
        self, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Environment:
        """POST /v1/environments: an environment and its version 1
        (``name``, ``variables``, ``files``, ``credentials``,
        ``third_party_safe``; see EnvironmentRequest)."""
        return cast(t.Environment, self._json("POST", "/v1/environments", query=query, body=body, timeout=timeout))

    @operation("listEnvironments")
    def list_environments(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.EnvironmentList:
        """GET /v1/environments: a project's environments with their latest versions."""
        return cast(t.EnvironmentList, self._json("GET", "/v1/environments", query=query, timeout=timeout))

    @operation("getEnvironment")
    def get_environment(
        self, environment: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Environment:
        """GET /v1/environments/{environment}: by ID (env_...) or name, with its latest version."""
        path = _path("/v1/environments/{}", environment)
        return cast(t.Environment, self._json("GET", path, query=query, timeout=timeout))

    @operation("updateEnvironment")
    def update_environment(
        self, environment: str, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Environment:
        """PATCH /v1/environments/{environment}: a new version from the
        latest (``set``, ``unset``; ``files``, ``credentials`` and
        ``third_party_safe`` replace when given); running sandboxes keep
        the version they pinned."""
        path = _path("/v1/environments/{}", environment)
        return cast(t.Environment, self._json("PATCH", path, query=query, body=body, timeout=timeout))

    @operation("deleteEnvironment")
    def delete_environment(self, environment: str, *, query: t.Query | None = None, timeout: float | None = None) -> None:
        """DELETE /v1/environments/{environment}: with its versions and
        sealed values; Conflict while a live sandbox pins it."""
        self._json("DELETE", _path("/v1/environments/{}", environment), query=query, timeout=timeout)

    @operation("listEnvironmentVersions")
    def list_environment_versions(
        self, environment: str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.EnvironmentVersionList:
        """GET /v1/environments/{environment}/versions: oldest first."""
        path = _path("/v1/environments/{}/versions", environment)
        return cast(t.EnvironmentVersionList, self._json("GET", path, query=query, timeout=timeout))

    @operation("getEnvironmentVersion")
    def get_environment_version(
        self, environment: str, version: int | str, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.EnvironmentVersion:
        """GET /v1/environments/{environment}/versions/{version}: one version (from 1)."""
        if isinstance(version, bool) or not isinstance(version, (int, str)):
            raise ValueError(f"version must be an int or a str, not {version!r}")
        path = _path("/v1/environments/{}/versions/{}", environment, str(version))
        return cast(t.EnvironmentVersion, self._json("GET", path, query=query, timeout=timeout))

    # --- volumes --------------------------------------------------------

    @operation("createVolume")
    def create_volume(self, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None) -> t.Volume:
        """POST /v1/volumes: a volume (``name``, ``size_gb``, ``project``),
        encrypted under its own key; attach it at create with
        ``volumes=[{"name": ..., "path": ..., "read_only": ...}]``."""
        return cast(t.Volume, self._json("POST", "/v1/volumes", query=query, body=body, timeout=timeout))

    @operation("listVolumes")
    def list_volumes(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.VolumeList:
        """GET /v1/volumes: a project's volumes."""
        return cast(t.VolumeList, self._json("GET", "/v1/volumes", query=query, timeout=timeout))

    @operation("getVolume")
    def get_volume(self, volume: str, *, query: t.Query | None = None, timeout: float | None = None) -> t.Volume:
        """GET /v1/volumes/{volume}: by ID (vol_...) or name."""
        return cast(t.Volume, self._json("GET", _path("/v1/volumes/{}", volume), query=query, timeout=timeout))

    @operation("resizeVolume")
    def resize_volume(
        self, volume: str, size_gb: int, *, query: t.Query | None = None, timeout: float | None = None
    ) -> t.Volume:
        """PATCH /v1/volumes/{volume}: grow it (no sandbox may have it attached)."""
        path = _path("/v1/volumes/{}", volume)
        return cast(t.Volume, self._json("PATCH", path, query=query, body={"size_gb": size_gb}, timeout=timeout))

    @operation("deleteVolume")
    def delete_volume(self, volume: str, *, query: t.Query | None = None, timeout: float | None = None) -> None:
        """DELETE /v1/volumes/{volume}: its key is erased, then its file;
        Conflict while a sandbox has it attached."""
        self._json("DELETE", _path("/v1/volumes/{}", volume), query=query, timeout=timeout)

    # --- audit log ------------------------------------------------------
    # Every change, and every read of sandbox contents, denied attempts too:
    # who (``principal``: a key ID, or "operator"), from where, what (the
    # operationId and its target), the outcome and the request ID; never
    # request data. A key sees its own account's entries.

    @operation("listAudit")
    def list_audit(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.AuditList:
        """GET /v1/audit: one page of entries, oldest first. Query ``from``
        and ``to`` (RFC 3339), ``principal``, ``target``, ``action``,
        ``outcome`` ("ok", "denied" or "error"), ``account`` (the operator
        only), ``after`` (the cursor: a sequence number), ``limit`` (1 to
        1000, default 100) and ``newest`` (True: the last ``limit`` entries
        that match, still oldest first, with no ``next``). ``next``,
        present when the page is full, is the ``after`` of the next page;
        audit_entries follows it for you."""
        if query and query.get("format") not in (None, "json"):
            raise ValueError("list_audit reads JSON pages; audit_entries(query) iterates every entry")
        return cast(t.AuditList, self._json("GET", "/v1/audit", query=query, timeout=timeout))

    def audit_entries(self, query: t.Query | None = None, *, timeout: float | None = None) -> Iterator[t.AuditEntry]:
        """Every entry that matches ``query`` (list_audit's filters), oldest
        first, one list_audit page at a time, following each page's
        ``next``. ``limit`` is the page size (default 1000); ``after``
        starts past that cursor. A generator: errors raise as it runs."""
        q: dict[str, t.QueryValue] = {"limit": 1000, **(query or {})}
        while True:
            page = self.list_audit(query=q, timeout=timeout)
            yield from page["entries"]
            cursor = page.get("next")
            if not cursor:
                return
            if cursor == q.get("after"):
                raise TransportError(f"list_audit: the next cursor {cursor!r} does not move past the page")
            q["after"] = cursor

    @operation("verifyAudit")
    def verify_audit(self, *, timeout: float | None = None) -> t.AuditReport:
        """GET /v1/audit/verify: checks the hash chain and the signed
        checkpoints (the operator only). When ``ok`` is False,
        ``first_bad`` is the first entry altered, removed or reordered and
        ``reason`` says how it shows."""
        return cast(t.AuditReport, self._json("GET", "/v1/audit/verify", timeout=timeout or self.lifecycle_timeout))

    @operation("getAuditKey")
    def get_audit_key(self, *, timeout: float | None = None) -> t.AuditKey:
        """GET /v1/audit/key: the ed25519 public key (base64) that verifies
        the log's checkpoints."""
        return cast(t.AuditKey, self._json("GET", "/v1/audit/key", timeout=timeout))

    # --- events -----------------------------------------------------------
    # What happened on the engine's side rather than by a caller: a budget's
    # warnings, its being reached and what it did (principal "budget:ID"),
    # a guest using a placeholder where it is not swapped ("sandbox:ID"), a
    # VM that stopped on its own ("engine"). They are audit entries; a key
    # sees those of the sandboxes and budgets it may see.

    @operation("listEvents")
    def list_events(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.EventList:
        """GET /v1/events: one page of events, oldest first. Query ``after``
        (the cursor: a sequence number), ``limit`` (1 to 1000, default 100)
        and ``account`` (the operator only). ``next`` is always there: the
        ``after`` of the next page (an empty page keeps it). events()
        follows the stream, or the pages."""
        if query and query.get("follow"):
            raise ValueError("list_events reads one page; events(query) follows the stream")
        return cast(t.EventList, self._json("GET", "/v1/events", query=query, timeout=timeout))

    def events(
        self, query: t.Query | None = None, *, follow: bool = True, timeout: float | None = None
    ) -> Iterator[t.AuditEntry]:
        """Yields events (AuditEntry dicts) that match ``query``
        (list_events's), oldest first. With ``follow`` (GET /v1/events
        with follow=true) it never ends: each event comes as the server
        appends it, and an ``error`` event raises its HareBoxError. The
        server ends a stream after a while, to authenticate the key again;
        this opens it again after the last event's ``seq``, so nothing is
        missed or repeated. ``timeout`` bounds the wait
        for any byte, so keep it above the server's 15 s keepalive.
        Without ``follow`` it reads every page so far, following ``next``.
        A generator: nothing is sent before the first event is asked for,
        errors raise as it runs, and closing it (or leaving its loop)
        closes the connection."""
        if not follow:
            q: dict[str, t.QueryValue] = {"limit": 1000, **(query or {}), "follow": None}
            while True:
                page = self.list_events(query=q, timeout=timeout)
                yield from page["events"]
                if int(page["next"]) <= int(str(q.get("after") or 0)):
                    return  # the cursor stands still: nothing newer
                q["after"] = page["next"]
        q = {**(query or {}), "follow": True}
        while True:
            opened = time.monotonic()
            conn, resp = self._send("GET", "/v1/events", query=q, timeout=timeout)
            try:
                while (event := _next_streamed_event(resp)) is not None:
                    q["after"] = event["seq"]
                    yield event
            finally:
                _close(conn, resp)
            if time.monotonic() - opened < 1:
                time.sleep(1)  # (a server that ends streams at once is not hammered)

    # --- budgets and usage ------------------------------------------------
    # Money is a decimal string ("25.00"), never a float. The operator
    # names the account with query ``account`` (ID or name; default the
    # default account); a key always acts in its own.

    @operation("createBudget")
    def create_budget(self, *, body: t.Body, query: t.Query | None = None, timeout: float | None = None) -> t.Budget:
        """POST /v1/budgets: a dollar limit (``limit_usd``) per ``period``
        ("monthly" or "total") on the sandboxes of a ``scope`` (``kind``
        "account", "project", "fleet", "label" or "key", with its ``ref``
        or ``labels``) and the ``action`` taken when it is reached
        ("notify", "deny_new", "pause", "stop" or "delete"); also ``name``
        and ``warn_at_percent`` (see BudgetRequest). A project ``ref`` (ID
        or name) comes back as the project's ID."""
        return cast(t.Budget, self._json("POST", "/v1/budgets", query=query, body=body, timeout=timeout))

    @operation("listBudgets")
    def list_budgets(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.BudgetList:
        """GET /v1/budgets: an account's budgets with their spend and reservations."""
        return cast(t.BudgetList, self._json("GET", "/v1/budgets", query=query, timeout=timeout))

    @operation("getBudget")
    def get_budget(self, budget_id: str, *, timeout: float | None = None) -> t.Budget:
        """GET /v1/budgets/{budget}: a budget with its spend and reservations."""
        return cast(t.Budget, self._json("GET", _path("/v1/budgets/{}", budget_id), timeout=timeout))

    @operation("deleteBudget")
    def delete_budget(self, budget_id: str, *, timeout: float | None = None) -> None:
        """DELETE /v1/budgets/{budget}: removes a budget and what it
        reserved. A key's ``budget_usd`` budget (``from_key``) is refused:
        it is part of the key's scope."""
        self._json("DELETE", _path("/v1/budgets/{}", budget_id), timeout=timeout)

    @operation("getUsage")
    def get_usage(self, *, query: t.Query | None = None, timeout: float | None = None) -> t.UsageList:
        """GET /v1/usage: metered usage and its cost, one row per group,
        sorted by group. Query ``group_by`` ("account", "project", "fleet",
        "key", "sandbox" (the default) or "label:KEY"), ``from`` and ``to``
        (RFC 3339; intervals that overlap the range count whole) and
        ``account``."""
        return cast(t.UsageList, self._json("GET", "/v1/usage", query=query, timeout=timeout))

    # --- transport ------------------------------------------------------

    def _exec_timeout(self, body: t.Body) -> float:
        """The command's own timeout plus a margin, so the server, which
        enforces the command's timeout, always answers first."""
        return _seconds(body.get("timeout_seconds"), _DEFAULT_EXEC_SECONDS) + self.exec_margin

    def _code_timeout(self, body: t.Body) -> float:
        """The cell's own timeout, the grace the server gives the
        interpreter to interrupt it, and a margin, so the server, which
        enforces both, always answers first."""
        return _seconds(body.get("timeout_seconds"), _DEFAULT_CODE_SECONDS) + _CODE_GRACE_SECONDS + self.exec_margin

    def _json(
        self,
        method: str,
        path: str,
        *,
        query: t.Query | None = None,
        body: t.Body | None = None,
        raw: bytes | IO[bytes] | None = None,
        timeout: float | None = None,
        ok: tuple[int, ...] = (),
    ) -> Any:
        """Sends a request and returns its JSON reply (None for 204); a
        status in ``ok`` is returned like a 2xx."""
        conn, resp = self._send(method, path, query=query, body=body, raw=raw, timeout=timeout, ok=ok)
        try:
            data = _read(resp)
        finally:
            conn.close()
        if resp.status == 204 or not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise TransportError(f"{method} {path}: the reply is not JSON", status=resp.status) from None

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: t.Query | None = None,
        body: t.Body | None = None,
        raw: bytes | IO[bytes] | None = None,
        accept: str = "application/json",
        timeout: float | None = None,
        ok: tuple[int, ...] = (),
        extra_headers: Mapping[str, str] | None = None,
        response_class: type[http.client.HTTPResponse] | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends a request; returns the open connection and a 1xx or 2xx
        response (or one whose status is in ``ok``) whose body is still
        unread, or raises the API's error. ``response_class`` replaces
        http.client's for reading the reply."""
        headers = {"User-Agent": USER_AGENT, "Accept": accept, **(extra_headers or {})}
        if self._api_key:
            headers["Authorization"] = "Bearer " + self._api_key
        payload: bytes | IO[bytes] | None = raw
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif raw is not None:
            headers["Content-Type"] = "application/octet-stream"
        target = self._base + path
        encoded = _encode_query(query) if query else ""
        if encoded:  # a query of only None values sends none
            target += "?" + encoded
        conn = self._connection(timeout or self.timeout)
        if response_class is not None:
            conn.response_class = response_class
        try:
            conn.request(method, target, body=payload, headers=headers)
            resp = conn.getresponse()
            if resp.status >= 300 and resp.status not in ok:
                raise _error_reply(resp)
        except HareBoxError:
            conn.close()
            raise
        except TimeoutError:
            conn.close()
            raise RequestTimeout(f"{method} {path}: no answer within {timeout or self.timeout:g} s") from None
        except _PinMismatch as e:
            conn.close()
            raise TransportError(f"{method} {path}: {e}") from None
        except ssl.SSLCertVerificationError as e:
            conn.close()
            trusted = f"the CAs in {self._ca} ({self._ca_name})" if self._ca else "the system's CAs"
            why = e.verify_message or str(e)
            raise TransportError(f"{method} {path}: the server's certificate was not trusted ({why}; trusting {trusted})") from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise TransportError(f"{method} {path}: {type(e).__name__}: {e}") from None
        return conn, resp

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """Every request's connection is made here, streams' too."""
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        assert self._tls is not None
        if self._pin is not None:
            return _PinnedHTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._tls, pin=self._pin, source=self._ca_name
            )
        return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._tls)


_PIN_PREFIX = "sha256:"
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


def _trust(ca: str | None, name: str) -> tuple[ssl.SSLContext, bytes | None]:
    """The TLS context for an https server and, for a fingerprint, the
    pinned SHA-256 (the certificate's DER). ``ca`` is HAREBOX_CA's value
    (``name`` says which of the option and the variable gave it); None
    is the system's trust store. A bad value raises ValueError."""
    if ca is None:
        ctx = ssl.create_default_context()
        pin = None
    elif ca.startswith(_PIN_PREFIX):
        digits = ca[len(_PIN_PREFIX):].strip().replace(":", "")
        if not re.fullmatch(r"[0-9a-fA-F]{64}", digits):
            raise ValueError(f"{name} {ca!r}: a fingerprint is sha256: and 64 hex digits (':' between bytes allowed)")
        # The pin replaces the chain and name checks, made after the
        # handshake by _PinnedHTTPSConnection.connect.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        pin = bytes.fromhex(digits)
    else:
        try:
            with open(ca, "rb") as f:
                pem = f.read()
        except OSError as e:
            raise ValueError(f"{name}: cannot read the CA file {ca!r}: {e.strerror or e}") from None
        if _PEM_CERTIFICATE not in pem:
            raise ValueError(f"{name} {ca!r}: no PEM certificate in it (no {_PEM_CERTIFICATE.decode()} line)")
        try:
            ctx = ssl.create_default_context(cafile=ca)
        except ssl.SSLError as e:
            raise ValueError(f"{name} {ca!r}: not a usable PEM certificate: {e.reason or e}") from None
        pin = None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx, pin


class _PinMismatch(OSError):
    """The server's certificate is not the pinned one."""


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that, right after each TLS handshake and before
    any request is written, checks the SHA-256 of the server's certificate
    against the pin; on a mismatch it closes the socket and raises
    _PinMismatch. http.client reconnects through connect() too, so no
    connection skips the check."""

    def __init__(self, host: str, port: int | None, *, timeout: float, context: ssl.SSLContext, pin: bytes, source: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._pin = pin
        self._pin_source = source

    def connect(self) -> None:
        super().connect()
        sock = cast(ssl.SSLSocket, self.sock)
        der = sock.getpeercert(binary_form=True)
        got = hashlib.sha256(der).digest() if der else None
        if got != self._pin:
            self.sock = None
            sock.close()
            seen = f"its fingerprint sha256:{got.hex()}" if got else "it presented none"
            raise _PinMismatch(
                f"the server's certificate was not trusted: it did not match the pinned fingerprint "
                f"sha256:{self._pin.hex()} ({self._pin_source}); {seen}"
            )


class _EventStream(Generic[E]):
    """The events of one streamed reply: iterate it, or use it as a
    context manager to close the connection early. Subclasses decode the
    events; an ``error`` event raises its HareBoxError, events of other
    names are skipped (they are for newer clients)."""

    #: Names the stream in errors.
    _what = "event stream"
    #: The event that ends the stream: a JSON object.
    _last = "exit"
    #: The events before it, decoded by _output.
    _names: tuple[str, ...] = ("stdout", "stderr")

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self._done = False

    def __iter__(self) -> Iterator[E]:
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops reading and closes the connection."""
        self._done = True
        _close(self._conn, self._resp)

    def __del__(self) -> None:
        # A loop that breaks early leaves the stream open: close it quietly.
        _close(self._conn, self._resp)

    def __next__(self) -> E:
        if self._done:
            raise StopIteration
        try:
            while True:
                event = _read_sse_event(self._resp, self._what)
                if event is None:
                    self._ended()
                    self.close()
                    raise StopIteration
                name, data = event
                if name == "error":
                    raise error_from_body(0, json.loads(data))
                if name == self._last:
                    result = json.loads(data)
                    if not isinstance(result, dict):
                        raise TransportError(f"{self._what}: the {name} event is not a JSON object")
                    self.close()
                    return self._event(name, result)
                if name in self._names:
                    return self._event(name, self._output(name, json.loads(data)))
                # Unknown events are for newer clients: skip them.
        except HareBoxError:
            self.close()
            raise
        except TimeoutError:
            self.close()
            raise RequestTimeout(f"{self._what}: no event within the timeout") from None
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
            self.close()
            raise TransportError(f"{self._what}: {type(e).__name__}: {e}") from None

    def _event(self, name: str, payload: Any) -> E:
        """The tuple yielded for an event and its decoded payload."""
        raise NotImplementedError

    def _output(self, name: str, data: Any) -> Any:
        """The payload of the JSON ``data`` of an event of ``_names``."""
        raise NotImplementedError

    def _ended(self) -> None:
        """Called when the stream ends before its last event; raises if
        that is not a normal end."""
        raise TransportError(f"{self._what} ended before the {self._last} event")


class ExecStream(_EventStream[ExecEvent]):
    """The events of one exec_stream call; iterate it, or use it as a
    context manager to close the connection early. It closes itself after
    the ``exit`` event."""

    _what = "exec stream"

    def _event(self, name: str, payload: Any) -> ExecEvent:
        return ExecEvent(name, payload)

    def _output(self, name: str, data: Any) -> bytes:
        return base64.b64decode(data["data"])


class CodeStream(_EventStream[CodeEvent]):
    """The events of one run_code_stream call, as CodeEvent(name, payload)
    tuples: ``("stdout", str)``, ``("stderr", str)``, ``("result",
    CodeResult)``, ``("exception", CodeError)``, then ``("end",
    CodeExecution)``. Iterate it, or use it as a context manager to close
    the connection early; it closes itself after the ``end`` event. A
    stream that ends before it raises TransportError."""

    _what = "code stream"
    _last = "end"
    _names = ("stdout", "stderr", "result", "exception")

    def _event(self, name: str, payload: Any) -> CodeEvent:
        return CodeEvent(name, payload)

    def _output(self, name: str, data: Any) -> Any:
        if name in ("stdout", "stderr"):
            text = data["text"]
            if not isinstance(text, str):
                raise TransportError(f"{self._what}: a {name} event's text is not a string")
            return text
        if not isinstance(data, dict):
            raise TransportError(f"{self._what}: the {name} event is not a JSON object")
        return data


class ProcessOutputStream(_EventStream[ExecEvent]):
    """The events of one get_process_output call: ``("stdout",
    OutputChunk)`` and ``("stderr", OutputChunk)``, then ``("exit",
    ExecResult)`` once the process has ended. Iterate it, or use it as a
    context manager to close the connection early; it closes itself after
    the ``exit`` event and at the end of the stream.

    ``stdout_offset`` and ``stderr_offset`` are where each stream stands:
    the offsets asked for, then the ``end`` of the last chunk read of that
    stream; asking again from them gets only what came since. A chunk
    whose offset goes back before that is not the API talking: it raises
    TransportError."""

    _what = "process output"

    def __init__(
        self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, *, follow: bool, offsets: tuple[int, int]
    ) -> None:
        super().__init__(conn, resp)
        self._follow = follow
        self.stdout_offset, self.stderr_offset = offsets

    def _event(self, name: str, payload: Any) -> ExecEvent:
        return ExecEvent(name, payload)

    def _output(self, name: str, data: Any) -> t.OutputChunk:
        offset = data["offset"]
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise TransportError(f"{self._what}: a {name} chunk's offset is not a byte offset: {offset!r}")
        position = self.stdout_offset if name == "stdout" else self.stderr_offset
        if offset < position:
            raise TransportError(f"{self._what}: a {name} chunk at offset {offset} goes back before {position}")
        chunk = t.OutputChunk(offset, base64.b64decode(data["data"], validate=True))
        if name == "stdout":
            self.stdout_offset = chunk.end
        else:
            self.stderr_offset = chunk.end
        return chunk

    def _ended(self) -> None:
        # Without follow the stream ends with what the agent keeps; with
        # follow only the exit (or an error) ends it.
        if self._follow:
            raise TransportError(f"{self._what}: the stream ended before the exit event")


class _LineReader(Protocol):
    def readline(self, limit: int = -1, /) -> bytes: ...


def _read_sse_event(resp: _LineReader, what: str) -> tuple[str, str] | None:
    """Reads one server-sent event: its name and its (joined) data; None
    when the stream ends (an event cut off by the end is dropped).
    Comments (": keepalive") and fields other than event and data are
    skipped."""
    name = "message"
    data: list[str] = []
    while True:
        line = resp.readline(_MAX_EVENT_LINE)
        if not line:
            return None
        if not line.endswith(b"\n"):
            raise TransportError(f"{what}: an event line is too long or cut short")
        text = line.decode().rstrip("\r\n")
        if not text:
            if data:
                return name, "\n".join(data)
            name = "message"
            continue
        if text.startswith(":"):
            continue
        key, _, value = text.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)


def _next_streamed_event(resp: http.client.HTTPResponse) -> t.AuditEntry | None:
    """The next ``event`` of a followed /v1/events stream, None at the
    stream's end; an ``error`` event raises its HareBoxError."""
    try:
        while True:
            event = _read_sse_event(resp, "events stream")
            if event is None:
                return None
            name, data = event
            if name == "event":
                entry = json.loads(data)
                if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int):
                    raise ValueError("an event without a seq")
                return cast(t.AuditEntry, entry)
            if name == "error":
                raise error_from_body(0, json.loads(data))
            # Unknown events are for newer clients: skip them.
    except HareBoxError:
        raise
    except TimeoutError:
        raise RequestTimeout("events stream: no byte within the timeout (not even the keepalive)") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise TransportError(f"events stream: {type(e).__name__}: {e}") from None


def _close(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
    """Closes a stream: the response too, which holds the socket when the
    server said it closes the connection (HTTP/1.0 or Connection: close)."""
    resp.close()
    conn.close()


def _seconds(value: Any, default: float) -> float:
    """A timeout from a request, or the server's default when it has none
    (a malformed one is the server's to refuse)."""
    try:
        return float(value) or default
    except (TypeError, ValueError):
        return default


def _offset(value: Any) -> int:
    """A byte offset from a query, as the server read it (which refuses
    anything but a whole number from 0 before the stream starts); 0 when
    unset."""
    try:
        return max(0, int(str(value))) if value is not None else 0
    except ValueError:
        return 0


def _query_true(value: Any) -> bool:
    """Whether a query's boolean parameter says true, as the server reads
    it (Go's strconv.ParseBool)."""
    if isinstance(value, bool):
        return value
    return value is not None and str(value) in ("1", "t", "T", "true", "TRUE", "True")


def _path(template: str, *params: str) -> str:
    """Fills path parameters, escaped so that an ID can never change the
    route ("../", "?", "#" are all quoted)."""
    for p in params:
        if not isinstance(p, str) or not p:
            raise ValueError(f"path parameter must be a non-empty string, not {p!r}")
    return template.format(*(quote(p, safe="") for p in params))


def _project_query(project: str | None, account: str | None) -> dict[str, t.QueryValue]:
    """The query naming a project and an account; None is left out."""
    return {"project": project, "account": account}


def _encode_query(query: t.Query) -> str:
    """Encodes a query: bools as true/false, lists as repeated keys, None left out."""
    pairs: list[tuple[str, str]] = []
    for key, value in query.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None:
                continue
            pairs.append((key, ("true" if item else "false") if isinstance(item, bool) else str(item)))
    return urlencode(pairs)


def _read(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read()
    except TimeoutError:
        raise RequestTimeout("the reply stalled past the timeout") from None
    except (OSError, http.client.HTTPException) as e:
        raise TransportError(f"reading the reply: {type(e).__name__}: {e}") from None


def _error_reply(resp: http.client.HTTPResponse) -> HareBoxError:
    """The error for a non-2xx reply, from its JSON error body if it has one."""
    data = resp.read(_MAX_ERROR_BODY)
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    err = error_from_body(resp.status, body, retry_after=parse_retry_after(resp.getheader("Retry-After")))
    if body is None and data:
        err.message += ": " + data[:200].decode(errors="replace").strip()
    return err
