"""Execution and Result: a code interpreter's finished cell and its rich
results, as ``Sandbox.run_code`` returns them.

They are read-only views of the API's CodeExecution and CodeResult (the
TypedDicts Client.run_code returns): the same fields as attributes, with
the images decoded to bytes and the cell's exception as an
ExecutionError.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, cast

from . import types as t

__all__ = ["Execution", "ExecutionError", "Result", "RESULT_FORMATS"]

#: The formats a Result may have, in the order ``Result.formats()`` lists them.
RESULT_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "latex", "json", "chart")


@dataclass(frozen=True)
class ExecutionError:
    """The exception a cell raised (a CodeError), as data: run_code
    returns it in ``Execution.error``, it does not raise it. ``name`` is
    the exception's class (TimeoutError for a timeout, KernelDied for a
    dead kernel, ExitCode for a bash cell's non-zero status), ``value``
    its message, ``traceback`` the kernel's traceback ("" when it gave
    none)."""

    name: str
    value: str
    traceback: str = ""

    @classmethod
    def from_json(cls, data: t.CodeError) -> ExecutionError:
        return cls(name=data["name"], value=data["value"], traceback=data.get("traceback", ""))

    def to_dict(self) -> t.CodeError:
        """The CodeError it was made from."""
        out: t.CodeError = {"name": self.name, "value": self.value}
        if self.traceback:
            out["traceback"] = self.traceback
        return out


@dataclass(frozen=True, repr=False)
class Result:
    """One rich result of a cell (a CodeResult): the value of its last
    expression (``is_main_result``) or something it displayed (a chart,
    for one), in each format the kernel gave that the host keeps; the
    others are None. ``png`` and ``jpeg`` are the image's bytes (the
    API's base64, decoded), ``width`` and ``height`` the PNG's (else the
    JPEG's) in pixels; ``json`` is the application/json value; ``chart``
    what a Matplotlib figure draws, as data (a dict: its ``type``,
    ``title``, axes and ``elements``). HTML, SVG, Markdown and LaTeX are
    the sandbox's own text: never render them trusted."""

    is_main_result: bool = False
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: bytes | None = None
    jpeg: bytes | None = None
    latex: str | None = None
    json: Any = None
    chart: dict[str, Any] | None = None
    width: int | None = None
    height: int | None = None
    #: The formats present, in RESULT_FORMATS' order (a json value may be null).
    _formats: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_json(cls, data: t.CodeResult) -> Result:
        """Decodes a CodeResult (its images from base64)."""
        raw: dict[str, Any] = dict(data)
        png, jpeg = raw.get("png"), raw.get("jpeg")
        return cls(
            is_main_result=bool(raw.get("is_main_result", False)),
            text=raw.get("text"),
            html=raw.get("html"),
            markdown=raw.get("markdown"),
            svg=raw.get("svg"),
            png=base64.b64decode(png, validate=True) if png is not None else None,
            jpeg=base64.b64decode(jpeg, validate=True) if jpeg is not None else None,
            latex=raw.get("latex"),
            json=raw.get("json"),
            chart=raw.get("chart"),
            width=raw.get("width"),
            height=raw.get("height"),
            _formats=tuple(f for f in RESULT_FORMATS if f in raw),
        )

    def __repr__(self) -> str:
        # The images by their size: a chart's bytes would flood a log.
        parts = [f"is_main_result={self.is_main_result}"]
        for f in self._formats:
            value = getattr(self, f)
            parts.append(f"{f}=<{len(value)} bytes>" if isinstance(value, bytes) else f"{f}={value!r}")
        if self.width is not None or self.height is not None:
            parts.append(f"width={self.width}, height={self.height}")
        return f"Result({', '.join(parts)})"

    def formats(self) -> list[str]:
        """The formats it has, of "text", "html", "markdown", "svg", "png",
        "jpeg", "latex", "json" and "chart", in that order."""
        return list(self._formats)

    def to_dict(self) -> t.CodeResult:
        """The CodeResult it was made from (images as base64)."""
        out: dict[str, Any] = {"is_main_result": self.is_main_result}
        for f in self._formats:
            value = getattr(self, f)
            out[f] = base64.b64encode(value).decode() if f in ("png", "jpeg") else value
        if self.width is not None:
            out["width"] = self.width
        if self.height is not None:
            out["height"] = self.height
        return cast(t.CodeResult, out)


@dataclass(frozen=True)
class Execution:
    """A finished cell (a CodeExecution), as Sandbox.run_code returns it:
    ``status`` is "ok", "error" (the cell raised: see ``error``),
    "timeout" (it was interrupted; the context stays usable) or "died"
    (the kernel died: the context answers so until it is restarted).
    ``stdout`` and ``stderr`` are what it printed (``stdout_truncated``
    and ``stderr_truncated`` say the server kept only the first part),
    ``results`` its rich results (``results_dropped`` counts those the
    server did not keep), ``text`` the main result's text."""

    context_id: str
    execution_count: int
    status: Literal["ok", "error", "timeout", "died"]
    stdout: str
    stderr: str
    results: list[Result]
    error: ExecutionError | None
    duration_ms: int
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    results_dropped: int = 0

    @classmethod
    def from_json(
        cls,
        data: t.CodeExecution,
        *,
        stdout: str | None = None,
        stderr: str | None = None,
        results: Sequence[Result] | None = None,
    ) -> Execution:
        """Decodes a CodeExecution. ``stdout``, ``stderr`` and ``results``,
        when given, replace its own (a streamed cell's end has them
        empty)."""
        error = data.get("error")
        return cls(
            context_id=data["context_id"],
            execution_count=data["execution_count"],
            status=data["status"],
            stdout=data.get("stdout", "") if stdout is None else stdout,
            stderr=data.get("stderr", "") if stderr is None else stderr,
            results=[Result.from_json(r) for r in data.get("results") or []] if results is None else list(results),
            error=ExecutionError.from_json(error) if error else None,
            duration_ms=data.get("duration_ms", 0),
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            results_dropped=data.get("results_dropped", 0),
        )

    @property
    def main_result(self) -> Result | None:
        """The result that is the value of the cell's last expression, if any."""
        return next((r for r in self.results if r.is_main_result), None)

    @property
    def text(self) -> str | None:
        """The main result's text (its text/plain, e.g. "42"), or None."""
        main = self.main_result
        return main.text if main is not None else None

    def to_dict(self) -> t.CodeExecution:
        """The cell as a CodeExecution (images as base64)."""
        out: dict[str, Any] = {
            "context_id": self.context_id,
            "execution_count": self.execution_count,
            "status": self.status,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "results": [r.to_dict() for r in self.results],
            "duration_ms": self.duration_ms,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
        }
        if self.error is not None:
            out["error"] = self.error.to_dict()
        if self.results_dropped:
            out["results_dropped"] = self.results_dropped
        return cast(t.CodeExecution, out)
