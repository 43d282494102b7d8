"""Shapes of the API's JSON, as TypedDicts.

They describe what the server returns (api/openapi.yaml is the contract),
so a type checker catches ``result["exitcode"]``. At run time they are
plain dicts: fields the server adds later pass through untouched.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, NotRequired, TypedDict, Union

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
    state: Literal["creating", "running", "paused", "stopped", "deleted"]
    image: str
    size: Resources
    labels: NotRequired[dict[str, str]]
    no_env: bool
    site: Site
    created_at: str
    expires_at: NotRequired[str]
    error: NotRequired[str]


class SandboxList(TypedDict):
    sandboxes: list[SandboxJSON]


class Health(TypedDict):
    status: str


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
    result: NotRequired[ExecResult]


class ProcessList(TypedDict):
    processes: list[Process]


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


class FirewallPolicy(TypedDict):
    default_outbound: Literal["allow", "deny"]
    outbound: NotRequired[list[FirewallRule]]
