"""Client nodes authenticate with their node secret, not ACL tokens: bootstrapping ACLs takes no workload down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from node.wire.errors import PERMISSION_DENIED, RPCError
from node.wire.rpc_client import RPCClient
from tests.lifecycle.conftest import Env, cluster_env, wait_until

pytestmark = pytest.mark.cluster

NODE = "0b8a3a5e-1d7c-4c43-9d2a-000000000001"


@pytest.fixture
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from cluster_env(tmp_path_factory, "node-identity")


@pytest.fixture
def slow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Long heartbeat TTLs: a node this test registers by hand stays up while it is examined."""
    config = '[scheduler]\nmin_heartbeat_ttl = "120s"\nheartbeat_grace = "60s"\nfailover_heartbeat_ttl = "120s"\n'
    yield from cluster_env(tmp_path_factory, "node-secret", config)


def spec(job_id: str, *, type: str = "service", count: int = 1, config: dict[str, Any] | None = None) -> dict[str, Any]:
    group = {"Name": "g", "Count": count,
             "Tasks": [{"Name": "t", "Driver": "sim", "Config": config or {}, "Resources": {"CPU": 100, "MemoryMB": 64}}]}
    return {"ID": job_id, "Type": type, "Datacenters": ["dc1"], "TaskGroups": [group]}


def rpc(env: Env, token: str | None) -> RPCClient:
    return RPCClient(env.addresses, token=token, timeout=15.0)


def read(env: Env, token: str | None, method: str, args: dict[str, Any] | None = None) -> Any:
    with rpc(env, token) as c:
        return c.call(method, args or {})["data"]


def test_bootstrapping_acls_on_a_live_cluster_takes_no_node_or_alloc_down(env: Env) -> None:
    sim = env.start_sim(3, "ident")
    env.call("job.register", {"job": spec("web", count=3)})
    env.call("job.register", {"job": spec("etl-before", type="batch", count=2, config={"run_for": "6s"})})

    def running(token: str | None, job_id: str, count: int) -> list[str] | None:
        rows = read(env, token, "alloc.list", {"job_id": job_id})
        up = sorted(a["ID"] for a in rows if a["ClientStatus"] == "running")
        return up if len(up) == count else None

    web = wait_until(lambda: running(None, "web", 3), 60, "web running")
    wait_until(lambda: running(None, "etl-before", 2), 60, "the first batch job running")
    mgmt = env.call("acl.bootstrap")["SecretID"]
    with pytest.raises(RPCError) as err:
        read(env, None, "node.list")
    assert err.value.code == PERMISSION_DENIED  # ACLs are on for people and tools
    with rpc(env, mgmt) as c:
        c.call("job.register", {"job": spec("etl-after", type="batch", count=2, config={"run_for": "1s"})})

    def dead(job_id: str) -> bool:
        return read(env, mgmt, "job.get", {"job_id": job_id})["Status"] == "dead"

    wait_until(lambda: dead("etl-before") and dead("etl-after"), 90, "both batch jobs complete")
    deadline = time.monotonic() + 10  # several heartbeat TTLs (2s + 2s grace): a refused heartbeat would show
    while time.monotonic() < deadline:  # every look, not only the last, finds the nodes ready
        nodes = [n for n in read(env, mgmt, "node.list") if n["ID"] in sim.nodes]
        assert len(nodes) == 3 and all(n["Status"] == "ready" for n in nodes), nodes
        time.sleep(0.5)
    allocs = read(env, mgmt, "alloc.list")
    assert not [a for a in allocs if a["ClientStatus"] in ("lost", "failed")], allocs
    assert running(mgmt, "web", 3) == web, "the service allocs ran on, untouched"
    for job_id in ("etl-before", "etl-after"):
        done = [a for a in allocs if a["JobID"] == job_id]
        assert len(done) == 2 and all(a["ClientStatus"] == "complete" for a in done), done
    assert sim.proc.poll() is None and "pass a token" not in sim.output() and "secret" not in sim.output().lower()


def _refused(env: Env, token: str | None, method: str, args: dict[str, Any]) -> str:
    with rpc(env, token) as c, pytest.raises(RPCError) as err:
        c.call(method, args)
    assert err.value.code == PERMISSION_DENIED, err.value
    assert "\n" not in err.value.message and "right-secret" not in err.value.message
    return err.value.message


def _node(env: Env, token: str | None) -> dict[str, Any]:
    return read(env, token, "node.get", {"node_id": NODE})


def test_a_wrong_node_secret_is_refused_and_changes_nothing(slow_env: Env) -> None:
    env = slow_env
    register = {"node": {"ID": NODE, "Name": "ident-1", "SecretID": "right-secret", "Status": "ready",
                         "Attributes": {"driver.sim": "1", "kernel.name": "linux", "cpu.arch": "amd64"}}}
    with rpc(env, None) as c:
        c.call("node.register", register)
    assert "SecretID" not in _node(env, None) and "SecretHash" not in _node(env, None)
    env.call("job.register", {"job": spec("pinned", count=1)})
    alloc = wait_until(lambda: next(iter(read(env, None, "alloc.list", {"node_id": NODE})), None), 60, "an alloc")
    for mgmt in (None, "acls-on"):
        if mgmt:  # the same refusals once ACLs are on; an operator's token is not a node's secret
            mgmt = env.call("acl.bootstrap")["SecretID"]
        before = _node(env, mgmt)
        status = read(env, mgmt, "alloc.get", {"alloc_id": alloc["ID"]})["ClientStatus"]
        again = {"node": {**register["node"], "SecretID": "wrong", "Name": "hijacked"}}
        assert "wrong node secret" in _refused(env, "wrong", "node.register", again)
        assert "wrong node secret" in _refused(env, "wrong", "node.heartbeat", {"node_ids": [NODE]})
        assert "wrong node secret" in _refused(env, "wrong", "node.status", {"node_id": NODE, "status": "ready"})
        update = {"allocs": [{"ID": alloc["ID"], "ClientStatus": "failed"}]}
        assert "wrong node secret" in _refused(env, "wrong", "alloc.update", update)
        assert "pass it" in _refused(env, None, "node.heartbeat", {"node_ids": [NODE]})
        if mgmt:
            _refused(env, mgmt, "node.heartbeat", {"node_ids": [NODE]})
            _refused(env, mgmt, "alloc.update", update)
        after = _node(env, mgmt)
        assert after["Name"] == "ident-1" and after["ModifyIndex"] == before["ModifyIndex"]
        assert read(env, mgmt, "alloc.get", {"alloc_id": alloc["ID"]})["ClientStatus"] == status
        with rpc(env, "right-secret") as c:  # the node's own secret works, ACLs on or off
            assert c.call("node.heartbeat", {"node_ids": [NODE]})["Unknown"] == []
            c.call("node.register", register)
            c.call("alloc.update", {"allocs": [{"ID": alloc["ID"], "ClientStatus": "running"}]})
            assert c.call("alloc.list", {"node_id": NODE})["data"]
            assert c.call("job.get", {"job_id": "pinned"})["data"]["ID"] == "pinned"
