"""The plan applier: the leader's single writer of scheduler plans (Nomad's planApply).

Workers plan concurrently on snapshots that may already be stale; the
applier takes their plans one at a time and checks each against the newest
committed state before anything reaches the log (optimistic concurrency, as
Nomad's plan applier and Protean's replicated store do):

- every node that receives a new placement must still exist, be ready and
  eligible and not draining, and have room for everything the plan puts on
  it once the plan's own stops are taken off (usage from a journal-driven
  ``NodeUsageCache`` caught up to the same read);
- an in-place update must still find its alloc live and unchanged;
- a follow-up annotation must still find its alloc wanted.

Placements on a node that fails a check are rejected (all of that node's,
as Nomad does); the rest of the plan commits *without* the eval updates and
the worker plans the eval again on the newer state. A whole plan commits
with its evals in the last entry. Plans larger than one raft entry
(``max_entry_bytes``) are cut by ``scheduler.plan.to_entries``; all entries
but the last are proposed together, and the last (the one carrying the
evals) only once they all committed, so an eval is never marked done for a
plan that is not in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fsm.caches import NodeUsageCache
from fsm.messages import PlanApply
from fsm.store import StateReader
from fsm.structs import DESIRED_RUN, NODE_ELIGIBLE, NODE_READY, Allocation, Node, Resources
from node.core.writes import entry_size
from node.leader.shims import RaftApplier, StateReads
from scheduler.plan import Plan, logged_size, to_entries

if TYPE_CHECKING:
    pass


@dataclass
class PlanResult:
    index: int = 0  # raft index of the last committed entry (0: nothing written)
    whole: bool = True  # every placement accepted and the evals written
    placed: int = 0
    stopped: int = 0
    rejected: int = 0  # placements rejected
    rejected_nodes: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # node id -> why
    entries: int = 0
    # A rejected plan may have met the claims of plans still committing: their
    # ends, which the worker waits for before it plans again (Nomad's RefreshIndex).
    # Planned again at once, it would see the same state and be rejected again.
    after: list[asyncio.Event] = field(default_factory=list)

    async def settled(self, timeout: float) -> None:
        """Wait (bounded) until the plans committing when this one was checked have ended."""
        if self.after:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self.after)), timeout)


@dataclass
class ApplierStats:
    plans: int = 0
    partial: int = 0
    rejected_placements: int = 0
    entries: int = 0
    placed: int = 0


@dataclass(frozen=True)
class Claim:
    """What one proposed, not yet applied PlanApply entry will hold, per node.

    ``probe`` is an alloc the entry places: once it exists in a snapshot, the
    whole entry has been applied there (entries apply atomically) and its
    claim is already in the usage cache.
    """

    probe: str
    usage: dict[str, Resources]


def claims_of(body: PlanApply, inplace: set[str]) -> Claim | None:
    new = [a for a in body.allocs_to_place if a.id not in inplace]
    if not new:
        return None
    usage: dict[str, Resources] = {}
    for alloc in new:
        usage.setdefault(alloc.node_id, Resources.zero()).add(alloc.resources)
    return Claim(new[0].id, usage)


def pending_usage(reader: StateReader, claims: list[Claim]) -> dict[str, Resources]:
    """Per-node resources of in-flight entries that ``reader`` does not show yet."""
    out: dict[str, Resources] = {}
    for claim in claims:
        if reader.alloc(claim.probe) is not None:
            continue
        for node_id, r in claim.usage.items():
            out.setdefault(node_id, Resources.zero()).add(r)
    return out


def freed_usage(reader: StateReader, plan: Plan, nodes: Container[str]) -> dict[str, Resources]:
    """Per-node resources that ``plan``'s stops give back on ``nodes`` (where it also places)."""
    freed: dict[str, Resources] = {}
    for stop_id in {s.id for s in plan.stop if s.desired_status != DESIRED_RUN}:
        alloc = reader.alloc(stop_id)
        if alloc is None or alloc.terminal() or alloc.node_id not in nodes:
            continue
        freed.setdefault(alloc.node_id, Resources.zero()).add(alloc.resources)
    return freed


def node_refusal(node: Node | None, placing: bool) -> str | None:
    """Why a plan may not place on ``node`` whatever its resources, or None."""
    if node is None:
        return "node no longer exists"
    if placing and node.status != NODE_READY:
        return f"node is {node.status}"
    if placing and (node.drain or node.scheduling_eligibility != NODE_ELIGIBLE):
        return "node is draining or ineligible"
    return None


def usage_after(reader: StateReader, plan: Plan, allocs: list[Allocation], used: Resources) -> Resources | None:
    """``used`` once ``allocs`` are placed on their node; None if an in-place update went stale."""
    for alloc in allocs:
        if alloc.id not in plan.inplace:
            used.add(alloc.resources)
            continue
        current = reader.alloc(alloc.id)
        if current is None or current.terminal() or current.modify_index != alloc.modify_index:
            return None
        # The live copy's claim is already in ``used``; add only the difference.
        used.add(alloc.resources)
        used.subtract(current.resources)
    return used


def check_plan(
    reader: StateReader, plan: Plan, cache: NodeUsageCache, in_flight: list[Claim] | None = None
) -> tuple[Plan, dict[str, str]]:
    """(the part of ``plan`` that still fits, {rejected node: reason}) at ``reader``'s index.

    ``in_flight``: entries of earlier plans that were proposed but may not
    be applied yet; what they place counts as used.
    """
    cache.catch_up(reader)
    pending = pending_usage(reader, in_flight or [])
    rejected: dict[str, str] = {}
    by_node: dict[str, list[Allocation]] = {}
    for alloc in plan.place:
        by_node.setdefault(alloc.node_id, []).append(alloc)
    freed = freed_usage(reader, plan, by_node)
    for node_id, allocs in sorted(by_node.items()):
        node = reader.node(node_id)
        refusal = node_refusal(node, any(a.id not in plan.inplace for a in allocs))
        if refusal is not None:
            rejected[node_id] = refusal
            continue
        assert node is not None
        used = cache.usage(node_id)
        if node_id in pending:
            used.add(pending[node_id])
        if node_id in freed:
            used.subtract(freed[node_id])
        after = usage_after(reader, plan, allocs, used)
        if after is None:
            rejected[node_id] = "an in-place update found its allocation changed"
            continue
        dim = after.exhausted(node.resources)
        if dim is not None:
            rejected[node_id] = f"resources exhausted: {dim}"
    annotations_ok = True
    for stop in plan.stop:
        if stop.desired_status == DESIRED_RUN:
            current = reader.alloc(stop.id)
            if current is None or current.desired_status != DESIRED_RUN or current.next_allocation:
                annotations_ok = False
    if not rejected and annotations_ok:
        return plan, {}
    accepted = plan.without_nodes(rejected)
    if not annotations_ok:
        accepted.stop = [s for s in accepted.stop if s.desired_status != DESIRED_RUN]
        rejected.setdefault("", "a follow-up annotation found its allocation changed")
    return accepted, rejected


MAX_IN_FLIGHT = 4  # plans proposed and not yet committed while the next one is checked


class PlanApplier:
    """One per leadership term: a queue of plans, checked one at a time, committed pipelined.

    Like Nomad's plan applier, the next plan is checked while earlier ones
    are still committing: their placements count as used (``Claim``s) until
    the snapshot shows them, so pipelining never lets two plans overcommit a
    node. Entries of one plan are proposed in order; a later plan's entries
    may commit before an earlier plan's last (eval-carrying) entry, which is
    harmless — the last entry only writes evals.
    """

    def __init__(self, state: StateReads, raft: RaftApplier, *, max_entry_bytes: int, log: Any) -> None:
        self.state = state
        self.raft = raft
        self.max_entry_bytes = max_entry_bytes
        self.cache = NodeUsageCache()
        self.queue: asyncio.Queue[tuple[Plan, asyncio.Future[PlanResult]]] = asyncio.Queue()
        self.stats = ApplierStats()
        self.log = log.bind(component="plan_apply")
        self.in_flight: dict[int, list[Claim]] = {}
        self._ended: dict[int, asyncio.Event] = {}  # in-flight plan key -> set once it committed or failed
        self._seq = 0
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def submit(self, plan: Plan) -> PlanResult:
        """Queue ``plan`` and wait for its outcome (raises what proposing raised)."""
        future: asyncio.Future[PlanResult] = asyncio.get_running_loop().create_future()
        await self.queue.put((plan, future))
        return await future

    async def run(self) -> None:
        current: asyncio.Future[PlanResult] | None = None
        try:
            while True:
                plan, current = await self.queue.get()
                if current.cancelled():
                    continue
                await self._slots.acquire()
                try:
                    started = await self._start(plan, current)
                except Exception as exc:  # noqa: BLE001 - handed to the worker, which nacks
                    started = False
                    if not current.done():
                        current.set_exception(exc)
                if not started:
                    self._slots.release()
        finally:
            for task in list(self._tasks):
                task.cancel()
            # The plan being checked and those still queued will never
            # commit: their workers must not wait for them.
            if current is not None:
                current.cancel()
            while not self.queue.empty():
                _plan, future = self.queue.get_nowait()
                future.cancel()

    async def _start(self, plan: Plan, future: asyncio.Future[PlanResult]) -> bool:
        """Check ``plan`` and start committing what fits; False if nothing was proposed."""
        claims = [c for cs in self.in_flight.values() for c in cs]
        accepted, rejected = await self.state.local(lambda r: check_plan(r, plan, self.cache, claims))
        result = PlanResult(whole=not rejected)
        if rejected:
            result.after = [self._ended[k] for k in self.in_flight]
            result.rejected_nodes = sorted(n for n in rejected if n)
            result.reasons = dict(rejected)
            result.rejected = len(plan.place) - len(accepted.place)
            self.stats.partial += 1
            self.stats.rejected_placements += result.rejected
            self.log.info(
                "plan partly rejected; its eval is planned again",
                eval_id=plan.eval_id,
                rejected=result.rejected,
                nodes=len(result.rejected_nodes),
                why=sorted(set(rejected.values()))[:3],
            )
        self.stats.plans += 1
        if accepted.empty():
            future.set_result(result)
            return False
        bodies = to_entries(accepted, self.max_entry_bytes, entry_size, item_size=logged_size)
        self._seq += 1
        key = self._seq
        self.in_flight[key] = [c for c in (claims_of(b, accepted.inplace) for b in bodies) if c is not None]
        self._ended[key] = asyncio.Event()
        # Propose the head entries now, in order, before the next plan is checked.
        head = [asyncio.ensure_future(self.raft.propose(b)) for b in bodies[:-1]]
        task = asyncio.ensure_future(self._commit(key, accepted, bodies, head, result, future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.sleep(0)  # let the head proposals reach raft before the next plan's
        return True

    async def _commit(
        self,
        key: int,
        accepted: Plan,
        bodies: list[PlanApply],
        head: list[asyncio.Future[dict[str, Any]]],
        result: PlanResult,
        future: asyncio.Future[PlanResult],
    ) -> None:
        try:
            for outcome in await asyncio.gather(*head, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
                result.index = max(result.index, outcome["index"])
            out = await self.raft.propose(bodies[-1])
            result.index = max(result.index, out["index"])
            result.entries = len(bodies)
            result.placed = len(accepted.new_placements)
            result.stopped = len(accepted.stop)
            self.stats.entries += len(bodies)
            self.stats.placed += result.placed
            if not future.done():
                future.set_result(result)
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the worker, which nacks
            if not future.done():
                future.set_exception(exc)
        finally:
            self.in_flight.pop(key, None)
            self._ended.pop(key).set()
            self._slots.release()
