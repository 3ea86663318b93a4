"""The job lifecycle on the leader: one object per leadership term that wires it together.

``lifecycle_loop`` (a leader loop) builds a ``Lifecycle`` when this server
wins leadership and drops it when leadership is lost: the eval broker and
the blocked-evals tracker (``node.leader.broker``), the plan applier
(``node.leader.plan_apply``), the scheduler workers (``node.leader.workers``), the
heartbeat monitor (``node.leader.heartbeat``) and the deployment watcher
(``node.leader.deployments``).

The broker learns of evaluations by following the change journal with a
``fsm.cursor.Cursor`` — the same way caches do — rather than from the
endpoints that write them, so every writer (job registration, plans, node
updates, the GC engineer's ``eval.update``, another leader's entries
replayed before this one took over) reaches it the same way:

- the first catch-up is a rebuild: the pending evals of the state go to the
  broker, the blocked ones to the tracker (and are re-checked once, since
  capacity may have changed while nobody watched), and jobs left without
  an eval after a failover (live allocs on a down node, failed allocs not
  yet handled) get one;
- then each batch: a pending eval is enqueued; a blocked eval is tracked;
  a complete eval that placed everything untracks its job's blocked eval;
  an alloc or node change that frees or adds capacity unblocks blocked
  evals; a failed alloc (or a finished service alloc) gets an eval for its
  job; a node that went down gets evals for the jobs on it (the drainer,
  ``node.leader.drainer``, makes a drain's as it marks allocs to move),
  a node that became usable gets evals for system jobs — each only if the
  job has no eval queued already (one that has not started will see the
  change anyway).

Writes of evals the leader makes on its own (canceled duplicates, failed
evals and their follow-ups, evals for failures) go through ``EvalWriter`` in
batched EvalUpsert entries.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm import codec
from fsm.cursor import Cursor, Record
from fsm.store import StateReader
from fsm.structs import (
    CLIENT_COMPLETE,
    CLIENT_FAILED,
    DESIRED_RUN,
    EVAL_BLOCKED,
    EVAL_CANCELED,
    EVAL_COMPLETE,
    EVAL_FAILED,
    EVAL_PENDING,
    NODE_DOWN,
    Evaluation,
    Job,
)
from fsm.topics import (
    TOPIC_ALLOC,
    TOPIC_DEPLOYMENT,
    TOPIC_EVAL,
    TOPIC_NODE,
    TOPIC_QUEUE,
    TOPIC_WORKLOAD,
)
from node.core.wakeup import wait_event
from node.core.writes import leader_entry_bytes
from node.leader.admission import Admitter
from node.leader.broker import BlockedEvals, EvalBroker
from node.leader.deployments import DeploymentWatcher
from node.leader.drainer import Drainer
from node.leader.evalwriter import EvalWriter
from node.leader.heartbeat import HeartbeatMonitor
from node.leader.nodeevals import node_down_evals, node_up_evals
from node.leader.nodeviews import NodeViews
from node.leader.placement import keep_fresh
from node.leader.plan_apply import PlanApplier
from node.leader.shims import NodeView
from node.leader.workers import Worker, WorkerStats
from node.wire.errors import RPCError
from scheduler.evals import new_eval
from scheduler.index import PlacementIndex

if TYPE_CHECKING:
    from node.core.api import ServerAPI

TOPICS = (TOPIC_EVAL, TOPIC_ALLOC, TOPIC_NODE, TOPIC_DEPLOYMENT, TOPIC_WORKLOAD, TOPIC_QUEUE)
TRIGGER_ALLOC_FAILURE = "alloc-failure"
TRIGGER_ALLOC_STOP = "alloc-stop"
TRIGGER_LEADER = "leader-recovery"
HOUSEKEEPING_INTERVAL = 0.2
TAIL_IDLE_WAKE = 1.0

_CURRENT: weakref.WeakKeyDictionary[Any, Lifecycle] = weakref.WeakKeyDictionary()


def current(server: ServerAPI) -> Lifecycle | None:
    """This server's lifecycle while it leads, else None."""
    return _CURRENT.get(server)


def _needs_rescheduling(client_status: str, next_allocation: str | None, followup_eval_id: str | None) -> bool:
    """A wanted alloc that failed, not yet replaced or waiting for a follow-up eval.

    Only failed allocs are rescheduled, as in Nomad: a running alloc whose
    checks fail stays, and its rollout's progress deadline decides.
    """
    return client_status == CLIENT_FAILED and not next_allocation and not followup_eval_id


def _evaluates(job: Job, trigger: str) -> bool:
    """Whether an alloc's end is worth an eval of its job.

    Not for a stopped job; not for a batch alloc that completed; and not for
    a failed system alloc: system groups have no reschedule policy, so Nomad
    leaves it failed until the next job or node change evaluates the job.
    """
    if job.stop:
        return False
    if trigger == TRIGGER_ALLOC_STOP and job.type == "batch":
        return False
    return not (trigger == TRIGGER_ALLOC_FAILURE and job.type == "system")


@dataclass
class Initial:
    """What a new leader reads once: the broker's and tracker's contents, and loose ends."""

    index: int
    pending: list[Evaluation] = field(default_factory=list)
    blocked: list[Evaluation] = field(default_factory=list)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    deployments: set[str] = field(default_factory=set)
    orphans: list[Evaluation] = field(
        default_factory=list
    )  # evals for jobs a dead leader left without one

    @classmethod
    def load(cls, reader: StateReader) -> Initial:
        init = cls(index=reader.applied_index)
        for status, out in ((EVAL_PENDING, init.pending), (EVAL_BLOCKED, init.blocked)):
            for eval_id in reader.eval_ids_by_status(status):
                ev = reader.eval(eval_id)
                if ev is not None:
                    out.append(ev)
        init.pending.sort(key=lambda e: e.create_index)
        for node in reader.nodes():
            init.nodes[node.id] = NodeView(node.status, node.scheduling_eligibility, node.drain)
        init.deployments = {d.id for d in reader.deployments() if d.active()}
        covered = {e.job_id for e in init.pending}
        needy: dict[str, str] = {}
        for alloc in reader.alloc_statuses():
            job_id = alloc.job_id
            if job_id in covered or job_id in needy or alloc.desired_status != DESIRED_RUN:
                continue
            status = alloc.client_status
            if _needs_rescheduling(status, alloc.next_allocation, alloc.followup_eval_id):
                needy[job_id] = TRIGGER_ALLOC_FAILURE
            elif status not in (CLIENT_FAILED, CLIENT_COMPLETE, "lost"):
                view = init.nodes.get(alloc.node_id)
                if view is None or view.status == NODE_DOWN:
                    needy[job_id] = "node-update"
        for job_id, trigger in sorted(needy.items()):
            job = reader.job(job_id)
            if job is not None and _evaluates(job, trigger):
                init.orphans.append(new_eval(job, trigger))
        return init


class Lifecycle:
    """One leadership term: follows the journal and runs the lifecycle's tasks."""

    def __init__(self, server: ServerAPI) -> None:
        cfg = server.config.scheduler
        self.server = server
        self.log = server.log.bind(component="lifecycle")
        self.broker = EvalBroker(
            delivery_limit=cfg.eval_delivery_limit,
            nack_timeout=cfg.eval_nack_timeout,
            nack_delay=cfg.eval_nack_delay,
            nack_delay_later=cfg.eval_nack_delay_later,
            state_clock=server.state_now,
        )
        self.blocked = BlockedEvals()
        entry_bytes = server.raft.max_entry_bytes
        # The leader's own bulk entries are cut smaller, so users' writes wait less behind them (node/core/writes.py).
        bulk_bytes = leader_entry_bytes(entry_bytes)
        self.applier = PlanApplier(server, server, max_entry_bytes=bulk_bytes, log=server.log)
        self.stats = WorkerStats()
        # Nodes, usage and trait rankings for the workers, from the journal (scheduler.index).
        self.placement = PlacementIndex()
        self.writer = EvalWriter(
            server,
            server,
            max_entry_bytes=bulk_bytes,
            followup_delay=cfg.failed_eval_followup,
            log=server.log,
        )
        # Keeps the draining and changed nodes as views are written, for the monitor and drainer (issue #36).
        self.nodes = NodeViews()
        self.active_deployments: set[str] = set()
        self.heartbeats = HeartbeatMonitor(
            server,
            server,
            server.heartbeats,
            self.nodes,
            config=cfg,
            is_leader=lambda: server.raft.is_leader,
            max_entry_bytes=entry_bytes,
            log=server.log,
            deliveries=self.broker,
        )
        self.deployments = DeploymentWatcher(
            server, server, self.active_deployments, self.broker, self.writer, log=server.log
        )
        self.drainer = Drainer(server, server, self.nodes, log=server.log)
        self.admitter = Admitter(server, server, max_entry_bytes=bulk_bytes, log=server.log)
        self.cursor = Cursor(self, TOPICS)
        self.started = time.monotonic()
        self._rebuilt: Initial | None = None
        self._batches: list[tuple[int, Sequence[Record]]] = []
        # Work the tail found that needs state reads (resolved after each catch-up).
        self._job_needs: dict[str, str] = {}  # job id -> trigger
        self._node_needs: dict[str, str] = {}  # node id -> "down" | "up"
        # Node id -> index of the journal batch that marked it down (see _uncovered).
        self._down_at: dict[str, int] = {}

    # -- Follower (called inside Cursor.catch_up, on an executor thread) ----------
    def rebuild(self, reader: StateReader) -> None:
        self._rebuilt = Initial.load(reader)
        self._batches = []

    def apply(self, index: int, records: Sequence[Record]) -> None:
        self._batches.append((index, records))

    # -- running ------------------------------------------------------------------
    async def run(self) -> None:
        _CURRENT[self.server] = self
        try:
            await self.follow()
            workers = [
                Worker(
                    self.server,
                    self.broker,
                    self.blocked,
                    self.applier,
                    self.stats,
                    f"w{i}",
                    self.log,
                    index=self.placement,
                )
                for i in range(self.server.config.scheduler.workers)
            ]
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._tail())
                tg.create_task(self.applier.run())
                tg.create_task(keep_fresh(self.server, self.placement, self.broker, self.log))
                for worker in workers:
                    tg.create_task(worker.run())
                tg.create_task(self._housekeeping())
                tg.create_task(self.heartbeats.run())
                tg.create_task(self.deployments.run())
                tg.create_task(self.drainer.run())
                tg.create_task(self.admitter.run())
        finally:
            self.broker.disable()
            # What the term built goes now, not with the collector's next full pass (see PlacementIndex.close).
            self.placement.close()
            if _CURRENT.get(self.server) is self:
                del _CURRENT[self.server]

    async def _tail(self) -> None:
        while True:
            event = self.server.commit_event()
            await self.follow()
            if event is None:
                await asyncio.sleep(0.05)
                continue
            await wait_event(event, TAIL_IDLE_WAKE)

    async def follow(self) -> None:
        """Catch up with the journal and act on what changed."""

        def step(reader: StateReader) -> tuple[Initial | None, list[tuple[int, Sequence[Record]]]]:
            self.cursor.catch_up(reader)
            rebuilt, batches = self._rebuilt, self._batches
            self._rebuilt, self._batches = None, []
            return rebuilt, batches

        rebuilt, batches = await self.server.local(step)
        if rebuilt is not None:
            await self._restore(rebuilt)
        for index, records in batches:
            self.dispatch(index, records)
        await self._resolve()

    async def _restore(self, init: Initial) -> None:
        for ev in init.pending:
            self.broker.enqueue(ev)
        for ev in init.blocked:
            for again in self.blocked.block(ev):
                self.broker.enqueue(again)
        for ev in self.blocked.capacity_changed(init.index):
            self.broker.enqueue(ev)
        self.heartbeats.covered.following_from(init.index)
        # Filled in place: the heartbeat monitor, drainer and deployment watcher hold these.
        self.nodes.clear()
        self.nodes.update(init.nodes)
        self.active_deployments.clear()
        self.active_deployments.update(init.deployments)
        self.deployments.poke.set()
        self.drainer.poke.set()
        orphans = [e for e in init.orphans if not self.broker.has_queued(e.namespace, e.job_id)]
        if orphans:
            for ev in orphans:
                ev.triggered_by = (
                    TRIGGER_LEADER if ev.triggered_by == "node-update" else ev.triggered_by
                )
            await self.writer.create(orphans)
        self.log.info(
            "lifecycle started",
            index=init.index,
            pending=len(init.pending),
            blocked=len(init.blocked),
            nodes=len(init.nodes),
            deployments=len(init.deployments),
            orphans=len(orphans),
        )

    def dispatch(self, index: int, records: Sequence[Record]) -> None:
        """Act on one journal batch (on the event loop; no state reads here)."""
        capacity = False
        for topic, _type, key, obj in records:
            if topic == TOPIC_EVAL:
                self._on_eval(key, obj)
            elif topic == TOPIC_ALLOC:
                if obj is None:
                    capacity = True
                    continue
                capacity |= self._on_alloc(obj, index)
            elif topic == TOPIC_NODE:
                capacity |= self._on_node(key, obj, index)
            elif topic == TOPIC_QUEUE or (topic == TOPIC_WORKLOAD and (obj is None or obj.get("state") != "admitted")):
                # A workload that waits, ends or goes may let another in; an admission (the
                # admitter's own, which goes again after a pass that moved) does not.
                self.admitter.poke.set()
            elif topic == TOPIC_DEPLOYMENT:
                if obj is not None and obj.get("status") in ("running", "paused"):
                    if key not in self.active_deployments:
                        # Started in this term: only progress from here on needs an eval.
                        self.deployments.seen.setdefault(key, 0)
                    self.active_deployments.add(key)
                else:
                    self.active_deployments.discard(key)
                self.deployments.poke.set()
        if capacity:
            for ev in self.blocked.capacity_changed(index):
                self.broker.enqueue(ev)

    def _on_eval(self, key: str, obj: dict[str, Any] | None) -> None:
        if obj is None:
            self.blocked.forget(key)
            return
        ev = codec.from_wire(Evaluation, obj)
        if ev.status == EVAL_PENDING:
            self.broker.enqueue(ev)
        elif ev.status == EVAL_BLOCKED:
            for again in self.blocked.block(ev):
                self.broker.enqueue(again)
        elif ev.status == EVAL_COMPLETE and not ev.failed_tg_allocs:
            stale = self.blocked.untrack(ev.namespace, ev.job_id, keep=ev.id)
            if stale is not None:
                asyncio.ensure_future(
                    self._finish(
                        [stale], EVAL_CANCELED, "canceled: a newer evaluation placed everything"
                    )
                )
        else:
            self.blocked.forget(ev.id)

    def _on_alloc(self, alloc: dict[str, Any], index: int) -> bool:
        """Returns whether the alloc freed capacity a placement can use; notes jobs that need an eval."""
        if alloc.get("deployment_id"):
            self.deployments.poke.set()
        view = self.nodes.get(alloc["node_id"])
        if view is not None and view.drain:
            self.drainer.poke.set()
        status = alloc["client_status"]
        desired = alloc["desired_status"]
        if desired == DESIRED_RUN and not alloc.get("next_allocation"):
            if _needs_rescheduling(status, alloc.get("next_allocation"), alloc.get("followup_eval_id")):
                self._job_needs.setdefault(alloc["job_id"], TRIGGER_ALLOC_FAILURE)
            elif status == CLIENT_COMPLETE:
                self._job_needs.setdefault(alloc["job_id"], TRIGGER_ALLOC_STOP)
        freed = desired != DESIRED_RUN or status in (CLIENT_FAILED, CLIENT_COMPLETE, "lost")
        if not freed:
            self.heartbeats.covered.live_alloc(alloc["node_id"], index)
        # Room freed on a node nothing can be placed on (down, draining, ineligible, gone) helps no
        # blocked eval: in a mass node-down every lost alloc would unblock them all, again and again.
        return freed and view is not None and view.usable

    def _on_node(self, node_id: str, obj: dict[str, Any] | None, index: int) -> bool:
        before = self.nodes.get(node_id)
        if obj is None:
            self.nodes.pop(node_id, None)
            self.heartbeats.covered.forget_node(node_id)
            return False
        view = NodeView(obj["status"], obj["scheduling_eligibility"], bool(obj.get("drain")))
        self.nodes[node_id] = view
        if view.status == NODE_DOWN and (before is None or before.status != NODE_DOWN):
            self._node_needs[node_id] = "down"
            self._down_at[node_id] = index
            return False
        if view.drain:
            self.drainer.poke.set()
        if view.usable and (before is None or not before.usable):
            self._node_needs[node_id] = "up"
            return True
        return False

    async def _resolve(self) -> None:
        """Turn what the tail noted into evals (reading state once for all of it)."""
        if not self._job_needs and not self._node_needs:
            return
        job_needs, self._job_needs = self._job_needs, {}
        node_needs, self._node_needs = self._node_needs, {}
        node_needs = self._uncovered(node_needs)
        if not job_needs and not node_needs:
            return

        def build(reader: StateReader) -> list[Evaluation]:
            out: list[Evaluation] = []
            for job_id, trigger in sorted(job_needs.items()):
                job = reader.job(job_id)
                if job is not None and _evaluates(job, trigger):
                    out.append(new_eval(job, trigger))
            for node_id, what in sorted(node_needs.items()):
                if what == "down":
                    out += node_down_evals(reader, node_id)
                else:
                    out += node_up_evals(reader, node_id)
            return out

        evals = await self.server.local(build)
        seen: set[str] = set()
        todo = []
        for ev in evals:
            if ev.job_id in seen or self.broker.has_queued(ev.namespace, ev.job_id):
                continue
            seen.add(ev.job_id)
            todo.append(ev)
        if todo:
            try:
                await self.writer.create(todo)
            except RPCError as exc:
                self.log.warning("could not create evaluations", error=str(exc), count=len(todo))

    def _uncovered(self, node_needs: dict[str, str]) -> dict[str, str]:
        """``node_needs`` less the down nodes whose mark-down entry already carried every eval they need.

        Reading each down node's allocs again (``node_down_evals``) only to
        find its jobs' evals queued was most of the tail's work after a
        storm. A node whose flagged entry is still being proposed waits for
        the next pass (its down record can reach the tail before the
        proposal's answer); one the monitor cannot vouch for is read as
        before (see ``nodeevals.CoveredDowns``).
        """
        covered = self.heartbeats.covered
        out: dict[str, str] = {}
        for node_id, what in node_needs.items():
            if what == "down":
                if covered.waiting(node_id):
                    self._node_needs.setdefault(node_id, what)
                    continue
                if covered.covered(node_id, self._down_at.pop(node_id, 0)):
                    continue
            out[node_id] = what
        return out

    async def _finish(self, evals: list[Evaluation], status: str, description: str) -> None:
        try:
            await self.writer.finish(evals, status, description)
        except RPCError as exc:
            self.log.warning("could not finish evaluations", error=str(exc), status=status)

    async def _housekeeping(self) -> None:
        """Write what the broker and tracker decided: failed and canceled evals."""
        limit = self.server.config.scheduler.eval_delivery_limit
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            self.broker.tick()
            failed = self.broker.take_failed()
            if failed:
                await self._finish(
                    failed, EVAL_FAILED, f"evaluation reached its delivery limit ({limit})"
                )
            canceled = self.broker.take_cancelable() + self.blocked.take_duplicates()
            if canceled:
                await self._finish(
                    canceled, EVAL_CANCELED, "canceled: a newer evaluation of the job supersedes it"
                )

    def status(self) -> dict[str, Any]:
        return {
            "Broker": {**self.broker.counts(), "Blocked": len(self.blocked)},
            "BrokerTotals": {
                "Enqueued": self.broker.stats.enqueued,
                "Delivered": self.broker.stats.delivered,
                "Acked": self.broker.stats.acked,
                "Nacked": self.broker.stats.nacked,
                "Failed": self.broker.stats.failed,
                "Canceled": self.broker.stats.canceled,
                "Unblocks": self.blocked.unblocks,
            },
            "Workers": self.stats.to_nomad(),
            "PlanApplier": {
                "Plans": self.applier.stats.plans,
                "PartialPlans": self.applier.stats.partial,
                "RejectedPlacements": self.applier.stats.rejected_placements,
                "Entries": self.applier.stats.entries,
                "Placed": self.applier.stats.placed,
            },
            "Nodes": len(self.nodes),
            "PlacementIndex": self.placement.status(),
            "ActiveDeployments": len(self.active_deployments),
            "LeaderSeconds": round(time.monotonic() - self.started, 3),
        }


async def lifecycle_loop(server: ServerAPI) -> None:
    """Leader loop: the whole lifecycle for as long as this server leads (unless turned off)."""
    if not server.config.scheduler.enabled:
        server.log.info("scheduler disabled by config ([scheduler] enabled = false)")
        return
    await Lifecycle(server).run()


LEADER_LOOPS = [lifecycle_loop]
