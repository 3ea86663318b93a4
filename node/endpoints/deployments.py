"""RPC methods that read deployments (the operations on them are in ``deployment_ops``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fsm.store import StateReader
from fsm.structs import Deployment
from node.core.acl import Need
from node.core.context import RequestContext
from node.core.paging import PageRequest, Row, index_rows, table_rows
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, by_prefix, found, id_arg, method
from node.leader.deployments import (
    Decision,
    DeploymentError,
    fail_by_user,
    pause_or_resume,
    promote_by_user,
)
from node.wire.errors import BAD_REQUEST, NOT_FOUND, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- deployments -------------------------------------------------------------------
@method("deployment.get")
async def deployment_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    dep_id = id_arg(args, "deployment_id")
    return await server.read(
        ctx,
        args,
        ("deployments",),
        lambda r: found(by_prefix(r.deployment, r.deployments, dep_id), f"deployment {dep_id}"),
        point=True,
    )


@method("deployment.list")
async def deployment_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of deployments: one job's (``job_id``), or all by id (``prefix``)."""
    job_id = arg(args, "job_id", required=False)

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        if job_id:
            return index_rows(r, "deployments_by_job", job_id, r.deployment, req)
        return table_rows(r, "deployments", req)

    return await list_page(server, ctx, args, ("deployments",), rows)


async def _operate(
    server: ServerAPI, ctx: RequestContext, args: dict[str, Any], choose: Callable[[StateReader, Deployment], Decision]
) -> dict[str, Any]:
    """An operator's change to one deployment, decided on the leader's state as its watcher decides.

    Answers Nomad's DeploymentUpdateResponse.
    """
    dep_id = id_arg(args, "deployment_id")
    server.ensure_leader()
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists

    def decision(r: StateReader) -> Decision:
        dep = by_prefix(r.deployment, r.deployments, dep_id)
        if dep is None:
            raise RPCError(NOT_FOUND, f"deployment {dep_id} not found")
        try:
            return choose(r, dep)
        except DeploymentError as exc:
            raise RPCError(BAD_REQUEST, str(exc)) from None

    d = await server.local(decision)
    result = await server.write(ctx, Need.WRITE, d.entry())
    index = result["index"]
    eval_ids = result["value"].get("eval_ids") or [""]
    out: dict[str, Any] = {"DeploymentID": d.deployment_id, "EvalID": eval_ids[0], "DeploymentModifyIndex": index, "Index": index}
    if eval_ids[0]:
        out["EvalCreateIndex"] = index
    if d.rollback is not None:
        out["RevertedJobVersion"] = d.rollback.version  # the stable version gone back to, as Nomad
    return out


@method("deployment.fail")
async def deployment_fail(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Mark a running deployment failed (rolling back where a group has auto_revert), as Nomad."""
    return await _operate(server, ctx, args, fail_by_user)


@method("deployment.pause")
async def deployment_pause(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Pause (``pause``: true, the default) or resume a rollout, as Nomad's Deployment.Pause."""
    pause = args.get("pause", True)
    if not isinstance(pause, bool):
        raise RPCError(BAD_REQUEST, "argument 'pause' must be a bool")
    return await _operate(server, ctx, args, lambda r, dep: pause_or_resume(r, dep, pause))


@method("deployment.promote")
async def deployment_promote(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Promote a rollout's canaries (``groups``, or every group waiting), as Nomad's Deployment.Promote."""
    groups = args.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise RPCError(BAD_REQUEST, "argument 'groups' must be a list of task group names")
    return await _operate(server, ctx, args, lambda r, dep: promote_by_user(r, dep, groups))
