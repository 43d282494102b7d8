"""Errors the client raises.

Every failure is a HareBoxError, so one ``except harebox.HareBoxError``
is enough; the subclasses exist so callers can react to the one case
they care about (``except harebox.NotFound``) without comparing strings.
"""

from __future__ import annotations

from typing import Any, Mapping


class HareBoxError(Exception):
    """An error from the API, or from reaching it.

    ``status`` is the HTTP status (0 when no response came back), ``code``
    the API's error code (``invalid``, ``not_found``, ...), ``field`` the
    request field at fault as a JSON path, when the server named one.
    """

    def __init__(self, message: str, *, status: int = 0, code: str = "", field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        head = f"{self.status} {self.code}" if self.status else self.code
        return f"{head}: {self.message}{where}" if head else f"{self.message}{where}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r}, field={self.field!r})"


class InvalidRequest(HareBoxError):
    """400 ``invalid``: the request is wrong; ``field`` says where."""


class Unauthorized(HareBoxError):
    """401 ``unauthorized``: no API key, or not a valid one."""


class NotFound(HareBoxError):
    """404 ``not_found``: no such sandbox, process, file or route."""


class Conflict(HareBoxError):
    """409 ``conflict``: the sandbox's state forbids it, or the name is taken."""


class TooLarge(HareBoxError):
    """413 ``too_large``: a body or file past the server's limit."""


class OverCapacity(HareBoxError):
    """503 ``over_capacity``: the host has no room for another sandbox now."""


class Unavailable(HareBoxError):
    """503 ``unavailable``: a part of the server (or the guest agent) is down."""


class ServerTimeout(HareBoxError):
    """504 ``timeout``: the server gave up waiting (on the VM or its agent)."""


class InternalError(HareBoxError):
    """500 ``internal``: a bug or an unexpected failure in the server."""


class TransportError(HareBoxError):
    """No usable response: connection refused or reset, or a reply that is
    not the API's (status is 0 when nothing came back)."""


class RequestTimeout(TransportError):
    """The client's own timeout expired before the server answered."""


_BY_CODE: dict[str, type[HareBoxError]] = {
    "invalid": InvalidRequest,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_large": TooLarge,
    "over_capacity": OverCapacity,
    "unavailable": Unavailable,
    "timeout": ServerTimeout,
    "internal": InternalError,
}

# Used when a reply has no usable error body (a proxy's HTML page, say),
# and to give stream errors, which arrive after a 200, their usual status.
_BY_STATUS: dict[int, str] = {
    400: "invalid",
    401: "unauthorized",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    500: "internal",
    503: "unavailable",
    504: "timeout",
}
_STATUS_OF: dict[str, int] = {
    "invalid": 400,
    "unauthorized": 401,
    "not_found": 404,
    "conflict": 409,
    "too_large": 413,
    "over_capacity": 503,
    "unavailable": 503,
    "timeout": 504,
    "internal": 500,
}


def error_from_body(status: int, body: Any) -> HareBoxError:
    """Builds the error for an API error body ``{"error": {...}}``.

    ``status`` 0 means the error came inside a stream; it takes the status
    the code has everywhere else.
    """
    err: Any = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(err, Mapping) or not isinstance(err.get("code"), str):
        # Not the API talking (a proxy's page, a redirect): keep the status.
        status_code = _BY_STATUS.get(status, "")
        cls: type[HareBoxError] = _BY_CODE[status_code] if status_code else TransportError
        return cls(f"HTTP {status} without an API error body", status=status, code=status_code)
    code: str = err["code"]
    message: Any = err.get("message")
    field: Any = err.get("field")
    cls = _BY_CODE.get(code, HareBoxError)
    return cls(
        message if isinstance(message, str) else code,
        status=status or _STATUS_OF.get(code, 0),
        code=code,
        field=field if isinstance(field, str) and field else None,
    )
