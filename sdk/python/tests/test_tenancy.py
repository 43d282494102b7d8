"""Accounts, projects, fleets and scoped API keys. They need no VM: every
test here is quick. One account per run (deleted at the end, even when a
test fails) holds a project, a fleet and the keys the tests make; the
``hb`` client is the operator (the root key)."""

from __future__ import annotations

import time
from typing import Iterator, TypedDict

import pytest

import harebox
from harebox import types as t

#: The parent key's scope: it reads sandboxes and manages keys, in one
#: project; accounts:read lets it look up accounts, so that another
#: account is NotFound (unseen), not Forbidden (an action it lacks).
PARENT_ACTIONS = ["sandboxes:read", "keys:write", "keys:read", "accounts:read"]


class Tenant(TypedDict):
    account: t.Account
    project: t.Project
    fleet: t.Fleet


@pytest.fixture(scope="module")
def tenant(hb: harebox.Client, run_label: str) -> Iterator[Tenant]:
    """An account made for this run, with a project and a fleet in it."""
    account = hb.create_account(body={"name": f"sdk-py-{run_label}"})
    try:
        project = hb.create_project(body={"name": "web"}, query={"account": account["id"]})
        fleet = hb.create_fleet(project["name"], body={"name": "workers"}, query={"account": account["name"]})
        yield {"account": account, "project": project, "fleet": fleet}
    finally:
        try:
            hb.delete_account(account["id"])
        except harebox.NotFound:
            pass  # test_delete_fleet_project_account got there first


def client_for(hb: harebox.Client, key: t.KeyWithSecret) -> harebox.Client:
    """A client of the same server that uses this key's secret."""
    return harebox.Client(url=hb.url, api_key=key["secret"])


def test_accounts_projects_and_fleets(hb: harebox.Client, tenant: Tenant) -> None:
    account, project, fleet = tenant["account"], tenant["project"], tenant["fleet"]
    assert account["id"].startswith("acc_") and account["created_at"]
    assert hb.get_account(account["name"]) == account
    assert hb.get_account(account["id"]) == account
    assert account["id"] in [a["id"] for a in hb.list_accounts()["accounts"]]

    assert project["id"].startswith("prj_")
    assert (project["account_id"], project["name"]) == (account["id"], "web")
    mine = {"account": account["name"]}
    assert sorted(p["name"] for p in hb.list_projects(query=mine)["projects"]) == ["default", "web"]
    assert hb.get_project("web", query=mine) == project
    assert hb.get_project(project["id"], query=mine) == project
    # A project ID names its account; a name without ?account= is looked
    # up in the default account.
    assert hb.get_project(project["id"]) == project
    with pytest.raises(harebox.NotFound):
        hb.get_project("web")

    assert fleet["id"].startswith("flt_")
    assert (fleet["account_id"], fleet["project_id"], fleet["name"]) == (account["id"], project["id"], "workers")
    assert hb.list_fleets("web", query=mine)["fleets"] == [fleet]
    assert hb.get_fleet(project["id"], "workers", query=mine) == fleet
    assert hb.get_fleet("web", fleet["id"], query=mine) == fleet

    with pytest.raises(harebox.Conflict):
        hb.create_project(body={"name": "web"}, query=mine)
    with pytest.raises(harebox.InvalidRequest) as err:
        hb.create_account(body={"name": "Not A Label"})
    assert err.value.field == "name"


def test_scoped_key_sees_and_does_only_its_scope(hb: harebox.Client, tenant: Tenant, test_image: str) -> None:
    account, project = tenant["account"], tenant["project"]
    parent = hb.create_key(body={
        "account_id": account["id"],
        "description": "sdk-python parent",
        "scope": {"actions": PARENT_ACTIONS, "projects": [project["name"]]},
    })
    assert parent["secret"].startswith("hbk_") and parent["id"].startswith("key_")
    assert parent["account_id"] == account["id"]
    assert parent["scope"]["projects"] == [project["id"]]  # names are stored as IDs
    assert parent["hint"].startswith("hbk_") and parent["hint"] not in ("", parent["secret"])
    got = hb.get_key(parent["id"])
    assert "secret" not in got and got["id"] == parent["id"]

    scoped = client_for(hb, parent)
    assert scoped.list_sandboxes() == {"sandboxes": []}
    assert scoped.list_sandboxes(query={"project": project["name"]}) == {"sandboxes": []}
    with pytest.raises(harebox.Forbidden) as err:
        scoped.create_sandbox(body={"image": test_image, "ttl_seconds": 60})
    assert (err.value.status, err.value.code) == (403, "forbidden")
    assert scoped.get_account(account["id"])["name"] == account["name"]
    with pytest.raises(harebox.NotFound) as missing:
        scoped.get_account("default")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert [k["id"] for k in scoped.list_keys()["keys"]] == [parent["id"]]

    with pytest.raises(harebox.Forbidden) as wider:
        scoped.create_key(body={"scope": {"actions": ["*"], "projects": [project["name"]]}})
    assert wider.value.field == "scope.actions"
    with pytest.raises(harebox.Forbidden) as unlimited:
        scoped.create_key(body={"scope": {"actions": ["sandboxes:read"]}})  # every project
    assert unlimited.value.field == "scope.projects"

    child = scoped.create_key(body={"scope": {"actions": ["sandboxes:read"], "projects": [project["id"]]}})
    assert (child["parent_id"], child["account_id"]) == (parent["id"], account["id"])
    assert scoped.get_key(child["id"])["parent_id"] == parent["id"]
    child_client = client_for(hb, child)
    assert child_client.list_sandboxes() == {"sandboxes": []}
    with pytest.raises(harebox.Forbidden):
        child_client.list_keys()
    with pytest.raises(harebox.Forbidden):
        child_client.get_account(account["id"])  # an action the child lacks

    revoked = hb.revoke_key(parent["id"])
    assert revoked["id"] == parent["id"] and revoked.get("revoked_at")
    assert hb.get_key(child["id"]).get("revoked_at")
    with pytest.raises(harebox.Unauthorized) as gone:
        child_client.list_sandboxes()
    assert (gone.value.status, gone.value.code) == (401, "unauthorized")
    with pytest.raises(harebox.Unauthorized):
        scoped.list_sandboxes()


def test_rotated_key_has_a_new_secret(hb: harebox.Client, tenant: Tenant) -> None:
    key = hb.create_key(body={"account_id": tenant["account"]["name"], "scope": {"actions": ["sandboxes:read"]}})
    old = client_for(hb, key)
    assert old.list_sandboxes() == {"sandboxes": []}
    rotated = hb.rotate_key(key["id"])
    assert rotated["id"] == key["id"] and rotated["secret"].startswith("hbk_")
    assert rotated["secret"] != key["secret"] and rotated.get("rotated_at")
    with pytest.raises(harebox.Unauthorized):
        old.list_sandboxes()
    assert client_for(hb, rotated).list_sandboxes() == {"sandboxes": []}
    assert key["id"] in [k["id"] for k in hb.list_keys(query={"account": tenant["account"]["id"]})["keys"]]
    hb.revoke_key(key["id"])


def test_rate_limited_key_says_when_to_retry(hb: harebox.Client, tenant: Tenant) -> None:
    key = hb.create_key(body={
        "account_id": tenant["account"]["id"],
        "scope": {"actions": ["sandboxes:read"], "rate": {"per_second": 1, "burst": 1}},
    })
    assert key["scope"]["rate"] == {"per_second": 1, "burst": 1}
    limited = client_for(hb, key)
    limited.list_sandboxes()
    with pytest.raises(harebox.RateLimited) as err:
        limited.list_sandboxes()
    assert (err.value.status, err.value.code) == (429, "rate_limited")
    assert err.value.retry_after is not None and err.value.retry_after > 0
    time.sleep(err.value.retry_after)
    limited.list_sandboxes()  # the bucket refilled
    hb.revoke_key(key["id"])


def test_delete_fleet_project_account(hb: harebox.Client, tenant: Tenant) -> None:
    """Last: deletes the run's account (the fixture then has nothing to do)."""
    account, project, fleet = tenant["account"], tenant["project"], tenant["fleet"]
    mine = {"account": account["id"]}
    key = hb.create_key(body={"account_id": account["id"], "scope": {"actions": ["sandboxes:read"]}})

    assert hb.delete_fleet(project["id"], fleet["name"], query=mine) is None
    with pytest.raises(harebox.NotFound):
        hb.get_fleet(project["id"], fleet["id"], query=mine)
    assert hb.delete_project(project["name"], query=mine) is None
    with pytest.raises(harebox.NotFound):
        hb.get_project(project["id"], query=mine)
    with pytest.raises(harebox.Conflict):
        hb.delete_project("default", query=mine)

    assert hb.delete_account(account["name"]) is None
    with pytest.raises(harebox.NotFound):
        hb.get_account(account["id"])
    assert account["id"] not in [a["id"] for a in hb.list_accounts()["accounts"]]
    with pytest.raises(harebox.Unauthorized):
        client_for(hb, key).list_sandboxes()  # the account's keys are revoked
