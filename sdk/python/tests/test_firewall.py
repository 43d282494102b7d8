"""The shared sandbox's firewall policy: get, set, and a bad policy refused."""

from __future__ import annotations

import pytest

import harebox

PYPI_ONLY = {
    "default_outbound": "deny",
    "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "files.pythonhosted.org"]}],
}


def test_set_and_get_firewall(hb: harebox.Client, box: harebox.Sandbox) -> None:
    assert hb.get_firewall(box.id)["default_outbound"] in ("allow", "deny")
    now = hb.set_firewall(box.id, body=PYPI_ONLY)
    assert now["default_outbound"] == "deny"
    assert now["outbound"][0]["hosts"] == ["pypi.org", "files.pythonhosted.org"]
    assert hb.get_firewall(box.id) == now


def test_bad_policy_is_refused_and_changes_nothing(hb: harebox.Client, box: harebox.Sandbox) -> None:
    before = hb.set_firewall(box.id, body=PYPI_ONLY)
    bad = {"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "70000"}]}
    with pytest.raises(harebox.InvalidRequest) as err:
        hb.set_firewall(box.id, body=bad)
    assert (err.value.status, err.value.field) == (400, "outbound[0].ports")
    assert hb.get_firewall(box.id) == before
