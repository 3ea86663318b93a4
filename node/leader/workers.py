"""Scheduler workers: leader loops that turn evaluations into committed plans.

Each worker dequeues an eval from the broker, reads one consistent snapshot
(a single LMDB read transaction, with its own journal-driven usage cache
caught up to exactly that index), runs the scheduler off the event loop, and
hands the plan to the plan applier in this process (no RPC hop: the workers
run on the leader, as Nomad's do). A plan the applier only partly accepts
is planned again on newer state, up to ``MAX_ATTEMPTS`` times; then the eval
is nacked and redelivered later. The eval is acked only after its plan —
with the eval's own new status — is in the log, so a leader that dies
mid-way leaves the eval pending for the next leader (at-least-once).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm.caches import NodeUsageCache
from fsm.store import StateReader
from fsm.structs import EVAL_TERMINAL, Evaluation
from node.leader.broker import BrokerError, EvalBroker
from node.leader.plan_apply import PlanApplier, PlanResult
from node.leader.shims import StateReads
from node.wire.errors import NO_LEADER, NOT_LEADER, RPCError
from scheduler.errors import SchedulerError
from scheduler.generic import schedule
from scheduler.plan import Plan
from scheduler.state import load_snapshot

if TYPE_CHECKING:
    from node.leader.broker import BlockedEvals

MAX_ATTEMPTS = 5
SETTLE_WAIT = 10.0  # longest wait, after a rejection, for the plans that were committing
LATENCY_SAMPLES = 20_000
# Protean: while plans conflict, pick at random among the best few nodes.
CONFLICT_WINDOW = 10.0  # seconds a conflict counts as recent
CONFLICT_TOP_K = 4
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
    latencies: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    plan_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    commit_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))

    def percentile(self, q: float, samples: collections.deque[float] | None = None) -> float:
        samples = self.latencies if samples is None else samples
        if not samples:
            return 0.0
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def reset(self) -> None:
        self.evals = self.skipped = self.nacked = self.placements = self.plan_conflicts = 0
        self.latencies.clear()
        self.plan_seconds.clear()
        self.commit_seconds.clear()

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
            "CommitMsP50": round(self.percentile(0.5, self.commit_seconds) * 1000, 2),
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
    ) -> None:
        self.state = state
        self.broker = broker
        self.blocked = blocked
        self.applier = applier
        self.stats = stats
        self.cache = NodeUsageCache()
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

    def plan(self, reader: StateReader, ev: Evaluation) -> Plan | None:
        """Schedule ``ev`` on one snapshot; None when the eval is already finished."""
        current = reader.eval(ev.id)
        if current is None or current.status in EVAL_TERMINAL:
            return None
        snap = load_snapshot(reader, current, time.time_ns(), self.cache)
        recent = time.monotonic() - self.stats.last_conflict < CONFLICT_WINDOW
        return schedule(snap, top_k=CONFLICT_TOP_K if recent else 1)

    async def process(self, ev: Evaluation) -> None:
        enqueued = self.broker.enqueued_at(ev.id)
        for _attempt in range(MAX_ATTEMPTS):
            started = time.monotonic()
            plan = await self.state.local(lambda r: self.plan(r, ev))
            if plan is None:
                self.stats.skipped += 1
                return
            if plan.blocked_eval_id:
                self.blocked.expect(plan.blocked_eval_id, plan.snapshot_index)
            planned = time.monotonic()
            result: PlanResult = await self.applier.submit(plan)
            self.stats.plan_seconds.append(planned - started)
            self.stats.commit_seconds.append(time.monotonic() - planned)
            self.stats.placements += result.placed
            if result.whole:
                self.stats.evals += 1
                if enqueued is not None:
                    self.stats.latencies.append(time.monotonic() - enqueued)
                return
            self.stats.plan_conflicts += 1
            self.stats.last_conflict = time.monotonic()
            await result.settled(SETTLE_WAIT)
        raise SchedulerError(f"evaluation {ev.id}: the plan was rejected {MAX_ATTEMPTS} times in a row")
