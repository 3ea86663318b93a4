"""The simulated client's alloc GC: the I/O around ``client.gc``'s decisions, for each node.

Each node keeps a record of its terminal allocs (what ``node status``
shows, through the node's attributes) and their directories until a pass
evicts them. Passes start on the four triggers of Nomad's client:

- the interval ticker (``gc_interval``), for every node that keeps some;
- an alloc turning terminal (``finished``);
- a new alloc that would exceed ``gc_max_allocs`` (``make_room``, awaited
  before the alloc starts);
- the servers deleting an alloc (``server_deleted``: their GC; reason ``server-gc``);

and when forced (``force``: ``caravan client gc``; reason ``forced``).
Passes of one node run one at a time (a lock); each removes at most
``gc_parallel_destroys`` directories at once. A failing cleanup is logged
with the alloc's id and the pass goes on with the next alloc; that alloc is
kept (its directory still uses the disk) and no pressure pass picks it
again, while a forced or server GC of it tries once more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from client import allocdir
from client import gc as rules
from client.driver import TaskSpec

# Node attributes a node reports what it holds in (``caravan node status`` shows them).
ATTR_PREFIX = "client.gc."


@dataclass
class AllocDirState:
    """One alloc's directory on a node: where, what made it, what it holds, and when it ended."""

    alloc_id: str
    path: str
    tasks: Sequence[TaskSpec] = ()
    bytes: int = 0
    inodes: int = 0
    finished: float = 0.0  # wall clock; 0 while live
    status: str = ""  # client status it ended with
    cleanup_failed: bool = False
    deleted: bool = False  # the servers deleted it while it ran: destroy it when it ends


@dataclass
class NodeGCState:
    live: dict[str, AllocDirState] = field(default_factory=dict)
    held: dict[str, AllocDirState] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    evicted: int = 0
    last_eviction: str = ""  # "<alloc id> <reason>"


@dataclass(frozen=True)
class NodeDisk:
    """A node's configured size: what its usage percentages are of."""

    disk_bytes: int
    inodes: int


class Collector:
    """Alloc directories and the GC of every node of one simulated client process."""

    def __init__(
        self,
        data_dir: str,
        cfg: rules.GCConfig,
        disk: NodeDisk,
        *,
        log: Callable[[str], None],
        warn: Callable[[str], None],
    ) -> None:
        self.data_dir = data_dir
        self.cfg = cfg
        self.disk = disk
        self.log = log
        self.warn = warn
        self.nodes: dict[str, NodeGCState] = {}
        self.where: dict[str, str] = {}  # alloc id -> node id
        self.dirty: set[str] = set()  # nodes whose kept allocs changed since their last report
        self.max_destroying: dict[str, int] = {}  # the most at once, per node (tests read it)
        self._tasks: set[asyncio.Task[Any]] = set()

    def node(self, node_id: str) -> NodeGCState:
        state = self.nodes.get(node_id)
        if state is None:
            state = self.nodes[node_id] = NodeGCState()
        return state

    # -- an alloc's life -------------------------------------------------------------
    def started(self, node_id: str, alloc_id: str) -> None:
        """Count a new alloc on its node from now (its directory is made once its tasks are known)."""
        path = allocdir.alloc_path(self.data_dir, node_id, alloc_id)
        self.node(node_id).live[alloc_id] = AllocDirState(alloc_id, path)
        self.where[alloc_id] = node_id

    async def build(self, node_id: str, alloc_id: str, tasks: Sequence[TaskSpec]) -> None:
        """Make the alloc's directory and let its tasks write; then measure what they wrote.

        An alloc whose tasks write nothing (no ``write_mb`` or ``files``) gets
        no directory: it would hold nothing to inspect or free, and a load
        test placing a million allocs then touches no disk.
        """
        entry = self.node(node_id).live.get(alloc_id)
        if entry is None:
            return
        entry.tasks = tasks
        if not any(t.write_mb or t.files for t in tasks):
            return
        await asyncio.to_thread(allocdir.build, entry.path, tasks)
        entry.bytes, entry.inodes = await asyncio.to_thread(allocdir.measure, entry.path)

    def finished(self, node_id: str, alloc_id: str, status: str) -> None:
        """The alloc is terminal: keep it (and run a pass), or destroy it if the servers already deleted it."""
        state = self.node(node_id)
        entry = state.live.pop(alloc_id, None)
        if entry is None:
            return
        entry.finished, entry.status = time.time(), status
        state.held[alloc_id] = entry
        self.dirty.add(node_id)
        if entry.deleted:
            self.spawn(self._server_gc(node_id, alloc_id))
        else:
            self.spawn(self.collect(node_id))

    def forget(self, node_id: str, alloc_id: str) -> None:
        """Drop a live alloc without keeping it (the client shuts down and takes it along)."""
        self.node(node_id).live.pop(alloc_id, None)
        self.where.pop(alloc_id, None)

    # -- what a pass sees --------------------------------------------------------------
    def usage(self, node_id: str) -> rules.NodeUsage:
        """The node now: its evictable kept allocs, and what it cannot free (live ones, failed cleanups)."""
        state = self.node(node_id)
        fixed = [*state.live.values(), *(h for h in state.held.values() if h.cleanup_failed)]
        held = tuple(
            rules.Held(h.alloc_id, h.finished, h.bytes, h.inodes)
            for h in state.held.values()
            if not h.cleanup_failed
        )
        return rules.NodeUsage(
            held=held,
            fixed_count=len(fixed),
            fixed_bytes=sum(a.bytes for a in fixed),
            fixed_inodes=sum(a.inodes for a in fixed),
            disk_bytes=self.disk.disk_bytes,
            inodes=self.disk.inodes,
        )

    def attributes(self, node_id: str) -> dict[str, str]:
        """What the node holds, as node attributes (usage counts live and kept allocs)."""
        state = self.node(node_id)
        everything = [*state.live.values(), *state.held.values()]
        used_bytes = sum(a.bytes for a in everything)
        used_inodes = sum(a.inodes for a in everything)
        held = sorted(state.held.values(), key=lambda h: (h.finished, h.alloc_id))
        return {
            f"{ATTR_PREFIX}allocs_held": str(len(held)),
            f"{ATTR_PREFIX}held": ",".join(h.alloc_id[:8] for h in held),
            f"{ATTR_PREFIX}disk_used_bytes": str(used_bytes),
            f"{ATTR_PREFIX}disk_used_percent": f"{rules.percent(used_bytes, self.disk.disk_bytes):.1f}",
            f"{ATTR_PREFIX}disk_bytes": str(self.disk.disk_bytes),
            f"{ATTR_PREFIX}inodes_used": str(used_inodes),
            f"{ATTR_PREFIX}inodes_used_percent": f"{rules.percent(used_inodes, self.disk.inodes):.1f}",
            f"{ATTR_PREFIX}inodes": str(self.disk.inodes),
            f"{ATTR_PREFIX}evicted": str(state.evicted),
            f"{ATTR_PREFIX}last_eviction": state.last_eviction,
        }

    # -- triggers ------------------------------------------------------------------------
    def spawn(self, work: Awaitable[Any]) -> None:
        """Run a pass in the background; a bug in it is reported, never silently lost."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.warn(f"gc: a collection failed: {task.exception()!r}")

    async def ticker(self) -> None:
        """The interval trigger: a pass on every node that keeps terminal allocs, every ``gc_interval``."""
        while True:
            await asyncio.sleep(self.cfg.interval)
            for node_id in [n for n, s in self.nodes.items() if s.held]:
                await self.collect(node_id)

    async def collect(self, node_id: str) -> int:
        """One pressure pass (disk, then inodes, then count); the number of allocs evicted."""
        async with self.node(node_id).lock:
            return await self._pass(node_id, count_only=False)

    async def make_room(self, node_id: str) -> int:
        """Before a new alloc (already counted as live) starts: evict until the count is within ``gc_max_allocs``."""
        async with self.node(node_id).lock:
            return await self._pass(node_id, count_only=True)

    async def force(self, node_id: str, alloc_id: str = "") -> int:
        """Collect every kept alloc of the node (or the one named) now, whatever the pressure."""
        state = self.node(node_id)
        async with state.lock:
            if not alloc_id:
                victims = [
                    (h.alloc_id, rules.FORCED)
                    for h in sorted(state.held.values(), key=lambda h: h.finished)
                    if not h.cleanup_failed
                ]
                return await self._destroy(node_id, victims)
            if alloc_id in state.live:
                self.log(
                    f"gc: node {node_id}: alloc {alloc_id} is not terminal; kept (only terminal allocs are collected)"
                )
                return 0
            if alloc_id not in state.held:
                self.log(
                    f"gc: node {node_id}: alloc {alloc_id} is not kept here (already collected, or never ran here)"
                )
                return 0
            return await self._destroy(node_id, [(alloc_id, rules.FORCED)])

    def server_deleted(self, alloc_id: str) -> None:
        """The servers' GC deleted the alloc: destroy it now if it is kept here, else once it ends."""
        node_id = self.where.get(alloc_id)
        if node_id is None:
            return
        state = self.node(node_id)
        live = state.live.get(alloc_id)
        if live is not None:
            live.deleted = True
        elif alloc_id in state.held:
            self.spawn(self._server_gc(node_id, alloc_id))

    async def _server_gc(self, node_id: str, alloc_id: str) -> None:
        state = self.node(node_id)
        async with state.lock:
            if alloc_id in state.held:
                await self._destroy(node_id, [(alloc_id, rules.SERVER_GC)])

    # -- the pass and the I/O ----------------------------------------------------------------
    async def _pass(self, node_id: str, *, count_only: bool) -> int:
        """Evict as ``client.gc`` plans, re-planning after each round, until it plans nothing."""
        evicted = 0
        while True:
            usage = self.usage(node_id)
            plan = rules.plan_evictions(usage, self.cfg, count_only=count_only)
            if not plan:
                return evicted
            why = rules.describe(plan[0][1], usage, self.cfg)
            self.log(
                f"gc: node {node_id}: {why}; evicting {len(plan)} terminal alloc(s), oldest-finished first"
            )
            evicted += await self._destroy(node_id, [(h.alloc_id, reason) for h, reason in plan])

    async def _destroy(self, node_id: str, victims: list[tuple[str, str]]) -> int:
        """Destroy kept allocs, at most ``gc_parallel_destroys`` at once; how many went."""
        state = self.node(node_id)
        limit = asyncio.Semaphore(self.cfg.parallel_destroys)
        running = 0

        async def one(alloc_id: str, reason: str) -> bool:
            nonlocal running
            entry = state.held.get(alloc_id)
            if entry is None:
                return False
            async with limit:
                running += 1
                self.max_destroying[node_id] = max(self.max_destroying.get(node_id, 0), running)
                try:
                    await asyncio.to_thread(allocdir.destroy, entry.path, entry.tasks)
                except allocdir.CleanupError as exc:
                    entry.cleanup_failed = True
                    self.warn(
                        f"gc: node {node_id}: alloc {alloc_id}: driver cleanup failed ({exc}); "
                        "skipped, the GC goes on with the next alloc"
                    )
                    return False
                finally:
                    running -= 1
            state.held.pop(alloc_id, None)
            self.where.pop(alloc_id, None)
            state.evicted += 1
            state.last_eviction = f"{alloc_id} {reason}"
            self.dirty.add(node_id)
            self.log(f"gc: node {node_id}: evicted alloc {alloc_id} (reason: {reason})")
            return True

        done = await asyncio.gather(*(one(a, r) for a, r in victims))
        return sum(done)
