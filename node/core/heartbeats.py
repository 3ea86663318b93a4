"""Heartbeat TTLs and each node's deadline, as the leader grants and keeps them.

Only the leader's copy decides anything: the leader's heartbeat monitor
(``node.leader.heartbeat``) marks a node down once its deadline passes. The
table lives on the server, not in the monitor, because the ``node.register``
/ ``node.heartbeat`` / ``node.status`` endpoints grant TTLs whether or not a
monitor runs yet, and a new leadership term starts from an empty table.

The TTL follows Nomad (``nomad/heartbeat.go``): the leader grants
``max(min_heartbeat_ttl, nodes / max_heartbeats_per_second)`` plus a random
stagger of up to that much again, so however large the cluster, all its
nodes together heartbeat about ``max_heartbeats_per_second`` times a
second, and nodes that registered together do not expire together. A
node's deadline is its granted TTL plus ``heartbeat_grace``; each node has
its own, so the monitor keeps them in a heap and touches only the due ones.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Collection, Iterator

from node.core.config import SchedulerConfig

# Rebuild the heap once it holds this many times more entries than nodes
# (each beat pushes one; the superseded ones are skipped as they come up).
_HEAP_SLACK = 4


def base_ttl(nodes: int, min_ttl: float, per_second: float) -> float:
    """The TTL before jitter: long enough that ``nodes`` beats take a second at ``per_second``, never below ``min_ttl``."""
    return max(min_ttl, nodes / per_second)


def granted_ttl(nodes: int, min_ttl: float, per_second: float, rng: random.Random) -> float:
    """What the leader grants one heartbeat: the base TTL plus a stagger in [0, base) (Nomad's RandomStagger)."""
    base = base_ttl(nodes, min_ttl, per_second)
    return base + rng.random() * base


class Heartbeats:
    """Node id -> the monotonic time at which the leader may mark it down."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self._deadlines: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []  # (deadline, node id); superseded entries stay until popped

    def __len__(self) -> int:
        """Nodes with a deadline: what the TTL scales with (Nomad counts its heartbeat timers)."""
        return len(self._deadlines)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._deadlines))

    def grant(self, node_ids: Collection[str], cfg: SchedulerConfig) -> float:
        """Heartbeats from ``node_ids`` now: one granted TTL for all of them, which is returned.

        The nodes of this call count too, so the first heartbeat of a large
        fleet to a new leader is already told a TTL that fits the fleet.
        """
        new = sum(1 for node_id in node_ids if node_id not in self._deadlines)
        ttl = granted_ttl(len(self._deadlines) + new, cfg.min_heartbeat_ttl, cfg.max_heartbeats_per_second, self._rng)
        deadline = self._clock() + ttl + cfg.heartbeat_grace
        for node_id in node_ids:
            self.set(node_id, deadline)
        return ttl

    def longest(self, cfg: SchedulerConfig, nodes: int | None = None) -> float:
        """The longest TTL plus grace a node could hold in a cluster of ``nodes`` (default: those with a deadline, and one more)."""
        count = len(self._deadlines) + 1 if nodes is None else nodes
        return 2 * base_ttl(count, cfg.min_heartbeat_ttl, cfg.max_heartbeats_per_second) + cfg.heartbeat_grace

    def set(self, node_id: str, deadline: float) -> None:
        """``node_id`` may be marked down once the monotonic clock passes ``deadline``."""
        self._deadlines[node_id] = deadline
        heapq.heappush(self._heap, (deadline, node_id))
        if len(self._heap) > _HEAP_SLACK * len(self._deadlines) + 1024:
            self._heap = [(d, n) for n, d in self._deadlines.items()]
            heapq.heapify(self._heap)

    def hold(self, node_id: str, deadline: float) -> None:
        """Keep ``node_id`` at least until ``deadline`` (a new leader's failover grace)."""
        if self._deadlines.get(node_id, 0.0) < deadline:
            self.set(node_id, deadline)

    def deadline(self, node_id: str) -> float | None:
        """When ``node_id`` may be marked down, or None if it has no deadline this term."""
        return self._deadlines.get(node_id)

    def due(self, now: float) -> list[str]:
        """Nodes whose deadline passed by ``now``; they lose their deadline (the caller re-arms a retry)."""
        return [node_id for node_id, _deadline in self.due_by(now)]

    def due_by(self, when: float) -> list[tuple[str, float]]:
        """``(node, deadline)`` of the nodes due by ``when``, earliest first; they lose their deadline."""
        out = []
        while self._heap and self._heap[0][0] <= when:
            deadline, node_id = heapq.heappop(self._heap)
            if self._deadlines.get(node_id) == deadline:
                del self._deadlines[node_id]
                out.append((node_id, deadline))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline held, or None when no node has one (drops superseded heap entries)."""
        heap = self._heap
        while heap and self._deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def forget(self, node_id: str) -> None:
        """Drop ``node_id``'s deadline (it is down or gone); its stale heap entry is skipped later."""
        self._deadlines.pop(node_id, None)

    def clear(self) -> None:
        """A new leadership term: nobody has heartbeated to this leader yet."""
        self._deadlines.clear()
        self._heap.clear()
