"""The scheduler configuration on real processes: CLI and HTTP change placement on the next eval.

Three servers with ACLs on and one simulated client of two empty nodes.
Each phase registers a job of two allocs that each take a quarter of a
node, checks where they went, and stops the job so the next phase starts
from empty nodes again: binpack (the default) puts both on one node; after
``set-config -scheduler-algorithm=spread`` the next job's allocs go to two;
after an HTTP PUT back to binpack, to one again. Every server's stale read
shows the same configuration; a wrong token and a bad policy are refused,
with one line, changing nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from node import devcluster as cl
from node.wire.rpc_client import RPCClient
from tests.lifecycle.conftest import LIFECYCLE_CONFIG, Env, wait_until

pytestmark = pytest.mark.cluster

CONFIG_PATH = "/v1/operator/scheduler/configuration"


@dataclass
class ACLEnv(Env):
    """A cluster whose ACLs are bootstrapped: its RPCs carry the management token."""

    token: str = ""
    reader: str = ""

    def client(self, timeout: float = 15.0) -> RPCClient:
        return RPCClient(self.addresses, token=self.token or None, timeout=timeout)

    def caravan(self, *args: str, token: str | None = None) -> Any:
        return self.cli(*args, "--token", self.token if token is None else token)

    def http(self, node: cl.ClusterNode, method: str, token: str | None = None, **kw: Any) -> requests.Response:
        headers = {"X-Nomad-Token": self.token if token is None else token}
        return requests.request(method, f"http://{node.http_address}{CONFIG_PATH}", headers=headers, timeout=15, **kw)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ACLEnv]:
    tmp = tmp_path_factory.mktemp("scheduler-config")
    cluster = cl.up(str(tmp / "cluster"), 3, extra_config=LIFECYCLE_CONFIG, timeout=60)
    e = ACLEnv(cluster, tmp)
    try:
        e.token = e.call("acl.bootstrap")["SecretID"]
        e.reader = e.call("acl.token.create", {"name": "r", "policies": ["read"]})["SecretID"]
        e.start_sim(2, "pol", "--token", e.token)
        yield e
    finally:
        e.stop_sims()
        cl.down(cl.Cluster.load(cluster.dir))


def _spec(job_id: str) -> dict[str, Any]:
    task = {"Name": "t", "Driver": "sim", "Config": {}, "Resources": {"CPU": 1000, "MemoryMB": 2048}}
    return {"Job": {"ID": job_id, "Type": "service", "Datacenters": ["dc1"],
                    "TaskGroups": [{"Name": "g", "Count": 2, "Tasks": [task]}]}}


def _nodes_used(env: ACLEnv, job_id: str) -> list[int]:
    """Register ``job_id`` (two allocs of a quarter node each), wait for both, stop it; allocs per node used."""
    env.call("job.register", {"job": _spec(job_id)})

    def placed() -> list[dict[str, Any]] | None:
        rows = [a for a in env.read("alloc.list", {"job_id": job_id}) if a["DesiredStatus"] == "run"]
        return rows if len(rows) == 2 else None

    rows = wait_until(placed, 60, f"{job_id}'s two allocs placed")
    env.call("job.stop", {"job_id": job_id})
    wait_until(lambda: all(a["DesiredStatus"] == "stop" for a in env.read("alloc.list", {"job_id": job_id})),
               60, f"{job_id}'s allocs stopped")
    per_node: dict[str, int] = {}
    for a in rows:
        per_node[a["NodeID"]] = per_node.get(a["NodeID"], 0) + 1
    return sorted(per_node.values())


def _config(env: ACLEnv, address: str | None = None) -> dict[str, Any]:
    with RPCClient([address] if address else env.addresses, token=env.reader, timeout=15) as c:
        return c.call("operator.scheduler.get_config", {"stale": True} if address else {})["data"]["SchedulerConfig"]


def _every_server_holds(env: ACLEnv, modify_index: int) -> dict[str, Any]:
    """Wait until every server's own (stale) copy is at ``modify_index``; all copies must be equal."""
    def same() -> dict[str, Any] | None:
        copies = [_config(env, node.rpc_addr) for node in env.cluster.nodes]
        if any(c["ModifyIndex"] != modify_index for c in copies):
            return None
        assert all(c == copies[0] for c in copies), copies
        return copies[0]

    return wait_until(same, 30, f"every server to hold the configuration set at {modify_index}")


def test_set_config_through_cli_and_http_changes_the_next_placement(env: ACLEnv) -> None:
    shown = json.loads(env.caravan("operator", "scheduler", "get-config", "-json", token=env.reader).stdout)
    assert shown["SchedulerAlgorithm"] == "binpack" and shown["ModifyIndex"] == 0
    assert _nodes_used(env, "pack-1") == [2]

    out = env.caravan("operator", "scheduler", "set-config", "-scheduler-algorithm=spread")
    assert out.returncode == 0 and "Scheduler configuration updated!" in out.stdout, out.stderr
    spread = _every_server_holds(env, _config(env)["ModifyIndex"])
    assert spread["SchedulerAlgorithm"] == "spread"
    assert spread["PlacementPolicy"]["Preference"][1] == {"Name": "worst-fit", "Buckets": 3}
    table = env.caravan("operator", "scheduler", "get-config", token=env.reader).stdout
    assert "Scheduler Algorithm     = spread" in table and "worst-fit:3" in table
    assert _nodes_used(env, "spread-1") == [1, 1], "spread is in force but the allocs packed: the selector must rank by snap.policy"

    follower = next(n for n in env.cluster.nodes if (cl.status_of(n.rpc_addr) or {}).get("Role") == "follower")
    put = env.http(follower, "PUT", params={"cas": str(spread["ModifyIndex"])}, json={"SchedulerAlgorithm": "binpack"})
    assert put.status_code == 200 and put.json()["Updated"] is True, put.text
    binpack = _every_server_holds(env, put.json()["ModifyIndex"])
    assert binpack["SchedulerAlgorithm"] == "binpack" and binpack["CreateIndex"] == spread["CreateIndex"]
    for node in env.cluster.nodes:  # Nomad's GET, stale on each server
        got = env.http(node, "GET", token=env.reader, params={"stale": ""})
        assert got.status_code == 200 and got.json()["SchedulerConfig"] == binpack
        assert int(got.headers["X-Nomad-Index"]) == binpack["ModifyIndex"] == got.json()["Index"]
    assert _nodes_used(env, "pack-2") == [2]


def test_wrong_tokens_bad_policies_and_stale_cas_change_nothing(env: ACLEnv) -> None:
    before = _config(env)
    for token in ("not-a-real-secret", env.reader):
        out = env.caravan("operator", "scheduler", "set-config", "-scheduler-algorithm=spread", token=token)
        assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "token" in out.stderr
        assert env.http(env.cluster.nodes[0], "PUT", token=token, json={"SchedulerAlgorithm": "spread"}).status_code == 403

    bad_cli = [
        (["--preference", "best-fit:0"], "needs buckets between 1 and 1000, like best-fit:3"),
        (["--validation", "node-status,datacenter"], "validation rule 'resources' is required; add it back to the list"),
        (["--preference", "fastest-fit"], "unknown preference rule 'fastest-fit'"),
        (["--top-k-max", "99"], "top_k_max must be between 1 and 64"),
        (["-scheduler-algorithm=random"], "-scheduler-algorithm must be binpack or spread"),
        (["-scheduler-algorithm=spread", "-check-index", str(before["ModifyIndex"] + 1000)],
         "could not be atomically updated"),
    ]
    for args, message in bad_cli:
        out = env.caravan("operator", "scheduler", "set-config", *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode != 0 and len(lines) == 1 and message in lines[0], (args, out.stderr)

    leader = env.cluster.nodes[0]
    put = env.http(leader, "PUT", json={"PlacementPolicy": {"Validation": ["node-status"]}})
    assert put.status_code == 400 and put.text.strip().endswith("add it back to the list"), put.text
    put = env.http(leader, "PUT", params={"cas": str(before["ModifyIndex"] + 1000)}, json={})
    assert put.status_code == 200 and put.json()["Updated"] is False
    assert _every_server_holds(env, before["ModifyIndex"]) == before
    # A refused config is not even a log entry: the replicas agree on the state.
    digests = {node.id: _digest(env, node.rpc_addr) for node in env.cluster.nodes}
    wait_until(lambda: len({_digest(env, n.rpc_addr) for n in env.cluster.nodes}) == 1, 30, f"equal digests {digests}")


def _digest(env: ACLEnv, address: str) -> tuple[str, int]:
    with RPCClient([address], token=env.token, timeout=15) as c:
        d = c.call("debug.digest", {"stale": True})
    return d["digest"], d["index"]


def test_a_subscriber_sees_the_change_on_the_journal(env: ACLEnv) -> None:
    start = _config(env)["ModifyIndex"]
    out = env.caravan("operator", "scheduler", "set-config", "--top-k-max", "8", "--cluster-top", "12")
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 30
    events: list[Any] = []
    with RPCClient(env.addresses, token=env.reader, timeout=15) as c:
        for item in c.stream("event.stream", {"index": start, "topics": ["Operator"], "heartbeat": 0.5}):
            events = item.get("events") or []
            if events or time.monotonic() > deadline:
                break
    assert events and events[0][0:3] == ["Operator", "SchedulerConfigUpdated", "scheduler"], events
    assert (events[0][3]["cluster_top"], events[0][3]["top_k_max"]) == (12, 8)
