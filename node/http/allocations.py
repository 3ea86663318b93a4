"""Nomad's ``/v1/evaluations``, ``/v1/evaluation/:id``, ``/v1/allocations`` and ``/v1/allocation/:id``.

Reads only: each maps onto an ``eval.*`` or ``alloc.*`` RPC with the
request's stale / blocking options; allocation lists are Nomad's stubs.
"""

from __future__ import annotations

from aiohttp import web

from node.http.shapes import alloc_stubs
from node.http.translate import by_path, prefix_arg, read, read_reply, reply


async def evals_list(request: web.Request) -> web.Response:
    return await read_reply(request, "eval.list", {"prefix": prefix_arg(request)})


async def eval_get(request: web.Request) -> web.Response:
    return await read_reply(request, "eval.get", by_path(request, "eval_id"))


async def eval_allocations(request: web.Request) -> web.Response:
    """The allocations one evaluation placed: its job's allocations, those with its EvalID."""
    ev, _ = await read(request, "eval.get", by_path(request, "eval_id"))
    data, index = await read(request, "alloc.list", {"job_id": ev["JobID"]})
    return reply(request, alloc_stubs([a for a in data if a.get("EvalID") == ev["ID"]]), index)


async def allocs_list(request: web.Request) -> web.Response:
    data, index = await read(request, "alloc.list", {"prefix": prefix_arg(request)})
    return reply(request, alloc_stubs(data), index)


async def alloc_get(request: web.Request) -> web.Response:
    return await read_reply(request, "alloc.get", by_path(request, "alloc_id"))
