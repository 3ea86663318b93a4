"""Replication through real server processes: forwarding, reads, kill -9 and restarts."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from node import devcluster as cl
from node.wire.errors import RPCError
from tests.cluster.conftest import ClusterHandle, job_spec, wait_until

pytestmark = pytest.mark.cluster


def register(c: ClusterHandle, job_id: str, address: str | None = None) -> int:
    return c.client(address).call("job.register", {"job": job_spec(job_id)})["Index"]


def present_jobs(c: ClusterHandle, address: str | None = None) -> set[str]:
    rows = c.client(address).call("job.list", {})["data"]
    return {j["ID"] for j in rows}


def test_writes_through_every_server_converge(cluster: ClusterHandle) -> None:
    last = 0
    for i, address in enumerate(cluster.addresses):
        last = max(last, register(cluster, f"job-{i}", address))
    for address in cluster.addresses:
        assert present_jobs(cluster, address) >= {"job-0", "job-1", "job-2"}
    digests = cluster.digests(expect_index=last)
    assert len({d for d, _ in digests.values()}) == 1


def test_forwarded_write_is_linearizable_from_a_follower(cluster: ClusterHandle) -> None:
    follower = cluster.followers()[0]
    index = register(cluster, "fwd", follower.rpc_addr)
    # A default (linearizable) read on a follower is answered by the leader after a barrier.
    data = cluster.client(follower.rpc_addr).call("job.get", {"job_id": "fwd"})
    assert data["data"]["ID"] == "fwd" and data["data"]["JobModifyIndex"] == index


def test_stale_read_is_served_locally_and_reports_its_index(cluster: ClusterHandle) -> None:
    index = register(cluster, "stale")
    follower = cluster.followers()[0]
    cluster.kill(cluster.leader())
    # With the leader gone a stale read still answers from the follower's own state.
    reply = wait_until(lambda: cluster.client(follower.rpc_addr, timeout=3).call("job.get", {"job_id": "stale", "stale": True}),
                       30, "a stale read")
    assert reply["data"]["ID"] == "stale"
    assert reply["applied_index"] >= index


def test_request_id_retry_is_idempotent(cluster: ClusterHandle) -> None:
    client = cluster.client()
    first = client.call("job.register", {"job": job_spec("idem")}, request_id="req-fixed-1")
    second = client.call("job.register", {"job": job_spec("idem", meta={"changed": "yes"})}, request_id="req-fixed-1")
    assert second["Index"] == first["Index"]
    versions = client.call("job.versions", {"job_id": "idem"})["data"]["Versions"]
    assert len(versions) == 1  # the retry did not apply the second body


def test_kill_leader_keeps_every_acknowledged_write(cluster: ClusterHandle) -> None:
    acked: list[str] = []
    stop = threading.Event()
    errors: list[Exception] = []

    def writer() -> None:
        client = cluster.client(timeout=20)
        i = 0
        while not stop.is_set():
            job_id = f"w-{i}"
            try:
                client.call("job.register", {"job": job_spec(job_id)})
                acked.append(job_id)
            except RPCError as exc:  # an unknown outcome is allowed, a lost ack is not
                errors.append(exc)
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    wait_until(lambda: len(acked) >= 20, 30, "some acknowledged writes")
    old = cluster.leader()
    cluster.kill(old)
    wait_until(lambda: (n := cluster.leader()) and n.id != old.id, 30, "a new leader")
    count = len(acked)
    wait_until(lambda: len(acked) >= count + 20, 30, "writes through the new leader")
    stop.set()
    thread.join(30)
    assert present_jobs(cluster) >= set(acked)
    cluster.restart(old)
    cluster.digests()


def test_follower_killed_and_restarted_catches_up(cluster: ClusterHandle) -> None:
    follower = cluster.followers()[0]
    register(cluster, "before")
    cluster.kill(follower)
    last = 0
    for i in range(30):
        last = register(cluster, f"during-{i}")
    cluster.restart(follower)
    digests = cluster.digests(expect_index=last, timeout=60)
    assert len({d for d, _ in digests.values()}) == 1
    assert {"before", "during-29"} <= present_jobs(cluster, follower.rpc_addr)


def test_kill_all_three_at_once_loses_no_acknowledged_write(cluster: ClusterHandle) -> None:
    acked = []
    for i in range(40):
        register(cluster, f"all-{i}")
        acked.append(f"all-{i}")
    for node in cluster.cluster.nodes:
        cl.kill(cluster.cluster, node.id, signal.SIGKILL)
    for node in cluster.cluster.nodes:
        cl.start_node(node)
    cluster.cluster.save()
    cluster.leader(60)
    assert present_jobs(cluster) >= set(acked)
    cluster.digests(timeout=60)


def test_servers_on_distinct_loopback_addresses(cluster_factory) -> None:  # noqa: ANN001
    c = cluster_factory(hosts=["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    hosts = {n.rpc_addr.split(":")[0] for n in c.cluster.nodes}
    assert hosts == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    index = 0
    for i, address in enumerate(c.addresses):
        index = register(c, f"host-{i}", address)
    assert len({d for d, _ in c.digests(expect_index=index).values()}) == 1


def test_leadership_transfer(cluster: ClusterHandle) -> None:
    old = cluster.leader()
    target = cluster.followers()[0]
    reply = cluster.client().call("operator.raft.transfer", {"to": target.id})
    assert reply["Leader"] == target.rpc_addr
    assert wait_until(lambda: cluster.leader().id == target.id, 30, "the target to lead")
    assert old.id != target.id
    register(cluster, "after-transfer")


def test_a_forward_lost_in_a_leader_that_stopped_answering_is_unknown_outcome_not_no_leader(
    cluster: ClusterHandle,
) -> None:
    """A follower forwards a write to a leader that then hangs (SIGSTOP), with no
    majority left to elect another. The write may have reached the leader's log, so
    the follower must not answer no_leader (which promises the write did not run)."""
    leader = cluster.leader()
    follower, other = cluster.followers()
    for node in (other, leader):
        os.kill(node.pid, signal.SIGSTOP)
    try:
        with pytest.raises(RPCError) as info:
            cluster.client(follower.rpc_addr, timeout=30).call(
                "job.register", {"job": job_spec("hung")}, idempotent=False, request_id="hung-1"
            )
        assert info.value.code == "unknown_outcome", info.value
        assert "hung-1" in info.value.message
    finally:
        for node in (other, leader):
            os.kill(node.pid, signal.SIGCONT)
    # A retry with the same id settles it: applied once, whatever happened before.
    index = cluster.client().call("job.register", {"job": job_spec("hung")}, request_id="hung-1")["Index"]
    assert index > 0 and "hung" in present_jobs(cluster)
