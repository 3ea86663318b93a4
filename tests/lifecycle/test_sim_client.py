"""The simulated client's loops under server errors, driven by a scripted server.

The loops' retry paths hang on timing a real cluster rarely shows (a reload
failing right after the journal moved past the client), so a scripted
server plays the RPC side here; the client code is the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from client.sim import SimClient, SimConfig, SimError
from node.wire.errors import RESET_REQUIRED, UNAVAILABLE, RPCError
from tests.conditions import wait_until_async

JOB = {"ID": "j", "Type": "service", "Version": 0,
       "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "sim", "Config": {}}]}]}


class ScriptedServer:
    """Answers as the servers would, with the stream and alloc.list outcomes scripted in order."""

    def __init__(self, streams: list[Any], lists: list[Any]) -> None:
        self.streams = streams
        self.lists = lists
        self.updates: list[dict[str, Any]] = []
        self.job: dict[str, Any] = JOB
        self.stream_from: list[int] = []  # the index each event.stream call asked to follow from
        self.list_answers: dict[str, Any] = {}  # node id -> its alloc.list answer (else the scripted order)

    async def call(self, method: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        if method == "node.register":
            return {"Index": 3}
        if method == "node.heartbeat":
            return {"HeartbeatTTL": 10.0}
        if method == "job.get":
            return {"data": self.job}
        if method == "alloc.update":
            self.updates.extend(args["allocs"])
            return {}
        if method == "alloc.list" and args["node_id"] in self.list_answers:
            return self.list_answers[args["node_id"]]
        if method == "alloc.list":
            outcome = self.lists.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        raise AssertionError(f"unexpected call {method}")

    def stream(self, method: str, args: dict[str, Any], idle_timeout: float | None = None) -> AsyncIterator[Any]:
        self.stream_from.append(args["index"])
        return self._stream(self.streams.pop(0) if self.streams else [])

    async def _stream(self, script: Any) -> AsyncIterator[Any]:
        if isinstance(script, Exception):
            raise script
        for item in script:
            yield item
        await asyncio.Event().wait()  # an idle stream

    async def close(self) -> None:
        pass


def _sim(server: ScriptedServer, nodes: int = 1) -> SimClient:
    sim = SimClient(SimConfig(servers=["127.0.0.1:1"], nodes=nodes, report_interval=0.01))
    sim.rpc = server  # type: ignore[assignment]
    return sim


@contextlib.asynccontextmanager
async def _running(sim: SimClient) -> AsyncIterator[None]:
    task = asyncio.create_task(sim.run())
    try:
        yield
    finally:
        sim.stop_event.set()
        await task


def _reported(server: ScriptedServer, alloc_id: str, status: str) -> Any:
    return lambda: any(u["ID"] == alloc_id and u["ClientStatus"] == status for u in server.updates)


def test_a_failed_reload_after_a_reset_is_retried_and_the_allocs_run() -> None:
    async def scenario() -> None:
        server = ScriptedServer([], [])
        sim = _sim(server)
        node_id = next(iter(sim.nodes))
        alloc = {"ID": "a1", "NodeID": node_id, "JobID": "j", "JobVersion": 0, "TaskGroup": "g",
                 "DesiredStatus": "run", "ClientStatus": "pending"}
        server.streams = [RPCError(RESET_REQUIRED, "the journal moved past index 3")]
        server.lists = [RPCError(UNAVAILABLE, "no leader"), {"data": [alloc], "index": 9}]
        async with _running(sim):
            await wait_until_async(_reported(server, "a1", "running"), 10, "the alloc reported running after the reload was retried")
            assert sim.index == 9 and sim.stats.resets == 1 and "no leader" in sim.stats.errors[-1]

    asyncio.run(scenario())


def test_a_loop_that_breaks_stops_the_client_with_an_error() -> None:
    async def scenario() -> None:
        server = ScriptedServer([[{"index": 5, "events": [["Allocation", "AllocationUpdated"]]}]], [])
        sim = _sim(server)
        with pytest.raises(SimError, match="following allocations loop stopped"):
            await asyncio.wait_for(sim.run(), 10)

    asyncio.run(scenario())


def test_an_alloc_stopped_before_it_ran_here_is_acknowledged() -> None:
    async def scenario() -> None:
        server = ScriptedServer([], [])
        sim = _sim(server)
        node_id = next(iter(sim.nodes))
        stopped = {"id": "a2", "node_id": node_id, "job_id": "j", "job_version": 0, "task_group": "g",
                   "desired_status": "stop", "client_status": "pending"}
        server.streams = [[{"index": 5, "events": [["Allocation", "AllocationUpdated", "a2", stopped]]}]]
        async with _running(sim):
            await wait_until_async(_reported(server, "a2", "complete"), 10, "the stop acknowledged")
            assert sim.stats.started == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("healthy", [True, False])
def test_an_alloc_is_reported_healthy_after_min_healthy_time_or_unhealthy_after_healthy_deadline(healthy: bool) -> None:
    """A task whose checks never pass (``"healthy": false``) stays running and is reported
    unhealthy once the group's healthy_deadline has gone by, as Nomad's client reports it."""
    async def scenario() -> None:
        server = ScriptedServer([], [])
        server.job = {**JOB, "TaskGroups": [{
            "Name": "g", "Update": {"MinHealthyTime": 50_000_000, "HealthyDeadline": 400_000_000},
            "Tasks": [{"Name": "t", "Driver": "sim", "Config": {"healthy": healthy}}]}]}
        sim = _sim(server)
        node_id = next(iter(sim.nodes))
        alloc = {"ID": "a3", "NodeID": node_id, "JobID": "j", "JobVersion": 0, "TaskGroup": "g",
                 "DeploymentID": "d1", "DesiredStatus": "run", "ClientStatus": "pending"}
        server.streams = [RPCError(RESET_REQUIRED, "the journal moved past index 3")]
        server.lists = [{"data": [alloc], "index": 9}]
        loop = asyncio.get_running_loop()
        async with _running(sim):
            start = loop.time()
            health = lambda: [u["DeploymentStatus"] for u in server.updates if "DeploymentStatus" in u]  # noqa: E731
            await wait_until_async(health, 10, "the alloc's health reported")
            took = loop.time() - start
            assert [h["Healthy"] for h in health()] == [healthy]
            assert took >= (0.05 if healthy else 0.4)
            assert all(u["ClientStatus"] == "running" for u in server.updates), server.updates

    asyncio.run(scenario())


def test_after_a_reload_from_servers_at_different_indexes_the_stream_follows_from_the_oldest() -> None:
    """Found by a campaign run: after a client restart, node A's list came from a server at index 20
    and node B's from one still at 10; B's alloc placed at 15 was in neither B's list nor a stream
    begun at 20, and stayed pending for good."""

    async def scenario() -> None:
        server = ScriptedServer([], [])
        sim = _sim(server, nodes=2)
        a, b = sorted(sim.nodes)
        on_b = {"ID": "b1", "NodeID": b, "JobID": "j", "JobVersion": 0, "TaskGroup": "g", "DesiredStatus": "run", "ClientStatus": "pending"}
        server.list_answers = {a: {"data": [], "index": 18, "applied_index": 20}, b: {"data": [], "index": 8, "applied_index": 10}}
        server.streams = [RPCError(RESET_REQUIRED, "the journal moved past index 3"),
                          [{"index": 15, "events": [["Allocation", "AllocationUpdated", "b1", _snake(on_b)]]}]]
        async with _running(sim):
            await wait_until_async(_reported(server, "b1", "running"), 10, "the alloc placed between the two lists ran")
        assert server.stream_from[1] == 10, server.stream_from

    asyncio.run(scenario())


def _snake(alloc: dict[str, Any]) -> dict[str, Any]:
    """An alloc as the event stream carries it (the record's own field names)."""
    return {"id": alloc["ID"], "node_id": alloc["NodeID"], "job_id": alloc["JobID"], "job_version": alloc["JobVersion"],
            "task_group": alloc["TaskGroup"], "desired_status": alloc["DesiredStatus"], "client_status": alloc["ClientStatus"]}
