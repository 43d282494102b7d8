"""A sandbox's life through the client: create, get, list by label, pause,
resume, delete. It has its own sandbox, since it ends by deleting it."""

from __future__ import annotations

import pytest

import harebox


def test_lifecycle(hb: harebox.Client, test_image: str, run_label: str) -> None:
    name = f"sdk-py-{run_label}"
    mine = f"sdk-python-test={run_label}"
    # The with block deletes the sandbox on the way out, even if an assert fails.
    with hb.create(
        name=name, image=test_image, size={"preset": "small"}, ttl_seconds=900, no_env=True,
        labels={"sdk-python-test": run_label, "role": "lifecycle"},
    ) as box:
        assert box.id.startswith("sbx_") and box.state == "running"
        assert (box.name, box.image, box.no_env, box.labels["role"]) == (name, test_image, True, "lifecycle")
        assert box.size["vcpus"] >= 1 and box.expires_at

        assert hb.get_sandbox(box.id)["id"] == box.id
        # "agent" is the agent's last health check, which the server may
        # have made since the create answered.
        got, created = hb.sandbox(box.id).to_dict(), box.to_dict()
        assert got.pop("agent", None) in (None, "ok")
        created.pop("agent", None)
        assert got == created

        labelled = hb.list_sandboxes(query={"label": [mine, "role=lifecycle"]})["sandboxes"]
        assert [b["id"] for b in labelled] == [box.id]
        running = hb.list_sandboxes(query={"state": "running", "label": mine})["sandboxes"]
        assert box.id in [b["id"] for b in running]

        with pytest.raises(harebox.Conflict):
            hb.create(name=name, image=test_image)  # a live sandbox has the name

        assert box.pause().state == "paused"
        assert hb.get_sandbox(box.id)["state"] == "paused"
        with pytest.raises(harebox.Conflict):
            box.pause()
        assert box.resume().state == "running"
        assert box.run("echo back")["stdout"] == "back\n"

    assert box.state == "deleted"
    assert box.refresh().state == "deleted"  # deleted sandboxes stay readable
    live = hb.list_sandboxes(query={"state": "running", "label": mine})["sandboxes"]
    assert box.id not in [b["id"] for b in live]
