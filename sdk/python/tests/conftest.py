"""Fixtures for tests against a real hareboxd with real VMs.

The client is imported from the source tree, so the tests need no install;
with HAREBOX_TEST_INSTALLED=1 it is imported as installed (the e2e suite
installs the built wheel into a fresh directory and runs them on that).
Tests that need a server take the ``hb`` fixture, which skips them all with
one reason when HAREBOX_URL is unset. Sandboxes are few (each boot is ~10 s
under software emulation) and always deleted, even when a test fails.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

SDK_DIR = Path(__file__).resolve().parent.parent
INSTALLED = os.environ.get("HAREBOX_TEST_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, str(SDK_DIR))

import harebox  # noqa: E402

if INSTALLED and Path(harebox.__file__).resolve().is_relative_to(SDK_DIR):
    raise RuntimeError(f"HAREBOX_TEST_INSTALLED=1, but harebox comes from the source tree ({harebox.__file__})")

NO_SERVER = "HAREBOX_URL is not set: these tests need a running hareboxd (eval \"$(scripts/devserver.sh)\")"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skips every test that needs the server from this one place, so the
    summary shows the reason once, not once per test."""
    if "hb" in getattr(item, "fixturenames", ()) and not os.environ.get("HAREBOX_URL"):
        pytest.skip(NO_SERVER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the modules that need no server (no test of theirs takes ``hb``)
    first, then the others; each keeps its tests' order. The shared
    sandbox is created before the first test (``box_first``): the quick
    tests that boot nothing then give the golden boot it starts time to
    end before the next create."""
    server: dict[object, bool] = {}
    for item in items:
        module = getattr(item, "module", None)
        server[module] = server.get(module, False) or "hb" in getattr(item, "fixturenames", ())
    items.sort(key=lambda item: server[getattr(item, "module", None)])


@pytest.fixture(scope="session")
def hb() -> harebox.Client:
    """A client of the server under test, from HAREBOX_URL and HAREBOX_API_KEY."""
    return harebox.Client()


@pytest.fixture(scope="session")
def test_image() -> str:
    """The image for test sandboxes: "minimal" boots fastest."""
    return os.environ.get("HAREBOX_TEST_IMAGE", "minimal")


@pytest.fixture(scope="session")
def run_label() -> str:
    """A label value unique to this test run, to find its sandboxes."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def box(hb: harebox.Client, test_image: str, run_label: str) -> Iterator[harebox.Sandbox]:
    """One running sandbox shared by the exec, files, firewall and
    monitoring tests, created with monitoring on (the default, asked for)."""
    sandbox = hb.create(
        image=test_image, ttl_seconds=1800, monitoring=True, labels={"sdk-python-test": run_label, "role": "shared"},
    )
    try:
        yield sandbox
    finally:
        delete_quietly(hb, sandbox.id)


@pytest.fixture(scope="session", autouse=True)
def box_first(request: pytest.FixtureRequest) -> None:
    """Creates the shared sandbox before the first test, when a test of the
    run uses it. It is then the run's first create of its image, which
    boots and starts the server's golden boot of that image in the
    background (a few seconds longer than the create); the tests that boot
    nothing come next (pytest_collection_modifyitems) and give that time
    to end, so later creates restore from it rather than boot too (a create
    that comes while it runs boots). And the monitoring tests find the
    sandbox sampled already rather than wait up to a sampling interval."""
    if not os.environ.get("HAREBOX_URL") or not any("box" in getattr(item, "fixturenames", ()) for item in request.session.items):
        return
    try:
        request.getfixturevalue("box")
    except Exception:  # noqa: BLE001 - each test that uses box gets the error
        pass


def delete_quietly(hb: harebox.Client, sandbox_id: str) -> None:
    """Deletes a sandbox in a teardown: deleted already is fine."""
    if hb.get_sandbox(sandbox_id)["state"] != "deleted":
        hb.delete_sandbox(sandbox_id)
