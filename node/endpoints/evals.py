"""RPC methods that read evaluations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fsm.store import StateReader
from node.core.context import RequestContext
from node.core.paging import PageRequest, Row, index_rows, table_rows
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, by_prefix, found, id_arg, method

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- evals ----------------------------------------------------------------------------
@method("eval.get")
async def eval_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    eval_id = id_arg(args, "eval_id")
    return await server.read(
        ctx, args, ("evals",), lambda r: found(by_prefix(r.eval, r.evals, eval_id), f"evaluation {eval_id}"), point=True
    )


@method("eval.list")
async def eval_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of evaluations: one job's (``job_id``, in its index's order), or all by id (``prefix``)."""
    job_id = arg(args, "job_id", required=False)

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        return index_rows(r, "evals_by_job", job_id, r.eval, req) if job_id else table_rows(r, "evals", req)

    return await list_page(server, ctx, args, ("evals",), rows)

