"""Events: the engine's own acts, read as pages and followed as a stream.

They need the root key in HAREBOX_API_KEY. The page tests boot no VM. The
follow test boots one sandbox in an account made for the run, under an
account budget that notifies at $0.000001: the sandbox's first metered
seconds reach it, and the budgetReached event arrives on a stream followed
in a thread (its socket timeout bounds every read, and deleting the
account ends the stream). The sandbox, the budget and the account are
deleted at the end, even when the test fails.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Union

import pytest

import harebox
from harebox import types as t

from conftest import delete_quietly

#: What the engine records as events: who acted.
EVENT_PRINCIPALS = ("budget:", "sandbox:", "engine")

Followed = Union[t.AuditEntry, BaseException]


def test_list_events_pages(hb: harebox.Client) -> None:
    page = hb.list_events()
    assert set(page) == {"events", "next"}
    assert isinstance(page["events"], list) and isinstance(page["next"], str) and page["next"].isdigit()
    seqs = [e["seq"] for e in page["events"]]
    assert seqs == sorted(seqs) and all(s <= int(page["next"]) for s in seqs)
    for e in page["events"]:
        assert e["principal"].startswith(EVENT_PRINCIPALS), e
    # After the cursor: nothing older, and the cursor never goes back.
    later = hb.list_events(query={"after": page["next"], "limit": 1000})
    assert all(e["seq"] > int(page["next"]) for e in later["events"])
    assert int(later["next"]) >= int(page["next"])
    assert all(e["seq"] > int(page["next"]) for e in hb.events({"after": page["next"]}, follow=False))


@pytest.mark.parametrize(("query", "field"), [({"limit": 0}, "limit"), ({"limit": 1001}, "limit"),
                                              ({"after": -1}, "after"), ({"account": "no-such-account"}, "account")])
def test_bad_queries_name_the_field(hb: harebox.Client, query: t.Query, field: str) -> None:
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.list_events(query=query)
    assert (bad.value.status, bad.value.code, bad.value.field) == (400, "invalid", field)


def follow(hb: harebox.Client, query: t.Query, got: queue.Queue[Followed]) -> None:
    """Puts every followed event on ``got``, then the error that ended the stream."""
    try:
        for event in hb.events(query, timeout=30):
            got.put(event)
    except BaseException as e:  # noqa: BLE001 - handed to the test's thread
        got.put(e)


def wait_for_reached(got: queue.Queue[Followed], budget_id: str, seconds: float) -> tuple[t.AuditEntry, list[t.AuditEntry]]:
    """The budget's budgetReached event from the stream, and every event before it."""
    seen: list[t.AuditEntry] = []
    deadline = time.monotonic() + seconds
    while True:
        try:
            item = got.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"no budgetReached event of {budget_id} within {seconds:g} s; followed: {seen}")
        if isinstance(item, BaseException):
            raise AssertionError(f"the followed stream ended early: {item!r}; followed: {seen}") from item
        if item["action"] == "budgetReached":
            return item, seen
        seen.append(item)


def test_follow_sees_a_budget_reached(hb: harebox.Client, test_image: str, run_label: str) -> None:
    account = hb.create_account(body={"name": f"sdk-py-events-{run_label}"})
    mine = {"account": account["id"]}
    got: queue.Queue[Followed] = queue.Queue()
    follower: threading.Thread | None = None
    try:
        budget = hb.create_budget(body={"name": "tiny", "scope": {"kind": "account"}, "period": "monthly",
                                        "limit_usd": "0.000001", "action": "notify"}, query=mine)
        try:
            cursor = hb.list_events(query=mine)["next"]
            follower = threading.Thread(target=follow, args=(hb, {**mine, "after": cursor}, got), daemon=True)
            follower.start()
            made = hb.create_sandbox(body={"account_id": account["id"], "image": test_image, "ttl_seconds": 600,
                                           "labels": {"sdk-python-test": run_label}})
            assert made["state"] == "running"  # notify never refuses
            assert hb.delete_sandbox(made["id"])["state"] == "deleted"

            reached, before = wait_for_reached(got, budget["id"], 20)
            assert reached["principal"] == f"budget:{budget['id']}"
            assert (reached["target"], reached["account_id"], reached["outcome"]) == (budget["id"], account["id"], "ok")
            assert reached["seq"] > int(cursor)
            for e in before:  # the budget's warnings, if any, and nothing of another account
                assert e["account_id"] == account["id"] and e["principal"] == reached["principal"], e

            # The page shows it too, the same entry.
            listed = hb.list_events(query=mine)
            assert reached in listed["events"] and int(listed["next"]) >= reached["seq"]
            assert reached in list(hb.events(mine, follow=False))
            assert hb.get_budget(budget["id"]).get("reached_at")
        finally:
            for s in hb.list_sandboxes(query=mine)["sandboxes"]:
                delete_quietly(hb, s["id"])
            hb.delete_budget(budget["id"])
    finally:
        hb.delete_account(account["id"])
    # Following an account that is gone ends the stream with an error event,
    # raised as its HareBoxError.
    assert follower is not None
    follower.join(30)
    assert not follower.is_alive(), "the followed stream did not end when its account was deleted"
    items = [got.get_nowait() for _ in range(got.qsize())]
    assert items and isinstance(items[-1], harebox.InvalidRequest), items
    assert (items[-1].status, items[-1].code) == (400, "invalid")
