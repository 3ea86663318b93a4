"""The RPCs a scheduler worker uses to write its results: ``eval.update`` and ``plan.submit``.

Nomad's workers call ``Eval.Update`` (an EvalUpsert of the evals they
finished, blocked or created) and ``Plan.Submit`` (the leader's plan applier
commits the plan as one PlanApply entry). These are the same two writes,
exposed as RPCs so that a worker in another process, and tests that drive
evaluations and allocations to completion without a scheduler, take the
real write path: validated here, forwarded to the leader, stamped and put on
the log. Both need a write (or management) token once ACLs are bootstrapped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm import codec
from fsm import messages as m
from fsm.errors import ApplyRejected, CodecError
from fsm.store import StateReader
from fsm.structs import Evaluation
from fsm.validate import check_alloc, check_eval
from node.core.acl import Need
from node.core.context import RequestContext
from node.endpoints.registry import method
from node.spec.nomadjson import from_nomad
from node.wire.errors import BAD_REQUEST, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


def _bad(message: str) -> RPCError:
    return RPCError(BAD_REQUEST, message)


def _evals(raw: Any, where: str, *, required: bool) -> list[Evaluation]:
    if raw is None and not required:
        return []
    if not isinstance(raw, list) or (required and not raw):
        raise _bad(f"argument {where!r} must be a {'non-empty ' if required else ''}list of evaluations")
    try:
        evals = [codec.from_wire(Evaluation, from_nomad(e), f"{where}[{i}]") for i, e in enumerate(raw)]
        for ev in evals:
            check_eval(ev)
    except CodecError as exc:
        raise _bad(str(exc)) from None
    except ApplyRejected as exc:
        raise _bad(exc.message) from None
    return evals


@method("eval.update")
async def eval_update(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Upsert evaluations (a worker acking, blocking or creating evals): {evals: [...]}."""
    evals = _evals(args.get("evals"), "evals", required=True)
    result = await server.write(ctx, Need.WRITE, m.EvalUpsert(evals=evals))
    return {"Index": result["index"], "EvalIDs": result["value"]["eval_ids"]}


@method("plan.submit")
async def plan_submit(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Commit a scheduler plan: {plan: {EvalID, JobID, AllocsToPlace, AllocsToStop, Deployment, Evals}}.

    Every placed alloc must name an evaluation that exists or that the plan
    itself upserts: an alloc without its eval would be an orphan that no
    collector could ever account for.
    """
    raw = args.get("plan")
    if not isinstance(raw, dict):
        raise _bad("argument 'plan' must be a map (EvalID, JobID, AllocsToPlace, AllocsToStop, ...)")
    try:
        plan = codec.from_wire(m.PlanApply, from_nomad(raw), "plan")
        for alloc in plan.allocs_to_place:
            check_alloc(alloc)
        for ev in plan.evals:
            check_eval(ev)
    except CodecError as exc:
        raise _bad(str(exc)) from None
    except ApplyRejected as exc:
        raise _bad(exc.message) from None
    if not plan.allocs_to_place and not plan.allocs_to_stop and plan.deployment is None and not plan.evals:
        raise _bad("the plan is empty: give AllocsToPlace, AllocsToStop, a Deployment or Evals")
    own = {ev.id for ev in plan.evals}
    wanted = sorted({a.eval_id for a in plan.allocs_to_place} - own)

    def missing(r: StateReader) -> list[str]:
        return [eval_id for eval_id in wanted if r.eval(eval_id) is None]

    await server.authorize(ctx, Need.WRITE)
    await server.linearize(ctx)  # check on the leader's current state, not a lagging replica's
    absent = await server.local(missing)
    if absent:
        raise _bad(f"allocations name evaluation(s) that do not exist: {', '.join(absent[:5])}")
    result = await server.write(ctx, Need.WRITE, plan)
    value = result["value"]
    return {
        "Index": result["index"],
        "Placed": value["placed"],
        "Stopped": value["stopped"],
        "EvalIDs": value["eval_ids"],
    }
