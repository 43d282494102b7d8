"""The code interpreter through a real server: cells in a running sandbox
made from the code-interpreter image, named by HAREBOX_TEST_CODE_SANDBOX
(skipped without it). The tests boot nothing: they run in contexts they
make in that sandbox and delete, so its default contexts are left as
they were."""

from __future__ import annotations

import os
import struct
import time
from typing import Iterator

import pytest

import harebox

SANDBOX = os.environ.get("HAREBOX_TEST_CODE_SANDBOX", "")

pytestmark = pytest.mark.skipif(
    not SANDBOX,
    reason="HAREBOX_TEST_CODE_SANDBOX is not set: these tests need a running sandbox made from the code-interpreter image",
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def code_box(hb: harebox.Client) -> harebox.Sandbox:
    """The sandbox HAREBOX_TEST_CODE_SANDBOX names; it must be running."""
    box = hb.sandbox(SANDBOX)
    assert box.state == "running", f"HAREBOX_TEST_CODE_SANDBOX {SANDBOX} is {box.state}, not running"
    return box


@pytest.fixture(scope="module")
def ctx(code_box: harebox.Sandbox) -> Iterator[str]:
    """A python context of the tests' own, deleted at the end."""
    made = code_box.create_code_context()
    assert made["language"] == "python" and made["cwd"]
    try:
        yield made["id"]
    finally:
        code_box.delete_code_context(made["id"])


def test_state_lasts_from_one_cell_to_the_next(code_box: harebox.Sandbox, ctx: str) -> None:
    first = code_box.run_code("x = 41", context=ctx)
    second = code_box.run_code("x + 1", context=ctx)
    assert (first.status, first.text, first.error) == ("ok", None, None)
    assert (second.status, second.text, second.context_id) == ("ok", "42", ctx)
    assert second.execution_count == first.execution_count + 1
    assert second.main_result is not None and second.main_result.formats() == ["text"]


def test_a_chart_is_a_png(code_box: harebox.Sandbox, ctx: str) -> None:
    x = code_box.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.show()",
        context=ctx,
    )
    assert x.status == "ok", x.error
    charts = [r for r in x.results if r.png is not None]
    assert len(charts) == 1, x.results
    chart = charts[0]
    assert chart.png is not None and chart.png.startswith(PNG_SIGNATURE)
    assert chart.width is not None and chart.height is not None and chart.width > 0 and chart.height > 0
    # The size is the PNG's own (its IHDR chunk).
    assert struct.unpack(">II", chart.png[16:24]) == (chart.width, chart.height)
    assert "png" in chart.formats()


def test_a_dataframe_is_an_html_table(code_box: harebox.Sandbox, ctx: str) -> None:
    x = code_box.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})", context=ctx)
    assert x.status == "ok", x.error
    main = x.main_result
    assert main is not None and main.html is not None and "<table" in main.html
    assert x.text is not None and "a" in x.text and "b" in x.text


def test_callbacks_get_output_as_it_comes(code_box: harebox.Sandbox, ctx: str) -> None:
    got: list[tuple[float, str]] = []
    results: list[harebox.Result] = []
    x = code_box.run_code(
        "import time\nprint('a', flush=True)\ntime.sleep(2)\nprint('b')\n6 * 7",
        context=ctx,
        on_stdout=lambda text: got.append((time.monotonic(), text)),
        on_result=results.append,
    )
    ended = time.monotonic()
    assert "".join(text for _, text in got) == "a\nb\n" == x.stdout
    assert got[0][1].startswith("a")
    # The first line came while the cell still slept, not with its end.
    assert ended - got[0][0] >= 1.0, f"stdout came {ended - got[0][0]:.2f} s before the end"
    assert [r.text for r in results] == ["42"] and x.text == "42" and x.results == results


def test_an_exception_is_the_cells_error(code_box: harebox.Sandbox, ctx: str) -> None:
    x = code_box.run_code("def f():\n    return 1 / 0\nf()", context=ctx)
    assert x.status == "error" and x.error is not None
    assert x.error.name == "ZeroDivisionError"
    assert "1 / 0" in x.error.traceback
    # Streamed, on_error gets the same error.
    errors: list[harebox.ExecutionError] = []
    y = code_box.run_code("f()", context=ctx, on_error=errors.append)
    assert y.status == "error" and y.error is not None and y.error.name == "ZeroDivisionError"
    assert errors == [y.error]


def test_contexts_are_kernels_of_their_own(code_box: harebox.Sandbox, ctx: str) -> None:
    shell = code_box.create_code_context(language="bash", cwd="/tmp")
    try:
        assert (shell["language"], shell["cwd"]) == ("bash", "/tmp")
        listed = {c["id"]: c for c in code_box.code_contexts()}
        assert shell["id"] in listed and ctx in listed
        code_box.run_code("X=5", context=shell)
        assert code_box.run_code("echo $X $PWD", context=shell).stdout == "5 /tmp\n"
        failed = code_box.run_code("false", context=shell)
        assert failed.error is not None and (failed.error.name, failed.error.value) == ("ExitCode", "1")
        # A restart loses the state.
        assert code_box.restart_code_context(shell["id"])["id"] == shell["id"]
        assert code_box.run_code("echo ${X:-unset}", context=shell).stdout == "unset\n"
    finally:
        code_box.delete_code_context(shell["id"])
    assert shell["id"] not in {c["id"] for c in code_box.code_contexts()}
    with pytest.raises(harebox.HareBoxError):
        code_box.run_code("echo hi", context=shell["id"])

