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

Throughput (issue 36): a worker does not wait for one plan's commit before
planning the next. It keeps up to ``PIPELINE_DEPTH`` evals between dequeue
and commit, and plans the evals that are ready together (up to
``PLAN_BATCH``) in one read: one executor hop and one index catch-up for
all of them. Each plan is made with what plans still committing or queued
at the applier place counted as used (``Snapshot.held``; the applier alone
decides what commits), as are the plans before it in its batch, so that
pipelined plans do not all pick the node the committed state shows as best.
The applier then checks the plans that queued together in one read and
commits them in one raft entry.

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
from node.leader.plan_apply import (
    Claim,
    PlanApplier,
    PlanResult,
    add_claim,
    pending_usage,
    plan_claim,
)
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
PIPELINE_DEPTH = 16  # evals a worker has between dequeue and commit while its plans commit cleanly
PIPELINE_RAMP = 8  # evals in a row that widen the pipeline by one (see Worker._depth)
MAX_HELD_NODES = 256  # nodes of plans still committing that a planning read counts as used, at most
PLAN_BATCH = 8  # evals ready together that a worker plans in one read
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
    # Raft index of each committed plan's last entry: plans sharing one were merged into one Batch entry.
    entry_indices: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))

    def plans_per_entry(self) -> float:
        """Plans committed per raft entry, over the recent plans (1.0: no merging)."""
        return len(self.entry_indices) / len(set(self.entry_indices)) if self.entry_indices else 0.0

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
        self.entry_indices.clear()
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
            "PlansPerEntry": round(self.plans_per_entry(), 2),
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


@dataclass
class Planned:
    """One eval's plan from a planning read: the plan (None: nothing to do), or why it failed."""

    plan: Plan | None
    missed: bool = False  # whether planning it built a trait ranking (a cache miss)
    error: Exception | None = None
    outcome: asyncio.Future[PlanResult] | None = None  # the applier's answer, once the plan is queued there
    queued_at: float = 0.0  # monotonic


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
        self.log = log.bind(component="worker", worker=name)
        self._pause = pause
        self._failures = 0  # evals failed in a row
        self._streak = 0  # evals that succeeded in a row this term

    async def run(self) -> None:
        """Take evals from the broker, up to ``_depth()`` of them between dequeue and commit at once.

        The evals ready together are planned in one read (``_plan_batch``),
        then each is submitted and waited for on its own task.
        """
        outstanding: set[asyncio.Task[None]] = set()
        try:
            while True:
                while len(outstanding) >= self._depth():
                    await asyncio.wait(outstanding, return_when=asyncio.FIRST_COMPLETED)
                got = await self.broker.dequeue()
                if got is None:
                    continue
                batch = [got]
                while len(outstanding) + len(batch) < self._depth() and len(batch) < PLAN_BATCH:
                    more = self.broker.try_dequeue()
                    if more is None:
                        break
                    batch.append(more)
                dequeued = time.monotonic()
                firsts = await self._plan_batch([ev for ev, _token in batch])
                for (ev, token), first in zip(batch, firsts, strict=True):
                    task = asyncio.create_task(self._handle(ev, token, first, dequeued))
                    outstanding.add(task)
                    task.add_done_callback(outstanding.discard)
        finally:
            for task in outstanding:
                task.cancel()
            await asyncio.gather(*outstanding, return_exceptions=True)

    def _depth(self) -> int:
        """How many evals this worker may have between dequeue and commit.

        Planning is serial (the applier's ``planning`` lock), but waiting for a
        commit need not be: while plans commit, the worker plans the next,
        so the applier has plans to group into one entry (without this,
        plans in flight were capped at the number of workers, and throughput
        at workers / commit latency). One at a time at the start of a term and
        after any failure, so that a fault such as lost leadership costs one
        eval, not a pipeline of them. It widens by one
        for every ``PIPELINE_RAMP`` evals that succeed in a row (a slow start,
        as TCP's): a short burst is planned much as one eval at a time was,
        and a sustained one reaches the full depth within a few hundred evals.
        """
        return min(PIPELINE_DEPTH, 1 + self._streak // PIPELINE_RAMP)

    async def _handle(self, ev: Evaluation, token: str, first: Planned | None = None, dequeued: float | None = None) -> None:
        """Process one dequeued eval, then ack it, or nack it and back off."""
        try:
            await self.process(ev, first, dequeued)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the eval is redelivered
            self._streak = 0
            self._nack(ev, token, exc)
            await self._pause(min(BACKOFF_FIRST * 2 ** (self._failures - 1), BACKOFF_MAX))
            return
        self._failures = 0
        self._streak += 1
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

    def plan(
        self, reader: StateReader, ev: Evaluation, use_index: bool = True, claims: list[Claim] | None = None
    ) -> Plan | None | object:
        """Schedule ``ev`` on one snapshot; None when the eval is already finished, ``_STALE`` when
        ``reader`` is older than the shared index (read again: a new read is at least as new)."""
        out = self.plan_batch(reader, [ev], use_index, claims)
        if out is _STALE:
            return _STALE
        planned = out[0]  # type: ignore[index]
        if planned.error is not None:
            raise planned.error
        return planned.plan

    def plan_batch(
        self, reader: StateReader, evs: list[Evaluation], use_index: bool = True, claims: list[Claim] | None = None
    ) -> list[Planned] | object:
        """Schedule each of ``evs`` at ``reader``'s index, in order; ``_STALE`` as ``plan``.

        The index's lock is held while the scheduler runs, so that no other
        worker moves the index past this read meanwhile. ``claims``: the
        applier's plans still committing; what ``reader`` does not show of
        them yet counts as used (``Snapshot.held``), and so does what the
        plans before each eval in ``evs`` place, so that pipelined plans do
        not all pick the node the newest committed state shows as best.
        """
        if not use_index:
            return self._schedule_all(reader, evs, list(claims or []), None)
        with self.index.lock:
            if not self.index.catch_up(reader):
                return _STALE
            return self._schedule_all(reader, evs, list(claims or []), self.index)

    def _schedule_all(self, reader: StateReader, evs: list[Evaluation], claims: list[Claim], index: PlacementIndex | None) -> list[Planned]:
        out = []
        # What the claims hold that the read does not show, probed once for the batch; each plan
        # made here then adds its own (the read cannot show it), as pending_usage would find.
        pending = pending_usage(reader, claims)
        for ev in evs:
            try:
                current = reader.eval(ev.id)
                if current is None or current.status in EVAL_TERMINAL:
                    out.append(Planned(None))
                    continue
                snap = load_snapshot(reader, current, time.time_ns(), index=index)
                # Holding costs a re-rank per node: past a few hundred nodes (large plans, which
                # spread anyway) it costs more than the conflicts it saves. Read only while this
                # eval is planned; the plan's own claim is added after it.
                snap.held = pending if len(pending) <= MAX_HELD_NODES else {}
                plan = schedule(snap, top_k=self.stats.top_k(snap.policy.top_k_max))
                if plan.failed and snap.held:
                    # Whether a placement fails is decided on committed state alone: plans
                    # still committing may yet fail, and an eval blocked for room they only
                    # claimed would wait for a capacity change that never comes. The
                    # applier then rejects this plan if they commit, and it is planned again.
                    snap = load_snapshot(reader, current, time.time_ns(), index=index)
                    plan = schedule(snap, top_k=self.stats.top_k(snap.policy.top_k_max))
            except Exception as exc:  # noqa: BLE001 - this eval fails alone; the others of the batch go on
                out.append(Planned(None, error=exc))
                continue
            self.stats.placement.add(snap.stats)
            out.append(Planned(plan, missed=snap.stats.misses > 0))
            claim = plan_claim(plan)
            if claim is not None:
                add_claim(pending, claim)
        return out

    async def _plan_batch(self, evs: list[Evaluation]) -> list[Planned]:
        """Plan ``evs`` in one read and queue the plans at the applier; timed per eval.

        Under the applier's planning lock, shared by the workers: the claims
        are taken and the plans queued with no other worker's read between,
        so every read sees the plans made before it.
        """
        started = time.monotonic()
        async with self.applier.planning:
            for attempt in range(STALE_READS + 1):
                use_index = attempt < STALE_READS
                claims = self.applier.claims(queued=True)  # taken on the loop, which alone changes them
                out = await self.state.local(lambda r, use_index=use_index, claims=claims: self.plan_batch(r, evs, use_index, claims))
                if out is not _STALE:
                    return self._queue_plans(out, time.monotonic() - started)  # type: ignore[arg-type]
        raise AssertionError("unreachable: the last read does not use the index")

    def _queue_plans(self, out: list[Planned], elapsed: float) -> list[Planned]:
        """Hand each plan to the applier (after telling the blocked evals what to expect)."""
        now = time.monotonic()
        for planned in out:
            self.stats.plan_seconds.append(elapsed)
            (self.stats.plan_miss_seconds if planned.missed else self.stats.plan_hit_seconds).append(elapsed)
            plan = planned.plan
            if plan is None or planned.error is not None:
                continue
            if plan.blocked_eval_id:
                self.blocked.expect(plan.blocked_eval_id, plan.snapshot_index)
            planned.outcome, planned.queued_at = self.applier.enqueue(plan), now
        return out

    async def process(self, ev: Evaluation, first: Planned | None = None, dequeued: float | None = None) -> None:
        """Plan ``ev`` (its first plan may come from a batch read) until the applier takes a plan whole."""
        enqueued = self.broker.enqueued_at(ev.id)
        dequeued = time.monotonic() if dequeued is None else dequeued
        for attempt in range(MAX_ATTEMPTS):
            planned = first if attempt == 0 and first is not None else (await self._plan_batch([ev]))[0]
            if planned.error is not None:
                raise planned.error
            if planned.outcome is None:
                self.stats.skipped += 1
                return
            result: PlanResult = await planned.outcome
            self.stats.commit_seconds.append(time.monotonic() - planned.queued_at)
            self.stats.placements += result.placed
            if result.index:
                self.stats.entry_indices.append(result.index)
            self.stats.record_plan(conflict=not result.whole)
            if result.whole:
                self.stats.evals += 1
                if enqueued is not None:
                    self.stats.latencies.append(time.monotonic() - enqueued)
                self.stats.dequeue_seconds.append(time.monotonic() - dequeued)
                return
            await result.settled(SETTLE_WAIT)
        raise SchedulerError(f"evaluation {ev.id}: the plan was rejected {MAX_ATTEMPTS} times in a row")
