"""Nomad's ``/v1/client/gc`` and ``/v1/client/allocation/:id/gc``: a forced client GC.

In Nomad these reach one client agent (``node_id``, or the agent serving
the request); Caravan's servers cannot call clients, so both become the
``client.gc`` / ``client.allocation.gc`` RPCs, a replicated request the
clients read on their event streams. Without ``node_id`` every node
collects (a Caravan server has no local client to default to).
"""

from __future__ import annotations

from aiohttp import web

from node.http.translate import by_path, call_write


async def client_gc(request: web.Request) -> web.Response:
    """``PUT /v1/client/gc[?node_id=ID]``: one node's terminal allocs, or every node's."""
    node_id = request.query.get("node_id", "")
    return await call_write(request, "client.gc", {"node_id": node_id} if node_id else {})


async def client_allocation_gc(request: web.Request) -> web.Response:
    """``PUT /v1/client/allocation/:alloc_id/gc``: that alloc, on its node, if it is terminal there."""
    return await call_write(request, "client.allocation.gc", by_path(request, "alloc_id"))
