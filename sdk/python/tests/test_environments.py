"""Environments: versioned variables and files, pinned by sandboxes.

One project made for this run holds one environment (a plain MODE, a
secret TOKEN and a template file /etc/app.conf) and boots one sandbox with
it; the project's third-party switch is flipped only there. The tests run
in this file's order and the fixtures delete the sandbox, the environment
and the project at the end, even when a test fails. The secret value is
never in any answer: the sandbox sees only its own placeholder (hbph_...).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator, TypedDict

import pytest

import harebox
from harebox import types as t

from conftest import delete_quietly

CONF = "/etc/app.conf"


class Env(TypedDict):
    project: t.Project
    environment: t.Environment
    #: The secret TOKEN's value, unique to this run.
    secret: str
    #: ``{"project": <the run's project>}``, the query of every call here.
    query: dict[str, t.QueryValue]


def shows(answer: Any, secret: str) -> bool:
    """Whether an answer (a dict, a list, a Sandbox) contains the secret."""
    if isinstance(answer, harebox.Sandbox):
        answer = answer.to_dict()
    return secret in json.dumps(answer)


@pytest.fixture(scope="module")
def env(hb: harebox.Client, run_label: str) -> Iterator[Env]:
    """The run's project and environment; both deleted at the end."""
    project = hb.create_project(body={"name": f"sdk-py-env-{run_label}"})
    query: dict[str, t.QueryValue] = {"project": project["name"]}
    secret = f"sk-sdk-py-{uuid.uuid4().hex}-canary"
    body: t.EnvironmentRequest = {
        "name": f"app-{run_label}",
        "variables": {"MODE": {"value": "prod"}, "TOKEN": {"value": secret, "secret": True}},
        "files": [{"path": CONF, "content": "token={{TOKEN}}\n", "template": True}],
    }
    try:
        environment = hb.create_environment(body=body, query=query)
        try:
            yield {"project": project, "environment": environment, "secret": secret, "query": query}
        finally:
            try:
                hb.delete_environment(environment["id"], query=query)
            except harebox.NotFound:
                pass  # test_delete_environment got there first
    finally:
        hb.delete_project(project["id"])


@pytest.fixture(scope="module")
def env_box(hb: harebox.Client, env: Env, test_image: str, run_label: str) -> Iterator[harebox.Sandbox]:
    """The one sandbox of this file, with the environment's latest version."""
    sandbox = hb.create(
        image=test_image, ttl_seconds=1800, project=env["project"]["name"], environment=env["environment"]["name"],
        labels={"sdk-python-test": run_label, "role": "environment"},
    )
    try:
        yield sandbox
    finally:
        delete_quietly(hb, sandbox.id)


def test_environment_answers_never_show_the_secret(hb: harebox.Client, env: Env) -> None:
    e, secret, query = env["environment"], env["secret"], env["query"]
    assert e["id"].startswith("env_") and e["name"].startswith("app-")
    assert (e["project_id"], e["project"], e["account_id"]) == (
        env["project"]["id"], env["project"]["name"], env["project"]["account_id"])
    assert e["latest"] == 1 and e["created_at"] and e["updated_at"]
    v = e["version"]
    assert (v["environment_id"], v["version"], v["third_party_safe"]) == (e["id"], 1, False)
    assert v["variables"] == {"MODE": {"value": "prod"}, "TOKEN": {"secret": True}}
    assert [(f["path"], f["content"], f.get("template")) for f in v["files"]] == [(CONF, "token={{TOKEN}}\n", True)]

    answers: list[Any] = [
        e,
        hb.get_environment(e["name"], query=query),
        hb.get_environment(e["id"]),  # an ID names its project
        hb.list_environments(query=query),
        hb.list_environment_versions(e["name"], query=query),
        hb.get_environment_version(e["id"], 1, query=query),
    ]
    for answer in answers:
        assert not shows(answer, secret), answer
    assert answers[1] == answers[2] == e
    assert [x["id"] for x in answers[3]["environments"]] == [e["id"]]
    assert answers[4]["versions"] == [v] and answers[5] == v
    with pytest.raises(harebox.NotFound):
        hb.get_environment(e["name"])  # not in the default project
    with pytest.raises(harebox.NotFound):
        hb.get_environment_version(e["name"], 2, query=query)
    with pytest.raises(harebox.Conflict):
        hb.create_environment(body={"name": e["name"]}, query=query)


def test_sandbox_pins_the_latest_version_and_sees_only_placeholders(
    hb: harebox.Client, env: Env, env_box: harebox.Sandbox
) -> None:
    name, secret = env["environment"]["name"], env["secret"]
    assert env_box.state == "running"
    assert (env_box.environment, env_box.third_party, env_box.project) == (f"{name}@1", False, env["project"]["name"])
    assert hb.get_sandbox(env_box.id)["environment"] == f"{name}@1"
    assert not shows(env_box, secret)

    conf = hb.read_file(env_box.id, query={"path": CONF}).decode()
    assert conf.startswith("token=hbph_") and conf.endswith("\n"), conf
    assert secret not in conf
    # Every exec gets the variables: the plain value, and the same
    # placeholder for the secret as the file.
    out = env_box.run('printf "%s %s" "$MODE" "$TOKEN"')
    assert out["exit_code"] == 0, out
    assert out["stdout"] == f"prod {conf.strip().removeprefix('token=')}"


def test_update_makes_a_new_version_and_running_sandboxes_keep_theirs(
    hb: harebox.Client, env: Env, env_box: harebox.Sandbox
) -> None:
    e, secret, query = env["environment"], env["secret"], env["query"]
    conf = env_box.read_file(CONF)
    body: t.EnvironmentUpdate = {"set": {"MODE": {"value": "staging"}, "REGION": {"value": "fr-par"}}}
    updated = hb.update_environment(e["name"], body=body, query=query)
    assert not shows(updated, secret)
    assert (updated["id"], updated["latest"], updated["version"]["version"]) == (e["id"], 2, 2)
    assert updated["version"]["variables"] == {
        "MODE": {"value": "staging"}, "REGION": {"value": "fr-par"}, "TOKEN": {"secret": True}}
    assert hb.get_environment(e["id"], query=query)["latest"] == 2

    versions = hb.list_environment_versions(e["id"], query=query)["versions"]
    assert [v["version"] for v in versions] == [1, 2]
    assert not shows(versions, secret)
    assert hb.get_environment_version(e["name"], "1", query=query)["variables"]["MODE"] == {"value": "prod"}

    assert env_box.refresh().environment == f"{e['name']}@1"
    assert env_box.read_file(CONF) == conf
    assert env_box.run('printf "%s" "$MODE"')["stdout"] == "prod"


def test_third_party_sandbox_gets_only_safe_environments(
    hb: harebox.Client, env: Env, test_image: str, run_label: str
) -> None:
    """Every create here is refused before anything boots: no VM, no record."""
    e, project = env["environment"], env["project"]
    mine = f"sdk-python-test={run_label}"
    before = [b["id"] for b in hb.list_sandboxes(query={"label": mine})["sandboxes"]]
    base: dict[str, Any] = {"image": test_image, "project": project["name"], "labels": {"sdk-python-test": run_label, "role": "refused"}}

    with pytest.raises(harebox.Forbidden) as err:
        hb.create(**base, environment=e["name"], third_party=True)
    assert (err.value.status, err.value.code, err.value.field) == (403, "forbidden", "environment")
    with pytest.raises(harebox.Forbidden):
        hb.create(**base, environment=f"{e['id']}@1", third_party=True)
    with pytest.raises(harebox.InvalidRequest) as invalid:
        hb.create(**base, environment=e["name"], no_env=True)
    assert invalid.value.field == "environment"
    with pytest.raises(harebox.InvalidRequest) as missing:
        hb.create(**base, environment=f"{e['name']}@9")
    assert missing.value.field == "environment"

    # The project's default makes every new sandbox third-party.
    assert project["third_party_default"] is False
    mine_project = {"account": project["account_id"]}
    try:
        flipped = hb.update_project(project["name"], body={"third_party_default": True}, query=mine_project)
        assert (flipped["id"], flipped["third_party_default"]) == (project["id"], True)
        assert hb.get_project(project["id"])["third_party_default"] is True
        with pytest.raises(harebox.Forbidden) as by_default:
            hb.create(**base, environment=e["name"])
        assert by_default.value.field == "environment"
    finally:
        back = hb.update_project(project["id"], body={"third_party_default": False})
    assert back["third_party_default"] is False

    assert [b["id"] for b in hb.list_sandboxes(query={"label": mine})["sandboxes"]] == before


def test_delete_environment(hb: harebox.Client, env: Env, env_box: harebox.Sandbox) -> None:
    """Last: refused while the sandbox lives, then deleted after it."""
    e, query = env["environment"], env["query"]
    with pytest.raises(harebox.Conflict) as err:
        hb.delete_environment(e["name"], query=query)
    assert (err.value.status, err.value.code) == (409, "conflict")
    assert hb.get_environment(e["id"])["latest"] == 2

    assert env_box.delete().state == "deleted"
    assert hb.delete_environment(e["name"], query=query) is None
    with pytest.raises(harebox.NotFound):
        hb.get_environment(e["id"], query=query)
    assert hb.list_environments(query=query) == {"environments": []}
