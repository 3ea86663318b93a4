"""When each client node last heartbeated, as this server saw it.

Only the leader's copy decides anything: the leader's heartbeat monitor
(``node.leader.heartbeat``) marks a node down when its TTL passes with no
beat. The table lives on the server, not in the monitor, because the
``node.heartbeat`` endpoint records beats whether or not a monitor runs yet,
and a new leadership term starts from an empty table (every node gets a
fresh TTL from the moment this server leads).
"""

from __future__ import annotations

import time


class Heartbeats:
    """Node id -> monotonic time of its last heartbeat."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def beat(self, node_id: str) -> None:
        """Record a heartbeat from ``node_id`` now."""
        self._last[node_id] = time.monotonic()

    def last(self, node_id: str) -> float | None:
        """When ``node_id`` last heartbeated, or None if it has not this term."""
        return self._last.get(node_id)

    def forget(self, node_id: str) -> None:
        """Drop ``node_id``'s beat: its next TTL starts from its next heartbeat or the next pass."""
        self._last.pop(node_id, None)

    def clear(self) -> None:
        """A new leadership term: nobody has heartbeated to this leader yet."""
        self._last.clear()
