"""Workloads: what the clients do, and how each call becomes invoke/ok/fail/info.

Each workload runs ``lanes`` client threads. A lane is one sequential client
(a Jepsen "process"): it records ``invoke``, makes one RPC, records the
completion. After an ``info`` (unknown outcome) the operation may still be in
flight, so the lane continues under a new process id (``lane + k * lanes
total``), as Jepsen does; a timeline draws all of a lane's processes on one row.

Outcome rules (``classify``):

* ``ok`` -- the server answered with a result;
* ``fail`` -- the request certainly had no effect: ``not_leader``,
  ``no_leader`` and ``unavailable`` (the RPC contract: not executed, see
  ``node.errors.NOT_EXECUTED``), and answers that reject the request as
  such (bad_request, conflict, not_found, permission_denied, ...);
* ``info`` -- anything else (timeouts, ``unknown_outcome``, lost
  connections, internal errors): the write may or may not have happened.

Reads have no effect, so a read that gets no answer is recorded as ``fail``
(it constrains nothing either way, and dropping it keeps the checker fast).

Workloads:

* ``register`` -- per key (a job), a read/write/compare-and-set register
  held in the job's ``Meta["v"]``. A write registers the job with a new,
  globally unique value; a read is a linearizable ``job.get``; a cas is a
  read of (value, JobModifyIndex) followed by ``job.register`` with
  ``enforce_index`` = that index, recorded as its own operation
  ``cas(from=value read, to=new)``. Because every written value is unique
  and a job's JobModifyIndex changes exactly when its spec (here: the value)
  changes, "the index is unchanged" is equivalent to "the value is still
  ``from``", so the RegisterModel's cas is the exact specification (no ABA).
  ``conflict`` is a definite "not equal" (ok, output False). Keys rotate
  after a bounded number of operations so each key's history stays small
  enough for the exponential-worst-case linearizability search.
* ``set`` -- unique job registrations ``add(e)`` plus occasional reads of
  the whole set (``job.list`` over 16 id prefixes); after the faults are
  healed a final read must contain every acknowledged add and nothing that
  was never attempted or that definitely failed.
* ``lifecycle`` -- batch jobs run on a simulated client, finish and are
  collected by periodic and forced GC; see ``LifecycleWorkload``.
* ``journal`` -- an ``event.stream`` subscriber on every server, resuming
  after every fault; see ``JournalWorkload``.

Workloads that need RPCs other features add (``system.gc``,
``event.stream``) probe for them first and are skipped, with the reason in
the results, on servers that lack them (``unknown_method``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgpack

from jepsen_like.recorder import Clock, HistoryRecorder
from node.wire.errors import (
    BAD_REQUEST,
    CONFLICT,
    FRAME_TOO_LARGE,
    MALFORMED,
    NOT_EXECUTED,
    NOT_FOUND,
    PERMISSION_DENIED,
    UNKNOWN_METHOD,
    RPCError,
)
from node.wire.rpc_client import RPCClient

Outcome = Literal["fail", "info"]

#: Answers that reject the request itself: it was validated and refused, or
#: applied as a deterministic error (no effect).
DEFINITE_ERRORS = frozenset(
    {
        BAD_REQUEST,
        CONFLICT,
        NOT_FOUND,
        PERMISSION_DENIED,
        MALFORMED,
        FRAME_TOO_LARGE,
        UNKNOWN_METHOD,
    }
)

SET_BUCKETS = 16


def classify(err: BaseException) -> Outcome:
    """``fail`` if the request certainly had no effect, else ``info``."""
    if isinstance(err, RPCError) and (err.code in NOT_EXECUTED or err.code in DEFINITE_ERRORS):
        return "fail"
    return "info"


def error_text(err: BaseException) -> str:
    if isinstance(err, RPCError):
        return f"{err.code}: {err.message}"[:200]
    return f"{type(err).__name__}: {err}"[:200]


# -- the context clients share ---------------------------------------------------------
@dataclass
class RunContext:
    """What every workload's clients share during a run."""

    addresses: list[str]
    clock: Clock
    stop: threading.Event
    servers: list[str] = field(default_factory=list)  # names, in the order of ``addresses``
    out: str = ""  # the run directory (workloads with files of their own)
    op_timeout: float = 5.0
    think: float = 0.02  # mean pause between a lane's operations (seconds)
    total_lanes: int = 1
    notes: list[str] = field(default_factory=list)
    _unique: itertools.count = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def unique(self) -> int:
        with self._lock:
            return next(self._unique)

    def note(self, text: str) -> None:
        with self._lock:
            if len(self.notes) < 200:
                self.notes.append(text)

    def client(self, rng: random.Random) -> RPCClient:
        addresses = list(self.addresses)
        rng.shuffle(addresses)
        return RPCClient(addresses, timeout=self.op_timeout)

    def pause(self, rng: random.Random) -> None:
        """Think time between operations (pacing, not synchronization)."""
        if self.think > 0:
            self.stop.wait(rng.expovariate(1.0 / self.think))


class Lane:
    """One sequential client; a new process id after every ``info``."""

    def __init__(self, lane: int, ctx: RunContext, recorder: HistoryRecorder) -> None:
        self.lane = lane
        self.ctx = ctx
        self.recorder = recorder
        self.process = lane
        self.ops = 0

    def invoke(self, value: Any, key: Any = None) -> None:
        self.recorder.record(self.process, "invoke", value, key)
        self.ops += 1

    def complete(
        self, type: Literal["ok", "fail", "info"], value: Any = None, key: Any = None
    ) -> None:
        self.recorder.record(self.process, type, value, key)
        if type == "info":
            self.process += self.ctx.total_lanes


# -- workloads -------------------------------------------------------------------------------
class Workload:
    """Base: ``lanes`` client threads calling ``step`` until the run stops."""

    name = "workload"
    model = "none"
    #: lanes keep running after the fault phase, until ``final`` tells them to stop
    runs_past_stop = False
    #: TOML appended to every server's config when this workload is requested
    server_config = ""
    #: simulated client nodes (``caravan client sim``) this workload needs
    client_nodes = 0

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.first_lane = 0

    def configure(self, servers: int) -> None:
        """Adapt to the cluster size before lanes are numbered (default: nothing)."""

    def probe(self, client: RPCClient) -> str | None:
        """A reason to skip this workload on this cluster, or None."""
        return None

    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        with ctx.client(rng) as client:
            while not ctx.stop.is_set():
                self.step(lane, client, rng)
                ctx.pause(rng)

    def step(self, lane: Lane, client: RPCClient, rng: random.Random) -> None:
        raise NotImplementedError

    def final(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        """Reads after the faults are healed (default: none)."""

    def close(self) -> None:
        """Release files of the workload's own (default: none)."""


def _job(job_id: str, meta: dict[str, str]) -> dict[str, Any]:
    return {
        "ID": job_id,
        "Type": "service",
        "Meta": meta,
        "TaskGroups": [{"Name": "g", "Count": 0, "Tasks": [{"Name": "t", "Driver": "sim"}]}],
    }


class _KeyPool:
    """Active register keys; each is retired after ``ops_per_key`` operations."""

    def __init__(self, prefix: str, active: int, ops_per_key: int) -> None:
        self.prefix = prefix
        self.ops_per_key = ops_per_key
        self._next = itertools.count(active)
        self._keys = [f"{prefix}{i}" for i in range(active)]
        self._counts = dict.fromkeys(self._keys, 0)
        self._lock = threading.Lock()

    def pick(self, rng: random.Random) -> str:
        with self._lock:
            slot = rng.randrange(len(self._keys))
            key = self._keys[slot]
            self._counts[key] += 1
            if self._counts[key] >= self.ops_per_key:
                fresh = f"{self.prefix}{next(self._next)}"
                self._keys[slot] = fresh
                self._counts[fresh] = 0
            return key


class RegisterWorkload(Workload):
    name = "register"
    model = "register"

    def __init__(self, lanes: int = 4, keys: int = 3, ops_per_key: int = 120) -> None:
        super().__init__(lanes)
        self.pool = _KeyPool("reg-", keys, ops_per_key)
        self.ctx: RunContext | None = None

    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        self.ctx = ctx
        super().run_lane(lane, ctx, rng)

    def _read(self, lane: Lane, client: RPCClient, key: str) -> tuple[bool, int | None, int]:
        """One read op: (answered, value, JobModifyIndex)."""
        lane.invoke({"f": "read"}, key)
        try:
            job = client.call("job.get", {"job_id": key})["data"]
        except RPCError as err:
            if err.code == NOT_FOUND:
                lane.complete("ok", None, key)
                return True, None, 0
            lane.complete("fail", {"error": error_text(err)}, key)
            return False, None, 0
        except OSError as err:
            lane.complete("fail", {"error": error_text(err)}, key)
            return False, None, 0
        value = int(job["Meta"]["v"])
        lane.complete("ok", value, key)
        return True, value, int(job["JobModifyIndex"])

    def _register(
        self, lane: Lane, client: RPCClient, key: str, value: int, enforce: int | None
    ) -> None:
        args: dict[str, Any] = {"job": _job(key, {"v": str(value)})}
        if enforce is not None:
            args["enforce_index"] = enforce
        try:
            client.call("job.register", args)
        except (RPCError, OSError) as err:
            if enforce is not None and isinstance(err, RPCError) and err.code == CONFLICT:
                lane.complete("ok", False, key)
                return
            lane.complete(classify(err), {"error": error_text(err)}, key)
            return
        lane.complete("ok", True if enforce is not None else None, key)

    def step(self, lane: Lane, client: RPCClient, rng: random.Random) -> None:
        assert self.ctx is not None
        key = self.pool.pick(rng)
        roll = rng.random()
        if roll < 0.5:
            self._read(lane, client, key)
        elif roll < 0.75:
            value = self.ctx.unique()
            lane.invoke({"f": "write", "value": value}, key)
            self._register(lane, client, key, value, None)
        else:
            answered, current, index = self._read(lane, client, key)
            if not answered:
                return
            value = self.ctx.unique()
            lane.invoke({"f": "cas", "from": current, "to": value}, key)
            self._register(lane, client, key, value, index)


def set_job_id(element: int) -> str:
    return f"set{element % SET_BUCKETS:x}-{element}"


def set_element(job_id: str) -> int | None:
    head, sep, tail = job_id.partition("-")
    if not sep or not head.startswith("set") or not tail.isdigit():
        return None
    return int(tail)


class SetWorkload(Workload):
    name = "set"
    model = "set"

    def __init__(self, lanes: int = 2, read_fraction: float = 0.02) -> None:
        super().__init__(lanes)
        self.read_fraction = read_fraction
        self.ctx: RunContext | None = None

    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        self.ctx = ctx
        super().run_lane(lane, ctx, rng)

    def read_all(self, client: RPCClient) -> list[int]:
        """Every element, bucket by bucket (each bucket read is linearizable)."""
        found: set[int] = set()
        for bucket in range(SET_BUCKETS):
            rows = client.list_all("job.list", {"prefix": f"set{bucket:x}-"})
            for row in rows:
                element = set_element(row["ID"])
                if element is not None:
                    found.add(element)
        return sorted(found)

    def _read(self, lane: Lane, client: RPCClient, final: bool = False) -> bool:
        lane.invoke({"f": "read", "final": True} if final else {"f": "read"})
        try:
            elements = self.read_all(client)
        except (RPCError, OSError) as err:
            lane.complete("fail", {"error": error_text(err)})
            return False
        lane.complete("ok", elements)
        return True

    def step(self, lane: Lane, client: RPCClient, rng: random.Random) -> None:
        assert self.ctx is not None
        if rng.random() < self.read_fraction:
            self._read(lane, client)
            return
        element = self.ctx.unique()
        lane.invoke({"f": "add", "value": element})
        try:
            client.call("job.register", {"job": _job(set_job_id(element), {})})
        except (RPCError, OSError) as err:
            lane.complete(classify(err), {"error": error_text(err)})
            return
        lane.complete("ok")

    def final(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        rng = random.Random(0)
        with ctx.client(rng) as client:
            while time.monotonic() < deadline:
                if self._read(lane, client, final=True):
                    return
                ctx.stop.wait(0.5)  # the cluster is recovering: retry until the deadline


def _missing_method(client: RPCClient, method: str, args: dict[str, Any] | None = None) -> bool:
    """True only for an explicit ``unknown_method``; any other answer means it exists."""
    try:
        client.call(method, args or {}, timeout=5.0)
    except RPCError as err:
        return err.code == UNKNOWN_METHOD
    return False


#: Fast garbage collection for lifecycle runs (Nomad's defaults are minutes to hours).
LIFECYCLE_GC_CONFIG = """
[gc]
eval_interval = "2s"
eval_threshold = "3s"
batch_eval_threshold = "3s"
job_interval = "2s"
job_threshold = "3s"
deployment_interval = "2s"
deployment_threshold = "3s"

# Heartbeats as short as before TTLs grew with the cluster (10-20 s with
# jitter at 10 s minimum, plus a 5-minute hold after an election): the
# client-kill fault expects a dead client's nodes down within 30 s, even
# right after the kill fault moved leadership.
[scheduler]
min_heartbeat_ttl = "5s"
failover_heartbeat_ttl = "10s"
"""


def _keep_job(
    job_id: str, count: int, release: int = 0, auto_promote: bool = True
) -> dict[str, Any]:
    """A service that runs until the end of the run; its rollouts finish within a second.

    Each ``release`` changes the task's config, so the allocs are replaced
    through one canary first (promoted by ``auto_promote`` or by the workload).
    One alloc in twenty never passes its health checks, so the client itself
    reports it unhealthy at ``HealthyDeadline``; its rollout then replaces
    nothing more and fails at its progress deadline, unless a newer version
    comes first.
    """
    spec = _job(job_id, {})
    update = {
        "MaxParallel": 1,
        "MinHealthyTime": 500_000_000,
        "HealthyDeadline": 3_000_000_000,
        "ProgressDeadline": 10_000_000_000,
        "Canary": 1,
        "AutoPromote": auto_promote,
    }
    # An alloc that crashes in a rollout is replaced within the run (Nomad's shortest delay).
    reschedule = {"Delay": 5_000_000_000, "DelayFunction": "constant", "Unlimited": True}
    # A node drain (the drain nemesis) moves them one at a time, each step once the last replacement is healthy.
    migrate = {"MaxParallel": 1, "MinHealthyTime": 500_000_000, "HealthyDeadline": 3_000_000_000}
    spec["TaskGroups"] = [
        {
            "Name": "g",
            "Count": count,
            "Update": update,
            "Migrate": migrate,
            "ReschedulePolicy": reschedule,
            "Tasks": [
                {
                    "Name": "t",
                    "Driver": "sim",
                    "Config": {"release": release, "unhealthy_rate": 0.05},
                    "Resources": {"CPU": 10, "MemoryMB": 10},
                }
            ],
        }
    ]
    return spec


class LifecycleWorkload(Workload):
    """Jobs run, finish and get collected by periodic and forced GC, under faults.

    Needs the scheduler, a simulated client (``caravan client sim``, started by
    the runner as one more process) and ``system.gc``. The servers get short
    GC intervals and thresholds (``LIFECYCLE_GC_CONFIG``). Actor lanes
    register batch jobs ``life-N`` that run 0.3-2 s and finish, service jobs
    ``keep-N`` that run until the end and are never stopped (but rescaled,
    so their rollouts move allocs in place, and released, so a canary goes
    first; their rollouts are promoted, paused and resumed, and their allocs
    sometimes reported unhealthy, so the rollout replaces them), stop some
    ``life`` jobs, read single jobs and force GC; an observer lane lists all
    of them twice a second. After healing, the final phase forces GC and
    records jobs, evaluations and allocations. ``checkers.check_gc``:
    a job that is running (``keep``) is never collected, a collected job
    never comes back, and no evaluation or allocation outlives its job.

    Its forced GC collects every dead job, including the set and register
    workloads' (count 0, dead once their evaluation completes), so it runs
    on its own (``RunOptions.validate``).
    """

    name = "lifecycle"
    model = "gc"
    server_config = LIFECYCLE_GC_CONFIG
    client_nodes = 3

    def __init__(self, lanes: int = 3, keep_jobs: int = 6) -> None:
        super().__init__(lanes)
        self.keep_jobs = keep_jobs
        self.ctx: RunContext | None = None
        self._lock = threading.Lock()
        self.registered: list[str] = []
        self.keep_ids: list[str] = []
        self.releases: dict[str, int] = {}  # keep job -> its task config's release number
        # keep job -> until when it is not rescaled: its rollout has time to replace an alloc
        # reported unhealthy (after the 5 s reschedule delay) before a newer version cancels it
        self.resting: dict[str, float] = {}
        self.keeps = 0

    def probe(self, client: RPCClient) -> str | None:
        if _missing_method(client, "system.gc", {"dry_run": True}):
            return "the servers have no system.gc RPC (leader garbage collection is not built); skipped"
        if _missing_method(client, "node.list"):
            return "the servers have no node.list RPC; skipped"
        return None

    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        self.ctx = ctx
        if lane.lane - self.first_lane == self.lanes - 1:  # the observer
            with ctx.client(rng) as client:
                while not ctx.stop.is_set():
                    self.observe(lane, client)
                    ctx.stop.wait(0.5)
            return
        super().run_lane(lane, ctx, rng)

    def _call(
        self,
        lane: Lane,
        client: RPCClient,
        value: dict[str, Any],
        method: str,
        args: dict[str, Any],
        shape: Callable[[Any], Any],
        read: bool = False,
    ) -> Any:
        lane.invoke(value)
        try:
            result = client.call(method, args)
        except (RPCError, OSError) as err:
            if read and isinstance(err, RPCError) and err.code == NOT_FOUND:
                lane.complete("ok", None)
                return None
            lane.complete("fail" if read else classify(err), {"error": error_text(err)})
            return None
        out = shape(result)
        lane.complete("ok", out)
        return out

    def observe(self, lane: Lane, client: RPCClient) -> None:
        def shape(rows: list[dict[str, Any]]) -> dict[str, Any]:
            return {j["ID"]: j["Status"] + ("/stop" if j.get("Stop") else "") for j in rows}

        jobs: dict[str, Any] = {}
        lane.invoke({"f": "list"})
        try:
            for prefix in ("life-", "keep-"):
                jobs.update(shape(client.list_all("job.list", {"prefix": prefix})))
        except (RPCError, OSError) as err:
            lane.complete("fail", {"error": error_text(err)})
            return
        lane.complete("ok", jobs)

    def step(self, lane: Lane, client: RPCClient, rng: random.Random) -> None:
        assert self.ctx is not None
        roll = rng.random()
        with self._lock:
            known = list(self.registered)
            keep_ids = list(self.keep_ids)
            want_keep = self.keeps < self.keep_jobs and roll < 0.1
            if want_keep:
                self.keeps += 1
        if want_keep:
            job_id = f"keep-{self.ctx.unique()}"
            self._call(
                lane,
                client,
                {"f": "run", "job": job_id, "kind": "keep"},
                "job.register",
                {"job": _keep_job(job_id, 1)},
                lambda r: None,
            )
            with self._lock:
                self.keep_ids.append(job_id)
        elif roll < 0.15 and keep_ids:
            # A running service scaled (its allocs move into the new version's
            # rollout in place, the client reports their health again) or
            # released (a canary first, then the rest replaced); a successful
            # rollout marks the version stable, all under the faults.
            job_id = rng.choice(keep_ids)
            count = rng.randint(1, 3)
            with self._lock:
                if self.resting.get(job_id, 0.0) > time.monotonic():
                    return
                if rng.random() < 0.3:
                    self.releases[job_id] = self.releases.get(job_id, 0) + 1
                release = self.releases.get(job_id, 0)
            spec = _keep_job(job_id, count, release, auto_promote=rng.random() < 0.5)
            self._call(
                lane,
                client,
                {"f": "scale", "job": job_id, "count": count, "release": release},
                "job.register",
                {"job": spec},
                lambda r: None,
            )
            return
        elif roll < 0.17 and keep_ids:
            self._hold_or_resume(lane, client, rng.choice(keep_ids))
            return
        elif roll < 0.18 and keep_ids:
            self._sicken(lane, client, rng, rng.choice(keep_ids))
            return
        elif roll < 0.7 or not known:
            job_id = f"life-{self.ctx.unique()}"
            run_for = f"{rng.randint(300, 2000)}ms"
            spec = _job(job_id, {})
            spec["Type"] = "batch"
            spec["TaskGroups"] = [
                {
                    "Name": "g",
                    "Count": rng.randint(1, 2),
                    "Tasks": [
                        {
                            "Name": "t",
                            "Driver": "sim",
                            "Config": {"run_for": run_for},
                            "Resources": {"CPU": 10, "MemoryMB": 10},
                        }
                    ],
                }
            ]
            self._call(
                lane,
                client,
                {"f": "run", "job": job_id, "kind": "batch"},
                "job.register",
                {"job": spec},
                lambda r: None,
            )
        elif roll < 0.8 and (stoppable := [j for j in known if j not in keep_ids]):
            # Only life jobs: keep jobs run to the end (and are rescaled, which
            # would register a stopped and collected one again).
            job_id = rng.choice(stoppable)
            self._call(
                lane,
                client,
                {"f": "stop", "job": job_id},
                "job.stop",
                {"job_id": job_id},
                lambda r: None,
            )
            return
        elif roll < 0.9:
            self._call(
                lane,
                client,
                {"f": "gc"},
                "system.gc",
                {},
                lambda r: {k: v for k, v in r.items() if isinstance(v, int)},
            )
            return
        else:
            job_id = rng.choice(known)
            self._call(
                lane,
                client,
                {"f": "get", "job": job_id},
                "job.get",
                {"job_id": job_id},
                lambda r: {
                    job_id: r["data"]["Status"] + ("/stop" if r["data"].get("Stop") else "")
                },
                read=True,
            )
            return
        with self._lock:
            self.registered.append(job_id)

    def _hold_or_resume(self, lane: Lane, client: RPCClient, job_id: str) -> None:
        """An operator promotes a keep job's canaries, pauses its running rollout, or resumes a paused one.

        A paused rollout places nothing more until it is resumed or the next
        rescale replaces (cancels) it; either way the job keeps running.
        """
        try:
            deployments = client.list_all("deployment.list", {"job_id": job_id})
        except (RPCError, OSError):
            return
        active = [d for d in deployments if d["Status"] in ("running", "paused")]
        if not active:
            return
        dep = max(active, key=lambda d: d["CreateIndex"])
        waiting = any(
            s.get("DesiredCanaries") and not s.get("Promoted")
            for s in (dep.get("TaskGroups") or {}).values()
        )
        if waiting and dep["Status"] == "running":  # refused while a canary is not yet healthy
            self._call(
                lane,
                client,
                {"f": "promote", "deployment": dep["ID"]},
                "deployment.promote",
                {"deployment_id": dep["ID"]},
                lambda r: None,
            )
            return
        pause = dep["Status"] == "running"
        self._call(
            lane,
            client,
            {"f": "pause" if pause else "resume", "deployment": dep["ID"]},
            "deployment.pause",
            {"deployment_id": dep["ID"], "pause": pause},
            lambda r: None,
        )

    def _sicken(self, lane: Lane, client: RPCClient, rng: random.Random, job_id: str) -> None:
        """A health check fails: a running alloc of a keep job's active rollout is reported unhealthy.

        As in Nomad the alloc keeps running and is not replaced; its rollout
        replaces nothing more and fails at its progress deadline. The job is
        not rescaled meanwhile, so the deadline is reached.
        """
        try:
            deployments = client.list_all("deployment.list", {"job_id": job_id})
            allocs = client.list_all("alloc.list", {"job_id": job_id})
        except (RPCError, OSError):
            return
        active = {d["ID"] for d in deployments if d["Status"] in ("running", "paused")}
        running = [
            a
            for a in allocs
            if a["ClientStatus"] == "running"
            and a["DesiredStatus"] == "run"
            and a["DeploymentID"] in active
        ]
        if not running:
            return
        alloc = rng.choice(sorted(running, key=lambda a: a["ID"]))
        with self._lock:
            self.resting[job_id] = time.monotonic() + 15.0
        health = {"Healthy": False, "Timestamp": time.time_ns()}
        self._call(
            lane,
            client,
            {"f": "sicken", "job": job_id, "alloc": alloc["ID"]},
            "alloc.update",
            {
                "allocs": [
                    {"ID": alloc["ID"], "ClientStatus": "running", "DeploymentStatus": health}
                ]
            },
            lambda r: None,
        )

    def final(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        """Force GC until it finds nothing more, then record jobs, evals and allocs."""
        rng = random.Random(1)
        with ctx.client(rng) as client:
            for _ in range(3):
                self._call(
                    lane,
                    client,
                    {"f": "gc"},
                    "system.gc",
                    {},
                    lambda r: {k: v for k, v in r.items() if isinstance(v, int)},
                )
                ctx.stop.wait(1.0)  # let reaps of the previous pass settle before the next
            while time.monotonic() < deadline:
                lane.invoke({"f": "final"})
                try:
                    jobs = {
                        j["ID"]: j["Status"] + ("/stop" if j.get("Stop") else "")
                        for prefix in ("life-", "keep-")
                        for j in client.list_all("job.list", {"prefix": prefix})
                    }
                    evals = [
                        [e["ID"], e["JobID"], e["Status"]] for e in client.list_all("eval.list", {})
                    ]
                    allocs = [
                        [
                            a["ID"],
                            a["JobID"],
                            a["ClientStatus"],
                            a.get("NodeID", ""),
                            a.get("DesiredStatus", ""),
                        ]
                        for a in client.list_all("alloc.list", {})
                    ]
                    nodes = {n["ID"]: n.get("Status", "") for n in client.list_all("node.list", {})}
                except (RPCError, OSError) as err:
                    lane.complete("fail", {"error": error_text(err)})
                    ctx.stop.wait(0.5)
                    continue
                lane.complete(
                    "ok", {"jobs": jobs, "evals": evals, "allocs": allocs, "nodes": nodes}
                )
                return


JOURNAL_FILE = "journal.jsonl"


def _stream_batches(item: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The batches in one ``event.stream`` item ([] for a bare progress item; None for an unknown shape)."""
    if "packed" in item:  # a run of batches packed once by the server for all its subscribers
        unpacked = msgpack.unpackb(item["packed"], raw=False)
        return list(unpacked) if isinstance(unpacked, list) else None
    if "batches" in item:
        return list(item["batches"])
    if "index" in item:
        return [item]
    if "progress" in item:
        return []
    return None


class JournalWorkload(Workload):
    """A change-journal subscriber on every server, resuming across every fault.

    Lane *i* follows server *i* with ``event.stream`` (all topics, batches as
    raw msgpack so nothing is decoded, grouped). Every batch is recorded as
    (server, index, hash of its bytes); every break and resubscription too.
    A break (the server was killed, paused, restarted) is followed by a
    resubscription to the same server from the last index received, or the
    last progress bookmark, until the run's final phase has seen every
    subscriber reach the cluster's applied index. ``checkers.check_journal``
    then demands: strictly increasing indexes per subscriber (ordered, no
    duplicate, no batch split), no gaps (a batch any server delivered inside
    a subscriber's span is delivered to it too), identical bytes for one
    index on every server.
    """

    name = "journal"
    model = "journal"
    runs_past_stop = True

    def __init__(self, lanes: int = 3, heartbeat: float = 1.0, group: int = 64) -> None:
        super().__init__(lanes)
        self.heartbeat = heartbeat
        self.group = group
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._fp: Any = None
        self.last: dict[str, int] = {}

    def configure(self, servers: int) -> None:
        self.lanes = servers

    def probe(self, client: RPCClient) -> str | None:
        if _missing_method(client, "event.stream"):
            return "the servers have no event.stream RPC (the change journal is not built); skipped"
        return None

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._fp.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._fp.flush()

    def run_lane(self, lane: Lane, ctx: RunContext, rng: random.Random) -> None:
        with self._lock:
            if self._fp is None:
                self._fp = open(Path(ctx.out) / JOURNAL_FILE, "a", encoding="utf-8")  # noqa: SIM115
        slot = lane.lane - self.first_lane
        server, address = ctx.servers[slot], ctx.addresses[slot]
        last = 0
        self.last[server] = 0
        client = RPCClient([address], timeout=ctx.op_timeout)
        while not self.done.is_set():
            if ctx.servers[slot] != server:  # the member nemesis put a new server in this place
                client.close()
                server, last, client = self._follow(ctx, slot, server, last)
            self._write(
                {"t": ctx.clock.now(), "server": server, "kind": "subscribe", "index": last}
            )
            try:
                for item in client.stream(
                    "event.stream",
                    {
                        "index": last,
                        "heartbeat": self.heartbeat,
                        "encoding": "msgpack",
                        "group": self.group,
                    },
                    idle_timeout=3 * self.heartbeat + 2,
                ):
                    last = self._take(item, server, ctx.clock.now(), last)
                    if self.done.is_set():
                        break
            except (RPCError, OSError) as err:
                last = self._broke(err, server, ctx.clock.now(), last)
            if not self.done.is_set():
                self.done.wait(0.2)  # back off before resubscribing to a server that is down
        self._write({"t": ctx.clock.now(), "server": server, "kind": "end", "index": last})

    def _take(self, item: dict[str, Any], server: str, now: float, last: int) -> int:
        """Record one stream item's batches and progress; returns the subscriber's new position."""
        batches = _stream_batches(item)
        if batches is None:  # a shape this harness does not know: say so, never skip silently
            keys = sorted(map(str, item))
            self._write({"t": now, "server": server, "kind": "unknown_item", "keys": keys})
            return last
        for batch in batches:
            raw = batch.get("raw") or b""
            index = int(batch["index"])
            digest = hashlib.blake2b(raw, digest_size=12).hexdigest()
            record = {"t": now, "server": server, "kind": "batch", "index": index}
            self._write(record | {"hash": digest, "size": len(raw)})
            last = max(last, index)
        if "progress" in item:
            last = max(last, int(item["progress"]))
            record = {"t": now, "server": server, "kind": "progress"}
            self._write(record | {"index": int(item["progress"])})
        self.last[server] = last
        return last

    def _broke(self, err: Exception, server: str, now: float, last: int) -> int:
        """Record a broken subscription (a reset when the server compacted past us); where to resubscribe."""
        record: dict[str, Any] = {
            "t": now,
            "server": server,
            "kind": "break",
            "error": error_text(err),
        }
        if isinstance(err, RPCError):
            if err.code == "reset_required":
                record["kind"] = "reset"
                record["oldest_index"] = err.details.get("oldest_index")
                last = int(err.details.get("oldest_index") or last)
            resume = err.details.get("resume_index")
            if isinstance(resume, int):
                last = max(last, resume)
        self._write(record)
        return last

    def _follow(
        self, ctx: RunContext, slot: int, old: str, last: int
    ) -> tuple[str, int, RPCClient]:
        """Subscribe to the server that took ``old``'s place, from index 0; ``old`` is retired from the check.

        From 0, not from where ``old`` got: the checker compares each
        server's whole journal, and a new server's starts where it caught up
        (a snapshot install answers ``reset_required``, which it excuses).
        """
        self._write({"t": ctx.clock.now(), "server": old, "kind": "retired", "index": last})
        server = ctx.servers[slot]
        self.last.pop(old, None)
        self.last[server] = 0
        return server, 0, RPCClient([ctx.addresses[slot]], timeout=ctx.op_timeout)

    def final(self, lane: Lane, ctx: RunContext, deadline: float) -> None:
        """Let every subscriber reach the index the cluster has applied, then stop them."""
        target = 0
        for address in ctx.addresses:
            try:
                with RPCClient([address], timeout=5.0) as client:
                    target = max(target, int(client.call("debug.digest", {"stale": True})["index"]))
            except (RPCError, OSError):
                continue
        while time.monotonic() < deadline:
            if self.last and all(v >= target for v in list(self.last.values())):
                break
            ctx.stop.wait(0.2)  # polling the subscribers' progress with a deadline
        self._write({"t": ctx.clock.now(), "server": "*", "kind": "target", "index": target})
        self.done.set()

    def close(self) -> None:
        with self._lock:
            if self._fp is not None:
                self._fp.close()


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "register": RegisterWorkload,
    "set": SetWorkload,
    "lifecycle": LifecycleWorkload,
    "journal": JournalWorkload,
}
