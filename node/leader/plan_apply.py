"""The plan applier: the leader's single writer of scheduler plans (Nomad's planApply).

Workers plan concurrently on snapshots that may already be stale; the
applier takes their plans in queue order and checks each against the newest
committed state, plus what the plans before it still committing claim,
before anything reaches the log (optimistic concurrency, as Nomad's plan
applier and Protean's replicated store do). Plans that queued together are
checked in one read and proposed together, so they share one raft entry
(``check_group``; the merged entry commits what the plans one by one would):

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


def claim_for(new: list[Allocation]) -> Claim | None:
    """What placing ``new`` uses on each node, as one claim (None for no placement)."""
    if not new:
        return None
    usage: dict[str, Resources] = {}
    for alloc in new:
        usage.setdefault(alloc.node_id, Resources.zero()).add(alloc.resources)
    return Claim(new[0].id, usage)


def claims_of(body: PlanApply, inplace: set[str]) -> Claim | None:
    return claim_for([a for a in body.allocs_to_place if a.id not in inplace])


def pending_usage(reader: StateReader, claims: list[Claim]) -> dict[str, Resources]:
    """Per-node resources of in-flight entries that ``reader`` does not show yet."""
    out: dict[str, Resources] = {}
    for claim in claims:
        if reader.alloc(claim.probe) is not None:
            continue
        add_claim(out, claim)
    return out


def add_claim(pending: dict[str, Resources], claim: Claim) -> None:
    """Count ``claim`` in ``pending`` (fresh ``Resources``: the claim's own are never changed).

    For the claim of a plan made or checked in the same read, which that
    read cannot show yet: adding it keeps ``pending`` equal to
    ``pending_usage`` over all the claims, without probing each one again.
    """
    for node_id, r in claim.usage.items():
        pending.setdefault(node_id, Resources.zero()).add(r)


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
    reader: StateReader,
    plan: Plan,
    cache: NodeUsageCache,
    in_flight: list[Claim] | None = None,
    *,
    pending: dict[str, Resources] | None = None,
) -> tuple[Plan, dict[str, str]]:
    """(the part of ``plan`` that still fits, {rejected node: reason}) at ``reader``'s index.

    ``in_flight``: entries of earlier plans that were proposed but may not
    be applied yet; what they place counts as used. ``pending``: instead,
    what they place that ``reader`` does not show yet, already summed
    (``pending_usage``; ``check_group`` keeps it for a whole group).
    """
    cache.catch_up(reader)
    if pending is None:
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


MAX_IN_FLIGHT = 64  # plans proposed and not yet committed while the next ones are checked
MAX_ENTRIES_IN_FLIGHT = 56  # no plan is checked while their entries reach this (four plans cut in 14)
MAX_GROUP = 32  # plans checked in one read and proposed together


def plan_claim(plan: Plan) -> Claim | None:
    """One claim for all of ``plan``'s new placements: what a plan checked or planned after it sees as used."""
    return claim_for(plan.new_placements)


def check_group(
    reader: StateReader, plans: list[Plan], cache: NodeUsageCache, in_flight: list[Claim] | None = None
) -> list[tuple[Plan, dict[str, str]]]:
    """``check_plan`` for each of ``plans`` in order, at one read.

    Each plan sees what the plans before it in the group accepted as used
    (a claim whose probe the read cannot show yet), so the group accepts
    exactly what checking and applying the plans one by one would. Why one
    read: the applier's check is serial, and one executor hop per plan was
    its throughput limit under load. An in-place update of an alloc that an
    earlier plan of the group also updates or stops is refused, as it would
    be once the earlier plan is applied (the broker's one eval per job makes
    this rare).
    """
    # The in-flight claims are probed once for the group; each accepted plan's claim is then added
    # (the read cannot show it: it is not even proposed yet).
    pending = pending_usage(reader, list(in_flight or []))
    touched: set[str] = set()
    out: list[tuple[Plan, dict[str, str]]] = []
    for plan in plans:
        stale = {a.node_id for a in plan.place if a.id in plan.inplace and a.id in touched}
        accepted, rejected = check_plan(reader, plan.without_nodes(stale) if stale else plan, cache, pending=pending)
        if stale:
            accepted.evals = []
            rejected.update(dict.fromkeys(stale, "an in-place update found its allocation changed"))
        out.append((accepted, rejected))
        claim = plan_claim(accepted)
        if claim is not None:
            add_claim(pending, claim)
        touched.update(a.id for a in accepted.place)
        touched.update(s.id for s in accepted.stop)
    return out


class PlanApplier:
    """One per leadership term: a queue of plans, checked in groups, committed pipelined.

    Like Nomad's plan applier, the next plans are checked while earlier ones
    are still committing: their placements count as used (``Claim``s) until
    the snapshot shows them, so pipelining never lets two plans overcommit a
    node. Plans that queued while the applier was busy are checked together
    in one read (``check_group``) and proposed in the same loop turn, so the
    write queue puts them in one Batch entry: one raft entry, commit wait
    and apply transaction per group, not per plan. Entries of one plan are
    proposed in order; a later plan's entries may commit before an earlier
    plan's last (eval-carrying) entry, which is harmless — the last entry
    only writes evals.
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
        # Submitted plans not checked yet -> what they place, taken once: every planning read asks (``claims``).
        self._queued: dict[asyncio.Future[PlanResult], Claim | None] = {}
        self._entries_in_flight = 0  # PlanApply entries proposed and not yet committed (see _next_group)
        self._room = asyncio.Event()  # set whenever entries in flight end
        # Held by the workers while they plan and queue their plans, so that each planning read
        # sees every plan made before it (``claims(queued=True)``) and plans for other nodes.
        self.planning = asyncio.Lock()

    def claims(self, queued: bool = False) -> list[Claim]:
        """What the plans proposed and not yet committed place; with ``queued``, also those not checked yet.

        The check counts only the former. The workers plan with both: a plan
        still in the queue is most likely accepted, and an eval planned
        without it would pick the node it fills.
        """
        out = [c for cs in self.in_flight.values() for c in cs]
        if queued:
            out += [claim for claim in self._queued.values() if claim is not None]
        return out

    def enqueue(self, plan: Plan) -> asyncio.Future[PlanResult]:
        """Queue ``plan`` now; its outcome comes on the future (cancel it to withdraw the plan)."""
        future: asyncio.Future[PlanResult] = asyncio.get_running_loop().create_future()
        self._queued[future] = plan_claim(plan)
        future.add_done_callback(self._forget)
        self.queue.put_nowait((plan, future))
        return future

    def _forget(self, future: asyncio.Future[PlanResult]) -> None:
        self._queued.pop(future, None)

    async def submit(self, plan: Plan) -> PlanResult:
        """Queue ``plan`` and wait for its outcome (raises what proposing raised)."""
        return await self.enqueue(plan)

    async def run(self) -> None:
        group: list[tuple[Plan, asyncio.Future[PlanResult]]] = []
        try:
            while True:
                group = await self._next_group()
                await self._start_group(group)
                group = []
        finally:
            for task in list(self._tasks):
                task.cancel()
            # The plans being checked and those still queued will never
            # commit: their workers must not wait for them.
            for _plan, future in group:
                future.cancel()
            while not self.queue.empty():
                _plan, future = self.queue.get_nowait()
                future.cancel()

    async def _next_group(self) -> list[tuple[Plan, asyncio.Future[PlanResult]]]:
        """The next plans to check, each holding an in-flight slot.

        A plan the applier waited for is checked alone, at once; plans that
        queued while it was busy go together, up to MAX_GROUP and the free slots.
        """
        group: list[tuple[Plan, asyncio.Future[PlanResult]]] = []
        waited = self.queue.empty()
        while not group:
            item = await self.queue.get()
            await self._slots.acquire()
            # Counting plans alone let large plans (a dozen entries each) put hundreds of
            # entries at raft, and each plan's last entry waited behind them all.
            while self._entries_in_flight >= MAX_ENTRIES_IN_FLIGHT:
                self._room.clear()
                await self._room.wait()
            if item[1].cancelled():
                self._slots.release()
                continue
            group.append(item)
        while not waited and len(group) < MAX_GROUP and not self.queue.empty() and not self._slots.locked():
            item = self.queue.get_nowait()
            if item[1].cancelled():
                continue
            await self._slots.acquire()
            group.append(item)
        return group

    async def _start_group(self, group: list[tuple[Plan, asyncio.Future[PlanResult]]]) -> None:
        """Check the group's plans in one read and start committing what fits."""
        claims = self.claims()
        plans = [plan for plan, _future in group]
        try:
            checked = await self.state.local(lambda r: check_group(r, plans, self.cache, claims))
        except Exception as exc:  # noqa: BLE001 - handed to the workers, which nack
            for _plan, future in group:
                if not future.done():
                    future.set_exception(exc)
                self._slots.release()
            return
        for (plan, future), (accepted, rejected) in zip(group, checked, strict=True):
            self._forget(future)  # checked: its claim is in flight now, or gone
            try:
                started = not future.done() and self._start(plan, future, accepted, rejected)
            except Exception as exc:  # noqa: BLE001 - handed to the worker, which nacks
                started = False
                future.set_exception(exc)
            if not started:
                self._slots.release()
        await asyncio.sleep(0)  # let the proposals reach the write queue before the next group's

    def _start(self, plan: Plan, future: asyncio.Future[PlanResult], accepted: Plan, rejected: dict[str, str]) -> bool:
        """Start committing what fits of a checked ``plan``; False if nothing was proposed."""
        result = PlanResult(whole=not rejected)
        if rejected:
            # Every plan committing now, the group's earlier ones included, may hold what was refused.
            result.after = list(self._ended.values())
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
        self._entries_in_flight += len(bodies)
        self.in_flight[key] = [c for c in (claims_of(b, accepted.inplace) for b in bodies) if c is not None]
        self._ended[key] = asyncio.Event()
        task = asyncio.ensure_future(self._commit(key, accepted, bodies, result, future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _commit(
        self,
        key: int,
        accepted: Plan,
        bodies: list[PlanApply],
        result: PlanResult,
        future: asyncio.Future[PlanResult],
    ) -> None:
        try:
            # The head entries at once, in order; the last (with the evals) once they committed.
            head = [asyncio.ensure_future(self.raft.propose(b)) for b in bodies[:-1]]
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
            self._entries_in_flight -= len(bodies)
            self._room.set()
