"""The ``quota`` workload: queued jobs in two cohorts of queues, their ledgers sampled under faults.

Set-up (once, idempotent, retried until acknowledged): the queues of
``QUEUES`` -- cohort ``lab`` (three queues), cohort ``farm`` (two, limited
in cpu and memory) and ``solo`` (no cohort) -- with borrowing and lending
limits and every preemption policy, and the priority classes of
``CLASSES``. The set-up operation's input is the definitions, so the
checker (``jepsen_like.quota_check``) judges against what was asked, not
against what the servers say they hold.

Actor lanes register queued jobs ``qt-N`` of random sizes (100-500 MHz a
task, one or two tasks) and priority classes in random queues: batch jobs
that run 1-4 s and finish (releasing their quota), services that run until
stopped. They stop some, resize some services (a changed ask is weighed
again: an admitted one returns to pending), and read single workloads
(``queue.workload``, linearizable). With several times more asked than the
cohorts hold, queues borrow, reclaim and preempt all the time.

The observer lane samples every queue's ledger with one ``queue.list``
read (one page: one consistent cut), in turn through the leader
(linearizable) and on each server on its own (``stale``), and records each
sample: the checker runs ``fsm.quota.Ledger.violations()`` and its own
arithmetic on every one.

After healing, ``final`` waits (bounded) until the queues settle (two
reads of every workload a second apart agree and no batch job holds quota),
records every workload as the leader shows it (``census``), then reads
each server's own state with stale reads (digest index, ``queue.list``,
every workload, digest index again) until every server shows one
unchanged index (``replicas``): the checker compares them.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from jepsen_like.workloads import Lane, RunContext, Workload, classify, error_text
from node.wire.errors import NOT_FOUND, UNKNOWN_METHOD, RPCError
from node.wire.rpc_client import RPCClient

JOB_PREFIX = "qt-"
CPU, MEMORY = "cpu", "memory"

#: Kueue's ClusterQueues as ``queue.upsert`` takes them: two cohorts and a queue on its own.
QUEUES: list[dict[str, Any]] = [
    {
        "name": "lab-a",
        "cohort": "lab",
        "resources": [{"name": CPU, "nominal": 1200, "borrowing_limit": 600}],
        "reclaim_within_cohort": "Any",
        "within_queue": "LowerPriority",
        "queueing_strategy": "BestEffortFIFO",
    },
    {
        "name": "lab-b",
        "cohort": "lab",
        "resources": [{"name": CPU, "nominal": 1200, "lending_limit": 600}],
        "reclaim_within_cohort": "LowerPriority",
        "within_queue": "LowerOrNewerEqualPriority",
        "queueing_strategy": "StrictFIFO",
    },
    {
        "name": "lab-c",
        "cohort": "lab",
        "resources": [{"name": CPU, "nominal": 600, "borrowing_limit": 1200, "lending_limit": 300}],
        "reclaim_within_cohort": "Any",
        "within_queue": "Never",
        "queueing_strategy": "BestEffortFIFO",
    },
    {
        "name": "farm-x",
        "cohort": "farm",
        "resources": [
            {"name": CPU, "nominal": 1500, "borrowing_limit": 1000},
            {"name": MEMORY, "nominal": 768, "lending_limit": 384},
        ],
        "reclaim_within_cohort": "Any",
        "within_queue": "LowerPriority",
        "queueing_strategy": "BestEffortFIFO",
    },
    {
        "name": "farm-y",
        "cohort": "farm",
        "resources": [
            {"name": CPU, "nominal": 1000, "lending_limit": 500},
            {"name": MEMORY, "nominal": 512, "borrowing_limit": 256},
        ],
        "reclaim_within_cohort": "LowerPriority",
        "within_queue": "LowerPriority",
        "queueing_strategy": "BestEffortFIFO",
    },
    {
        "name": "solo",
        "cohort": "",
        "resources": [{"name": CPU, "nominal": 800}],
        "reclaim_within_cohort": "Never",
        "within_queue": "LowerPriority",
        "queueing_strategy": "BestEffortFIFO",
    },
]
#: Kueue's WorkloadPriorityClasses.
CLASSES: dict[str, int] = {"qt-low": 0, "qt-mid": 50, "qt-high": 100}

#: Simulated nodes: 4 x 4000 MHz, twice what all queues together may admit (6300 MHz), so an
#: admitted workload is never kept from running by placement.
CLIENT_NODES = 4
SAMPLE_INTERVAL = 0.25  # seconds between two ledger samples
STALE_TIMEOUT = 2.0  # a paused server's stale read gives up soon (a read: no effect either way)
#: per actor lane: above this many live services, a lane stops one rather than add one
LIVE_SERVICES = 10
SETTLE_WAIT = 40.0  # longest wait after healing for the queues to settle
REPLICA_TRIES = 8  # reads of every server's state until all show one unchanged index


def job_spec(
    job_id: str, kind: str, queue: str, pclass: str, cpu: int, memory: int, count: int, run_for: str
) -> dict[str, Any]:
    """A queued job of one group: ``count`` tasks of ``cpu`` MHz and ``memory`` MB."""
    config: dict[str, Any] = {"run_for": run_for} if kind == "batch" else {}
    task = {
        "Name": "t",
        "Driver": "sim",
        "Config": config,
        "Resources": {"CPU": cpu, "MemoryMB": memory},
    }
    return {
        "ID": job_id,
        "Type": kind,
        "Queue": queue,
        "PriorityClass": pclass,
        "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [task]}],
    }


def workload_view(wl: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the history keeps of a workload (None: it has none)."""
    if wl is None:
        return None
    return {
        "state": wl.get("state", ""),
        "queue": wl.get("queue", ""),
        "usage": dict(wl.get("usage") or {}),
        "priority": wl.get("priority", 0),
        "evictions": len(wl.get("evictions") or []),
        "position": wl.get("position", 0),
    }


def ledger_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``queue.list`` rows by queue name: cohort, ledger per resource, admitted and pending counts."""
    return {
        r["name"]: {
            "cohort": r.get("cohort", ""),
            "ledger": r.get("ledger") or {},
            "admitted": r.get("admitted", 0),
            "pending": r.get("pending", 0),
        }
        for r in rows
    }


def read_ledgers(client: RPCClient, stale: bool, timeout: float | None = None) -> dict[str, Any]:
    """Every queue's ledger from one ``queue.list`` page (one read: a consistent cut)."""
    args: dict[str, Any] = {"per_page": 100}
    if stale:
        args["stale"] = True
    answer = client.call("queue.list", args, timeout=timeout)
    if answer.get("next_token"):
        raise RuntimeError(
            "queue.list answered more than one page; the sample would not be one cut"
        )
    return {"index": answer.get("index", 0), "queues": ledger_rows(answer.get("data") or [])}


def read_workload(
    client: RPCClient, job_id: str, stale: bool = False, timeout: float | None = None
) -> dict[str, Any] | None:
    args: dict[str, Any] = {"job_id": job_id, **({"stale": True} if stale else {})}
    try:
        return workload_view(client.call("queue.workload", args, timeout=timeout)["data"])
    except RPCError as err:
        if err.code == NOT_FOUND:
            return None
        raise


class QuotaWorkload(Workload):
    """Queued jobs in two cohorts, ledgers sampled on every server; see the module docstring."""

    name = "quota"
    model = "quota"
    client_nodes = CLIENT_NODES

    def __init__(self, lanes: int = 3) -> None:
        super().__init__(lanes)  # lane 0 observes; the others act
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self.jobs: dict[str, dict[str, Any]] = {}  # every job id attempted -> its kind and spec
        self.stopped: set[str] = set()
        self._next = 0

    def probe(self, client: RPCClient) -> str | None:
        try:
            client.call("queue.list", {}, timeout=5.0)
        except RPCError as err:
            if err.code == UNKNOWN_METHOD:
                return "the servers have no queue RPCs (queues are not built); skipped"
        except OSError:
            return None
        return None

    # -- lanes ------------------------------------------------------------------------------
    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        with ctx.client(rng) as client:
            if lane.lane == self.first_lane:
                self._setup(lane, client, ctx)
                self._observe(lane, ctx, client)
                return
            while not self.ready.is_set() and not ctx.stop.is_set():
                self.ready.wait(0.2)
            while not ctx.stop.is_set():
                self._act(lane, client, rng)
                ctx.stop.wait(rng.uniform(0.15, 0.45))

    def _setup(self, lane: Lane, client: RPCClient, ctx: RunContext) -> None:
        """Create the queues and priority classes (idempotent), again after any failure, until acknowledged."""
        while not ctx.stop.is_set():
            lane.invoke({"f": "setup", "queues": QUEUES, "classes": CLASSES})
            try:
                for name, value in CLASSES.items():
                    client.call(
                        "priority_class.upsert", {"priority_class": {"name": name, "value": value}}
                    )
                for queue in QUEUES:
                    client.call("queue.upsert", {"queue": queue})
            except (RPCError, OSError) as err:
                lane.complete(classify(err), {"error": error_text(err)})
                ctx.stop.wait(0.3)
                continue
            lane.complete("ok")
            self.ready.set()
            return

    def _observe(self, lane: Lane, ctx: RunContext, leader: RPCClient) -> None:
        """Sample every queue's ledger: through the leader, then each server's own state, in turn."""
        turn = 0
        clients: dict[str, RPCClient] = {}
        try:
            while not ctx.stop.is_set():
                slot = turn % (len(ctx.addresses) + 1)
                turn += 1
                if slot == 0:
                    self._sample(lane, leader, "leader", False)
                else:
                    address = ctx.addresses[slot - 1]
                    server = ctx.servers[slot - 1] if slot - 1 < len(ctx.servers) else address
                    if address not in clients:
                        clients[address] = RPCClient([address], timeout=STALE_TIMEOUT)
                    self._sample(lane, clients[address], server, True)
                ctx.stop.wait(SAMPLE_INTERVAL)
        finally:
            for c in clients.values():
                c.close()

    def _sample(self, lane: Lane, client: RPCClient, server: str, stale: bool) -> None:
        lane.invoke({"f": "ledger", "server": server, "stale": stale})
        try:
            sample = read_ledgers(client, stale, timeout=STALE_TIMEOUT if stale else None)
        except (RPCError, OSError, RuntimeError) as err:
            lane.complete("fail", {"error": error_text(err)})  # a read: no effect either way
            return
        lane.complete("ok", sample)

    def _new_id(self) -> str:
        with self._lock:
            self._next += 1
            return f"{JOB_PREFIX}{self._next}"

    def _live(self, kind: str | None = None) -> list[str]:
        with self._lock:
            return sorted(
                j
                for j, info in self.jobs.items()
                if j not in self.stopped
                and info["acked"]
                and (kind is None or info["kind"] == kind)
            )

    def _act(self, lane: Lane, client: RPCClient, rng: random.Random) -> None:
        """One step: register (60%), stop (15%), resize a service (10%) or read a workload (15%)."""
        roll = rng.random()
        services = self._live("service")
        if roll < 0.6 and len(services) <= LIVE_SERVICES * (self.lanes - 1):
            self._register(lane, client, rng, self._new_id(), None)
        elif roll < 0.75:
            live = services if services and rng.random() < 0.8 else self._live()
            if live:
                self._stop(lane, client, rng.choice(live))
        elif roll < 0.85 and services:
            self._register(lane, client, rng, rng.choice(services), "service")
        elif known := self._live():
            self._read(lane, client, rng.choice(known))

    def _register(
        self, lane: Lane, client: RPCClient, rng: random.Random, job_id: str, kind: str | None
    ) -> None:
        """Register a new job (``kind`` None: batch or service at random) or resize a service."""
        with self._lock:
            known = self.jobs.get(job_id)
        if known is not None:
            spec = dict(known["spec"])
        else:
            spec = {
                "kind": kind or rng.choice(("batch", "service")),
                "queue": rng.choice(QUEUES)["name"],
                "pclass": rng.choice(sorted(CLASSES)),
                "memory": rng.choice((32, 64, 96, 128)),
                "count": rng.randint(1, 2),
                "run_for": f"{rng.uniform(1.0, 4.0):.1f}s",
            }
        spec["cpu"] = rng.randrange(100, 501, 50)
        usage = {CPU: spec["cpu"] * spec["count"], MEMORY: spec["memory"] * spec["count"]}
        with self._lock:
            info = self.jobs.setdefault(
                job_id, {"kind": spec["kind"], "acked": False, "usages": []}
            )
            info["spec"] = spec
            info["usages"].append(usage)
        lane.invoke(
            {
                "f": "register" if known is None else "resize",
                "job": job_id,
                "kind": spec["kind"],
                "queue": spec["queue"],
                "priority_class": spec["pclass"],
                "usage": usage,
            }
        )
        body = job_spec(
            job_id,
            spec["kind"],
            spec["queue"],
            spec["pclass"],
            spec["cpu"],
            spec["memory"],
            spec["count"],
            spec["run_for"],
        )
        try:
            client.call("job.register", {"job": body})
        except (RPCError, OSError) as err:
            outcome = classify(err)
            if outcome == "info":  # it may have been registered: a job the final reads look at
                with self._lock:
                    info["acked"] = True
            lane.complete(outcome, {"error": error_text(err)})
            return
        with self._lock:
            info["acked"] = True
        lane.complete("ok")

    def _stop(self, lane: Lane, client: RPCClient, job_id: str) -> None:
        with self._lock:
            self.stopped.add(job_id)  # never touched again, whatever the answer
        lane.invoke({"f": "stop", "job": job_id})
        try:
            client.call("job.stop", {"job_id": job_id})
        except (RPCError, OSError) as err:
            lane.complete(classify(err), {"error": error_text(err)})
            return
        lane.complete("ok")

    def _read(self, lane: Lane, client: RPCClient, job_id: str) -> None:
        lane.invoke({"f": "workload", "job": job_id})
        try:
            view = read_workload(client, job_id)
        except (RPCError, OSError) as err:
            lane.complete("fail", {"error": error_text(err)})
            return
        lane.complete("ok", view)

    # -- after healing ----------------------------------------------------------------------
    def _census(self, client: RPCClient, stale: bool = False) -> dict[str, Any]:
        with self._lock:
            ids = sorted(self.jobs)
        return {
            j: read_workload(client, j, stale=stale, timeout=10.0 if stale else None) for j in ids
        }

    def _settled(self, census: dict[str, Any]) -> bool:
        """No batch job holds quota: nothing more finishes, so nothing more moves."""
        with self._lock:
            kinds = {j: info["kind"] for j, info in self.jobs.items()}
        return not any(
            wl and wl["state"] == "admitted" and kinds.get(j) == "batch" for j, wl in census.items()
        )

    def final(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        """Let the queues settle (bounded), then record the leader's census and every server's own state."""
        started = time.monotonic()
        settle_by = min(deadline - 15.0, started + SETTLE_WAIT)
        census: dict[str, Any] | None = None
        error = ""
        settled = False
        lane.invoke({"f": "census"})
        with ctx.client(random.Random(3)) as client:
            previous: dict[str, Any] | None = None
            while True:
                try:
                    census = self._census(client)
                except (RPCError, OSError) as err:
                    error = error_text(err)
                else:
                    settled = census == previous and self._settled(census)
                    if settled:
                        break
                    previous = census
                if time.monotonic() >= settle_by:
                    break
                time.sleep(1.0)  # polling a condition with a deadline
        if census is None:
            lane.complete("fail", {"error": error or "no answer"})
        else:
            waited = round(time.monotonic() - started, 2)
            jobs = self._missing_jobs(ctx, census)
            lane.complete(
                "ok", {"workloads": census, "jobs": jobs, "settled": settled, "waited": waited}
            )
        self._replicas(lane, ctx, deadline)

    def _missing_jobs(self, ctx: RunContext, census: dict[str, Any]) -> dict[str, Any]:
        """For each job without a workload: its status, or None if the job is gone (collected).

        A finished batch job may be collected by the GC (the lifecycle
        workload forces it), taking its workload along: not a loss.
        """
        out: dict[str, Any] = {}
        with ctx.client(random.Random(4)) as client:
            for job_id in sorted(j for j, wl in census.items() if wl is None):
                try:
                    job = client.call("job.get", {"job_id": job_id})["data"]
                except RPCError as err:
                    if err.code == NOT_FOUND:
                        out[job_id] = None
                        continue
                    out[job_id] = f"unread: {error_text(err)}"
                    continue
                except OSError as err:
                    out[job_id] = f"unread: {error_text(err)}"
                    continue
                out[job_id] = job.get("Status", "") + ("/stop" if job.get("Stop") else "")
        return out

    def _replicas(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        """Each server's own state (stale reads) at one index, unchanged while it was read."""
        lane.invoke({"f": "replicas"})
        reads: dict[str, Any] = {}
        for attempt in range(REPLICA_TRIES):
            reads = {}
            for server, address in zip(ctx.servers, ctx.addresses, strict=False):
                try:
                    with RPCClient([address], timeout=10.0) as client:
                        before = int(client.call("debug.digest", {"stale": True})["index"])
                        ledgers = read_ledgers(client, True, timeout=10.0)
                        workloads = self._census(client, stale=True)
                        after = int(client.call("debug.digest", {"stale": True})["index"])
                except (RPCError, OSError, RuntimeError) as err:
                    reads[server] = {"error": error_text(err)}
                    continue
                reads[server] = {
                    "index_before": before,
                    "index_after": after,
                    "queues": ledgers["queues"],
                    "workloads": workloads,
                }
            if consistent_cut(reads) or time.monotonic() >= deadline - 2.0:
                break
            # let the servers apply what is in flight, then read again
            time.sleep(0.5 + attempt * 0.5)
        lane.complete("ok", {"servers": reads, "consistent": consistent_cut(reads)})


def consistent_cut(reads: dict[str, Any]) -> bool:
    """Every server answered, and all read their state at one index that did not move meanwhile."""
    indexes = set()
    for read in reads.values():
        if "error" in read or read["index_before"] != read["index_after"]:
            return False
        indexes.add(read["index_before"])
    return len(indexes) == 1 and bool(reads)
