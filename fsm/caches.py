"""Journal-driven caches of derived state (see ``fsm.cursor``).

``NodeUsageCache`` keeps, per node, the resources claimed by its
non-terminal allocations — what placement needs for feasibility (does the
task group still fit on this node?) and ranking (bin-packing score) without
scanning every allocation for every placement.

Typical use by the scheduler (one cache per server process, shared by its
workers)::

    usage = NodeUsageCache()
    with fsm.read() as snap:          # the worker's consistent snapshot
        usage.catch_up(snap)          # now equals a rebuild at snap.applied_index
        used = usage.usage(node.id)   # Resources(cpu=..., memory_mb=..., disk_mb=...)

or ``usage.refresh(fsm)`` to move to the newest committed state. Results
are copies; the cache is safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fsm import codec
from fsm.cursor import Cursor, Record, Source
from fsm.store import StateReader
from fsm.structs import CLIENT_TERMINAL, DESIRED_EVICT, DESIRED_STOP, Resources
from fsm.writer import TOPIC_ALLOC

_SERVER_TERMINAL = (DESIRED_STOP, DESIRED_EVICT)


def _claims(alloc: dict[str, Any]) -> bool:
    """Whether an allocation (wire map) holds resources: Nomad's not-TerminalStatus."""
    return alloc.get("desired_status") not in _SERVER_TERMINAL and alloc.get("client_status") not in CLIENT_TERMINAL


@dataclass
class _Claim:
    node_id: str
    cpu: int
    memory_mb: int
    disk_mb: int


@dataclass
class _NodeTotal:
    cpu: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    allocs: int = 0


class NodeUsageCache:
    """Resources of non-terminal allocations, summed per node, following the journal.

    Only ``Allocation`` records matter: each carries the whole allocation
    (so its node and resources), and a deletion carries only its id, which
    the cache resolves from the claims it keeps per allocation.
    """

    TOPICS = frozenset({TOPIC_ALLOC})

    def __init__(self) -> None:
        self._claims: dict[str, _Claim] = {}
        self._nodes: dict[str, _NodeTotal] = {}
        self.cursor = Cursor(self, self.TOPICS)

    # -- reading -------------------------------------------------------------------
    @property
    def index(self) -> int | None:
        """The raft index the cache reflects (None before the first refresh)."""
        return self.cursor.index

    def usage(self, node_id: str) -> Resources:
        """Resources claimed on ``node_id`` by its non-terminal allocations (zero if none)."""
        with self.cursor.lock:
            total = self._nodes.get(node_id)
            if total is None:
                return Resources(cpu=0, memory_mb=0, disk_mb=0)
            return Resources(cpu=total.cpu, memory_mb=total.memory_mb, disk_mb=total.disk_mb)

    def alloc_count(self, node_id: str) -> int:
        """Number of non-terminal allocations on ``node_id``."""
        with self.cursor.lock:
            total = self._nodes.get(node_id)
            return 0 if total is None else total.allocs

    def usages(self) -> dict[str, Resources]:
        """Every node with at least one non-terminal allocation, with its usage."""
        with self.cursor.lock:
            return {
                node_id: Resources(cpu=t.cpu, memory_mb=t.memory_mb, disk_mb=t.disk_mb)
                for node_id, t in sorted(self._nodes.items())
            }

    def dump(self) -> dict[str, Any]:
        """The whole cache as plain data (tests compare it with a rebuild)."""
        with self.cursor.lock:
            return {
                "nodes": {n: (t.cpu, t.memory_mb, t.disk_mb, t.allocs) for n, t in sorted(self._nodes.items())},
                "claims": {a: (c.node_id, c.cpu, c.memory_mb, c.disk_mb) for a, c in sorted(self._claims.items())},
            }

    # -- moving forward ------------------------------------------------------------
    def catch_up(self, reader: StateReader) -> int:
        """Reflect exactly ``reader``'s index (same read transaction); returns it."""
        return self.cursor.catch_up(reader)

    def refresh(self, source: Source) -> int:
        """Reflect the newest committed state of ``source`` (an FSM or StateStore)."""
        return self.cursor.refresh(source)

    # -- Follower ------------------------------------------------------------------
    def rebuild(self, reader: StateReader) -> None:
        self._claims = {}
        self._nodes = {}
        for key, raw in reader.iter_raw("allocs"):
            self._track(key.decode(), codec.unpack(raw))

    def apply(self, index: int, records: Sequence[Record]) -> None:
        for topic, _type, alloc_id, obj in records:
            if topic == TOPIC_ALLOC:
                self._track(alloc_id, obj)

    # -- internals -----------------------------------------------------------------
    def _track(self, alloc_id: str, alloc: dict[str, Any] | None) -> None:
        """Set this allocation's claim from its newest version (None: deleted)."""
        old = self._claims.pop(alloc_id, None)
        if old is not None:
            self._add(old, -1)
        if alloc is None or not _claims(alloc):
            return
        res = alloc.get("resources") or {}
        claim = _Claim(
            alloc["node_id"],
            int(res.get("cpu", 0)),
            int(res.get("memory_mb", 0)),
            int(res.get("disk_mb", 0)),
        )
        self._claims[alloc_id] = claim
        self._add(claim, +1)

    def _add(self, claim: _Claim, sign: int) -> None:
        total = self._nodes.get(claim.node_id)
        if total is None:
            total = self._nodes[claim.node_id] = _NodeTotal()
        total.cpu += sign * claim.cpu
        total.memory_mb += sign * claim.memory_mb
        total.disk_mb += sign * claim.disk_mb
        total.allocs += sign
        if total.allocs == 0:
            del self._nodes[claim.node_id]
