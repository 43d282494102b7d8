"""The client against the served API: the document, the public routes, and
how errors map to exceptions."""

from __future__ import annotations

import re

import pytest

import harebox


#: Acronyms that run together in an operationId, split where they meet.
JOINED = {"URLCA": "UrlCa"}


def snake(operation_id: str) -> str:
    """getOpenAPI -> get_open_api, listSandboxes -> list_sandboxes,
    listURLs -> list_urls (an acronym's plural s stays with it), getURLCA
    -> get_url_ca (two acronyms, JOINED)."""
    for joined, split in JOINED.items():
        operation_id = operation_id.replace(joined, split)
    name = re.sub(r"([A-Z]{2,})s(?=[A-Z]|$)", lambda m: m.group(1).capitalize() + "s", operation_id)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def test_every_operation_has_a_method_and_no_more(hb: harebox.Client) -> None:
    doc = hb.get_open_api()
    documented = {
        op["operationId"]
        for item in doc["paths"].values()
        for method, op in item.items()
        if isinstance(op, dict) and "operationId" in op
    }
    implemented = harebox.Client.operations()
    assert sorted(documented - implemented.keys()) == [], "operations without a client method"
    assert sorted(implemented.keys() - documented) == [], "client methods for operations the document lacks"
    for operation_id, name in implemented.items():
        assert name == snake(operation_id)
        assert callable(getattr(hb, name))


def test_health_and_info(hb: harebox.Client) -> None:
    assert hb.get_health() == {"status": "ok"}
    ready = hb.get_ready()
    assert ready["status"] == "ready" and {"database", "hypervisor"} <= ready["checks"].keys()
    assert set(ready["checks"].values()) == {"ok"}
    info = hb.get_info()
    assert info["version"] and info["backend"]["name"]
    assert "name" in info["site"]


def test_wrong_api_key_is_unauthorized(hb: harebox.Client) -> None:
    wrong = harebox.Client(url=hb.url, api_key="hbk_wrong")
    with pytest.raises(harebox.Unauthorized) as err:
        wrong.list_sandboxes()
    assert (err.value.status, err.value.code) == (401, "unauthorized")
    assert "hbk_wrong" not in str(err.value)
    assert wrong.get_health() == {"status": "ok"}  # public routes need no key


def test_missing_sandbox_is_not_found(hb: harebox.Client) -> None:
    missing = "sbx_" + "0" * 26
    with pytest.raises(harebox.NotFound) as err:
        hb.get_sandbox(missing)
    assert (err.value.status, err.value.code) == (404, "not_found")
    with pytest.raises(harebox.NotFound):
        hb.exec_stream(missing, body={"cmd": "true"})


def test_bad_size_is_invalid_with_its_field(hb: harebox.Client) -> None:
    # (IDs: a record's health fields may change between the two lists.)
    before = sorted(b["id"] for b in hb.list_sandboxes()["sandboxes"])
    with pytest.raises(harebox.InvalidRequest) as err:
        hb.create(size={"preset": "huge"})
    assert (err.value.status, err.value.code, err.value.field) == (400, "invalid", "size.preset")
    assert sorted(b["id"] for b in hb.list_sandboxes()["sandboxes"]) == before


def test_unknown_field_is_invalid(hb: harebox.Client) -> None:
    with pytest.raises(harebox.InvalidRequest) as err:
        hb.create_sandbox(body={"nmae": "typo"})
    assert err.value.field == "nmae"


def test_path_parameters_cannot_change_the_route(hb: harebox.Client) -> None:
    # "../info" must reach /v1/sandboxes/..%2Finfo (no such sandbox), not /v1/info.
    with pytest.raises(harebox.NotFound):
        hb.get_sandbox("../info")



def test_bad_ttl_is_invalid_with_its_field(hb: harebox.Client, test_image: str) -> None:
    with pytest.raises(harebox.InvalidRequest) as err:
        hb.create(image=test_image, ttl_seconds=-1)
    assert err.value.field == "ttl_seconds"


def test_url_ca_issue_list_revoke(hb: harebox.Client) -> None:
    hb.create_project(body={"name": "urlca-sdk"})
    ca = hb.set_url_ca(project="urlca-sdk")
    assert ca["uploaded"] is False and "BEGIN CERTIFICATE" in ca["certificate"]
    assert hb.get_url_ca(project="urlca-sdk")["certificate"] == ca["certificate"]
    cert = hb.issue_client_cert("alice", ttl="1h", project="urlca-sdk")
    assert "PRIVATE KEY" in cert["private_key"] and cert["issued"] is True
    listed = hb.list_client_certs(project="urlca-sdk")
    assert [c["serial"] for c in listed] == [cert["serial"]]
    assert "private_key" not in listed[0]
    revoked = hb.revoke_client_cert(cert["serial"], project="urlca-sdk")
    assert revoked["revoked_at"]
    with pytest.raises(harebox.InvalidRequest):
        hb.issue_client_cert("bob", ttl="forever", project="urlca-sdk")
    hb.delete_url_ca(project="urlca-sdk")
    with pytest.raises(harebox.NotFound):
        hb.get_url_ca(project="urlca-sdk")
    hb.delete_project("urlca-sdk")
