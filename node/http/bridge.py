"""The bridge from an HTTP request to the server's own RPC handlers.

Every ``/v1`` route runs the very handler that ``caravan`` and the RPC
clients reach (``RPCServer.lookup``), in-process, with a request context
that carries the caller's ``X-Nomad-Token``. So validation, ACL checks,
linearizable / stale / blocking reads and forwarding of writes from a
follower to the leader are the RPC's own, and the HTTP API cannot drift
from them. The server is seen through ``ServerAPI`` only: this room sits
below the wiring in ``node.server``.

Answers are shaped here, once, for every route: reads through
``node.http.shapes`` (Nomad's whole objects), plus the few fields Nomad's
objects borrow from others (an allocation's NodeName and JobType, a job
stub's JobSummary, an allocation's Job), read stale and cached per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from fsm.ids import new_request_id
from node.core.api import ServerAPI
from node.core.context import RequestContext
from node.http.shapes import DEREGISTER_MISSING, shape_read
from node.wire.errors import NOT_FOUND, RPCError

# A request's cache of the objects its answer borrows fields from (node names, job types).
NAMES_KEY: web.RequestKey[dict[tuple[str, str, str], Any]] = web.RequestKey("caravan_http_names")


class HTTPError(Exception):
    """An answer other than 200, raised by route code: ``status`` and a one-line text."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def caller_token(request: web.Request) -> str | None:
    """The caller's secret: ``X-Nomad-Token``, else an ``Authorization: Bearer`` header."""
    token = request.headers.get("X-Nomad-Token") or None
    auth = request.headers.get("Authorization", "")
    if token is None and auth.lower().startswith("bearer "):
        token = auth[7:].strip() or None
    return token


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
            token = caller_token(request)
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
        """Run RPC ``method`` in-process, exactly as an RPC client's request would run.

        A read's answer comes back in Nomad's shape (``shapes.READ_SHAPES``),
        with the fields Nomad's objects carry from other objects filled in
        (an allocation's NodeName and JobType, a job stub's summary), so
        every route, page and blocking read serves the same objects.
        """
        try:
            out = await self.raw_call(request, method, args, token=token)
        except RPCError as exc:
            if method == "job.stop" and exc.code == NOT_FOUND:
                return dict(DEREGISTER_MISSING)  # Nomad: deregistering no job is a no-op, not a 404
            raise
        out = shape_read(method, out)
        if method in _JOINS and isinstance(out, dict) and "data" in out:
            await _JOINS[method](self, request, out["data"], token)
        return out

    async def raw_call(
        self,
        request: web.Request,
        method: str,
        args: dict[str, Any] | None = None,
        *,
        token: str | None = None,
    ) -> Any:
        """RPC ``method``'s answer as the RPC gives it (Caravan's shape)."""
        fn = self.handler(method)
        return await fn(self.context(request, method, token), dict(args or {}))

    async def lookup_field(
        self, request: web.Request, method: str, key: str, field: str, token: str | None
    ) -> Any:
        """One field of the object ``method`` reads for ``key`` (a stale read, cached per request).

        None when the object is gone (collected between the two reads).
        """
        cache = request.setdefault(NAMES_KEY, {})
        if (method, key, field) not in cache:
            arg = {"node.get": "node_id", "job.get": "job_id", "job.summary": "job_id"}[method]
            try:
                out = await self.raw_call(request, method, {arg: key, "stale": True}, token=token)
                value = out["data"] if field == "" else out["data"].get(field)
            except (RPCError, HTTPError):  # gone, or a server without that read: Nomad's zero
                value = None
            cache[(method, key, field)] = value
        return cache[(method, key, field)]

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


async def _alloc_names(api: HTTPAPI, request: web.Request, data: Any, token: str | None) -> None:
    """Each allocation's NodeName and JobType, as Nomad's allocations carry them."""
    for alloc in data if isinstance(data, list) else [data]:
        if not alloc.get("NodeName") and alloc.get("NodeID"):
            name = await api.lookup_field(request, "node.get", alloc["NodeID"], "Name", token)
            alloc["NodeName"] = name or ""
        if not alloc.get("JobType") and alloc.get("JobID"):
            kind = await api.lookup_field(request, "job.get", alloc["JobID"], "Type", token)
            alloc["JobType"] = kind or ""


async def _alloc_job(api: HTTPAPI, request: web.Request, data: Any, token: str | None) -> None:
    """One allocation read: its names, and its Job (the job at the alloc's version, as Nomad's)."""
    await _alloc_names(api, request, data, token)
    if not isinstance(data, dict) or data.get("Job") is not None:
        return
    try:
        out = await api.call(request, "job.versions", {"job_id": data["JobID"], "stale": True}, token=token)
    except (RPCError, HTTPError):
        return
    versions = out["data"].get("Versions", [])
    data["Job"] = next((j for j in versions if j.get("Version") == data.get("JobVersion")), None)


async def _job_summaries(api: HTTPAPI, request: web.Request, data: Any, token: str | None) -> None:
    """Each listed job's summary (Nomad's job stubs carry it)."""
    for job in data if isinstance(data, list) else []:
        summary = await api.lookup_field(request, "job.summary", job["ID"], "", token)
        job["JobSummary"] = shape_read("job.summary", {"data": summary})["data"] if summary else None


_JOINS: dict[str, Callable[[HTTPAPI, web.Request, Any, str | None], Awaitable[None]]] = {
    "alloc.list": _alloc_names,
    "alloc.get": _alloc_job,
    "job.list": _job_summaries,
}

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
