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
        used = usage.usage(node.id)   # Resources(cpu=..., memory_mb=..., disk_mb=..., devices=...)

or ``usage.refresh(fsm)`` to move to the newest committed state. Results
are copies; the cache is safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm import codec
from fsm.cursor import Cursor, Record, Source
from fsm.store import StateReader
from fsm.structs import CLIENT_TERMINAL, DESIRED_EVICT, DESIRED_STOP, Resources
from fsm.topics import TOPIC_ALLOC

_SERVER_TERMINAL = (DESIRED_STOP, DESIRED_EVICT)


def _claims(alloc: dict[str, Any]) -> bool:
    """Whether an allocation (wire map) holds resources: Nomad's not-TerminalStatus."""
    return alloc.get("desired_status") not in _SERVER_TERMINAL and alloc.get("client_status") not in CLIENT_TERMINAL


class _NodeTotal:
    """A node's running sum: a ``Resources`` changed in place (its own add and
    subtract, no new record per allocation) and how many allocations it holds."""

    __slots__ = ("used", "allocs")

    def __init__(self) -> None:
        self.used = Resources.zero()
        self.allocs = 0


class NodeUsageCache:
    """Resources of non-terminal allocations, summed per node, following the journal.

    Only ``Allocation`` records matter: each carries the whole allocation
    (so its node and resources), and a deletion carries only its id, which
    the cache resolves from the claims it keeps per allocation.
    """

    TOPICS = frozenset({TOPIC_ALLOC})

    def __init__(self) -> None:
        self._claims: dict[str, tuple[str, Resources]] = {}  # alloc id -> (node id, its claim)
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
            return Resources.zero() if total is None else total.used.copy()

    def alloc_count(self, node_id: str) -> int:
        """Number of non-terminal allocations on ``node_id``."""
        with self.cursor.lock:
            total = self._nodes.get(node_id)
            return 0 if total is None else total.allocs

    def usages(self) -> dict[str, Resources]:
        """Every node with at least one non-terminal allocation, with its usage."""
        with self.cursor.lock:
            return {node_id: t.used.copy() for node_id, t in sorted(self._nodes.items())}

    def dump(self) -> dict[str, Any]:
        """The whole cache as plain data (tests compare it with a rebuild)."""
        with self.cursor.lock:
            return {
                "nodes": {n: (*_dims(t.used), t.allocs) for n, t in sorted(self._nodes.items())},
                "claims": {a: (n, *_dims(r)) for a, (n, r) in sorted(self._claims.items())},
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
            self._release(old[0], old[1])
        if alloc is None or not _claims(alloc):
            return
        res = alloc.get("resources") or {}
        node_id = alloc["node_id"]
        devices = res.get("devices")
        claim = Resources(
            cpu=int(res.get("cpu", 0)),
            memory_mb=int(res.get("memory_mb", 0)),
            disk_mb=int(res.get("disk_mb", 0)),
            devices=dict(devices) if devices else {},
        )
        self._claims[alloc_id] = (node_id, claim)
        total = self._nodes.get(node_id)
        if total is None:
            total = self._nodes[node_id] = _NodeTotal()
        total.used.add(claim)
        total.allocs += 1

    def _release(self, node_id: str, claim: Resources) -> None:
        """Take a claim off its node's total, forgetting the node once it holds nothing."""
        total = self._nodes[node_id]
        total.used.subtract(claim)
        total.allocs -= 1
        if total.allocs == 0:
            del self._nodes[node_id]


def _dims(r: Resources) -> tuple[Any, ...]:
    """A usage as plain data; devices only when there are some (device-less dumps keep their shape)."""
    if r.devices:
        return (r.cpu, r.memory_mb, r.disk_mb, tuple(sorted(r.devices.items())))
    return (r.cpu, r.memory_mb, r.disk_mb)
