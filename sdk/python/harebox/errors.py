"""Errors the client raises.

Every failure is a HareBoxError, so one ``except harebox.HareBoxError``
is enough; the subclasses exist so callers can react to the one case
they care about (``except harebox.NotFound``) without comparing strings.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
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


class Forbidden(HareBoxError):
    """403 ``forbidden``: the API key's scope lacks the action (or the
    caller's address is outside the key's CIDRs). Objects a key may not
    see are NotFound, never Forbidden."""


class NotFound(HareBoxError):
    """404 ``not_found``: no such sandbox, process, file, account, project,
    fleet, key or route, or one the API key may not see."""


class Conflict(HareBoxError):
    """409 ``conflict``: the sandbox's state forbids it, or the name is taken."""


class TooLarge(HareBoxError):
    """413 ``too_large``: a body or file past the server's limit."""


class RateLimited(HareBoxError):
    """429 ``rate_limited``: the API key (or a key above it) spent its
    request rate. ``retry_after`` is the server's Retry-After in seconds
    (None if it sent none)."""

    def __init__(
        self, message: str, *, status: int = 0, code: str = "", field: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status, code=code, field=field)
        self.retry_after = retry_after

    def __str__(self) -> str:
        later = f" (retry after {self.retry_after:g} s)" if self.retry_after is not None else ""
        return super().__str__() + later

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", retry_after={self.retry_after!r})"


class BudgetExceeded(HareBoxError):
    """402 ``budget_exceeded``: a budget that covers the sandbox has no room
    for it; the create, resume or start is refused before anything boots."""


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
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_large": TooLarge,
    "rate_limited": RateLimited,
    "budget_exceeded": BudgetExceeded,
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
    402: "budget_exceeded",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
    504: "timeout",
}
_STATUS_OF: dict[str, int] = {
    "invalid": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "too_large": 413,
    "rate_limited": 429,
    "budget_exceeded": 402,
    "over_capacity": 503,
    "unavailable": 503,
    "timeout": 504,
    "internal": 500,
}


def parse_retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds: delay-seconds, or an HTTP date
    (seconds from now, at least 0); None when absent or malformed."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def error_from_body(status: int, body: Any, *, retry_after: float | None = None) -> HareBoxError:
    """Builds the error for an API error body ``{"error": {...}}``.

    ``status`` 0 means the error came inside a stream; it takes the status
    the code has everywhere else. ``retry_after`` (seconds, from the reply's
    Retry-After header) goes to RateLimited.
    """
    err: Any = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(err, Mapping) or not isinstance(err.get("code"), str):
        # Not the API talking (a proxy's page, a redirect): keep the status.
        status_code = _BY_STATUS.get(status, "")
        cls: type[HareBoxError] = _BY_CODE[status_code] if status_code else TransportError
        return _make(cls, f"HTTP {status} without an API error body", status=status, code=status_code, retry_after=retry_after)
    code: str = err["code"]
    message: Any = err.get("message")
    field: Any = err.get("field")
    cls = _BY_CODE.get(code, HareBoxError)
    return _make(
        cls,
        message if isinstance(message, str) else code,
        status=status or _STATUS_OF.get(code, 0),
        code=code,
        field=field if isinstance(field, str) and field else None,
        retry_after=retry_after,
    )


def _make(
    cls: type[HareBoxError], message: str, *, status: int, code: str, field: str | None = None, retry_after: float | None
) -> HareBoxError:
    if issubclass(cls, RateLimited):
        return cls(message, status=status, code=code, field=field, retry_after=retry_after)
    return cls(message, status=status, code=code, field=field)
