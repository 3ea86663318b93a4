"""The server as the rooms above ``core`` see it: a protocol, not the class.

``node.server.Server`` wires everything together and sits near the top of
the house; the leader services, the RPC endpoints and the HTTP API sit
below it and must not import it. They are typed against ``ServerAPI``
instead, the few things a handler may ask of the server it runs in, as
etcd's ``api/v3rpc`` reaches its server through an interface. ``Forward``
is how a handler on a follower says "send this to the leader"; the
server's dispatcher catches it and forwards the request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from node.core.writes import LEADER

if TYPE_CHECKING:
    import structlog

    from fsm.machine import FSM
    from fsm.store import StateReader
    from node.core.acl import Need
    from node.core.config import ServerConfig
    from node.core.context import RequestContext
    from node.core.heartbeats import Heartbeats
    from node.core.rpc_server import RPCServer
    from node.wire.rpc_client import AsyncRPCClient
    from raft.node import RaftNode


class Forward(Exception):
    """Raised by a handler on a server that is not the leader: the request goes to ``leader``."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(leader)
        self.leader = leader


class ServerAPI(Protocol):
    """What endpoints, leader services and the HTTP API may use of their server."""

    config: ServerConfig
    log: structlog.stdlib.BoundLogger
    fsm: FSM
    raft: RaftNode
    rpc: RPCServer
    forwarder: AsyncRPCClient
    executor: concurrent.futures.ThreadPoolExecutor
    cluster_id: str
    heartbeats: Heartbeats

    def status(self) -> dict[str, Any]:
        """This server's raft and membership status, in the shape ``status`` answers."""

    def leader_rpc(self) -> str | None:
        """The leader's RPC address, or None while there is none."""

    def state_now(self) -> int:
        """Now in the state's time (ns): the wall clock, never before the log's newest time."""

    def commit_event(self) -> asyncio.Event | None:
        """An event set at the next store commit (None before the server runs)."""

    def ensure_leader(self) -> None:
        """Raise ``Forward`` unless this server is the leader."""

    async def local(self, fn: Callable[[StateReader], Any]) -> Any:
        """``fn`` on this server's committed state, off the loop."""

    async def authorize(self, ctx: RequestContext, need: Need) -> None:
        """Check the caller's token for ``need``; raises RPCError."""

    async def propose(self, body: Any, rid: str | None = None, *, lane: str = LEADER) -> dict[str, Any]:
        """Leader-internal write: {index, value}; ``lane=CLIENT`` for one a caller waits on (node/core/writes.py)."""

    async def write(self, ctx: RequestContext, need: Need, body: Any) -> dict[str, Any]:
        """A client's write through the leader: {index, value, duplicate}."""

    async def linearize(self, ctx: RequestContext) -> None:
        """Be the leader and pass a barrier, so a following local read is linearizable."""

    async def read(
        self,
        ctx: RequestContext,
        args: dict[str, Any],
        tables: tuple[str, ...],
        fn: Callable[[StateReader], Any],
        *,
        need: Need = ...,
        point: bool = False,
    ) -> dict[str, Any]:
        """{"index", "data"}: linearizable, stale and/or blocking."""

    def fsm_digest(self) -> tuple[str, int]:
        """(digest, applied index) of this server's state."""

    async def transfer_leadership(self, ctx: RequestContext, target: str | None) -> dict[str, Any]:
        """Hand leadership to ``target`` (or any other server)."""
