"""The ``failover`` workload: steady services on the simulated client, watched while nodes go silent.

The ``clients`` nemesis (``jepsen_like.clients_fault``) cuts a share of the
simulated client's nodes off; the leader marks them down, their allocs lost,
and places replacements elsewhere. To judge that, the checker
(``jepsen_like.failover_check``) needs jobs whose wants never change --
so "this lost alloc still had to be replaced" is a fact, not a guess -- and
a record of every alloc the servers showed, since a lost alloc may be
collected before the run ends.

So this workload registers a few service jobs ``fo-N`` once, with seeded
counts and tasks that run until stopped, and never touches them again. Its
one lane then lists the allocs of each job twice a second (``allocs``
operations). After healing, ``final`` waits (bounded) until every job runs
its count and records jobs, allocs and nodes (the ``final`` operation).

Its server config shortens heartbeats, so a silenced node is down within
about 8-13 s (TTL 5-10 s plus 3 s grace) rather than 20-30 s.
"""

from __future__ import annotations

import random
import time
from typing import Any

from jepsen_like.workloads import Lane, RunContext, Workload, classify, error_text
from node.wire.errors import NOT_FOUND, RPCError
from node.wire.rpc_client import RPCClient

JOB_PREFIX = "fo-"
OBSERVE_INTERVAL = 0.5  # seconds between two listings of the jobs' allocs
FINAL_WAIT = 45.0  # longest wait after healing for every job to run its count

#: Short heartbeats (merged with other workloads' [scheduler] keys by the runner).
FAILOVER_CONFIG = """
[scheduler]
min_heartbeat_ttl = "5s"
failover_heartbeat_ttl = "10s"
heartbeat_grace = "3s"
"""

#: What the history keeps of an alloc: enough to follow replacement links and count what runs.
ALLOC_FIELDS = ("ID", "JobID", "TaskGroup", "NodeID", "DesiredStatus", "ClientStatus", "PreviousAllocation", "NextAllocation")


def alloc_row(alloc: dict[str, Any], read: int) -> dict[str, Any]:
    """The fields kept, and ``Read``: rows with one number came from one read (a consistent cut)."""
    return {**{k: alloc.get(k) or "" for k in ALLOC_FIELDS}, "Read": read}


def job_spec(job_id: str, count: int) -> dict[str, Any]:
    """A service whose one task runs until stopped; tiny, so any node has room for a replacement."""
    task = {"Name": "t", "Driver": "sim", "Config": {}, "Resources": {"CPU": 10, "MemoryMB": 10}}
    return {"ID": job_id, "Type": "service", "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [task]}]}


def running(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Allocs the servers want running and the client reports running."""
    return [a for a in rows if a["DesiredStatus"] == "run" and a["ClientStatus"] == "running"]


class FailoverWorkload(Workload):
    """Steady service jobs on the simulated client, observed for the failover checker."""

    name = "failover"
    model = "failover"
    server_config = FAILOVER_CONFIG
    client_nodes = 10  # a share of them goes silent at a time: enough for 20-50% to mean several

    def __init__(self, lanes: int = 1, jobs: int = 8) -> None:
        super().__init__(lanes)
        self.jobs = jobs
        self.counts: dict[str, int] = {}

    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        with ctx.client(rng) as client:
            for i in range(self.jobs):
                self._register(lane, client, ctx, f"{JOB_PREFIX}{i}", rng.randint(2, 3))
            while not ctx.stop.is_set():
                self._observe(lane, client)
                ctx.stop.wait(OBSERVE_INTERVAL)

    def _register(self, lane: Lane, client: RPCClient, ctx: RunContext, job_id: str, count: int) -> None:
        """Register one job, again after an unknown outcome (the same spec: idempotent), until acknowledged."""
        self.counts[job_id] = count
        while not ctx.stop.is_set():
            lane.invoke({"f": "run", "job": job_id, "count": count})
            try:
                client.call("job.register", {"job": job_spec(job_id, count)})
            except (RPCError, OSError) as err:
                lane.complete(classify(err), {"error": error_text(err)})
                ctx.stop.wait(0.2)
                continue
            lane.complete("ok")
            return

    def _allocs(self, client: RPCClient) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        reads = 0
        for job_id in sorted(self.counts):
            for page in client.pages("alloc.list", {"job_id": job_id}):
                rows += [alloc_row(a, reads) for a in page]
                reads += 1
        return rows

    def _observe(self, lane: Lane, client: RPCClient) -> None:
        lane.invoke({"f": "allocs"})
        try:
            rows = self._allocs(client)
        except (RPCError, OSError) as err:
            lane.complete("fail", {"error": error_text(err)})  # a read: no effect either way
            return
        lane.complete("ok", rows)

    def _state(self, client: RPCClient) -> dict[str, Any]:
        jobs: dict[str, Any] = {}
        for job_id in sorted(self.counts):
            try:
                job = client.call("job.get", {"job_id": job_id})["data"]
            except RPCError as err:
                if err.code != NOT_FOUND:
                    raise
                continue
            count = sum(int(g.get("Count") or 0) for g in job.get("TaskGroups") or [])
            jobs[job_id] = {"count": count, "status": job.get("Status", ""), "stop": bool(job.get("Stop"))}
        nodes = {n["ID"]: n.get("Status", "") for n in client.list_all("node.list", {})}
        return {"jobs": jobs, "allocs": self._allocs(client), "nodes": nodes}

    @staticmethod
    def _settled(state: dict[str, Any]) -> bool:
        """Every job runs exactly its count, and nothing of it is pending."""
        for job_id, job in state["jobs"].items():
            rows = [a for a in state["allocs"] if a["JobID"] == job_id]
            pending = [a for a in rows if a["DesiredStatus"] == "run" and a["ClientStatus"] == "pending"]
            if len(running(rows)) != job["count"] or pending:
                return False
        return True

    def final(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        """Wait (bounded) for every job to run its count, then record the state the checker judges."""
        deadline = min(deadline, time.monotonic() + FINAL_WAIT)
        started = time.monotonic()
        state: dict[str, Any] | None = None
        error = ""
        lane.invoke({"f": "final"})  # one operation over the wait: its value is the last state read
        with ctx.client(random.Random(2)) as client:
            while True:
                try:
                    state = self._state(client)
                except (RPCError, OSError) as err:
                    error = error_text(err)
                else:
                    if self._settled(state):
                        break
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.25)  # polling a condition with a deadline
        if state is None:
            lane.complete("fail", {"error": error or "no answer"})
            return
        lane.complete("ok", {**state, "settled": self._settled(state), "waited": round(time.monotonic() - started, 2)})
