"""Sandbox: one sandbox as an object, for code that works with one box.

It holds the sandbox's JSON fields and its client, so ``box.run(...)``
reads like the walkthrough. Everything it does goes through the Client's
operation methods; it adds no behaviour the API does not have.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

from . import types as t
from .errors import Conflict, TransportError
from .interpreter import Execution, ExecutionError, Result

if TYPE_CHECKING:
    from .client import Client, ExecStream, FileData, ProcessOutputStream
    from .pty import Pty


@dataclass(init=False, eq=False)
class Sandbox:
    """A sandbox: its fields as the server last reported them, and methods
    that act on it. ``refresh()`` re-reads the fields; the lifecycle
    methods update them from the server's reply."""

    id: str
    name: str
    account_id: str
    project_id: str
    project: str
    fleet_id: str | None
    fleet: str | None
    state: str
    image: str
    size: t.Resources
    labels: dict[str, str]
    no_env: bool
    environment: str | None
    third_party: bool
    monitoring: bool
    snapshots: bool
    agent: str | None
    site: t.Site
    #: Its address and name (NAME.PROJECT.internal) on its project's
    #: private mesh, if it is on it.
    mesh_address: str | None
    mesh_name: str | None
    created_at: str
    expires_at: str | None
    error: str | None
    client: Client = field(repr=False)

    def __init__(self, client: Client, data: t.SandboxJSON) -> None:
        self.client = client
        self._update(data)

    def _update(self, data: t.SandboxJSON) -> Sandbox:
        self.id = data["id"]
        self.name = data.get("name", "")
        self.account_id = data.get("account_id", "")
        self.project_id = data.get("project_id", "")
        self.project = data.get("project", "")
        self.fleet_id = data.get("fleet_id")
        self.fleet = data.get("fleet")
        self.state = data["state"]
        self.image = data.get("image", "")
        self.size = data.get("size", {"vcpus": 0, "memory_mb": 0, "disk_gb": 0})
        self.labels = dict(data.get("labels") or {})
        self.no_env = bool(data.get("no_env", False))
        self.environment = data.get("environment")
        self.third_party = bool(data.get("third_party", False))
        # Both default to True, as in CreateRequest.
        self.monitoring = bool(data.get("monitoring", True))
        self.snapshots = bool(data.get("snapshots", True))
        self.agent = data.get("agent")
        self.site = data.get("site", {"name": "", "country": ""})
        self.mesh_address = data.get("mesh_address")
        self.mesh_name = data.get("mesh_name")
        self.created_at = data.get("created_at", "")
        self.expires_at = data.get("expires_at")
        self.error = data.get("error")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The sandbox's fields as plain data (without the client)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "client"}

    # --- lifecycle ------------------------------------------------------

    def refresh(self) -> Sandbox:
        """Re-reads the sandbox from the server."""
        return self._update(self.client.get_sandbox(self.id))

    def pause(self) -> Sandbox:
        """Freezes the VM (state ``paused``)."""
        return self._update(self.client.pause_sandbox(self.id))

    def resume(self) -> Sandbox:
        """Continues a paused VM, or restores a hibernated one from its
        files (state ``running``)."""
        return self._update(self.client.resume_sandbox(self.id))

    def stop(self) -> Sandbox:
        """Shuts the VM down, keeping its disk (state ``stopped``)."""
        return self._update(self.client.stop_sandbox(self.id))

    def boot(self) -> Sandbox:
        """Boots a stopped VM again on its disk (state ``running``)."""
        return self._update(self.client.start_sandbox(self.id))

    def hibernate(self) -> Sandbox:
        """Writes the VM's memory, device state and disk to encrypted files
        on the host and stops its VMM (state ``hibernated``; see
        Client.hibernate_sandbox); ``resume()`` restores it."""
        return self._update(self.client.hibernate_sandbox(self.id))

    def delete(self) -> Sandbox:
        """Deletes the VM, its disks and network (state ``deleted``)."""
        return self._update(self.client.delete_sandbox(self.id))

    def fork(
        self,
        count: int | None = None,
        *,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        ttl_seconds: int | None = None,
    ) -> list[Sandbox]:
        """Makes ``count`` new sandboxes from this running or paused one
        (default 1; see Client.fork_sandbox) and returns them, running:
        each is restored from one snapshot of this sandbox, with its own
        ID, data key, machine-id and network. ``name`` names them NAME-1
        ... NAME-count, ``labels`` are added to this sandbox's; None means
        unset. Every clone is made or none is."""
        fields = {"count": count, "name": name, "labels": labels, "ttl_seconds": ttl_seconds}
        body = {k: v for k, v in fields.items() if v is not None}
        clones = self.client.fork_sandbox(self.id, body=body)["sandboxes"]
        return [Sandbox(self.client, data) for data in clones]

    def snapshot(self, name: str | None = None) -> t.Snapshot:
        """Snapshots this running or paused sandbox (memory, device state,
        its disk's writes; see Client.create_snapshot); it is paused only
        while the snapshot is written. Returns the Snapshot dict;
        ``client.create(snapshot=snap["id"])`` makes a sandbox from it."""
        return self.client.create_snapshot(self.id, body={} if name is None else {"name": name})

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        """Deletes the sandbox on leaving a ``with`` block, even on error."""
        if self.state != "deleted":
            try:
                self.delete()
            except Conflict:
                if self.refresh().state != "deleted":  # deleted elsewhere is fine
                    raise

    # --- commands -------------------------------------------------------

    def run(self, cmd: str | Sequence[str], timeout: float | None = None, **options: Any) -> t.ExecResult:
        """Runs a command and waits for it: a shell string, or an argv list.
        ``timeout`` is in seconds (the server's default is 300); ``options``
        are the other ExecRequest fields (env, cwd, user, stdin), where
        stdin may be bytes or text. Returns the ExecResult dict."""
        return self.client.exec(self.id, body=_exec_body(cmd, timeout, options))

    def stream(self, cmd: str | Sequence[str], timeout: float | None = None, **options: Any) -> ExecStream:
        """Like run, but yields ("stdout"|"stderr", bytes) as the command
        writes, then ("exit", ExecResult)."""
        return self.client.exec_stream(self.id, body=_exec_body(cmd, timeout, options))

    def start(self, cmd: str | Sequence[str], timeout: float | None = None, **options: Any) -> t.Process:
        """Starts a command in the background; see Client.get_process, and
        process_output for its output. (``boot()`` starts a stopped
        sandbox.)"""
        return self.client.start_process(self.id, body=_exec_body(cmd, timeout, options))

    def process_output(
        self,
        process_id: str,
        *,
        follow: bool = True,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        timeout: float | None = None,
    ) -> ProcessOutputStream:
        """A background process's output (see Client.get_process_output)
        from the given offsets: ("stdout"|"stderr", OutputChunk) as the
        agent keeps it and, with ``follow`` (the default), as it comes
        until the process ends; then ("exit", ExecResult) if it has
        ended. ``process_id`` is the Process's ``id``; ``timeout`` bounds
        each wait for a byte."""
        query: dict[str, t.QueryValue] = {
            "follow": True if follow else None,
            "stdout_offset": stdout_offset or None,
            "stderr_offset": stderr_offset or None,
        }
        return self.client.get_process_output(self.id, process_id, query=query, timeout=timeout)

    def pty(
        self,
        cmd: str | None = None,
        *,
        rows: int | None = None,
        cols: int | None = None,
        user: str | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> Pty:
        """Opens an interactive terminal in the sandbox (see
        Client.open_pty): the user's login shell, or ``cmd`` (a shell
        string), on a terminal of ``rows`` by ``cols`` (default 24 by 80).
        ``timeout`` ends the session after that many seconds (default
        none); None means unset. Returns a Pty; use it in a ``with``
        block."""
        query: dict[str, t.QueryValue] = {
            "cmd": cmd, "rows": rows, "cols": cols, "user": user, "cwd": cwd, "timeout_seconds": timeout,
        }
        return self.client.open_pty(self.id, query=query)

    # --- code interpreter -------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        context: str | t.CodeContext | None = None,
        language: Literal["python", "javascript", "typescript", "bash"] | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        on_result: Callable[[Result], object] | None = None,
        on_error: Callable[[ExecutionError], object] | None = None,
    ) -> Execution:
        """Runs a cell of code in this sandbox's code interpreter (a sandbox
        made from the code-interpreter image; see Client.run_code) and
        returns the finished cell as an Execution. ``context`` is a
        context's ID (or the CodeContext create_code_context returned);
        without it the cell runs in the default context of ``language``
        ("python", the default, "javascript", "typescript" or "bash"),
        whose state lasts from one
        cell to the next. ``env`` adds variables for this cell;
        ``timeout`` (seconds, default the server's 300) interrupts it.
        The cell's exception is ``Execution.error``, not a raise.

        With any of the callbacks the cell is streamed (run_code_stream):
        ``on_stdout`` and ``on_stderr`` get the text as the cell writes
        it, ``on_result`` each Result, ``on_error`` the cell's
        ExecutionError, as they come; the Execution returned then has
        what was streamed."""
        body: dict[str, Any] = {"code": code}
        if context is not None:
            body["context_id"] = context if isinstance(context, str) else context["id"]
        options = {"language": language, "env": env, "timeout_seconds": timeout}
        body.update((k, v) for k, v in options.items() if v is not None)
        if on_stdout is None and on_stderr is None and on_result is None and on_error is None:
            return Execution.from_json(self.client.run_code(self.id, body=body))
        stdout: list[str] = []
        stderr: list[str] = []
        results: list[Result] = []
        with self.client.run_code_stream(self.id, body=body) as stream:
            for name, payload in stream:
                if name == "stdout":
                    stdout.append(payload)
                    if on_stdout is not None:
                        on_stdout(payload)
                elif name == "stderr":
                    stderr.append(payload)
                    if on_stderr is not None:
                        on_stderr(payload)
                elif name == "result":
                    result = Result.from_json(payload)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
                elif name == "exception":
                    if on_error is not None:
                        on_error(ExecutionError.from_json(payload))
                elif name == "end":
                    return Execution.from_json(payload, stdout="".join(stdout), stderr="".join(stderr), results=results)
        raise TransportError("code stream ended before the end event")  # the stream raises first

    def code_contexts(self) -> list[t.CodeContext]:
        """The code interpreter's contexts (see Client.list_code_contexts)."""
        return self.client.list_code_contexts(self.id)["contexts"]

    def create_code_context(
        self,
        *,
        language: Literal["python", "javascript", "typescript", "bash"] | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> t.CodeContext:
        """Starts a code interpreter context: a kernel of its own ("python",
        the default, "javascript", "typescript" or "bash") that shares only the filesystem with the
        others, its code running in ``cwd`` (default the user's home) with
        ``env`` added (see Client.create_code_context); None means unset.
        Returns the CodeContext; ``run_code(code, context=ctx)`` runs in
        it."""
        fields = {"language": language, "cwd": cwd, "env": env}
        return self.client.create_code_context(self.id, body={k: v for k, v in fields.items() if v is not None})

    def restart_code_context(self, context_id: str) -> t.CodeContext:
        """Gives a context a fresh kernel: its state is lost, and a kernel
        that died comes back (see Client.restart_code_context)."""
        return self.client.restart_code_context(self.id, context_id)

    def delete_code_context(self, context_id: str) -> None:
        """Shuts a context's kernel down (see Client.delete_code_context)."""
        self.client.delete_code_context(self.id, context_id)

    # --- files ----------------------------------------------------------

    def write_file(self, path: str, data: FileData, mode: int | str | None = None, *, make_parents: bool = False) -> t.FileInfo:
        """Writes a file; ``mode`` is an int (0o755) or an octal string ("0755")."""
        query: dict[str, t.QueryValue] = {"path": path}
        if mode is not None:
            query["mode"] = mode if isinstance(mode, str) else format(mode, "04o")
        if make_parents:
            query["make_parents"] = True
        return self.client.write_file(self.id, query=query, body=data)

    def read_file(self, path: str) -> bytes:
        """Reads a whole file."""
        return self.client.read_file(self.id, query={"path": path})

    # --- published ports (URLs) ---------------------------------------

    def create_url(self, port: int, auth: str | None = None, oidc: t.OIDCRule | None = None) -> t.URL:
        """Publishes this sandbox's TCP ``port`` (1 to 65535) as a URL on
        the server's ingress (see Client.create_url). ``auth`` None means
        the server's default, ``"token"``: the URL's ``token`` and ``link``
        are shown only here and by rotate_url. With ``auth="oidc"``,
        ``oidc`` is the rule (``{"issuer", "audience", "subjects",
        "emails", "groups"}``, at least one of the last three) whose
        OpenID Connect ID tokens the ingress accepts as ``Authorization:
        Bearer``; such a URL has no token and no link. ``oidc`` is sent
        when given; the server refuses it without ``auth="oidc"``
        (InvalidRequest). With ``auth="mtls"`` the ingress takes a TLS
        client certificate signed by the project's URL CA (see
        Client.set_url_ca) and not revoked. Returns the URL dict."""
        body: dict[str, Any] = {"port": port}
        if auth is not None:
            body["auth"] = auth
        if oidc is not None:
            body["oidc"] = oidc
        return self.client.create_url(self.id, body=body)

    def list_urls(self) -> t.URLList:
        """This sandbox's URLs, oldest first, without tokens (see
        Client.list_urls)."""
        return self.client.list_urls(self.id)

    def get_url(self, url_id: str) -> t.URL:
        """One of this sandbox's URLs (url_...), without its token."""
        return self.client.get_url(self.id, url_id)

    def rotate_url(self, url_id: str) -> t.URL:
        """Gives a token URL a new token (see Client.rotate_url): when this
        returns, the old token is refused and what it opened is cut.
        Returns the URL with its new ``token`` and ``link``. An oidc URL
        has no token: InvalidRequest (400)."""
        return self.client.rotate_url(self.id, url_id)

    def delete_url(self, url_id: str) -> None:
        """Unpublishes the URL (see Client.delete_url)."""
        self.client.delete_url(self.id, url_id)


def _exec_body(cmd: str | Sequence[str], timeout: float | None, options: dict[str, Any]) -> dict[str, Any]:
    """Builds an ExecRequest: a str is a shell command, a sequence an argv."""
    body: dict[str, Any] = {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if timeout is not None:
        body["timeout_seconds"] = timeout
    stdin = options.pop("stdin", None)
    if stdin is not None:
        body["stdin"] = base64.b64encode(stdin.encode() if isinstance(stdin, str) else bytes(stdin)).decode()
    body.update((k, v) for k, v in options.items() if v is not None)
    return body
