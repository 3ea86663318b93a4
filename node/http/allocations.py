"""Nomad's ``/v1/evaluations``, ``/v1/evaluation/:id``, ``/v1/allocations`` and ``/v1/allocation/:id``.

Reads only: each maps onto an ``eval.*`` or ``alloc.*`` RPC with the
request's stale / blocking options; allocation lists are Nomad's stubs.
"""

from __future__ import annotations

import json

from aiohttp import web

from node.http.paging import and_filter, list_reply
from node.http.shapes import alloc_stubs
from node.http.translate import by_path, read, read_reply


async def evals_list(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "eval.list")


async def eval_get(request: web.Request) -> web.Response:
    return await read_reply(request, "eval.get", by_path(request, "eval_id"))


async def eval_allocations(request: web.Request) -> web.StreamResponse:
    """The allocations one evaluation placed: its job's allocations with its EvalID (filtered server side)."""
    ev, _ = await read(request, "eval.get", by_path(request, "eval_id"))
    only = and_filter(request.query.get("filter"), f"EvalID == {json.dumps(ev['ID'])}")
    return await list_reply(request, "alloc.list", {"job_id": ev["JobID"], "filter": only}, alloc_stubs)


async def allocs_list(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "alloc.list", shape=alloc_stubs)


async def alloc_get(request: web.Request) -> web.Response:
    return await read_reply(request, "alloc.get", by_path(request, "alloc_id"))
