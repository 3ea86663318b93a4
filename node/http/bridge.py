"""The bridge from an HTTP request to the server's own RPC handlers.

Every ``/v1`` route runs the very handler that ``caravan`` and the RPC
clients reach (``RPCServer.lookup``), in-process, with a request context
that carries the caller's ``X-Nomad-Token``. So validation, ACL checks,
linearizable / stale / blocking reads and forwarding of writes from a
follower to the leader are the RPC's own, and the HTTP API cannot drift
from them. The server is seen through ``ServerAPI`` only: this room sits
below the wiring in ``node.server``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from fsm.ids import new_request_id
from node.core.api import ServerAPI
from node.core.context import RequestContext


class HTTPError(Exception):
    """An answer other than 200, raised by route code: ``status`` and a one-line text."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class HTTPAPI:
    """One server's HTTP API state: its limits, its open streams, and the calls into its RPCs."""

    def __init__(self, server: ServerAPI) -> None:
        self.server = server
        self.log = server.log.bind(component="http")
        self.max_body = server.config.rpc_max_frame
        self.heartbeat = server.config.http_event_heartbeat
        self.streams: set[asyncio.Task[Any]] = set()

    def context(
        self, request: web.Request, method: str, token: str | None = None
    ) -> RequestContext:
        """The RPC request context: the caller's token (or ``token``), a fresh request id."""
        if token is None:
            token = request.headers.get("X-Nomad-Token") or None
            auth = request.headers.get("Authorization", "")
            if token is None and auth.lower().startswith("bearer "):
                token = auth[7:].strip() or None
        # Cheap and process-unique (uuid4 per request showed in profiles); "h"
        # marks ids the HTTP API made. Forwarding keeps the id, so the leader
        # applies each HTTP write once.
        request_id = "h" + new_request_id()
        peer = request.remote or "unknown"
        return RequestContext(
            request_id, method, token, peer, asyncio.get_running_loop(), self.log, request.transport
        )  # type: ignore[arg-type]

    def lookup(self, method: str) -> tuple[Callable[..., Any], bool] | None:
        """(handler, streaming) of RPC ``method`` on this server, or None when it has none."""
        return self.server.rpc.lookup(method)

    def handler(self, method: str, *, streaming: bool = False) -> Callable[..., Any]:
        """The RPC handler for ``method``; a 501 when this server has no such RPC (yet)."""
        found = self.lookup(method)
        if found is None or found[1] != streaming:
            raise HTTPError(
                501, f"{method} is not available on this server (not implemented in this version)"
            )
        return found[0]

    def has(self, method: str) -> bool:
        """Whether RPC ``method`` is registered here (routes whose RPC may not have landed)."""
        return self.lookup(method) is not None

    async def call(
        self,
        request: web.Request,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        token: str | None = None,
    ) -> Any:
        """Run RPC ``method`` in-process, exactly as an RPC client's request would run."""
        fn = self.handler(method)
        return await fn(self.context(request, method, token), dict(args or {}))

    def stream(self, request: web.Request, method: str, args: dict[str, Any]) -> Any:
        """Open streaming RPC ``method``: an async iterator of its items."""
        fn = self.handler(method, streaming=True)
        return fn(self.context(request, method), dict(args))

    def known_leader(self) -> bool:
        """``X-Nomad-KnownLeader``: whether this server knows a leader right now."""
        raft = getattr(self.server, "raft", None)
        try:
            return bool(raft is not None and raft.leader_address)
        except Exception:  # noqa: BLE001 - raft stopping
            return False


API_KEY: web.AppKey[HTTPAPI] = web.AppKey("caravan_http_api")


def api_of(request: web.Request) -> HTTPAPI:
    """The HTTP API of the server that received ``request``."""
    return request.app[API_KEY]


async def next_item(items: AsyncIterator[Any]) -> Any:
    """The next item of a streaming RPC, or None when it has ended."""
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return None
