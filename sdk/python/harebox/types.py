"""Shapes of the API's JSON, as TypedDicts.

They describe what the server returns (api/openapi.yaml is the contract),
so a type checker catches ``result["exitcode"]``. At run time they are
plain dicts: fields the server adds later pass through untouched.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, NamedTuple, NotRequired, TypedDict, Union

#: A query string: values are str, int, float, bool or a list of them
#: (a list repeats the parameter, as ``label`` needs); None is left out.
QueryValue = Union[str, int, float, bool, None, list[str], list[int]]
Query = Mapping[str, QueryValue]

#: A JSON request body.
Body = Mapping[str, Any]


class Site(TypedDict):
    name: str
    country: str


class Resources(TypedDict):
    vcpus: int
    memory_mb: int
    disk_gb: int


class SandboxJSON(TypedDict):
    id: str
    name: NotRequired[str]
    account_id: str
    project_id: str
    project: str
    fleet_id: NotRequired[str]
    fleet: NotRequired[str]
    #: "lost": the host that runs it stopped renewing its lease; it is
    #: "running" again when that host is back.
    state: Literal["creating", "running", "paused", "stopped", "hibernated", "deleted", "lost"]
    image: str
    size: Resources
    labels: NotRequired[dict[str, str]]
    no_env: bool
    #: The pinned environment, "NAME@VERSION".
    environment: NotRequired[str]
    #: A third-party sandbox gets only third_party_safe environments.
    third_party: NotRequired[bool]
    #: Whether the sandbox keeps command history (False: none at all).
    monitoring: NotRequired[bool]
    #: Whether snapshots and forks of the sandbox are allowed.
    snapshots: NotRequired[bool]
    #: How its create was served: "boot" (its image booted), "snapshot"
    #: (restored from a snapshot: a golden one, a fork's or a named one) or
    #: "pool" (claimed from the warm pool).
    served: NotRequired[Literal["boot", "snapshot", "pool"]]
    #: How long each step of its create took, in milliseconds ("total" the
    #: whole).
    create_phases_ms: NotRequired[dict[str, float]]
    #: While running: the guest agent's health ("ok" or "unresponsive").
    agent: NotRequired[str]
    site: Site
    #: The hareboxd that runs it (hosts that share a store each run their
    #: own; any of them answers for all).
    host: NotRequired[str]
    #: Its address on its project's private mesh, if it is on it.
    mesh_address: NotRequired[str]
    #: Its name there, "NAME.PROJECT.internal", which the project's mesh
    #: sandboxes resolve.
    mesh_name: NotRequired[str]
    created_at: str
    expires_at: NotRequired[str]
    error: NotRequired[str]


class SandboxList(TypedDict):
    """The body of list_sandboxes, and of fork_sandbox (the clones)."""

    sandboxes: list[SandboxJSON]


class ForkRequest(TypedDict, total=False):
    """The body of fork_sandbox; every field is optional."""

    #: How many clones (at most 16; default 1).
    count: int
    #: Names the clones NAME-1 ... NAME-count (a DNS label, at most 60 characters).
    name: str
    #: Added to the source's labels.
    labels: dict[str, str]
    #: Deletes each clone this many seconds after it is made.
    ttl_seconds: int


class SnapshotRequest(TypedDict, total=False):
    """The body of create_snapshot."""

    #: A DNS label, at most 63 characters; unique in the account.
    name: str


class Snapshot(TypedDict):
    """A snapshot of a sandbox: its memory, device state and its disk's
    writes. Create a sandbox from it with ``create(snapshot=ID)``."""

    #: e.g. "snap_01j8z3k5m6n7p8q9r0s1t2v3w4"
    id: str
    name: NotRequired[str]
    account_id: str
    project_id: str
    #: The source sandbox (it may since be deleted).
    sandbox_id: str
    image: str
    size: Resources
    labels: NotRequired[dict[str, str]]
    #: What the snapshot's files take on the host.
    bytes: int
    created_at: str


class SnapshotList(TypedDict):
    """The body of list_snapshots: oldest first."""

    snapshots: list[Snapshot]


# A guest image sandboxes can be created from (``create(image=...)``).
# (Its "from" key is a Python keyword: hence the functional form.)
Image = TypedDict("Image", {
    "name": str,
    # The OCI image it was built from (oci:DIR, docker-archive:FILE or registry:REF), if any.
    "from": NotRequired[str],
    # That OCI image's digest.
    "digest": NotRequired[str],
    "kernel_version": str,
    # RFC 3339 date-time.
    "built_at": str,
    # Whether it boots from a root disk (every image but minimal).
    "root_disk": bool,
})


class ImageList(TypedDict):
    """The body of list_images: by name."""

    images: list[Image]


class HostTunnel(TypedDict):
    """A host's tunnel to another host, as it last reported it."""

    #: The other host (empty if no host publishes that key now).
    host: str
    public_key: str
    endpoint: NotRequired[str]
    #: Absent before the first handshake.
    last_handshake: NotRequired[str]
    rx_bytes: int
    tx_bytes: int


class HostMesh(TypedDict):
    """A host's end of the mesh's tunnels (hareboxd --mesh-endpoint)."""

    public_key: str
    #: ADDR:PORT on the network between the hosts (UDP).
    endpoint: str
    tunnels: NotRequired[list[HostTunnel]]
    reported_at: NotRequired[str]


class Host(TypedDict):
    """A host of the deployment (a hareboxd that shares the store)."""

    name: str
    site: str
    #: Its site's country (ISO 3166-1 alpha-2), if it was given one.
    country: NotRequired[str]
    #: Its internal endpoint (https://HOST:PORT), where the other hosts
    #: forward requests for its sandboxes; absent when it has none.
    address: NotRequired[str]
    capacity: Resources
    #: What its sandboxes reserve, as of its last write.
    used: Resources
    #: False once another host found its lease lapsed (its running
    #: sandboxes are then "lost").
    up: bool
    started_at: str
    renewed_at: str
    lease_until: str
    #: Its end of the mesh's tunnels, if it has one.
    mesh: NotRequired[HostMesh]


class HostList(TypedDict):
    """The body of list_hosts: by name."""

    hosts: list[Host]


MoveResult = TypedDict("MoveResult", {"sandbox": SandboxJSON, "from": str, "to": str, "paused_ms": int})
"""The body of move_sandbox: the sandbox on its new host, the hosts, and
how long it did not run (milliseconds)."""


class DrainMoved(TypedDict):
    """A sandbox a drain moved, where, and how long it did not run."""

    id: str
    to: str
    paused_ms: int


class DrainStayed(TypedDict):
    """A sandbox a drain could not move, and why."""

    id: str
    error: str


class DrainReport(TypedDict):
    """The body of drain_host."""

    host: str
    moved: list[DrainMoved]
    stayed: list[DrainStayed]


class Pool(TypedDict):
    """The body of get_pool, set_pool and reset_pool: the warm pool as the
    host that answered keeps it."""

    pool: dict[str, int]
    source: Literal["deployment", "host"]
    set_at: NotRequired[str]
    host: str
    kept: bool
    idle: int


class HostName(TypedDict):
    """The body of rotate_mesh_key."""

    host: str


class HostRemoval(TypedDict):
    """The body of delete_host: the sandboxes it deleted."""

    host: str
    deleted_sandboxes: list[str]


# The body of build_image: name (lower-case letters, digits and dashes;
# not minimal or default) and from ("registry:REF", e.g.
# "registry:ghcr.io/org/app:1").
ImageBuildRequest = TypedDict("ImageBuildRequest", {"name": str, "from": str})


class OIDCRule(TypedDict):
    """Whose OpenID Connect ID tokens an ``oidc`` URL accepts: signed by
    ``issuer`` (checked against its published keys, which the server
    fetches and caches), for ``audience``, not expired, and naming one of
    the ``subjects``, one of the ``emails`` (unless the token's
    ``email_verified`` is false), or one of the ``groups`` (its ``groups``
    claim). At least one of subjects, emails and groups is required
    (InvalidRequest otherwise)."""

    #: The issuer, an https URL (without query or fragment).
    issuer: str
    #: The ``aud`` the tokens must carry (the client ID).
    audience: str
    subjects: NotRequired[list[str]]
    #: Compared without case.
    emails: NotRequired[list[str]]
    groups: NotRequired[list[str]]


class URLRequest(TypedDict):
    """The body of create_url."""

    #: The guest's TCP port, 1 to 65535 (plain HTTP in the guest; the
    #: ingress speaks TLS to clients).
    port: int
    #: How a client proves access: "token" (the default; a bearer token,
    #: or a link that swaps it for a cookie), "oidc" (an OpenID Connect ID
    #: token from ``oidc["issuer"]`` as ``Authorization: Bearer``), or
    #: "mtls" (a TLS client certificate signed by the project's URL CA and
    #: not revoked; host form only, so the ingress's host must be a name).
    auth: NotRequired[Literal["token", "oidc", "mtls"]]
    #: Required with auth "oidc", refused otherwise.
    oidc: NotRequired[OIDCRule]


class URL(TypedDict):
    """A sandbox's TCP port published on the server's ingress, behind a
    token, OpenID Connect or client certificates. A token goes in the
    ``X-HareBox-Token`` header or as ``Authorization: Bearer hburl_...``;
    a visit to ``link`` swaps it for a cookie. An ``oidc`` URL takes an ID
    token its rule allows as ``Authorization: Bearer``; an ``mtls`` URL a
    TLS client certificate from its project's URL CA, not revoked. The
    ingress takes a token or ID token off every request before the guest
    sees it."""

    #: e.g. "url_01j8z3k5m6n7p8q9r0s1t2v3w4"
    id: str
    sandbox_id: str
    account_id: str
    #: The sandbox's project, whose URL CA an "mtls" URL checks clients against.
    project_id: str
    port: int
    #: "token", "oidc" or "mtls"
    auth: str
    #: The rule of an "oidc" URL (which has no ``token`` and no ``link``).
    oidc: NotRequired[OIDCRule]
    #: The host form, https://PORT-ULID.HOST/ (the path form when the
    #: ingress's host is an address).
    url: str
    #: The path form, https://HOST/s/SANDBOX/PORT/, for hosts without
    #: wildcard DNS.
    path_url: str
    #: The token (``hburl_...``): in the create_url and rotate_url replies only.
    token: NotRequired[str]
    #: ``url`` with the token as the ``harebox_token`` query parameter, to
    #: share: the first visit swaps it for an HttpOnly, Secure,
    #: SameSite=Lax cookie. Only with ``token``.
    link: NotRequired[str]
    created_at: str
    #: When the token was last rotated.
    rotated_at: NotRequired[str]


class URLList(TypedDict):
    """The body of list_urls: oldest first, without tokens."""

    urls: list[URL]


class URLCA(TypedDict):
    """A project's URL certificate authority: the CA its ``mtls`` URLs
    check client certificates against (get_url_ca, set_url_ca)."""

    project_id: str
    #: The CA's certificate, PEM.
    certificate: str
    #: Uploaded by the user (who issues its certificates), not made by the server.
    uploaded: bool
    created_at: str


class ClientCert(TypedDict):
    """A client certificate the project issued, or the serial of one it
    revoked (issue_client_cert, list_client_certs, revoke_client_cert)."""

    project_id: str
    #: The serial number, lower-case hex.
    serial: str
    #: The subject's common name: who holds it.
    name: NotRequired[str]
    #: Issued by the server (False: a serial of an uploaded CA's
    #: certificate, recorded when revoked).
    issued: bool
    #: SHA-256 (hex) of the public keys of the CAs the serial is of: a
    #: revocation holds for these keys.
    issuer_keys: NotRequired[list[str]]
    not_after: NotRequired[str]
    created_at: str
    revoked_at: NotRequired[str]
    #: The certificate (PEM): in the issue_client_cert reply only.
    certificate: NotRequired[str]
    #: Its private key (PEM, PKCS#8): in the issue_client_cert reply only;
    #: the server does not keep it.
    private_key: NotRequired[str]


class ClientCertList(TypedDict):
    """The body of GET /v1/url-ca/certs: oldest first, without keys."""

    certs: list[ClientCert]


class Health(TypedDict):
    status: str


class Readiness(TypedDict):
    status: str
    checks: dict[str, str]


class Info(TypedDict):
    version: str
    backend: dict[str, str]
    site: Site


class ExecResult(TypedDict):
    exit_code: int
    signal: NotRequired[int]
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    error: NotRequired[str]


class Process(TypedDict):
    id: str
    sandbox_id: str
    cmd: NotRequired[str]
    argv: NotRequired[list[str]]
    pid: NotRequired[int]
    running: bool
    started_at: str
    tag: NotRequired[str]
    env: NotRequired[dict[str, str]]
    cwd: NotRequired[str]
    user: NotRequired[str]
    pty: NotRequired[bool]
    result: NotRequired[ExecResult]


class ProcessList(TypedDict):
    processes: list[Process]


class OutputChunk(NamedTuple):
    """One piece of a background process's stdout or stderr, as
    get_process_output yields it: ``offset`` is how many bytes of that
    stream came before ``data``. An offset past the previous chunk's
    ``end`` (or, for the first chunk, past the offset asked for) means
    the guest's agent dropped the bytes between: it keeps the last 4 MiB
    of each stream."""

    offset: int
    data: bytes

    @property
    def end(self) -> int:
        """The offset just past this chunk: where the next read of its
        stream starts (``stdout_offset`` or ``stderr_offset``)."""
        return self.offset + len(self.data)


class CodeRequest(TypedDict):
    """The body of run_code and run_code_stream: a cell of code."""

    #: At most 1 MiB.
    code: str
    #: The context it runs in; default the default context of ``language``
    #: (python's is "default", bash's "default-bash", javascript's
    #: "default-javascript", typescript's "default-typescript").
    context_id: NotRequired[str]
    #: "python" (the default), "javascript", "typescript" or "bash".
    language: NotRequired[Literal["python", "javascript", "typescript", "bash"]]
    #: Variables for this cell, over the sandbox's own.
    env: NotRequired[dict[str, str]]
    #: Interrupts the cell (the context stays usable); default 300, at most 3600.
    timeout_seconds: NotRequired[float]


class CodeContextRequest(TypedDict, total=False):
    """The body of create_code_context; every field is optional."""

    #: "python" (the default), "javascript", "typescript" or "bash".
    language: Literal["python", "javascript", "typescript", "bash"]
    #: Where its code runs (an absolute path); default the user's home.
    cwd: str
    env: dict[str, str]


class CodeContext(TypedDict):
    """A context of a sandbox's code interpreter: a kernel whose state
    lasts from one cell to the next."""

    id: str
    language: Literal["python", "javascript", "typescript", "bash"]
    cwd: str


class CodeContextList(TypedDict):
    """The body of list_code_contexts."""

    contexts: list[CodeContext]


class CodeResult(TypedDict):
    """One rich result of a cell, in each format the kernel gave that the
    host keeps. ``png`` and ``jpeg`` are base64; HTML, SVG, Markdown and
    LaTeX are the sandbox's own text (never render them trusted)."""

    #: The value of the cell's last expression (else something it displayed).
    is_main_result: bool
    text: NotRequired[str]
    html: NotRequired[str]
    markdown: NotRequired[str]
    svg: NotRequired[str]
    png: NotRequired[str]
    jpeg: NotRequired[str]
    latex: NotRequired[str]
    #: application/json: any JSON value.
    json: NotRequired[Any]
    #: What a Matplotlib figure draws, as data: its type (line, scatter,
    #: bar, pie, box_and_whisker, superchart, unknown), title, axes and
    #: elements.
    chart: NotRequired[dict[str, Any]]
    #: The PNG's (else the JPEG's) size in pixels.
    width: NotRequired[int]
    height: NotRequired[int]


class CodeError(TypedDict):
    """The exception a cell raised: TimeoutError for a timeout, KernelDied
    for a dead kernel, ExitCode for a bash cell's non-zero status."""

    name: str
    value: str
    traceback: NotRequired[str]


class CodeExecution(TypedDict):
    """A finished cell: the reply of run_code, and the ``end`` event of
    run_code_stream (there with stdout, stderr and results empty: they
    were streamed)."""

    context_id: str
    execution_count: int
    #: "died": the kernel died; the context answers so until it is restarted.
    status: Literal["ok", "error", "timeout", "died"]
    stdout: str
    stderr: str
    results: list[CodeResult]
    error: NotRequired[CodeError]
    duration_ms: int
    stdout_truncated: bool
    stderr_truncated: bool
    #: Results past the host's bounds, or in no format it keeps.
    results_dropped: NotRequired[int]


class Command(TypedDict):
    """One entry of a sandbox's command history."""

    id: str
    sandbox_id: str
    #: "exec" (exec), "stream" (exec_stream), "background" (start_process) or "code" (run_code).
    kind: Literal["exec", "stream", "background", "code"]
    cmd: NotRequired[str]
    argv: NotRequired[list[str]]
    user: NotRequired[str]
    cwd: NotRequired[str]
    started_at: str
    ended_at: str
    #: Its output bounded at 64 KiB per stream (``stdout_truncated`` when cut);
    #: empty once purged.
    result: NotRequired[ExecResult]
    #: The output is gone (the account's retention), or was never kept.
    output_purged: bool


class CommandList(TypedDict):
    """The body of list_commands: oldest first."""

    commands: list[Command]


class MetricSample(TypedDict):
    """One monitoring sample of a sandbox, measured on the host (never
    asked of the guest)."""

    sandbox_id: str
    time: str
    #: The VMM's CPU time (user and system) since it started, in seconds
    #: (a whole number may come as an int).
    cpu_seconds: float
    #: The VMM's resident memory.
    memory_bytes: int
    #: What the sandbox's own files take on the host's disk.
    disk_bytes: int
    #: What the guest sent on its link since it was made (0 without a network).
    net_sent_bytes: int
    net_received_bytes: int


class MetricSampleList(TypedDict):
    """The body of get_sandbox_metrics: oldest first."""

    samples: list[MetricSample]


class FileInfo(TypedDict):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    uid: int
    gid: int
    mtime: str
    link_target: NotRequired[str]


class FileList(TypedDict):
    entries: list[FileInfo]
    truncated: bool


class FirewallRule(TypedDict):
    action: Literal["allow", "deny"]
    protocol: NotRequired[Literal["tcp", "udp", "icmp", "any"]]
    ports: NotRequired[str]
    hosts: NotRequired[list[str]]
    cidrs: NotRequired[list[str]]


class MeshRule(TypedDict):
    """What a sandbox opens to its project's other mesh sandboxes in a
    fleet and/or with labels (neither: all of them); first match wins."""

    action: Literal["allow", "deny"]
    protocol: NotRequired[Literal["tcp", "udp", "any"]]
    ports: NotRequired[str]
    #: A fleet's name or ID.
    fleet: NotRequired[str]
    #: The labels a peer must all carry.
    labels: NotRequired[dict[str, str]]


class FirewallPolicy(TypedDict):
    default_outbound: Literal["allow", "deny"]
    outbound: NotRequired[list[FirewallRule]]
    #: Rules for the project's mesh; none matching, the project's
    #: mesh_default decides.
    mesh: NotRequired[list[MeshRule]]


class Retention(TypedDict, total=False):
    """How long an account's command history is kept, in days: a field left
    out keeps forever, 0 keeps nothing. The audit log is kept whatever
    this says."""

    #: Entries older than this go (0 to 36500).
    history_days: int
    #: Output older than this is dropped from its entry (0 to 36500).
    output_days: int


class Account(TypedDict):
    id: str
    name: str
    created_at: str
    #: ``{}`` keeps everything forever.
    retention: Retention


class AccountUpdate(TypedDict, total=False):
    """The body of update_account; a field left out stays as it is."""

    #: Replaces the account's retention (``{}`` keeps forever); lowering it
    #: purges at once.
    retention: Retention


class AccountList(TypedDict):
    accounts: list[Account]


class Project(TypedDict):
    id: str
    account_id: str
    name: str
    created_at: str
    #: Every new sandbox of the project is third-party.
    third_party_default: bool
    #: New sandboxes of the project are on its private mesh.
    mesh: bool
    #: "deny": its mesh sandboxes open nothing to each other that no mesh
    #: rule of theirs allows; absent: allowed.
    mesh_default: NotRequired[Literal["deny"]]


class ProjectList(TypedDict):
    projects: list[Project]


class Fleet(TypedDict):
    id: str
    account_id: str
    project_id: str
    name: str
    created_at: str


class FleetList(TypedDict):
    fleets: list[Fleet]


class Rate(TypedDict):
    per_second: float
    burst: int


class Scope(TypedDict, total=False):
    """What a key may do; every field is optional and they combine with AND."""

    #: operationIds or groups ("*", "sandboxes:read", "keys:write", ...).
    actions: list[str]
    sandboxes: list[str]
    #: Project IDs or names in a request; IDs in a reply.
    projects: list[str]
    labels: dict[str, str]
    cidrs: list[str]
    rate: Rate
    #: A dollar limit, e.g. "25.00".
    budget_usd: str


class Key(TypedDict):
    id: str
    account_id: str
    description: NotRequired[str]
    parent_id: NotRequired[str]
    ancestors: NotRequired[list[str]]
    scope: Scope
    created_at: str
    expires_at: NotRequired[str]
    revoked_at: NotRequired[str]
    rotated_at: NotRequired[str]
    #: The secret's first characters.
    hint: str


class KeyWithSecret(Key):
    #: The key (``hbk_...``); the API shows it only once.
    secret: str


class KeyList(TypedDict):
    keys: list[Key]


class ProjectUpdate(TypedDict, total=False):
    """The body of update_project."""

    #: New sandboxes of the project are third-party (only third-party-safe environments).
    third_party_default: bool
    #: New sandboxes of the project are on its private mesh.
    mesh: bool
    #: What its mesh sandboxes open to each other when no mesh rule of
    #: theirs matches.
    mesh_default: Literal["allow", "deny"]


class EnvVar(TypedDict, total=False):
    """A variable. In answers a secret has no ``value``: ``{"secret": True}``."""

    value: str
    #: Sealed in the host; a sandbox sees a placeholder (``hbph_...``) instead.
    secret: bool


class EnvFile(TypedDict):
    """A file the environment puts in the sandbox."""

    path: str
    #: Permission bits; default 0o644.
    mode: NotRequired[int]
    #: "user", "root" or "name:group".
    owner: NotRequired[str]
    content: str
    #: ``{{NAME}}`` is replaced by the variable's value (a secret's by the
    #: sandbox's placeholder).
    template: NotRequired[bool]


class CredentialRule(TypedDict):
    """Where a secret may be used, and how the host puts it in requests."""

    #: The secret variable.
    secret: str
    hosts: list[str]
    ports: NotRequired[str]
    #: A header to set to ``format``; without it the placeholder is
    #: replaced where it appears.
    header: NotRequired[str]
    #: e.g. "Bearer {value}".
    format: NotRequired[str]
    allow_http: NotRequired[bool]


class EnvironmentRequest(TypedDict):
    """The body of create_environment."""

    name: str
    project: NotRequired[str]
    variables: NotRequired[dict[str, EnvVar]]
    files: NotRequired[list[EnvFile]]
    credentials: NotRequired[list[CredentialRule]]
    third_party_safe: NotRequired[bool]


class EnvironmentUpdate(TypedDict, total=False):
    """The body of update_environment: a new version from the latest one.
    ``files``, ``credentials`` and ``third_party_safe`` replace the latest
    version's when given."""

    set: dict[str, EnvVar]
    unset: list[str]
    files: list[EnvFile]
    credentials: list[CredentialRule]
    third_party_safe: bool


class EnvironmentVersion(TypedDict):
    environment_id: str
    version: int
    created_at: str
    third_party_safe: bool
    variables: dict[str, EnvVar]
    files: list[EnvFile]
    credentials: list[CredentialRule]


class Environment(TypedDict):
    id: str
    account_id: str
    project_id: str
    #: The project's name.
    project: str
    name: str
    #: The newest version's number.
    latest: int
    created_at: str
    updated_at: str
    #: The version this answer describes (the latest, or the one just made).
    version: EnvironmentVersion


class EnvironmentList(TypedDict):
    environments: list[Environment]


class EnvironmentVersionList(TypedDict):
    versions: list[EnvironmentVersion]


class VolumeAttachment(TypedDict, total=False):
    sandbox_id: str
    path: str
    read_only: bool
    #: The layer it opens.
    layer: int


class Volume(TypedDict):
    """A project's disk that outlives sandboxes, encrypted under its own key."""

    id: str
    account_id: str
    project_id: str
    project: str
    name: str
    size_gb: int
    #: The host that holds its file.
    host: str
    created_at: str
    #: What its encrypted files take on the host's disk.
    used_bytes: int
    attachments: list[VolumeAttachment]
    #: Files over its first (a writer that attached beside readers writes to one of its own; a reader that attached beside a writer took the one the writer left).
    layers: NotRequired[int]
    #: What is being done to its files (resizing, folding its layers).
    busy: NotRequired[str]


class VolumeList(TypedDict):
    volumes: list[Volume]


class AuditEntry(TypedDict):
    """One entry of the audit log (never request data)."""

    #: From 1, no gaps: the cursor of list_audit's ``after``.
    seq: int
    time: str
    account_id: NotRequired[str]
    #: A key ID, or "operator"; for an event (list_events) "budget:ID",
    #: "sandbox:ID" or "engine".
    principal: str
    #: The caller's address.
    source: NotRequired[str]
    #: An operationId; for an event budgetWarning, budgetReached,
    #: budgetPause, budgetStop, budgetDelete, usePlaceholder or vmExited.
    action: str
    target: NotRequired[str]
    outcome: Literal["ok", "denied", "error"]
    #: The error's code (``not_found``, ``forbidden``, ...).
    error: NotRequired[str]
    #: The request's X-Request-ID.
    request_id: NotRequired[str]
    #: The previous entry's hash.
    prev: str
    #: SHA-256 of this entry's JSON without ``hash``.
    hash: str


class AuditList(TypedDict):
    """The body of list_audit."""

    entries: list[AuditEntry]
    #: The cursor (``after``) of the next page; present when this one is full.
    next: NotRequired[str]


class EventList(TypedDict):
    """The body of list_events: audit entries of the engine's own acts."""

    events: list[AuditEntry]
    #: The cursor (``after``) of the next page: the sequence number of the
    #: last entry looked at, as a string; an empty page keeps it.
    next: str


class AuditReport(TypedDict):
    """The body of verify_audit."""

    ok: bool
    entries: int
    checkpoints: int
    #: The first entry altered, removed or reordered.
    first_bad: NotRequired[int]
    reason: NotRequired[str]


class AuditKey(TypedDict):
    """The body of get_audit_key."""

    algorithm: Literal["ed25519"]
    #: Base64.
    public_key: str


class BudgetScope(TypedDict):
    """What a budget covers."""

    kind: Literal["account", "project", "fleet", "label", "key"]
    #: A project (ID or name in a request, its ID in a reply), a fleet ID
    #: or an API key ID; none for account and label.
    ref: NotRequired[str]
    #: A label scope's selector: every label must match.
    labels: NotRequired[dict[str, str]]


class BudgetRequest(TypedDict):
    """The body of create_budget."""

    name: NotRequired[str]
    scope: BudgetScope
    #: monthly: calendar months in UTC; total: from creation on.
    period: Literal["monthly", "total"]
    #: A decimal dollar amount, at most six decimals, e.g. "25.00".
    limit_usd: str
    #: notify: an audit event only; deny_new: creates, resumes and starts
    #: in scope are refused; pause, stop or delete: also the sandboxes in
    #: scope are paused, stopped or deleted.
    action: Literal["notify", "deny_new", "pause", "stop", "delete"]
    #: Up to 4 percentages of the limit (1 to 99), announced once a period each.
    warn_at_percent: NotRequired[list[int]]


class Budget(TypedDict):
    """A budget with its running account; money is a decimal string."""

    id: str
    account_id: str
    name: NotRequired[str]
    scope: BudgetScope
    #: The budget an API key's budget_usd makes; it goes with its key.
    from_key: NotRequired[bool]
    #: The project of a project or fleet scope.
    project_id: NotRequired[str]
    period: Literal["monthly", "total"]
    limit_usd: str
    action: Literal["notify", "deny_new", "pause", "stop", "delete"]
    warn_at_percent: NotRequired[list[int]]
    created_at: str
    #: The start of the current period.
    period_start: str
    #: Settled spend in the current period.
    spent_usd: str
    #: What the live sandboxes in scope hold for their next metering interval.
    reserved_usd: str
    #: When the period's spend reached the limit.
    reached_at: NotRequired[str]
    #: The action is decided but not yet done.
    action_pending: NotRequired[bool]
    #: The warning thresholds already announced this period.
    warned_percent: NotRequired[list[int]]


class BudgetList(TypedDict):
    budgets: list[Budget]


class UsageGroup(TypedDict):
    """The metered usage of one group and its cost."""

    #: The group's ID, or the label's value for label:KEY.
    group: str
    #: What the ID stands for: the account's, project's, fleet's or
    #: sandbox's name, the key's description (for a key that may read
    #: keys); absent for a label's value.
    name: NotRequired[str]
    vcpu_seconds: int
    memory_gib_seconds: int
    paused_seconds: int
    #: What the guests sent out of their network links, counted on the host.
    egress_bytes: int
    #: Snapshot storage held (10^9 bytes), in seconds: a snapshot's files,
    #: or a hibernated sandbox's.
    snapshot_gb_seconds: int
    cost_usd: str


class UsageList(TypedDict):
    """The body of get_usage."""

    usage: list[UsageGroup]
