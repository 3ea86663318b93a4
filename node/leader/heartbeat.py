"""Node heartbeats on the leader: the monitor that marks silent nodes down, and node evals.

Clients heartbeat each node within the TTL the leader granted it
(``node.core.heartbeats``: it grows with the cluster, so the leader hears
at most ``max_heartbeats_per_second`` beats, with jitter so expiries are
spread). Each node has its own deadline, granted TTL + ``heartbeat_grace``.
Each pass marks the nodes past theirs down together, in as few
``NodeBatchUpdateStatus`` entries as the entry size allows, each carrying
one ``node-update`` evaluation for every job with live allocs on its nodes
(``node.leader.nodeevals.down_batches``), so the scheduler marks those
allocs lost and replaces them — no window in which a node is down but
nobody is asked to act, and no storm of one entry per node and one eval per
node per job when a rack or a fleet goes silent. A node that heartbeats
while down is marked ready again.

The deadlines live only on the leader, and a new leader cannot know how
long a node was silent before it took over: as Nomad's
``initializeHeartbeatTimers``, it gives every live node
``failover_heartbeat_ttl`` (+ grace) to find it, so clients that are busy
failing over are not marked down by the thousand. A node's first heartbeat
to the new leader replaces that with its granted TTL.

While it marks nodes down it holds the eval broker's deliveries
(``deliveries``, bounded there): in a mass expiry the scheduler's plans
would otherwise fill the log and the leader's CPU ahead of the
mark-downs, and place replacements on nodes of the dying fleet that are
about to go down themselves.

The monitor is a leader-only loop and stops as soon as this server is not
the leader: a mark-down refused as ``not_leader`` ends it (one line in the
log, not one per node), and other failures are retried with backoff. One
line is logged per batch, not per node.

Each pass also settles the deadlines of the nodes whose view changed since
the last one (``settle``), not of every node: at 30,000 nodes a sweep of
them all cost the leader several percent of its CPU (issue #36). A full
sweep still runs now and then as a safety net (``sweep``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import NODE_DOWN
from node.core.config import SchedulerConfig
from node.core.heartbeats import Heartbeats
from node.core.writes import STATUS
from node.leader.nodeevals import NODES_PER_BATCH, CoveredDowns, down_batches, mark_down_budget
from node.leader.nodeviews import NodeViews
from node.leader.shims import DeliveryHold, NodeView, RaftApplier, StateReads
from node.wire.errors import NOT_LEADER, RPCError

FULL_SWEEP_INTERVAL = 60.0  # seconds between safety-net sweeps of every node (``HeartbeatMonitor.sweep``)
MARK_CONCURRENCY = 4  # mark-down passes in flight at once
RETRY_FIRST = 0.5  # seconds before a failed mark-down is retried, doubling per failure in a row
RETRY_MAX = 30.0
RETRY_LOG_EVERY = 30.0  # seconds between log lines about mark-downs that keep failing
LOGGED_IDS = 10  # node ids named in a batch's log line
HOLDER = "node-down"  # this monitor's name for its hold on the broker's deliveries
# Passes come at least this far apart, and sooner than ``interval`` only when a deadline falls due:
# a node is marked down within this of its deadline, and a fleet whose deadlines are spread over
# seconds is still marked in a few passes (one eval per job per pass), not one per node.
MIN_PASS_GAP = 0.25
# A pass also takes the nodes due within this of it (at most a tenth of the shortest TTL, so a node
# that beats on time is never taken): it reads their mark-down entries at once and commits each
# share as soon as its nodes' deadlines have passed. A share's read (its nodes' allocs and jobs)
# takes a few tenths of a second at 1M objects, and it used to start at the deadline: the 1,000
# silent nodes a new leader's failover hold lets go at one instant were all down 1.1 s after it.
READ_AHEAD = 0.5


class _NoHold:
    """Deliveries for a monitor run without a broker (tests): nothing to hold."""

    def hold(self, holder: str) -> None:
        pass

    def release(self, holder: str) -> None:
        pass

    def holding(self, holder: str) -> bool:
        return False


class HeartbeatMonitor:
    """Marks a node down once its own deadline passes; leader only, and stops when leadership is lost."""

    def __init__(
        self,
        state: StateReads,
        raft: RaftApplier,
        heartbeats: Heartbeats,
        nodes: Mapping[str, NodeView],
        *,
        config: SchedulerConfig,
        is_leader: Callable[[], bool],
        max_entry_bytes: int,
        log: Any,
        deliveries: DeliveryHold | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.deliveries = deliveries or _NoHold()
        self.raft = raft
        self.heartbeats = heartbeats
        # The lifecycle's live view, kept current from the journal (a plain mapping is copied).
        self.nodes = NodeViews.of(nodes)
        self.config = config
        self.is_leader = is_leader
        self.max_entry_bytes = max_entry_bytes
        self.clock = clock
        # The term began when this monitor was built (with the lifecycle, as leadership was won);
        # a new leader's first read of a large state takes seconds before the monitor runs.
        self.term_started = clock()
        self.marking: set[str] = set()
        # Nodes whose mark-down entry carried every eval they need, for the lifecycle's tail.
        self.covered = CoveredDowns()
        self.stopped = False
        self.log = log.bind(component="heartbeat")
        self._tasks: set[asyncio.Task[None]] = set()
        self._limit = asyncio.Semaphore(MARK_CONCURRENCY)
        self._rng = random.Random()
        self._failures = 0  # mark-downs failed in a row
        self._unlogged = 0  # failures since the last line about them
        self._logged_at = -float("inf")
        self._swept_at = -float("inf")
        self.full_sweep_every = FULL_SWEEP_INTERVAL  # seconds (tests turn the safety net off)
        # Nodes to settle on the next pass besides those whose view changed: those a pass found
        # due, and those a mark-down let go (see settle).
        self._recheck: set[str] = set()
        # Nodes a pass took before their deadline (READ_AHEAD): when each may go down.
        self._due_at: dict[str, float] = {}

    @property
    def interval(self) -> float:
        """Longest time between passes: a fraction of the shortest TTL (the full sweep and retries run on passes)."""
        return max(0.05, min(1.0, self.config.min_heartbeat_ttl / 4))

    @property
    def read_ahead(self) -> float:
        """How far ahead of their deadlines a pass takes nodes (``READ_AHEAD``, a tenth of the shortest TTL at most)."""
        return min(READ_AHEAD, self.config.min_heartbeat_ttl / 10)

    def next_pass(self, last: float) -> float:
        """When the pass after one at ``last`` runs: ``read_ahead`` before the next deadline, but not within ``MIN_PASS_GAP`` of ``last``.

        Waking only every ``interval`` left a node due just after a pass
        alive for up to a second more: under a node-loss storm's load that
        second, plus the mark-down's own, put the last nodes past TTL +
        grace (issue #34). Nomad keeps a timer per node.
        """
        at = last + self.interval
        due = self.heartbeats.next_deadline()
        if due is not None:
            at = min(at, max(due - self.read_ahead, last + min(MIN_PASS_GAP, self.interval)))
        return at

    def start_term(self, now: float) -> int:
        """Give every live node the failover TTL (+ grace) from ``now``, the term's start; returns how many.

        Counted from when leadership was won, not from when the monitor
        first runs: the grace is what clients are promised after an
        election, and a new leader's start-up reads must not lengthen it.

        Never less than the longest TTL the old leader could have granted in
        a cluster this size: a node told to come back in 20 minutes (100,000
        nodes at 50 a second) is not late after 5. A node that heartbeat
        this term already keeps the later deadline; its next heartbeat sets
        its granted TTL as usual.
        """
        live = [node_id for node_id, view in self.nodes.items() if view.status != NODE_DOWN]
        cfg = self.config
        until = now + max(cfg.failover_heartbeat_ttl + cfg.heartbeat_grace, self.heartbeats.longest(cfg, len(live)))
        for node_id in live:
            self.heartbeats.hold(node_id, until)
        self._swept_at = now
        return len(live)

    def settle(self, now: float) -> None:
        """Settle (as ``sweep`` does) only the nodes that may have come unsettled since the last pass.

        A node is settled when it is down or gone and has no deadline, or is
        live and has one (unless being marked down). Outside the heartbeat
        endpoints, a node comes unsettled only when its view is added,
        changes status or goes (``NodeViews.take_changed``), when a pass
        takes its deadline as due, or when a mark-down lets it go: one that
        failed, was cut short, or whose node was revived meanwhile (while it
        was being marked it was left alone). So those are all that need a
        look: the cost follows what changed, not the fleet.
        """
        todo = self.nodes.take_changed()
        if self._recheck:
            todo |= self._recheck
            self._recheck = set()
        if todo:
            self._settle(todo, now)

    def sweep(self, now: float) -> None:
        """Drop deadlines of nodes that are down or gone; give one to a live node that has none.

        A node gets a deadline from the heartbeat endpoints; one written to
        the log some other way (or revived while a mark-down ran) would never
        expire without this. It gets the longest TTL it could have been granted.

        Every pass settles the nodes that changed (``settle``); this look at
        every node runs only every ``FULL_SWEEP_INTERVAL`` (some 10 ms of
        CPU at 30,000 nodes), as a safety net for what no view change
        shows: an endpoint that grants a deadline to a node just marked down
        or removed, or forgets the deadline of one revived meanwhile.
        """
        self.nodes.take_changed()  # all settled below
        self._recheck = set()
        live = {node_id for node_id, view in self.nodes.items() if view.status != NODE_DOWN}
        for node_id in self.heartbeats:
            if node_id not in live:
                self.heartbeats.forget(node_id)
        self._give(live, now)
        self._swept_at = now

    def _settle(self, node_ids: Iterable[str], now: float) -> None:
        """Forget the deadlines of ``node_ids`` that are down or gone; give the live ones without one a deadline."""
        live = []
        for node_id in node_ids:
            view = self.nodes.get(node_id)
            if view is None or view.status == NODE_DOWN:
                self.heartbeats.forget(node_id)
            else:
                live.append(node_id)
        self._give(live, now)

    def _give(self, live: Iterable[str], now: float) -> None:
        """Give a deadline to the ``live`` nodes that have none and are not being marked down.

        All get the longest TTL plus grace the cluster could have granted
        with them counted: for one node what a heartbeat counts (the nodes
        with a deadline, and it), and for several the same whatever order
        they come in (the sweep before issue #36 counted them one at a time).
        """
        deadline, marking = self.heartbeats.deadline, self.marking
        give = [node_id for node_id in live if node_id not in marking and deadline(node_id) is None]
        if give:
            until = now + self.heartbeats.longest(self.config, len(self.heartbeats) + len(give))
            for node_id in give:
                self.heartbeats.set(node_id, until)

    def expired(self, now: float, ahead: float = 0.0) -> list[str]:
        """Live nodes past their deadline, or due within ``ahead`` (they leave the table; a failed mark-down re-arms one).

        The caller marks them down (``marking``), each not before its deadline
        (``_due_at`` keeps those still to come); one it does not is given a
        deadline again on the next pass, as is one that was being marked.
        """
        if now - self._swept_at >= self.full_sweep_every:
            self.sweep(now)
        else:
            self.settle(now)
        out = []
        for node_id, deadline in self.heartbeats.due_by(now + ahead):
            view = self.nodes.get(node_id)
            if view is not None and view.status != NODE_DOWN:
                self._recheck.add(node_id)
                if node_id not in self.marking:
                    out.append(node_id)
                    if deadline > now:
                        self._due_at[node_id] = deadline
        return out

    async def run(self) -> None:
        held = self.start_term(self.term_started)
        self.log.info("heartbeat monitor started", nodes_held=held, failover_ttl_s=self.config.failover_heartbeat_ttl)
        try:
            last = self.clock()
            while not self.stopped:
                await asyncio.sleep(max(0.0, self.next_pass(last) - self.clock()))
                if not self.is_leader():
                    self._stop()
                    break
                last = self.clock()
                expired = self.expired(last, self.read_ahead)
                if expired:
                    self.deliveries.hold(HOLDER)
                    self.marking.update(expired)
                    task = asyncio.ensure_future(self._mark_down(expired))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            # Mark-downs in flight are not children of the lifecycle's task group: end them with the loop.
            for task in list(self._tasks):
                task.cancel()
            self.deliveries.release(HOLDER)

    def _stop(self) -> None:
        """Leadership is lost: one line, then nothing more is tried (the next leader starts afresh)."""
        self.deliveries.release(HOLDER)
        if not self.stopped:
            self.stopped = True
            self.log.info("heartbeat monitor stopped: this server is not the leader", marking=len(self.marking))

    async def _mark_down(self, node_ids: list[str]) -> None:
        """Mark one pass's expired nodes down in batched entries; those that beat meanwhile stay up."""
        try:
            async with self._limit:
                if self.stopped:
                    return
                if not self.is_leader():
                    self._stop()
                    return
                todo = [n for n in node_ids if self.heartbeats.deadline(n) is None]
                await self._mark_shares(todo)
        finally:
            self.marking.difference_update(node_ids)
            for node_id in node_ids:
                self._due_at.pop(node_id, None)
            self._recheck.update(node_ids)  # settled next pass: any left live without a deadline gets one
            if not self.marking:
                self.deliveries.release(HOLDER)

    async def _mark_shares(self, todo: list[str]) -> None:
        """Mark ``todo`` down a share at a time, reading the next share while the last one commits.

        A share at a time: each read of the nodes' allocs is short, and the
        loop and raft thread get turns between them. One after another, a
        new leader's 1,000 silent nodes at 1M objects took four reads and
        four commits in a row, a second past their failover deadline (issue
        #34's storm with a leader kill); reading share k+1 while share k
        commits overlaps the two. Shares still commit in order, and none
        after one that failed (``_commit_share`` has planned the retry).
        """
        given: set[str] = set()  # jobs this pass's entries gave an eval (see down_batches)
        committing: asyncio.Future[bool] | None = None
        try:
            for start in range(0, len(todo), NODES_PER_BATCH):
                share = todo[start : start + NODES_PER_BATCH]
                before = set(given)
                read = await self._read_share(share, given)
                if committing is not None and not await committing:
                    return
                read = await self._when_due(share, read, given, before)
                if read is None:
                    continue
                committing = asyncio.ensure_future(self._commit_share(*read, todo[start:]))
            if committing is not None:
                await committing
        finally:
            if committing is not None and not committing.done():
                committing.cancel()

    async def _when_due(
        self, share: list[str], read: tuple[int, list[m.NodeBatchUpdateStatus], bool], given: set[str], before: set[str]
    ) -> tuple[int, list[m.NodeBatchUpdateStatus], bool] | None:
        """``read`` once every node of ``share`` is past its deadline; read again without any that beat meanwhile.

        A node taken ahead of its deadline (``READ_AHEAD``) that heartbeats
        before it has a deadline again: the share is read again without it,
        with ``given`` as it was before this share (its jobs' evals may have
        been in the entries now dropped). None: every node of the share beat.
        """
        wait = max((self._due_at.get(node_id, 0.0) for node_id in share), default=0.0) - self.clock()
        if wait <= 0:
            return read
        await asyncio.sleep(wait)
        beat = {node_id for node_id in share if self.heartbeats.deadline(node_id) is not None}
        if not beat:
            return read
        given.clear()
        given.update(before)
        rest = [node_id for node_id in share if node_id not in beat]
        return await self._read_share(rest, given) if rest else None

    async def _read_share(self, share: list[str], given: set[str]) -> tuple[int, list[m.NodeBatchUpdateStatus], bool]:
        """The mark-down entries of ``share``: (index read at, entries, whether they share ``given``).

        While the broker's deliveries are held, a job already given an eval by
        an earlier entry of the pass gets none again (no eval reaches the
        scheduler before the pass's entries have all committed).
        """
        budget = mark_down_budget(self.max_entry_bytes)
        shared = given if self.deliveries.holding(HOLDER) else None

        def build(reader: StateReader) -> tuple[int, list[m.NodeBatchUpdateStatus]]:
            return reader.applied_index, down_batches(reader, share, budget=budget, given=shared)

        read_at, batches = await self.state.local(build)
        return read_at, batches, shared is not None

    async def _commit_share(
        self, read_at: int, batches: list[m.NodeBatchUpdateStatus], shared: bool, rest: list[str]
    ) -> bool:
        """Commit one share's entries; False when the rest must wait (leadership lost, or a retry planned).

        Each entry's claim to carry every eval its nodes need (``covered``)
        is settled once the whole share is answered: kept only if every
        entry committed and the hold never lapsed, else dropped, so the
        lifecycle's tail reads those nodes again and gives any job left
        without one an eval.
        """
        answers = await asyncio.gather(*(self._propose(msg, read_at) for msg in batches))
        failed = [(msg, a) for msg, a in zip(batches, answers, strict=True) if isinstance(a, RPCError)]
        vouched = not failed and (not shared or self.deliveries.holding(HOLDER))
        for msg, answer in zip(batches, answers, strict=True):
            if isinstance(answer, RPCError):
                continue
            if vouched:
                self.covered.confirm(msg, answer["index"], (answer.get("value") or {}).get("node_ids", ()))
            else:
                self.covered.drop(msg.node_ids)
            self._marked(msg)
        if not failed:
            return True
        if any(error.code == NOT_LEADER for _, error in failed) or not self.is_leader():
            self._stop()
        else:
            done = {n for msg, a in zip(batches, answers, strict=True) if not isinstance(a, RPCError) for n in msg.node_ids}
            # A node that beat meanwhile keeps the deadline its heartbeat gave it.
            deadline = self.heartbeats.deadline
            self._retry_later([n for n in rest if n not in done and deadline(n) is None], failed[0][1])
        return False

    async def _propose(self, msg: m.NodeBatchUpdateStatus, read_at: int) -> dict[str, Any] | RPCError:
        """Commit one mark-down entry: its answer, or the error if it did not commit.

        A flagged entry's nodes are claimed in ``covered`` while it is in
        flight, so the lifecycle's tail waits for the answer instead of
        reading their allocs again; the caller settles the claim (it is
        dropped here if the proposal failed or was cancelled).
        """
        self.covered.open(msg, read_at)
        try:
            return await self.raft.propose(msg, lane=STATUS)
        except RPCError as exc:
            self.covered.drop(msg.node_ids)
            return exc
        except BaseException:
            self.covered.drop(msg.node_ids)
            raise

    def _marked(self, msg: m.NodeBatchUpdateStatus) -> None:
        self.log.info(
            "nodes missed their heartbeat; marked down",
            nodes=len(msg.node_ids), evals=len(msg.evals), node_ids=msg.node_ids[:LOGGED_IDS],
        )
        if self._failures:
            self.log.info("marking nodes down works again", failed_in_a_row=self._failures)
            self._failures = 0

    def _retry_later(self, node_ids: list[str], exc: RPCError) -> None:
        """Try ``node_ids`` again after a backoff that doubles with each failure in a row; log now and then."""
        self._failures += 1
        delay = min(RETRY_MAX, RETRY_FIRST * 2 ** min(self._failures - 1, 16))
        now = self.clock()
        # One deadline for all of them: they come due in one pass and go down in
        # as few entries as before, not one small entry (each with evals for
        # every job its node ran) per node. The jitter spreads retries apart.
        due = now + delay * (0.5 + self._rng.random() / 2)
        for node_id in node_ids:
            self.heartbeats.set(node_id, due)
        if now - self._logged_at < RETRY_LOG_EVERY:
            self._unlogged += 1
            return
        self.log.warning(
            "could not mark node down; retrying with backoff",
            nodes=len(node_ids), error=str(exc), failed_in_a_row=self._failures, not_logged=self._unlogged,
            retry_in_s=round(delay, 2),
        )
        self._logged_at, self._unlogged = now, 0
