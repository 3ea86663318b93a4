"""Node drains: empty a node so it can be taken out of service (Nomad's node drainer).

An operator starts a drain with ``node.drain`` (``caravan node drain
--enable``): the FSM closes the node to new work and keeps the drain's
strategy on it. The drainer, a leader task, then moves the node's work away
in Nomad's order, by marking allocs for migration
(``desired_transition.migrate``, with an eval for each job in the same
entry); the scheduler stops each marked alloc and places its replacement
elsewhere:

- service allocs move in steps: a group keeps at least ``count -
  migrate.max_parallel`` allocs whose health is known (Nomad counts an
  alloc with any health report, healthy or not), so the next alloc is
  marked only once a replacement's health was reported;
- batch allocs are left to finish, until the deadline;
- at the deadline (``-deadline``; at once with ``-force``) everything left
  is marked, system allocs too unless the drain ignores them, and the drain
  is done (Nomad's handleDeadlinedNodes does not wait for them to stop).
  The deadline passes in the state's time or on the leader's own clock,
  whichever comes first (``Overdue``);
- once the client has stopped every service and batch alloc on the node,
  the drain is done: the drainer marks the node's system allocs (unless
  ignored) and ends the drain, as Nomad's (1.10) does. The node stays
  ineligible until the operator opens it again.

A drain that is disabled leaves marked allocs to the scheduler and the
rest where they are.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import (
    SECOND,
    Allocation,
    DesiredTransition,
    DrainStrategy,
    Evaluation,
    Job,
    MigrateStrategy,
    Node,
)
from node.core.wakeup import wait_event
from node.leader.nodeevals import TRIGGER_NODE_DRAIN
from node.leader.nodeviews import NodeViews
from node.leader.shims import NodeView, RaftApplier, StateReads
from node.wire.errors import CONFLICT, RPCError
from scheduler.evals import new_eval

WATCH_INTERVAL = 1.0  # seconds between passes while a node drains (state changes wake it sooner)
MAX_MARKS_PER_ENTRY = 500  # allocs marked in one raft entry


def migrate_of(job: Job, group_name: str) -> MigrateStrategy:
    """The group's migrate block, Nomad's defaults where it has none."""
    group = next((g for g in job.task_groups if g.name == group_name), None)
    if group is None or group.migrate is None:
        return MigrateStrategy()
    return group.migrate


@dataclass
class DrainPass:
    """What one look at the draining nodes decided."""

    marks: dict[str, list[str]] = field(default_factory=dict)  # job id -> alloc ids to migrate
    jobs: dict[str, Job] = field(default_factory=dict)  # the jobs of ``marks`` (for their evals)
    nodes: dict[str, str] = field(default_factory=dict)  # job id -> the draining node of its first mark
    done: list[tuple[str, int]] = field(default_factory=list)  # (node id, drain started_at)

    def evals(self) -> list[Evaluation]:
        """One eval per job with marked allocs: the scheduler moves them."""
        return [new_eval(self.jobs[j], TRIGGER_NODE_DRAIN, node_id=self.nodes[j]) for j in sorted(self.marks)]


def _on_client(reader: StateReader, node: Node) -> list[Allocation]:
    """Allocs the node's client still runs (those being stopped included)."""
    return [a for a in reader.allocs_by_node(node.id) if not a.client_terminal()]


class Overdue:
    """Drain deadlines counted on this leader's monotonic clock too: whichever passes first.

    The FSM stamps a drain's force deadline in the state's time, and that time
    stands still while a leader whose clock ran ahead has pinned it forward
    (it never goes back). A 5 s deadline then waited for the skew as well:
    campaign 601:3 (seed 601), a clock jumped 60 s ahead, a drain still short
    of its 5 s deadline 35 s later. So a deadline also passes once the drain
    (this start and this deadline) has been seen by this leader for as long
    as the deadline. Never sooner than asked: a leader sees a drain only after
    it began. A new leader counts from its own first sight.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._first: dict[tuple[str, int, int], float] = {}  # (node, start, deadline) -> first seen
        self._seen: set[tuple[str, int, int]] = set()

    def __call__(self, node_id: str, strategy: DrainStrategy) -> bool:
        if strategy.deadline <= 0:
            return False
        drain = (node_id, strategy.started_at, strategy.force_deadline)  # a changed deadline counts anew
        self._seen.add(drain)
        first = self._first.setdefault(drain, self.clock())
        return self.clock() - first >= strategy.deadline / SECOND

    def end_pass(self) -> None:
        """Forget the drains the last pass did not see (ended, or changed)."""
        self._first = {d: t for d, t in self._first.items() if d in self._seen}
        self._seen = set()


def look(reader: StateReader, now: int, overdue: Callable[[str, DrainStrategy], bool] | None = None) -> DrainPass:
    """Nomad's drainer decisions for every draining node, on one state (``overdue``: see ``Overdue``)."""
    out = DrainPass()
    nodes = [n for n in reader.nodes() if n.drain_strategy is not None]
    if not nodes:
        return out
    stepped: dict[str, list[Allocation]] = defaultdict(list)  # service job id -> its allocs to move in steps
    jobs: dict[str, Job | None] = {}

    def job_of(job_id: str) -> Job | None:
        if job_id not in jobs:
            jobs[job_id] = reader.job(job_id)
        return jobs[job_id]

    def mark(alloc: Allocation) -> None:
        job = job_of(alloc.job_id)
        if job is None:
            return  # purged: the scheduler stops what is left of it
        out.marks.setdefault(alloc.job_id, []).append(alloc.id)
        out.jobs[alloc.job_id] = job
        out.nodes.setdefault(alloc.job_id, alloc.node_id)

    for node in sorted(nodes, key=lambda n: n.id):
        strategy: DrainStrategy = node.drain_strategy  # type: ignore[assignment]
        forced = strategy.forced(now) or (overdue is not None and overdue(node.id, strategy))
        system, other = [], []
        for alloc in _on_client(reader, node):
            job = job_of(alloc.job_id)
            kind = job.type if job is not None else "service"
            if kind == "system":
                if not alloc.server_terminal():
                    system.append(alloc)
                continue
            other.append(alloc)  # the drain is not done until the client has stopped it
            if alloc.desired_transition.migrate or alloc.server_terminal():
                continue  # moving, or being stopped anyway
            if forced:
                mark(alloc)
            elif kind == "service":
                stepped[alloc.job_id].append(alloc)
            # batch: left to finish until the deadline
        # System allocs go at the deadline, or once the client runs nothing else: then the drain is done.
        if not strategy.ignore_system_jobs and (forced or not other):
            for alloc in system:
                if not alloc.desired_transition.migrate:
                    mark(alloc)
        if forced or not other:
            out.done.append((node.id, strategy.started_at))

    for job_id, candidates in sorted(stepped.items()):
        job = job_of(job_id)
        if job is None:
            continue
        for alloc in _next_steps(reader, job, candidates):
            mark(alloc)
    return out


def _next_steps(reader: StateReader, job: Job, candidates: list[Allocation]) -> list[Allocation]:
    """Which of a service job's allocs on draining nodes move now (Nomad's handleTaskGroup).

    Per group: as many as the allocs with a health report exceed ``count -
    max_parallel``. An alloc marked but not yet stopped by the scheduler is
    already moving, so it does not count (as since Nomad 1.11; before, one
    more than ``max_parallel`` could move while the scheduler had not acted).
    """
    by_group: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in candidates:
        by_group[alloc.task_group].append(alloc)
    counts = {g.name: g.count for g in job.task_groups}
    all_allocs = reader.allocs_by_job(job.id)
    out: list[Allocation] = []
    for group_name, drainable in sorted(by_group.items()):
        reported = sum(
            1
            for a in all_allocs
            if a.task_group == group_name
            and not a.terminal()
            and not a.desired_transition.migrate
            and a.deployment_status is not None
            and a.deployment_status.healthy is not None
        )
        threshold = counts.get(group_name, 0) - migrate_of(job, group_name).max_parallel
        n = min(len(drainable), reported - threshold)
        if n > 0:
            out += sorted(drainable, key=lambda a: (a.create_index, a.id))[:n]
    return out


# -- the leader task ---------------------------------------------------------------------------
class Drainer:
    """Runs ``look`` whenever a draining node or its allocs change, and at least every second."""

    def __init__(self, state: StateReads, raft: RaftApplier, nodes: Mapping[str, NodeView], *, log: Any) -> None:
        self.state = state
        self.raft = raft
        # The lifecycle's live view, kept current from the journal (a plain mapping is copied).
        self.nodes = NodeViews.of(nodes)
        self.poke = asyncio.Event()
        self.overdue = Overdue()
        self.log = log.bind(component="drainer")

    def draining(self) -> bool:
        """Whether any node drains: kept as views are written, not a scan of every node on each wake."""
        return bool(self.nodes.draining)

    async def run(self) -> None:
        while True:
            await wait_event(self.poke, WATCH_INTERVAL)
            self.poke.clear()
            if not self.draining():
                continue
            try:
                await self.once()
            except RPCError as exc:
                self.log.warning("drain step failed; retrying", error=str(exc))

    async def once(self) -> DrainPass:
        """One pass: mark what moves now, end the drains that are done."""

        now = self.state.state_now()
        found = await self.state.local(lambda r: look(r, now, self.overdue))
        self.overdue.end_pass()
        if found.marks:
            await self._mark(found)
        for node_id, started_at in found.done:
            try:
                await self.raft.propose(m.NodeUpdateDrain(node_id=node_id, done_started_at=started_at))
                self.log.info("node drain complete", node=node_id)
            except RPCError as exc:
                if exc.code != CONFLICT:
                    raise
                self.log.info("node drain changed meanwhile", node=node_id, error=str(exc))
        return found

    async def _mark(self, found: DrainPass) -> None:
        """Mark allocs for migration, with an eval per job, in entries of bounded size."""
        evals = {ev.job_id: ev for ev in found.evals()}
        batch: dict[str, DesiredTransition] = {}
        batch_evals: list[Evaluation] = []
        for job_id in sorted(found.marks):
            for alloc_id in found.marks[job_id]:
                batch[alloc_id] = DesiredTransition(migrate=True)
            batch_evals.append(evals[job_id])  # the broker cancels it if the job has one queued
            if len(batch) >= MAX_MARKS_PER_ENTRY:
                await self.raft.propose(m.AllocDesiredTransition(allocs=batch, evals=batch_evals))
                batch, batch_evals = {}, []
        if batch:
            await self.raft.propose(m.AllocDesiredTransition(allocs=batch, evals=batch_evals))
        self.log.info("allocs marked for migration", allocs=sum(len(v) for v in found.marks.values()),
                      jobs=len(found.marks))
