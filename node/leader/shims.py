"""The narrow views of the server that leader services are handed.

As Nomad's drainer and deployment watcher get a ``RaftApplier`` shim rather
than the whole server, each leader service here names only what it uses:
reading committed state, and putting entries on the log. The server
satisfies both protocols; tests can hand a service a small fake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fsm.structs import NODE_ELIGIBLE, NODE_READY
from node.core.writes import LEADER

if TYPE_CHECKING:
    from fsm.store import StateReader


class StateReads(Protocol):
    """Reads of the leader's committed state."""

    async def local(self, fn: Callable[[StateReader], Any]) -> Any:
        """``fn`` on the committed state, off the event loop."""

    def state_now(self) -> int:
        """Now in the state's time (ns), never before the log's newest time."""


class RaftApplier(Protocol):
    """Leader-internal writes: one entry on the log, answered with its index and apply result."""

    async def propose(self, body: Any, rid: str | None = None, *, lane: str = LEADER) -> dict[str, Any]:
        """Commit ``body`` (in the write queue's ``lane``); raises ``RPCError`` (``not_leader`` once leadership is lost)."""


class DeliveryHold(Protocol):
    """The eval broker's holds: while one holds, no eval goes to a worker (``node.leader.broker``)."""

    def hold(self, holder: str) -> None:
        """Stop deliveries while ``holder`` holds (bounded by the broker)."""

    def release(self, holder: str) -> None:
        """End ``holder``'s hold."""

    def holding(self, holder: str) -> bool:
        """Whether ``holder``'s hold has stopped every delivery since it began."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the leader's services keep of a node between journal records.

    Frozen: a change is a new view written to ``NodeViews``, which keeps the
    draining and changed nodes as views are written (``node.leader.nodeviews``).
    """

    status: str
    eligibility: str
    drain: bool

    @property
    def usable(self) -> bool:
        return self.status == NODE_READY and self.eligibility == NODE_ELIGIBLE and not self.drain
