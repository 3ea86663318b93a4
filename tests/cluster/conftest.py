"""Real three-server clusters for tests: started per test, always torn down."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from node import devcluster as cl
from node.wire.rpc_client import RPCClient
from tests import conditions


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until truthy; fail the test at the deadline."""
    return conditions.wait_until(predicate, timeout, what)


class ClusterHandle:
    def __init__(self, cluster: cl.Cluster) -> None:
        self.cluster = cluster

    @property
    def addresses(self) -> list[str]:
        return self.cluster.rpc_addresses

    def client(self, address: str | None = None, token: str | None = None, timeout: float = 15.0) -> RPCClient:
        return RPCClient([address] if address else self.addresses, token=token, timeout=timeout)

    def status(self, address: str) -> dict[str, Any] | None:
        return cl.status_of(address, timeout=2.0)

    def leader(self, timeout: float = 30.0) -> cl.ClusterNode:
        def find() -> cl.ClusterNode | None:
            for node in self.cluster.nodes:
                if not cl.alive(node.pid):
                    continue
                st = self.status(node.rpc_addr)
                if st and st.get("Role") == "leader":
                    return node
            return None

        return wait_until(find, timeout, "a leader")

    def followers(self) -> list[cl.ClusterNode]:
        leader = self.leader()
        return [n for n in self.cluster.nodes if n.id != leader.id]

    def reload(self) -> None:
        """Re-read cluster.json after a CLI command restarted servers (new pids)."""
        self.cluster = cl.Cluster.load(self.cluster.dir)

    def kill(self, node: cl.ClusterNode) -> None:
        cl.kill(self.cluster, node.id)

    def restart(self, node: cl.ClusterNode) -> None:
        cl.restart(self.cluster, node.id)

    def digests(self, expect_index: int | None = None, timeout: float = 30.0) -> dict[str, tuple[str, int]]:
        """Each live server's (digest, index) once all report the same applied index."""

        def collect() -> dict[str, tuple[str, int]] | None:
            out = {}
            for node in self.cluster.nodes:
                if not cl.alive(node.pid):
                    continue
                d = self.client(node.rpc_addr, timeout=3.0).call("debug.digest", {"stale": True})
                out[node.id] = (d["digest"], d["index"])
            indexes = {i for _, i in out.values()}
            if len(indexes) != 1:
                return None
            if expect_index is not None and indexes.pop() < expect_index:
                return None
            return out

        return wait_until(collect, timeout, "replicas to reach the same applied index")


@pytest.fixture
def cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ClusterHandle]]:
    started: list[cl.Cluster] = []

    def make(nodes: int = 3, extra_config: str = "", hosts: list[str] | None = None) -> ClusterHandle:
        directory = tmp_path_factory.mktemp("cluster")
        c = cl.plan(str(directory), nodes, hosts=hosts, extra_config=extra_config)
        started.append(c)
        for node in c.nodes:
            cl.start_node(node)
        c.save()
        cl.wait_for_leader(c.rpc_addresses, 60.0)
        return ClusterHandle(c)

    yield make
    for c in started:
        try:  # pids may have changed behind our back (cluster restart, snapshot restore)
            c = cl.Cluster.load(c.dir)
        except cl.ClusterError:
            pass
        try:
            cl.down(c, timeout=10.0)
        except Exception:  # noqa: BLE001 - best effort, then SIGKILL
            for node in c.nodes:
                if cl.alive(node.pid):
                    cl.kill(c, node.id)


@pytest.fixture
def cluster(cluster_factory: Callable[..., ClusterHandle]) -> ClusterHandle:
    return cluster_factory()


def job_spec(job_id: str, count: int = 1, meta: dict[str, str] | None = None, job_type: str = "service") -> dict[str, Any]:
    return {
        "ID": job_id,
        "Type": job_type,
        "Meta": meta or {},
        "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [{"Name": "t", "Driver": "sim"}]}],
    }
