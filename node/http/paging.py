"""Nomad's list conventions over the paged list RPCs: ``per_page``, ``next_token``, ``filter``, ``reverse``.

With ``?per_page=N`` a list answers one page and, when more follow, the
``X-Nomad-NextToken`` header to pass as ``?next_token=`` (Nomad's paging;
the server may end a page early under its byte budget, so callers follow
the header, never count). Without ``per_page`` the list answers everything,
as Nomad does, but a page at a time: each page is one RPC read (bounded by
construction, see ``node.core.paging``) written into a chunked JSON array,
so the server never holds more than one page of the answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from node.http.bridge import API_KEY, api_of
from node.http.translate import query_bool, query_int, read_args, reply

NEXT_TOKEN = "X-Nomad-NextToken"
Shape = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _same(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return items


def list_args(request: web.Request) -> dict[str, Any]:
    """The list parameters of the query (a 400 for a malformed ``per_page`` or ``reverse``)."""
    args: dict[str, Any] = {}
    per_page = query_int(request, "per_page")
    if per_page:
        args["per_page"] = per_page
    for name in ("next_token", "filter", "prefix"):
        value = request.query.get(name, "")
        if value:
            args[name] = value
    if query_bool(request, "reverse"):
        args["reverse"] = True
    return args


def and_filter(user: str | None, extra: str) -> str:
    """The caller's filter narrowed by ``extra`` (a route's own condition), both server side."""
    return f"({user}) and ({extra})" if user else extra


async def list_reply(
    request: web.Request, method: str, args: dict[str, Any] | None = None, shape: Shape = _same
) -> web.StreamResponse:
    """A list route's answer: one page with ``?per_page``, else every page, streamed.

    ``args`` are the route's own RPC arguments (``job_id``...); they win
    over the query's list parameters, except ``filter``, which the route
    must combine itself (``and_filter``).
    """
    args = {**list_args(request), **(args or {})}
    if "per_page" in args:
        out = await api_of(request).call(request, method, {**read_args(request), **args})
        resp = reply(request, shape(out["data"]), out["index"])
        if out.get("next_token"):
            resp.headers[NEXT_TOKEN] = out["next_token"]
        return resp
    pages = all_pages(request, method, args)
    first = await anext(pages)
    resp = web.StreamResponse(status=200)
    resp.content_type = "application/json"
    resp.headers["X-Nomad-Index"] = str(max(int(first["index"]), 1))
    resp.headers["X-Nomad-KnownLeader"] = "true" if request.app[API_KEY].known_leader() else "false"
    resp.headers["X-Nomad-LastContact"] = "0"
    await resp.prepare(request)
    await _write_items(request, resp, first, pages, shape)
    return resp


async def _write_items(
    request: web.Request,
    resp: web.StreamResponse,
    first: dict[str, Any],
    pages: AsyncIterator[dict[str, Any]],
    shape: Shape,
) -> None:
    """The JSON array, a page per write; a page failing after the headers went cuts the answer short.

    A 200 is on the wire by then: closing the connection mid-array is the
    one way left to tell the client the list is incomplete (its JSON will
    not parse), rather than end it as if it were whole.
    """
    await resp.write(b"[")
    sep = b""
    out: dict[str, Any] | None = first
    try:
        while out is not None:
            for item in shape(out["data"]):
                await resp.write(sep + json.dumps(item, separators=(",", ":")).encode())
                sep = b","
            out = await anext(pages, None)
    except Exception as exc:  # noqa: BLE001 - any failure: the answer must not look complete
        api_of(request).log.warning("list answer cut short", path=request.path, error=str(exc))
        if request.transport is not None:
            request.transport.close()
        return
    await resp.write(b"]")
    await resp.write_eof()


async def all_pages(request: web.Request, method: str, args: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """Every page of list RPC ``method``: the first with the request's blocking options, the rest at once."""
    api = api_of(request)
    options = read_args(request)
    token = args.get("next_token", "")
    while True:
        call = {**options, **args, "next_token": token} if token else {**options, **args}
        out = await api.call(request, method, call)
        yield out
        token = out.get("next_token") or ""
        if not token:
            return
        options = {"stale": True} if options.get("stale") else {}


async def read_all(request: web.Request, method: str, args: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """(every item, the first page's index) of a list that is small by nature (a job's deployments)."""
    items: list[dict[str, Any]] = []
    index = 0
    async for out in all_pages(request, method, args):
        items.extend(out["data"])
        index = index or out["index"]
    return items, index
