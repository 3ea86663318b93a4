"""The admission service: Kueue's scheduler loop, as a leader task.

Whenever a workload or a queue changes (the lifecycle pokes it from the
journal), it reads the queues and their lines at one index, runs admission
cycles (``scheduler.queueing.plan``), and commits what they decided as one
``QueueAdmission`` entry with an eval for each job it touched: an admitted
job's eval places it; an evicted job's eval stops its allocs. The FSM checks
each decision again as it applies it, so a decision taken on a state that
moved on (this leader lost its term mid-reclaim) is skipped, never
over-admitted; the next leader starts from the committed ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fsm import messages as m
from fsm.queues import Eviction
from fsm.store import StateReader
from node.core.wakeup import wait_event
from node.core.writes import entry_size
from node.leader.shims import RaftApplier, StateReads
from node.wire.errors import BAD_REQUEST, NOT_LEADER, RPCError
from scheduler.evals import new_eval
from scheduler.queueing import Decisions, Evicted, load_line, plan

TRIGGER_ADMITTED = "queue-admission"
TRIGGER_EVICTED = "queue-preemption"
IDLE_INTERVAL = 5.0  # seconds between passes when nothing pokes it (a safety net, not the driver)
MAX_ADMITS_PER_ENTRY = 128  # about 27 KB with their evals: well inside the default entry limit
ENTRY_MARGIN = 1024  # bytes kept free under the raft entry limit (the stamp, the pickle framing)
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def decide(
    reader: StateReader,
    *,
    max_admits: int = MAX_ADMITS_PER_ENTRY,
    max_entry_bytes: int = 48 * 1024,
    measure: Callable[[Any], int] = entry_size,
) -> m.QueueAdmission | None:
    """One pass: the cycles' decisions as an entry (with the evals they need) that fits the raft
    entry limit, or None if nothing moves."""
    if not reader.count("queues"):
        return None
    decisions = plan(load_line(reader), max_admits=max_admits)
    if not decisions:
        return None
    return fit(_entry(reader, decisions), max_entry_bytes - ENTRY_MARGIN, measure)


def fit(body: m.QueueAdmission, limit: int, measure: Callable[[Any], int] = entry_size) -> m.QueueAdmission:
    """``body`` cut from the tail (admissions first, then evictions) until it is at most ``limit``
    bytes, keeping only the evals of the decisions left. What is cut is decided again next pass;
    apply re-checks each decision, so an admission kept without the eviction it followed is
    skipped, never over-admitted."""
    while measure(body) > limit and (len(body.admits) + len(body.evictions)) > 1:
        if body.admits:
            body.admits = body.admits[: len(body.admits) // 2]
        else:
            body.evictions = body.evictions[: max(1, len(body.evictions) // 2)]
        kept = {a.job_id for a in body.admits} | {e.job_id for e in body.evictions}
        body.evals = [ev for ev in body.evals if ev.job_id in kept]
    return body


def _entry(reader: StateReader, decisions: Decisions) -> m.QueueAdmission:
    body = m.QueueAdmission(
        evictions=[m.Evict(job_id=e.victim.job_id, eviction=_eviction(e)) for e in decisions.evictions],
        admits=[m.Admit(job_id=w.job_id, create_index=w.create_index) for w in decisions.admits],
    )
    triggers = {e.victim.job_id: TRIGGER_EVICTED for e in decisions.evictions}
    triggers.update({w.job_id: TRIGGER_ADMITTED for w in decisions.admits})
    for job_id, trigger in triggers.items():
        job = reader.job(job_id)
        if job is not None:
            body.evals.append(new_eval(job, trigger))
    return body


def _eviction(e: Evicted) -> Eviction:
    return Eviction(reason=e.reason, message=e.message, preemptor=e.preemptor)


class Admitter:
    """Runs admission cycles while this server leads; ``poke`` wakes it."""

    def __init__(self, state: StateReads, raft: RaftApplier, *, max_entry_bytes: int, log: Any) -> None:
        self.state = state
        self.raft = raft
        self.log = log
        self.max_entry_bytes = max_entry_bytes
        self.max_admits = MAX_ADMITS_PER_ENTRY
        self.poke = asyncio.Event()
        self.poke.set()  # a new term starts with a pass: the last leader may have left work undone
        self.passes = 0

    async def run(self) -> None:
        failures = 0
        while True:
            await wait_event(self.poke, IDLE_INTERVAL)
            self.poke.clear()
            try:
                moved = await self.once()
            except RPCError as exc:
                if exc.code == NOT_LEADER:
                    return  # the term is over: the next leader's service takes it from the log
                if exc.code == BAD_REQUEST and self.max_admits > 1:
                    self.max_admits //= 2  # refused as a whole (too large): decide less at a time
                failures += 1
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1]
                if failures == 1 or failures % 20 == 0:
                    self.log.warning("queue admission failed; retrying", error=str(exc), attempts=failures, delay=delay)
                await asyncio.sleep(delay)
                self.poke.set()
                continue
            failures = 0
            if moved:
                self.poke.set()  # capped, or what it freed lets more in: go again at once

    async def once(self) -> bool:
        """One pass; whether it committed anything."""
        self.passes += 1
        body = await self.state.local(lambda r: decide(r, max_admits=self.max_admits, max_entry_bytes=self.max_entry_bytes))
        if body is None:
            return False
        result = await self.raft.propose(body)
        value = result.get("value") or {}
        if value.get("evicted"):
            self.log.info("queue evictions", jobs=value["evicted"])
        return bool(value.get("admitted") or value.get("evicted"))
