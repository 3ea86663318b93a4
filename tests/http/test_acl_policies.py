"""ACL policies over HTTP and the CLI: CRUD, and every route allowed by its capability and denied without it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.http.support import ChunkedStream, HTTPCluster, job

pytestmark = pytest.mark.cluster

TIMEOUT = 30
REPO = Path(__file__).resolve().parents[2]
NODE_ID = "5d0f3c4e-0000-4000-8000-000000000001"

POLICIES = {
    "ns-read": 'namespace "default" { policy = "read" }',
    "ns-write": 'namespace "default" { policy = "write" }',
    "list-only": 'namespace "default" { capabilities = ["list-jobs"] }',
    "node-read": 'node { policy = "read" }',
    "node-write": 'node { policy = "write" }',
    "op-read": '{"operator": {"policy": "read"}}',  # JSON rules, as Nomad accepts
    "op-write": 'operator { policy = "write" }',
}

#: (verb, path, body, a policy that allows it, a policy that does not); management allows all.
ROUTES: list[tuple[str, str, Any, str, str]] = [
    ("GET", "/v1/jobs", None, "list-only", "node-read"),
    ("GET", "/v1/job/pol-web", None, "ns-read", "list-only"),
    ("GET", "/v1/job/pol-web/allocations", None, "ns-read", "node-write"),
    ("GET", "/v1/job/pol-web/evaluations", None, "ns-read", "op-write"),
    ("GET", "/v1/job/pol-web/versions", None, "ns-read", "list-only"),
    ("GET", "/v1/job/pol-web/summary", None, "ns-read", "node-read"),
    ("POST", "/v1/jobs", {"Job": job("pol-new")}, "ns-write", "ns-read"),
    ("DELETE", "/v1/job/pol-gone", None, "ns-write", "ns-read"),
    ("GET", "/v1/allocations", None, "ns-read", "node-read"),
    ("GET", "/v1/evaluations", None, "ns-read", "node-read"),
    ("GET", "/v1/deployments", None, "ns-read", "op-read"),
    ("GET", "/v1/nodes", None, "node-read", "ns-write"),
    ("GET", f"/v1/node/{NODE_ID}", None, "node-read", "ns-write"),
    ("POST", f"/v1/node/{NODE_ID}/eligibility", {"Eligibility": "eligible"}, "node-write", "node-read"),
    # Forced client GC: node:write for a node's (Nomad's), submit-job for one alloc's (404 here: no such alloc).
    ("PUT", f"/v1/client/gc?node_id={NODE_ID}", None, "node-write", "node-read"),
    ("PUT", "/v1/client/allocation/5d0f3c4e-0000-4000-8000-00000000a110/gc", None, "ns-write", "node-write"),
    ("GET", "/v1/operator/scheduler/configuration", None, "op-read", "node-write"),
    ("GET", "/v1/operator/raft/configuration", None, "op-read", "ns-write"),
    ("PUT", "/v1/system/gc", None, "", "op-write"),
    ("GET", "/v1/acl/tokens", None, "", "op-write"),
    ("GET", "/v1/acl/policies", None, "", "op-write"),
    ("GET", "/v1/acl/policy/ns-read", None, "", "ns-write"),
    ("PUT", "/v1/acl/policy/extra", {"Rules": 'node { policy = "read" }'}, "", "op-write"),
]


def hdr(token: str | None) -> dict[str, str]:
    return {"X-Nomad-Token": token} if token else {}


class Setup:
    def __init__(self, cluster: HTTPCluster) -> None:
        self.cluster = cluster
        self.base = cluster.leader_url
        boot = requests.post(f"{self.base}/v1/acl/bootstrap", timeout=TIMEOUT)
        assert boot.status_code == 200, boot.text
        self.mgmt = boot.json()["SecretID"]
        self.tokens: dict[str, str] = {"": self.mgmt}

    def call(self, verb: str, path: str, body: Any = None, token: str | None = None) -> requests.Response:
        return requests.request(verb, f"{self.base}{path}", json=body, headers=hdr(token), timeout=TIMEOUT)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from tests.http.support import start_cluster, stop_cluster

    cluster = start_cluster(tmp_path_factory.mktemp("http-policies"), 1)
    try:
        s = Setup(cluster)
        for name, rules in POLICIES.items():
            put = s.call("PUT", f"/v1/acl/policy/{name}", {"Name": name, "Description": f"{name} rules", "Rules": rules},
                         s.mgmt)
            assert put.status_code == 200, put.text
            made = s.call("POST", "/v1/acl/token", {"Name": name, "Type": "client", "Policies": [name]}, s.mgmt)
            assert made.status_code == 200, made.text
            s.tokens[name] = made.json()["SecretID"]
        with cluster.rpc() as c:
            c.call("node.register", {"node": {"ID": NODE_ID, "Name": "pol-node", "SecretID": "pol-node-secret"}})
        assert s.call("POST", "/v1/jobs", {"Job": job("pol-web")}, s.mgmt).status_code == 200
        assert s.call("POST", "/v1/jobs", {"Job": job("pol-gone")}, s.mgmt).status_code == 200
        yield s
    finally:
        stop_cluster(cluster)


def test_policy_crud_in_nomads_shape(setup: Setup) -> None:
    listed = setup.call("GET", "/v1/acl/policies", token=setup.mgmt)
    assert listed.status_code == 200
    stubs = {p["Name"]: p for p in listed.json()}
    assert set(POLICIES) <= set(stubs) and "Rules" not in stubs["ns-read"]
    assert stubs["ns-read"]["Description"] == "ns-read rules" and stubs["ns-read"]["CreateIndex"] > 0
    one = setup.call("GET", "/v1/acl/policy/op-read", token=setup.mgmt).json()
    assert one["Rules"] == POLICIES["op-read"] and one["Name"] == "op-read" and one["ModifyIndex"] > 0
    assert setup.call("GET", "/v1/acl/policy/nope", token=setup.mgmt).status_code == 404
    bad = setup.call("PUT", "/v1/acl/policy/broken", {"Rules": 'namespace "default" { policy = "admin" }'}, setup.mgmt)
    assert bad.status_code == 400 and "policy must be one of" in bad.text and "\n" not in bad.text.strip()
    reserved = setup.call("PUT", "/v1/acl/policy/read", {"Rules": 'node { policy = "read" }'}, setup.mgmt)
    assert reserved.status_code == 400 and "reserved" in reserved.text
    unknown = setup.call("POST", "/v1/acl/token", {"Type": "client", "Policies": ["no-such"]}, setup.mgmt)
    assert unknown.status_code == 400 and "no-such" in unknown.text
    assert setup.call("PUT", "/v1/acl/policy/temp", {"Rules": 'node { policy = "read" }'}, setup.mgmt).status_code == 200
    assert setup.call("DELETE", "/v1/acl/policy/temp", token=setup.mgmt).status_code == 200
    assert setup.call("GET", "/v1/acl/policy/temp", token=setup.mgmt).status_code == 404


@pytest.mark.parametrize(("verb", "path", "body", "allow", "deny"), ROUTES, ids=[f"{r[0]} {r[1]}" for r in ROUTES])
def test_each_route_allows_its_capability_and_denies_others(
    setup: Setup, verb: str, path: str, body: Any, allow: str, deny: str
) -> None:
    denied = setup.call(verb, path, body, setup.tokens[deny])
    assert denied.status_code == 403, (denied.status_code, denied.text)
    assert "\n" not in denied.text.strip()
    assert setup.call(verb, path, body, None).status_code == 403
    allowed = setup.call(verb, path, body, setup.tokens[allow])
    assert allowed.status_code != 403, allowed.text
    assert setup.call(verb, path, body, setup.mgmt).status_code != 403


def test_a_token_loses_what_a_deleted_policy_granted_and_gains_an_edit_at_once(setup: Setup) -> None:
    s = setup
    assert s.call("PUT", "/v1/acl/policy/flip", {"Rules": 'node { policy = "read" }'}, s.mgmt).status_code == 200
    token = s.call("POST", "/v1/acl/token", {"Type": "client", "Policies": ["flip"]}, s.mgmt).json()["SecretID"]
    assert s.call("GET", "/v1/nodes", token=token).status_code == 200
    assert s.call("GET", "/v1/jobs", token=token).status_code == 403
    assert s.call("PUT", "/v1/acl/policy/flip", {"Rules": 'namespace "*" { policy = "read" }'}, s.mgmt).status_code == 200
    assert s.call("GET", "/v1/jobs", token=token).status_code == 200
    assert s.call("GET", "/v1/nodes", token=token).status_code == 403
    assert s.call("DELETE", "/v1/acl/policy/flip", token=s.mgmt).status_code == 200
    assert s.call("GET", "/v1/jobs", token=token).status_code == 403


def _cli(setup: Setup, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(setup.cluster.cluster.rpc_addresses), "CARAVAN_TOKEN": setup.mgmt}
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env, input=stdin)


def test_cli_policy_apply_list_info_delete(setup: Setup, tmp_path: Path) -> None:
    rules = tmp_path / "dev.hcl"
    rules.write_text('namespace "default" {\n  policy = "write"\n}\nnode {\n  policy = "read"\n}\n')
    run: Callable[..., subprocess.CompletedProcess[str]] = lambda *a: _cli(setup, *a)  # noqa: E731
    applied = run("acl", "policy", "apply", "--description", "for devs", "dev", str(rules))
    assert applied.returncode == 0 and "Successfully wrote 'dev'" in applied.stdout, applied.stderr
    listed = run("acl", "policy", "list")
    assert listed.returncode == 0 and "dev" in listed.stdout and "for devs" in listed.stdout
    info = run("acl", "policy", "info", "dev")
    assert info.returncode == 0 and 'policy = "write"' in info.stdout and "for devs" in info.stdout
    token = run("acl", "token", "create", "--name", "dev", "--policy", "dev")
    assert token.returncode == 0 and "dev" in token.stdout, token.stderr
    bad = _cli(setup, "acl", "policy", "apply", "oops", "-", stdin='node { policy = "sudo" }')
    assert bad.returncode != 0 and "node policy must be one of" in bad.stderr
    deleted = run("acl", "policy", "delete", "dev")
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    assert run("acl", "policy", "info", "dev").returncode != 0


@pytest.mark.parametrize(("topic", "allow", "deny"), [
    ("Job", "ns-read", "node-read"),
    ("Allocation", "ns-read", "list-only"),  # list-jobs alone does not read allocs
    ("Node", "node-read", "ns-write"),
    ("Operator", "op-read", "ns-write"),
    ("ACLToken", "", "op-write"),
])
def test_each_event_topic_needs_its_capability(setup: Setup, topic: str, allow: str, deny: str) -> None:
    address = setup.cluster.leader().http_address
    for token, status in ((setup.tokens[deny], 403), (setup.tokens[allow], 200), (setup.mgmt, 200)):
        stream = ChunkedStream(address, f"/v1/event/stream?topic={topic}", token=token)
        try:
            assert stream.status == status, (topic, token == setup.mgmt, stream.status)
        finally:
            stream.close()


def test_a_wildcard_stream_leaves_out_the_topics_a_token_may_not_see(setup: Setup) -> None:
    stream = ChunkedStream(setup.cluster.leader().http_address, "/v1/event/stream", token=setup.tokens["node-read"])
    try:
        assert stream.status == 200
    finally:
        stream.close()
    stream = ChunkedStream(setup.cluster.leader().http_address, "/v1/event/stream", token="not-a-token")
    try:
        assert stream.status == 403
    finally:
        stream.close()
