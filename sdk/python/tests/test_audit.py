"""The audit log: what the operator and a scoped key did, denied attempts
included, read back with filters and pages; verify and the public key.

They boot no VM and need the root key in HAREBOX_API_KEY. One account per
run (deleted at the end, even when a test fails) holds a project, made by
the operator, and a key that may read sandboxes and the audit log only;
the key's attempt to create a project is refused. The tests run in this
file's order; ``acts`` is made once, before the first.
"""

from __future__ import annotations

import base64
from typing import Iterator, TypedDict

import pytest

import harebox
from harebox import types as t

#: The scoped key's actions: no projects:write.
KEY_ACTIONS = ["sandboxes:read", "audit:read"]


class Acts(TypedDict):
    #: The last entry's sequence number before the run's actions.
    before: int
    account: t.Account
    project: t.Project
    key: t.KeyWithSecret
    scoped: harebox.Client
    #: Every entry after ``before``, as the operator reads them.
    entries: list[t.AuditEntry]


def last_seq(hb: harebox.Client) -> int:
    seq = 0
    for entry in hb.audit_entries():
        seq = entry["seq"]
    return seq


@pytest.fixture(scope="module")
def acts(hb: harebox.Client, run_label: str) -> Iterator[Acts]:
    before = last_seq(hb)
    account = hb.create_account(body={"name": f"sdk-py-audit-{run_label}"})
    try:
        project = hb.create_project(body={"name": "web"}, query={"account": account["id"]})
        key = hb.create_key(body={"account_id": account["id"], "description": "sdk-python audit", "scope": {"actions": KEY_ACTIONS}})
        scoped = harebox.Client(url=hb.url, api_key=key["secret"])
        with pytest.raises(harebox.Forbidden):
            scoped.create_project(body={"name": "denied"})
        entries = list(hb.audit_entries({"after": before}))
        yield {"before": before, "account": account, "project": project, "key": key, "scoped": scoped, "entries": entries}
    finally:
        hb.delete_account(account["id"])


def only(entries: list[t.AuditEntry], **fields: object) -> t.AuditEntry:
    """The one entry with these fields."""
    found = [e for e in entries if all(e.get(k) == v for k, v in fields.items())]
    assert len(found) == 1, f"entries with {fields}: {found}"
    return found[0]


def test_entries_name_who_did_what(acts: Acts) -> None:
    entries, account, key = acts["entries"], acts["account"], acts["key"]
    assert [e["seq"] for e in entries] == list(range(acts["before"] + 1, acts["before"] + 1 + len(entries)))
    for e in entries:
        assert e["time"] and e["hash"] and (e["prev"] or e["seq"] == 1) and e["outcome"] in ("ok", "denied", "error")
    assert [e["prev"] for e in entries[1:]] == [e["hash"] for e in entries[:-1]]

    made = only(entries, action="createAccount", target=account["id"])
    assert (made["principal"], made["outcome"]) == ("operator", "ok")
    project = only(entries, action="createProject", principal="operator")
    assert project["outcome"] == "ok" and project.get("target") == acts["project"]["id"]
    created = only(entries, action="createKey", target=key["id"])
    assert (created["principal"], created["outcome"]) == ("operator", "ok")
    denied = only(entries, action="createProject", principal=key["id"])
    assert (denied["outcome"], denied.get("error"), denied.get("account_id")) == ("denied", "forbidden", account["id"])
    assert denied.get("source") and denied.get("request_id")
    assert key["secret"] not in repr(entries)


def test_filters_and_a_key_sees_its_account(hb: harebox.Client, acts: Acts) -> None:
    key, account = acts["key"], acts["account"]
    mine = hb.list_audit(query={"principal": key["id"], "outcome": "denied", "after": acts["before"]})
    assert [e["action"] for e in mine["entries"]] == ["createProject"] and "next" not in mine
    assert hb.list_audit(query={"action": "createKey", "target": key["id"]})["entries"] == [only(acts["entries"], action="createKey")]
    assert hb.list_audit(query={"from": "2100-01-01T00:00:00Z"}) == {"entries": []}
    assert hb.list_audit(query={"to": "2000-01-01T00:00:00Z"}) == {"entries": []}
    with pytest.raises(harebox.InvalidRequest) as bad:
        hb.list_audit(query={"from": "yesterday"})
    assert bad.value.field == "from"

    seen = acts["scoped"].list_audit(query={"limit": 1000})["entries"]
    assert seen and all(e.get("account_id") == account["id"] for e in seen)
    assert only(seen, principal=key["id"], outcome="denied")["action"] == "createProject"
    # The operator's account filter finds the same.
    assert only(hb.list_audit(query={"account": account["id"], "outcome": "denied"})["entries"], principal=key["id"])


def test_pages_of_one_follow_next(hb: harebox.Client, acts: Acts) -> None:
    entries = acts["entries"]
    assert len(entries) >= 3
    first = hb.list_audit(query={"after": acts["before"], "limit": 1})
    assert first["entries"] == entries[:1] and first["next"] == str(entries[0]["seq"])
    second = hb.list_audit(query={"after": first["next"], "limit": 1})
    assert second["entries"] == entries[1:2] and second["next"] == str(entries[1]["seq"])
    # audit_entries follows next to the end; a page of one changes nothing.
    paged = list(hb.audit_entries({"after": acts["before"], "limit": 1}))
    assert paged[: len(entries)] == entries


def test_verify_is_for_the_operator(hb: harebox.Client, acts: Acts) -> None:
    report = hb.verify_audit()
    assert report["ok"] is True, report
    assert report["entries"] >= acts["entries"][-1]["seq"] and report["checkpoints"] >= 0
    assert "first_bad" not in report
    with pytest.raises(harebox.Forbidden) as err:
        acts["scoped"].verify_audit()
    assert (err.value.status, err.value.code) == (403, "forbidden")


def test_public_key(hb: harebox.Client, acts: Acts) -> None:
    key = hb.get_audit_key()
    assert key["algorithm"] == "ed25519"
    assert len(base64.b64decode(key["public_key"], validate=True)) == 32
    assert acts["scoped"].get_audit_key() == key  # audit:read includes it
