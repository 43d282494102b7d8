"""Monitoring: a sandbox's samples and the server's Prometheus metrics.

They need the root key in HAREBOX_API_KEY. The shared sandbox
(conftest's ``box``), created with monitoring on before the first test of
the run, has its samples from the server's sampler (every 15 s on the dev
server, hareboxd --metrics-interval); the tests wait for the first if
there is none yet. A sandbox created with monitoring off has no samples;
that takes a second VM, so it is left to the Go tests. The keys that read
/metrics live in an account made for the run, deleted at the end, even
when a test fails.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pytest

import harebox
from harebox import types as t

#: How long the first sample may take: two sampling intervals and a margin.
FIRST_SAMPLE_SECONDS = 40
POLL_SECONDS = 2


@pytest.fixture(scope="module")
def metrics_box(box: harebox.Sandbox) -> harebox.Sandbox:
    """The monitored sandbox: the shared one, sampled since the run began
    (a sandbox of this file's own waited up to 15 s for its first sample)."""
    return box


@pytest.fixture(scope="module")
def metrics_account(hb: harebox.Client, run_label: str) -> Iterator[t.Account]:
    """An account made for this run, for the keys; deleted with them."""
    account = hb.create_account(body={"name": f"sdk-py-metrics-{run_label}"})
    try:
        yield account
    finally:
        hb.delete_account(account["id"])


def first_samples(hb: harebox.Client, box: harebox.Sandbox) -> list[t.MetricSample]:
    """Polls until the sandbox has a sample (or the wait is over)."""
    deadline = time.monotonic() + FIRST_SAMPLE_SECONDS
    while True:
        samples = hb.get_sandbox_metrics(box.id)["samples"]
        if samples or time.monotonic() > deadline:
            return samples
        time.sleep(POLL_SECONDS)


def test_a_monitored_sandbox_gets_samples(hb: harebox.Client, metrics_box: harebox.Sandbox) -> None:
    assert metrics_box.monitoring is True
    samples = first_samples(hb, metrics_box)
    assert samples, f"no sample within {FIRST_SAMPLE_SECONDS} s"
    fields = {"sandbox_id", "time", "cpu_seconds", "memory_bytes", "disk_bytes", "net_sent_bytes", "net_received_bytes"}
    for s in samples:
        assert fields <= s.keys(), s
        assert s["sandbox_id"] == metrics_box.id, s
        assert isinstance(s["cpu_seconds"], (int, float)) and s["cpu_seconds"] > 0, s
        assert isinstance(s["memory_bytes"], int) and s["memory_bytes"] > 0, s
        assert all(isinstance(s[f], int) and s[f] >= 0 for f in ("disk_bytes", "net_sent_bytes", "net_received_bytes")), s
    times = [datetime.fromisoformat(s["time"]) for s in samples]
    assert times == sorted(times)  # oldest first
    created = datetime.fromisoformat(metrics_box.created_at)
    assert all(created - timedelta(seconds=5) <= when <= datetime.now(timezone.utc) + timedelta(seconds=5) for when in times)


def test_the_query_picks_samples(hb: harebox.Client, metrics_box: harebox.Sandbox) -> None:
    samples = first_samples(hb, metrics_box)
    assert samples
    first = samples[0]
    assert hb.get_sandbox_metrics(metrics_box.id, query={"limit": 1})["samples"] == [first]
    # from is inclusive and to exclusive: the first sample's own time picks it, or leaves it out.
    assert hb.get_sandbox_metrics(metrics_box.id, query={"from": first["time"], "limit": 1})["samples"] == [first]
    assert hb.get_sandbox_metrics(metrics_box.id, query={"to": first["time"]})["samples"] == []
    future = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat(timespec="seconds")
    assert hb.get_sandbox_metrics(metrics_box.id, query={"from": future})["samples"] == []


@pytest.mark.parametrize(("query", "field"), [({"limit": 0}, "limit"), ({"limit": 10001}, "limit"),
                                              ({"from": "yesterday"}, "from"), ({"to": "2026-13-01"}, "to")])
def test_bad_queries_name_the_field(hb: harebox.Client, metrics_box: harebox.Sandbox, query: t.Query, field: str) -> None:
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.get_sandbox_metrics(metrics_box.id, query=query)
    assert (bad.value.status, bad.value.code, bad.value.field) == (400, "invalid", field)


def test_a_missing_sandbox_is_not_found(hb: harebox.Client) -> None:
    with pytest.raises(harebox.NotFound):
        hb.get_sandbox_metrics("sbx_" + "0" * 26)


def test_server_metrics_with_the_root_key(hb: harebox.Client, metrics_box: harebox.Sandbox) -> None:
    text = hb.get_server_metrics()
    assert isinstance(text, str)
    assert "harebox_sandboxes{" in text and "go_goroutines" in text, text[:2000]
    assert "# TYPE harebox_sandboxes gauge" in hb.get_server_metrics()
    running = [line for line in text.splitlines() if line.startswith('harebox_sandboxes{state="running"}')]
    assert len(running) == 1 and float(running[0].split()[-1]) >= 1, running  # metrics_box at least


@pytest.mark.parametrize("actions", [["sandboxes:read"], ["*"]])
def test_a_key_without_metrics_read_is_forbidden(
    hb: harebox.Client, metrics_account: t.Account, actions: list[str]
) -> None:
    key = hb.create_key(body={"account_id": metrics_account["id"], "description": "no metrics", "scope": {"actions": actions}})
    tenant = harebox.Client(url=hb.url, api_key=key["secret"])
    tenant.list_sandboxes()  # the key works
    with pytest.raises(harebox.Forbidden) as err:
        tenant.get_server_metrics()
    assert (err.value.status, err.value.code) == (403, "forbidden")


def test_a_key_with_metrics_read_reads_them(hb: harebox.Client, metrics_account: t.Account) -> None:
    key = hb.create_key(body={"account_id": metrics_account["id"], "scope": {"actions": ["metrics:read"]}})
    text = harebox.Client(url=hb.url, api_key=key["secret"]).get_server_metrics()
    assert "harebox_sandboxes{" in text and "go_goroutines" in text
