"""RPC methods for allocations: reads, and the client's status updates."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fsm import codec
from fsm import messages as m
from fsm.errors import CodecError
from fsm.store import StateReader
from fsm.structs import Node
from node.core.acl import Need, check_node_secret, hash_secret
from node.core.context import RequestContext
from node.core.paging import PageRequest, Row, index_rows, table_rows
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, bad, by_prefix, found, id_arg, method
from node.spec.nomadjson import from_nomad

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- allocs ----------------------------------------------------------------------------
@method("alloc.get")
async def alloc_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    alloc_id = id_arg(args, "alloc_id")
    return await server.read(
        ctx, args, ("allocs",), lambda r: found(by_prefix(r.alloc, r.allocs, alloc_id), f"allocation {alloc_id}"), point=True
    )


@method("alloc.list")
async def alloc_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of allocations: one job's (``job_id``), one node's (``node_id``), or all by id (``prefix``).

    A node's are in its index's order, live ones first; the others in id order.
    """
    job_id = arg(args, "job_id", required=False)
    node_id = arg(args, "node_id", required=False)

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        if job_id:
            return index_rows(r, "allocs_by_job", job_id, r.alloc, req)
        if node_id:
            return index_rows(r, "allocs_by_node", node_id, r.alloc, req)
        return table_rows(r, "allocs", req)

    return await list_page(server, ctx, args, ("allocs",), rows)


@method("alloc.update")
async def alloc_update(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Client status updates (what Nomad's Node.UpdateAlloc carries).

    The request's token is the node secret of the nodes the allocs run on
    (as Nomad's client authenticates); allocs of nodes registered without a
    secret need node:write. One wrong secret refuses the whole update.
    """
    raw = args.get("allocs")
    if not isinstance(raw, list) or not raw:
        raise bad("argument 'allocs' must be a non-empty list of {ID, ClientStatus, ...}")
    try:
        states = [codec.from_wire(m.AllocClientState, from_nomad(a), f"allocs[{i}]") for i, a in enumerate(raw)]
    except CodecError as exc:
        raise bad(str(exc)) from None
    server.ensure_leader()
    await _check_alloc_nodes(server, ctx, {s.id for s in states})
    result = await server.write(ctx, Need.NONE, m.AllocClientUpdate(allocs=states))
    return {"Index": result["index"], "Updated": result["value"]["updated"], "Ignored": result["value"]["ignored"]}


async def _check_alloc_nodes(server: ServerAPI, ctx: RequestContext, alloc_ids: set[str]) -> None:
    """Authenticate an update as the nodes its allocs run on; unknown allocs are the FSM's to ignore."""
    hashed = hash_secret(ctx.token) if ctx.token else ""

    def owners(r: StateReader) -> tuple[list[Node], bool]:
        node_ids = {a.node_id for a in map(r.alloc, sorted(alloc_ids)) if a is not None}
        nodes = [n for n in map(r.node, sorted(node_ids)) if n is not None]
        return nodes, len(nodes) < len(node_ids)

    nodes, orphans = await server.local(owners)
    for node in nodes:
        if node.secret_hash and node.secret_hash != hashed:
            check_node_secret(node, ctx.token)  # raises, naming the node
    if orphans or any(not n.secret_hash for n in nodes):
        await server.authorize(ctx, Need.WRITE)
