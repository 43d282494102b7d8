"""HareBox: run untrusted code in sandboxes that are real virtual machines.

    import harebox
    hb = harebox.Client()  # $HAREBOX_URL and $HAREBOX_API_KEY
    box = hb.create(name="untrusted", size={"preset": "small"}, no_env=True, ttl_seconds=900)
    result = box.run("python3 /home/user/job.py", timeout=300)
    box.delete()

The Client has one method per operation of the REST API (see
/openapi.json); errors raise HareBoxError and its subclasses.
"""

from .client import DEFAULT_URL, Client, CodeEvent, CodeStream, ExecEvent, ExecStream, ProcessOutputStream
from .errors import (
    BudgetExceeded,
    Conflict,
    Forbidden,
    HareBoxError,
    InternalError,
    InvalidRequest,
    NotFound,
    OverCapacity,
    RateLimited,
    RequestTimeout,
    ServerTimeout,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
)
from .interpreter import Execution, ExecutionError, Result
from .pty import Pty
from .sandbox import Sandbox

__version__ = "1.0.0"

__all__ = [
    "Client",
    "Sandbox",
    "ExecEvent",
    "ExecStream",
    "ProcessOutputStream",
    "CodeEvent",
    "CodeStream",
    "Execution",
    "ExecutionError",
    "Result",
    "Pty",
    "DEFAULT_URL",
    "HareBoxError",
    "InvalidRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "TooLarge",
    "RateLimited",
    "BudgetExceeded",
    "OverCapacity",
    "Unavailable",
    "ServerTimeout",
    "InternalError",
    "TransportError",
    "RequestTimeout",
]
