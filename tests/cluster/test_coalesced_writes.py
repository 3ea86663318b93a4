"""Coalesced writes through real servers: the leader combines concurrent writes into Batch entries.

kill -9 of the leader while batches are in flight must lose no acknowledged
write and apply each exactly once (a client retry carries the same request id;
the FSM returns the first result instead of applying it again).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal

import pytest

from node.wire.errors import NO_LEADER, NOT_LEADER, TIMEOUT, UNAVAILABLE, UNKNOWN_OUTCOME, RPCError
from node.wire.rpc_client import AsyncRPCClient
from tests.cluster.conftest import ClusterHandle, job_spec

pytestmark = pytest.mark.cluster

RETRYABLE = {NOT_LEADER, NO_LEADER, UNAVAILABLE, TIMEOUT, UNKNOWN_OUTCOME}


async def _write_all(cluster: ClusterHandle, count: int, window: int) -> tuple[dict[str, int], str, int]:
    """Register ``count`` jobs, ``window`` at a time; kill -9 the leader once some are acknowledged.

    A write whose outcome is unknown is retried with the same request id and a
    changed body (attempt number in Meta): applied twice, it would become
    version 1 of its job. Returns each acknowledged job's index, the killed
    node's id and how many writes had to be retried.
    """
    leader = cluster.leader()
    # straight to the leader, so the kill breaks writes in flight (a follower would forward and retry them itself)
    client = AsyncRPCClient([leader.rpc_addr, *(a for a in cluster.addresses if a != leader.rpc_addr)], timeout=10)
    acked: dict[str, int] = {}
    sem = asyncio.Semaphore(window)
    killed: list[str] = []
    retried: set[str] = set()

    async def one(i: int) -> None:
        job_id = f"co-{i}"
        async with sem:
            for attempt in range(40):
                try:
                    reply = await client.call(
                        "job.register",
                        {"job": job_spec(job_id, meta={"attempt": str(attempt)})},
                        request_id=f"co-req-{i}",
                        idempotent=False,  # an unknown outcome comes back here, to retry with a changed body
                    )
                except RPCError as exc:
                    if exc.code not in RETRYABLE:
                        raise
                    retried.add(job_id)
                    await asyncio.sleep(0.1)
                    continue
                acked[job_id] = reply["Index"]
                if len(acked) >= count // 4 and not killed:
                    os.kill(leader.pid, signal.SIGKILL)  # right here: batches are in flight
                    killed.append(leader.id)
                return

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()
    cluster.kill(leader)  # reaped
    return acked, killed[0], len(retried)


def test_kill_leader_during_coalesced_writes_loses_none_and_applies_each_once(cluster: ClusterHandle) -> None:
    count = 1200
    acked, killed, retried = asyncio.run(_write_all(cluster, count, window=128))
    assert len(acked) == count, "every write is acknowledged in the end (retries with the same request id)"
    assert retried > 0, "the kill left writes with an unknown outcome, retried"
    per_index = collections.Counter(acked.values())
    assert max(per_index.values()) > 1, "concurrent writes were coalesced into shared raft entries"

    old = next(n for n in cluster.cluster.nodes if n.id == killed)
    cluster.restart(old)
    digests = cluster.digests(expect_index=max(acked.values()), timeout=60)
    assert len({d for d, _ in digests.values()}) == 1
    rows = {j["ID"]: j for j in cluster.client().call("job.list", {})["data"]}
    for job_id, index in acked.items():
        job = rows.get(job_id)
        assert job is not None, f"acknowledged write {job_id} lost"
        assert job["Version"] == 0, f"{job_id} applied more than once"
        assert job["JobModifyIndex"] == index, f"{job_id}: acknowledged at {index}, stored at {job['JobModifyIndex']}"
