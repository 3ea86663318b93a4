"""The one way a list RPC reads: a page at a time (``node.core.paging``), through ``ServerAPI.read``.

Every list method (``job.list``, ``alloc.list``, ``eval.list``,
``deployment.list``, ``node.list``, ``acl.token.list``) answers
``{"index", "data": [...], "next_token"}``; ``next_token`` is "" when the
list is done. Callers that want everything follow the token (the CLI's
``node.cli.paging``, the HTTP API's ``node.http.paging``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fsm.store import StateReader
from node.core.acl import Need
from node.core.context import RequestContext
from node.core.paging import PageRequest, Row, collect, page_budget, page_request
from node.spec.nomadjson import to_nomad

if TYPE_CHECKING:
    from node.core.api import ServerAPI

Rows = Callable[[StateReader, PageRequest], Iterator[Row]]


async def list_page(
    server: ServerAPI,
    ctx: RequestContext,
    args: dict[str, Any],
    tables: tuple[str, ...],
    rows: Rows,
    *,
    view: Callable[[Any], dict[str, Any]] = to_nomad,
    need: Need = Need.READ,
) -> dict[str, Any]:
    """One page of a list: ``rows`` read from the state, shaped by ``view``, filtered and cut to size."""
    req = page_request(args)
    budget = page_budget(server.config.rpc_max_frame)
    out = await server.read(ctx, args, tables, lambda r: collect(rows(r, req), req, view, budget), need=need)
    page = out["data"]
    return {**out, "data": page.items, "next_token": page.next_token}
