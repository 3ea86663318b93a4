"""Nomad's ``/v1/nodes`` and ``/v1/node/:id`` routes: reads, drain and eligibility.

Client nodes are listed as Nomad's stubs; drain and eligibility bodies are
mapped onto the ``node.*`` RPCs, which decide what they mean.
"""

from __future__ import annotations

from aiohttp import web

from node.http.paging import list_reply
from node.http.shapes import NODE_STUB, stub
from node.http.translate import (
    bad,
    by_path,
    call_write,
    json_body,
    read,
    read_reply,
)


async def nodes_list(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "node.list", shape=lambda page: [stub(n, NODE_STUB) for n in page])


async def node_get(request: web.Request) -> web.Response:
    return await read_reply(request, "node.get", by_path(request, "node_id"))


async def node_allocations(request: web.Request) -> web.StreamResponse:
    node, _ = await read(request, "node.get", by_path(request, "node_id"))
    return await list_reply(request, "alloc.list", {"node_id": node["ID"]})


async def node_drain(request: web.Request) -> web.Response:
    """Nomad's ``/v1/node/:id/drain``: ``{"DrainSpec": {"Deadline": ns, "IgnoreSystemJobs": b}}``; null ends it."""
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad(
            'the body must be a JSON object: {"DrainSpec": {"Deadline": 3600000000000}} or {"DrainSpec": null}'
        )
    # node.drain resolves an id prefix itself.
    args = {
        "node_id": request.match_info["node_id"],
        "drain_spec": body.get("DrainSpec"),
        "mark_eligible": body.get("MarkEligible", False),
    }
    return await call_write(request, "node.drain", args)


async def node_eligibility(request: web.Request) -> web.Response:
    """Nomad's ``/v1/node/:id/eligibility``: ``{"Eligibility": "eligible" | "ineligible"}``."""
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("Eligibility"), str):
        raise bad(
            'the body must be a JSON object: {"Eligibility": "eligible"} or {"Eligibility": "ineligible"}'
        )
    node, _ = await read(request, "node.get", by_path(request, "node_id"))
    args = {"node_id": node["ID"], "eligibility": body["Eligibility"]}
    return await call_write(request, "node.eligibility", args)
