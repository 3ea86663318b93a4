"""RPC methods for the cluster itself: status, raft peers and leadership transfer, digests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm import messages as m
from node.core import joining, membership
from node.core.acl import Need
from node.core.api import Forward
from node.core.context import RequestContext
from node.endpoints.registry import arg, method
from node.leader.gc import collector, dry_run, force, force_detached
from node.leader.lifecycle import current
from node.wire.errors import BAD_REQUEST, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- status and operator --------------------------------------------------------
@method("status")
async def status(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    return server.status()


@method("operator.raft.peers")
async def raft_peers(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    await server.authorize(ctx, Need.READ)
    return server.status()["servers"]


@method("operator.raft.transfer")
async def raft_transfer(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    await server.authorize(ctx, Need.MANAGEMENT)
    target = arg(args, "to", required=False)
    return await server.transfer_leadership(ctx, target)


@method("operator.raft.add_peer")
async def raft_add_peer(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Add a server as a voter (what ``server join`` asks the cluster); management token and join proof."""
    return await membership.add_peer(server, ctx, args)


@method("operator.raft.remove_peer")
async def raft_remove_peer(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Remove the voter ``id`` or ``address`` (Nomad's ``operator raft remove-peer``); management token.

    With ``notice`` it is the leader telling the removed server itself (signed with the raft password).
    """
    if "notice" in args:
        return await membership.removed(server, ctx, args)
    return await membership.remove_peer(server, ctx, args)


@method("agent.join")
async def agent_join(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Nomad's ``server join``, sent to the *new* server: ask the cluster at ``address`` to add it.

    The caller's token goes on to the cluster, which checks it; this server
    has no ACL state of its own yet.
    """
    await server.authorize(ctx, Need.MANAGEMENT)
    address = arg(args, "address")
    joiner = joining.joiner_of(server)
    if joiner is None:
        raise RPCError(
            BAD_REQUEST,
            "this server is already a member of a cluster (it holds raft state); "
            "to move it, remove it there, wipe its data dir and start it with join set",
        )
    try:
        answer = await joiner.join_async(address, ctx.token)
    except joining.JoinError as exc:
        raise RPCError(BAD_REQUEST, str(exc)) from None
    return {"num_joined": 1, "error": "", "Members": [m.to_wire() for m in answer.members]}


@method("system.reconcile_summaries")
async def reconcile_summaries(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Recount every job summary from its allocs (management token)."""
    result = await server.write(ctx, Need.MANAGEMENT, m.ReconcileSummaries())
    return {"Index": result["index"], "Reconciled": result["value"]["reconciled"]}


@method("debug.digest")
async def debug_digest(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    await server.authorize(ctx, Need.READ)
    if not args.get("stale"):
        await server.linearize(ctx)
    digest, index = await ctx.run_blocking(server.fsm_digest)
    return {"digest": digest, "index": index, "node_id": server.config.node_id}


@method("scheduler.stats")
async def scheduler_stats(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """The leader's broker, worker and plan-applier counters (``reset`` clears the worker stats)."""

    await server.authorize(ctx, Need.READ)
    if not server.raft.is_leader:
        raise Forward(server.leader_rpc())
    lc = current(server)
    if lc is None:
        raise RPCError("unavailable", "the lifecycle is not running yet on the leader; retry in a moment")
    out = lc.status()
    if args.get("reset"):
        lc.stats.reset()
        lc.applier.stats.plans = lc.applier.stats.partial = lc.applier.stats.rejected_placements = 0
    out["Leader"] = server.rpc.address
    return out


@method("system.gc")
async def system_gc(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Force a garbage collection now (Nomad's ``PUT /v1/system/gc``); management token."""
    for flag in ("detach", "dry_run"):
        if flag in args and not isinstance(args[flag], bool):
            raise RPCError(BAD_REQUEST, f"argument {flag!r} must be true or false")
    await server.authorize(ctx, Need.MANAGEMENT)
    await server.linearize(ctx)  # the leader runs it; followers forward
    gc = collector(server)
    if args.get("dry_run"):
        limit = gc.limits.token_batch
        return await server.local(lambda r: dry_run(r, limit))
    if args.get("detach"):
        gc.spawn(force_detached(gc))
        return {"Detached": True, "Index": server.fsm.applied_index}
    outcome = await force(gc)
    return outcome.to_nomad()
