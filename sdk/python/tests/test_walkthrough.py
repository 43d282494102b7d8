"""The README's Python walkthrough (examples/untrusted/walkthrough.py), run
as it is, in a subprocess, against the server's default image (Debian,
with python3 in the guest)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest

import harebox
from conftest import SDK_DIR, delete_quietly

WALKTHROUGH = SDK_DIR.parent.parent / "examples" / "untrusted" / "walkthrough.py"


@pytest.fixture
def leftovers_deleted(hb: harebox.Client) -> Iterator[None]:
    """Deletes the walkthrough's sandbox if it failed before deleting it."""
    before = {b["id"] for b in hb.list_sandboxes()["sandboxes"]}
    yield
    for b in hb.list_sandboxes()["sandboxes"]:
        if b["id"] not in before and b.get("name") == "untrusted" and b["state"] != "deleted":
            delete_quietly(hb, b["id"])


@pytest.mark.usefixtures("leftovers_deleted")
def test_walkthrough_runs_verbatim(hb: harebox.Client) -> None:
    if not WALKTHROUGH.is_file():
        pytest.skip("examples/untrusted/walkthrough.py is not beside this SDK")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SDK_DIR), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(WALKTHROUGH)], env=env, cwd="/", capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("0 hello from user (uid 1000) on "), proc.stdout
    assert "read /etc/shadow: denied\n" in proc.stdout
    assert "sum: 499999500000\n" in proc.stdout
