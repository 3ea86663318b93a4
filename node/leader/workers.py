"""Scheduler workers: leader loops that turn evaluations into committed plans.

Each worker dequeues an eval from the broker, reads one consistent snapshot
(a single LMDB read transaction, with the term's placement index —
``scheduler.index.PlacementIndex``, shared by the workers — caught up to
exactly that index), runs the scheduler off the event loop, and
hands the plan to the plan applier in this process (no RPC hop: the workers
run on the leader, as Nomad's do). A plan the applier only partly accepts
is planned again on newer state, up to ``MAX_ATTEMPTS`` times; then the eval
is nacked and redelivered later. The eval is acked only after its plan —
with the eval's own new status — is in the log, so a leader that dies
mid-way leaves the eval pending for the next leader (at-least-once).

Conflict-aware choice (Protean): the workers keep a decaying rate of the
plans the applier only partly accepted, over about the last
``CONFLICT_PLANS`` plans (and halving every ``CONFLICT_HALF_LIFE`` seconds
without plans). At a low rate a placement takes the single best node; as
the rate rises, a random one of the best N, N growing with the rate up to
the policy's ``top_k_max``, so that concurrent plans stop claiming the same
nodes.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm.store import StateReader
from fsm.structs import EVAL_TERMINAL, Evaluation
from node.leader.broker import BrokerError, EvalBroker
from node.leader.plan_apply import PlanApplier, PlanResult
from node.leader.shims import StateReads
from node.wire.errors import NO_LEADER, NOT_LEADER, RPCError
from scheduler.errors import SchedulerError
from scheduler.generic import schedule
from scheduler.index import PlacementIndex
from scheduler.plan import Plan
from scheduler.state import load_snapshot
from scheduler.traits import PlacementStats

if TYPE_CHECKING:
    from node.leader.broker import BlockedEvals

MAX_ATTEMPTS = 5
SETTLE_WAIT = 10.0  # longest wait, after a rejection, for the plans that were committing
LATENCY_SAMPLES = 20_000
# Protean: while plans conflict, pick at random among the best few nodes.
CONFLICT_PLANS = 20  # the conflict rate averages about this many recent plans
CONFLICT_HALF_LIFE = 10.0  # seconds without plans that halve it
CONFLICT_LOW = 0.05  # below this rate a placement takes the best node
CONFLICT_SATURATION = 0.3  # from this rate on it picks among the policy's top_k_max best
# A read older than the shared placement index is read again; after this many, without the index.
STALE_READS = 3
_STALE = object()
# After a failed eval a worker pauses before taking the next, doubling the
# pause while failures repeat (Nomad's worker backs off the same way): a
# fault that fails every eval, such as this server losing its leadership,
# then costs a few nacks instead of draining the broker in a burst.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0


@dataclass
class WorkerStats:
    """What the leader's workers did this term (``scheduler.stats``)."""

    evals: int = 0
    skipped: int = 0
    nacked: int = 0
    placements: int = 0
    plan_conflicts: int = 0  # plans the applier only partly accepted
    last_conflict: float = -1e9  # monotonic time of the last one
    conflict_rate: float = 0.0  # decaying share of recent plans that conflicted (see the module doc)
    rate_at: float = 0.0  # monotonic time ``conflict_rate`` was last moved
    last_top_k: int = 1
    placement: PlacementStats = field(default_factory=PlacementStats)
    latencies: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    plan_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    commit_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    # Per eval, dequeued to its plan committed (every attempt): what one placement takes, without the queue.
    dequeue_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    # Snapshot and schedule, per attempt, when every ranking was a cache hit and when one was built.
    plan_hit_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    plan_miss_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))

    def percentile(self, q: float, samples: collections.deque[float] | None = None) -> float:
        samples = self.latencies if samples is None else samples
        if not samples:
            return 0.0
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def record_plan(self, conflict: bool, now: float | None = None) -> None:
        """Move the conflict rate by one plan's outcome (an exponential average over ~CONFLICT_PLANS plans)."""
        now = time.monotonic() if now is None else now
        self.conflict_rate = self.rate(now) + (float(conflict) - self.rate(now)) * 2 / (CONFLICT_PLANS + 1)
        self.rate_at = now
        if conflict:
            self.plan_conflicts += 1
            self.last_conflict = now

    def rate(self, now: float | None = None) -> float:
        """The conflict rate now, halved for every CONFLICT_HALF_LIFE seconds since the last plan."""
        now = time.monotonic() if now is None else now
        return self.conflict_rate * 0.5 ** (max(0.0, now - self.rate_at) / CONFLICT_HALF_LIFE)

    def top_k(self, top_k_max: int, now: float | None = None) -> int:
        """How many of the best nodes a placement picks among: 1 at a low conflict rate, up to
        ``top_k_max`` from CONFLICT_SATURATION on, growing with the rate in between."""
        rate = self.rate(now)
        k = 1 if rate < CONFLICT_LOW else 1 + math.ceil((top_k_max - 1) * min(1.0, rate / CONFLICT_SATURATION))
        self.last_top_k = max(1, min(top_k_max, k))
        return self.last_top_k

    def reset(self) -> None:
        self.evals = self.skipped = self.nacked = self.placements = self.plan_conflicts = 0
        self.placement = PlacementStats()
        self.latencies.clear()
        for samples in (self.plan_seconds, self.commit_seconds, self.dequeue_seconds, self.plan_hit_seconds, self.plan_miss_seconds):
            samples.clear()

    def to_nomad(self) -> dict[str, Any]:
        return {
            "EvalsProcessed": self.evals,
            "EvalsSkipped": self.skipped,
            "EvalsNacked": self.nacked,
            "Placements": self.placements,
            "PlanConflicts": self.plan_conflicts,
            "EvalLatencyMs": {
                "Count": len(self.latencies),
                "P50": round(self.percentile(0.50) * 1000, 2),
                "P99": round(self.percentile(0.99) * 1000, 2),
                "Max": round(max(self.latencies, default=0.0) * 1000, 2),
            },
            # Where an eval's time goes: snapshot + scheduling, and plan check + commit.
            "PlanMsP50": round(self.percentile(0.5, self.plan_seconds) * 1000, 2),
            "PlanMsP99": round(self.percentile(0.99, self.plan_seconds) * 1000, 2),
            "CommitMsP50": round(self.percentile(0.5, self.commit_seconds) * 1000, 2),
            "DequeueToCommitMs": {
                "P50": round(self.percentile(0.50, self.dequeue_seconds) * 1000, 2),
                "P99": round(self.percentile(0.99, self.dequeue_seconds) * 1000, 2),
            },
            "ConflictRate": round(self.rate(), 4),
            "TopK": self.last_top_k,
            "Placement": {
                **_placement_stats(self.placement),
                "PlanMsOnHitP50": round(self.percentile(0.5, self.plan_hit_seconds) * 1000, 2),
                "PlanMsOnMissP50": round(self.percentile(0.5, self.plan_miss_seconds) * 1000, 2),
            },
        }


def _placement_stats(p: PlacementStats) -> dict[str, Any]:
    """Trait-cache figures per placement: hits and misses, and nodes scored on each."""
    return {
        "Placements": p.placements,
        "CacheHits": p.hits,
        "CacheMisses": p.misses,
        "HitRate": round(p.hits / p.placements, 4) if p.placements else 0.0,
        "RescoredOnHit": p.rescored_hit,
        "RescoredOnMiss": p.rescored_miss,
        "RescoredPerHit": round(p.rescored_hit / p.hits, 2) if p.hits else 0.0,
        "RescoredPerMiss": round(p.rescored_miss / p.misses, 2) if p.misses else 0.0,
    }


class Worker:
    def __init__(
        self,
        state: StateReads,
        broker: EvalBroker,
        blocked: BlockedEvals,
        applier: PlanApplier,
        stats: WorkerStats,
        name: str,
        log: Any,
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
        index: PlacementIndex | None = None,
    ) -> None:
        self.state = state
        self.broker = broker
        self.blocked = blocked
        self.applier = applier
        self.stats = stats
        # The term's index, shared with the other workers (a worker alone keeps its own).
        self.index = index if index is not None else PlacementIndex()
        self._missed = False  # whether the last plan built a ranking (a cache miss)
        self.log = log.bind(component="worker", worker=name)
        self._pause = pause
        self._failures = 0  # evals failed in a row

    async def run(self) -> None:
        while True:
            got = await self.broker.dequeue()
            if got is None:
                continue
            ev, token = got
            try:
                await self.process(ev)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the eval is redelivered
                self._nack(ev, token, exc)
                await self._pause(min(BACKOFF_FIRST * 2 ** (self._failures - 1), BACKOFF_MAX))
                continue
            self._failures = 0
            try:
                self.broker.ack(ev.id, token)
            except BrokerError as exc:
                self.log.warning("ack refused", eval_id=ev.id, error=str(exc))

    def _nack(self, ev: Evaluation, token: str, exc: Exception) -> None:
        """Hand the eval back for redelivery: lost leadership is logged once per run of failures, other errors each time."""
        self._failures += 1
        self.stats.nacked += 1
        if isinstance(exc, RPCError) and exc.code in (NOT_LEADER, NO_LEADER):
            # Leadership moved: this worker is about to be stopped, and the new
            # leader takes the eval over from the replicated state.
            if self._failures == 1:
                self.log.info("this server is no longer the leader; evaluation handed back", eval_id=ev.id, job_id=ev.job_id)
        else:
            self.log.warning("evaluation failed; nacking it", eval_id=ev.id, job_id=ev.job_id, error=str(exc), failures_in_a_row=self._failures)
        try:
            self.broker.nack(ev.id, token)
        except BrokerError:
            pass

    def plan(self, reader: StateReader, ev: Evaluation, use_index: bool = True) -> Plan | None | object:
        """Schedule ``ev`` on one snapshot; None when the eval is already finished, ``_STALE`` when
        ``reader`` is older than the shared index (read again: a new read is at least as new).

        The index's lock is held while the scheduler runs, so that no other
        worker moves the index past this read meanwhile.
        """
        current = reader.eval(ev.id)
        if current is None or current.status in EVAL_TERMINAL:
            return None
        if not use_index:
            snap = load_snapshot(reader, current, time.time_ns())
            plan = schedule(snap, top_k=self.stats.top_k(snap.policy.top_k_max))
        else:
            with self.index.lock:
                if not self.index.catch_up(reader):
                    return _STALE
                snap = load_snapshot(reader, current, time.time_ns(), index=self.index)
                plan = schedule(snap, top_k=self.stats.top_k(snap.policy.top_k_max))
        self.stats.placement.add(snap.stats)
        self._missed = snap.stats.misses > 0
        return plan

    async def _plan(self, ev: Evaluation) -> Plan | None:
        for attempt in range(STALE_READS + 1):
            use_index = attempt < STALE_READS
            plan = await self.state.local(lambda r, use_index=use_index: self.plan(r, ev, use_index))
            if plan is not _STALE:
                return plan  # type: ignore[return-value]
        raise AssertionError("unreachable: the last read does not use the index")

    async def process(self, ev: Evaluation) -> None:
        enqueued = self.broker.enqueued_at(ev.id)
        dequeued = time.monotonic()
        for _attempt in range(MAX_ATTEMPTS):
            started = time.monotonic()
            plan = await self._plan(ev)
            if plan is None:
                self.stats.skipped += 1
                return
            if plan.blocked_eval_id:
                self.blocked.expect(plan.blocked_eval_id, plan.snapshot_index)
            planned = time.monotonic()
            result: PlanResult = await self.applier.submit(plan)
            self.stats.plan_seconds.append(planned - started)
            (self.stats.plan_miss_seconds if self._missed else self.stats.plan_hit_seconds).append(planned - started)
            self.stats.commit_seconds.append(time.monotonic() - planned)
            self.stats.placements += result.placed
            self.stats.record_plan(conflict=not result.whole)
            if result.whole:
                self.stats.evals += 1
                if enqueued is not None:
                    self.stats.latencies.append(time.monotonic() - enqueued)
                self.stats.dequeue_seconds.append(time.monotonic() - dequeued)
                return
            await result.settled(SETTLE_WAIT)
        raise SchedulerError(f"evaluation {ev.id}: the plan was rejected {MAX_ATTEMPTS} times in a row")
