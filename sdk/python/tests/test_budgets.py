"""Budgets and usage: a budget on each scope, read back, listed and
deleted; bad requests name their field; a create that an account budget
has no room for is refused with BudgetExceeded before anything boots.

They boot no VM and need the root key in HAREBOX_API_KEY. One account per
run holds a project, a fleet, a key and the budgets the tests make; the
budgets and the account are deleted at the end, even when a test fails
(a sandbox created by mistake is deleted first).
"""

from __future__ import annotations

from typing import Iterator, TypedDict

import pytest

import harebox
from harebox import types as t

from conftest import delete_quietly


class Tenant(TypedDict):
    account: t.Account
    project: t.Project
    fleet: t.Fleet
    key: t.KeyWithSecret
    #: ``{"account": ID}``: the operator's query for this account.
    mine: dict[str, str]


@pytest.fixture(scope="module")
def tenant(hb: harebox.Client, run_label: str) -> Iterator[Tenant]:
    account = hb.create_account(body={"name": f"sdk-py-budgets-{run_label}"})
    mine = {"account": account["id"]}
    try:
        project = hb.create_project(body={"name": "web"}, query=mine)
        fleet = hb.create_fleet("web", body={"name": "workers"}, query=mine)
        key = hb.create_key(body={"account_id": account["id"], "description": "sdk-python budgets",
                                  "scope": {"actions": ["sandboxes:read"]}})
        yield {"account": account, "project": project, "fleet": fleet, "key": key, "mine": mine}
    finally:
        try:
            for s in hb.list_sandboxes(query=mine)["sandboxes"]:
                delete_quietly(hb, s["id"])
            # Budgets outlive their account: they go first.
            for b in hb.list_budgets(query=mine)["budgets"]:
                if not b.get("from_key"):
                    hb.delete_budget(b["id"])
        finally:
            hb.delete_account(account["id"])


def create(hb: harebox.Client, tenant: Tenant, body: t.BudgetRequest) -> t.Budget:
    """Creates a budget in the run's account and checks what every budget says."""
    budget = hb.create_budget(body=body, query=tenant["mine"])
    assert budget["id"].startswith("bgt_") and budget["account_id"] == tenant["account"]["id"]
    assert (budget["period"], budget["action"]) == (body["period"], body["action"])
    assert (budget["spent_usd"], budget["reserved_usd"]) == ("0.00", "0.00")
    assert budget["created_at"] and budget["period_start"]
    assert "reached_at" not in budget and not budget.get("action_pending") and not budget.get("from_key")
    return budget


def test_a_budget_on_each_scope(hb: harebox.Client, tenant: Tenant) -> None:
    project, fleet, key = tenant["project"], tenant["fleet"], tenant["key"]
    account = create(hb, tenant, {"name": "all", "scope": {"kind": "account"}, "period": "monthly", "limit_usd": "25.00",
                                  "action": "notify", "warn_at_percent": [90, 50, 50]})
    assert account["scope"] == {"kind": "account"} and "project_id" not in account
    assert (account["name"], account["limit_usd"], account["warn_at_percent"]) == ("all", "25.00", [50, 90])
    assert account["period_start"].startswith(account["created_at"][:8] + "01T00:00:00")  # this month's start, UTC

    # A project by name: the budget stores its ID.
    web = create(hb, tenant, {"scope": {"kind": "project", "ref": "web"}, "period": "total", "limit_usd": "100",
                              "action": "deny_new"})
    assert web["scope"] == {"kind": "project", "ref": project["id"]} and web["project_id"] == project["id"]
    assert web["limit_usd"] == "100.00" and "name" not in web
    assert web["period_start"] == web["created_at"]  # a total runs from its creation

    workers = create(hb, tenant, {"scope": {"kind": "fleet", "ref": fleet["id"]}, "period": "monthly", "limit_usd": "0.5",
                                  "action": "pause"})
    assert workers["scope"] == {"kind": "fleet", "ref": fleet["id"]} and workers["project_id"] == project["id"]
    assert workers["limit_usd"] == "0.50"

    red = create(hb, tenant, {"scope": {"kind": "label", "labels": {"team": "red", "tier": "batch"}}, "period": "monthly",
                              "limit_usd": "0.000001", "action": "delete"})
    assert red["scope"] == {"kind": "label", "labels": {"team": "red", "tier": "batch"}} and red["limit_usd"] == "0.000001"

    # stop: the sandboxes in scope are stopped (they keep their disks).
    by_key = create(hb, tenant, {"scope": {"kind": "key", "ref": key["id"]}, "period": "total", "limit_usd": "7",
                                 "action": "stop"})
    assert by_key["scope"] == {"kind": "key", "ref": key["id"]}

    made = [account, web, workers, red, by_key]
    listed = hb.list_budgets(query={"account": tenant["account"]["name"]})["budgets"]
    assert sorted(listed, key=lambda b: b["id"]) == sorted(made, key=lambda b: b["id"])
    for b in made:
        assert hb.get_budget(b["id"]) == b
    # The default account's list is another account's.
    assert not {b["id"] for b in made} & {b["id"] for b in hb.list_budgets()["budgets"]}

    for b in made:
        assert hb.delete_budget(b["id"]) is None
    assert hb.list_budgets(query=tenant["mine"]) == {"budgets": []}
    with pytest.raises(harebox.NotFound):
        hb.get_budget(web["id"])
    with pytest.raises(harebox.NotFound):
        hb.delete_budget(web["id"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"period": "weekly"}, "period"),
        ({"action": "explode"}, "action"),
        ({"limit_usd": "0"}, "limit_usd"),
        ({"scope": {"kind": "account", "ref": "web"}}, "scope"),
        ({"scope": {"kind": "label"}}, "scope.labels"),
        ({"scope": {"kind": "project", "ref": "no-such-project"}}, "scope.ref"),
        ({"scope": {"kind": "fleet", "ref": "workers"}}, "scope.ref"),  # a fleet scope takes its ID
        ({"warn_at_percent": [100]}, "warn_at_percent[0]"),
    ],
)
def test_bad_requests_name_the_field(hb: harebox.Client, tenant: Tenant, change: dict[str, object], field: str) -> None:
    before = hb.list_budgets(query=tenant["mine"])
    body = {"scope": {"kind": "account"}, "period": "monthly", "limit_usd": "1.00", "action": "notify", **change}
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.create_budget(body=body, query=tenant["mine"])
    assert (bad.value.status, bad.value.code, bad.value.field) == (400, "invalid", field)
    assert hb.list_budgets(query=tenant["mine"]) == before


def test_create_without_room_is_refused(hb: harebox.Client, tenant: Tenant, test_image: str, run_label: str) -> None:
    budget = create(hb, tenant, {"name": "tiny", "scope": {"kind": "account"}, "period": "monthly",
                                 "limit_usd": "0.000001", "action": "deny_new"})
    try:
        body = {"account_id": tenant["account"]["id"], "image": test_image, "ttl_seconds": 600,
                "labels": {"sdk-python-test": run_label}}
        try:
            made = hb.create_sandbox(body=body)
        except harebox.BudgetExceeded as e:
            err = e
        else:
            delete_quietly(hb, made["id"])
            pytest.fail(f"create_sandbox was admitted past a budget of $0.000001: {made['id']}")
        assert (err.status, err.code) == (402, "budget_exceeded")
        assert "tiny" in err.message
        # Refused before anything was made or reserved.
        assert hb.list_sandboxes(query=tenant["mine"]) == {"sandboxes": []}
        after = hb.get_budget(budget["id"])
        assert (after["spent_usd"], after["reserved_usd"]) == ("0.00", "0.00") and "reached_at" not in after
    finally:
        hb.delete_budget(budget["id"])


@pytest.mark.parametrize("group_by", ["account", "project", "fleet", "key", "sandbox", "label:team", None])
def test_usage_groups(hb: harebox.Client, tenant: Tenant, group_by: str | None) -> None:
    # The run's account never ran a sandbox: no rows, whatever the grouping.
    assert hb.get_usage(query={**tenant["mine"], "group_by": group_by}) == {"usage": []}
    # The operator's usage of every account is a list of rows, sorted by group.
    rows = hb.get_usage(query={"group_by": group_by, "from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"})["usage"]
    assert isinstance(rows, list)
    assert [r["group"] for r in rows] == sorted(r["group"] for r in rows)
    for r in rows:
        assert isinstance(r["cost_usd"], str) and r["cost_usd"].count(".") == 1
        assert min(r["vcpu_seconds"], r["memory_gib_seconds"], r["paused_seconds"]) >= 0


def test_usage_bad_queries_name_the_field(hb: harebox.Client, tenant: Tenant) -> None:
    for query, field in [
        ({"group_by": "label:"}, "group_by"),
        ({"group_by": "region"}, "group_by"),
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-11-02T00:00:00Z", "to": "2026-11-01T00:00:00Z"}, "to"),
    ]:
        with pytest.raises(harebox.InvalidRequest) as bad:
            hb.get_usage(query={**tenant["mine"], **query})
        assert bad.value.field == field, query
