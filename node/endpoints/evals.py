"""RPC methods that read evaluations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm.store import StateReader
from node.core.context import RequestContext
from node.endpoints.registry import arg, by_prefix, found, id_arg, method
from node.spec.nomadjson import to_nomad

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
    job_id = arg(args, "job_id", required=False)

    def evals(r: StateReader) -> Any:
        rows = r.evals_by_job(job_id) if job_id else r.evals(arg(args, "prefix", required=False, default=""))
        return [to_nomad(e) for e in rows]

    return await server.read(ctx, args, ("evals",), evals)

