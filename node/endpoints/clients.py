"""RPC methods that reach client nodes: a forced client GC (Nomad's ``/v1/client/gc`` routes).

Servers never call clients (clients talk to servers, and follow the event
stream), so a request for clients is written as a ``ClientGC`` entry: the
FSM journals it under the ``ClientGC`` topic and every client that follows
the stream acts on the requests for its nodes. Being in the log, it
survives a leader change and reaches clients connected to followers; it is
asynchronous, as Nomad's forced GC is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm import messages as m
from fsm.structs import CLIENT_TERMINAL, Allocation
from node.core.acl import Need
from node.core.context import RequestContext
from node.endpoints.registry import arg, by_prefix, id_arg, method
from node.wire.errors import NOT_FOUND, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


@method("client.gc")
async def client_gc(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Ask one node (``node_id``, an id or unique prefix) or every node (none) to collect its terminal allocs now."""
    node_id = arg(args, "node_id", required=False, default="")
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists
    if node_id:
        node = await server.local(lambda r: by_prefix(r.node, r.nodes, node_id))
        if node is None:
            raise RPCError(NOT_FOUND, f"node {node_id} not found")
        node_id = node.id
    result = await server.write(ctx, Need.WRITE, m.ClientGC(node_id=node_id))
    return {"Index": result["index"], "NodeID": node_id}


@method("client.allocation.gc")
async def client_allocation_gc(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Ask an alloc's node to collect that alloc now; a live alloc is kept (as Nomad's client keeps it).

    ``Terminal`` in the answer says whether the servers see it terminal, so
    a caller can tell the user that a running alloc will not be collected.
    """
    alloc_id = id_arg(args, "alloc_id")
    await server.authorize(ctx, Need.WRITE)
    alloc: Allocation | None = await server.local(lambda r: by_prefix(r.alloc, r.allocs, alloc_id))
    if alloc is None:
        raise RPCError(NOT_FOUND, f"allocation {alloc_id} not found")
    result = await server.write(
        ctx, Need.WRITE, m.ClientGC(node_id=alloc.node_id, alloc_id=alloc.id)
    )
    terminal = alloc.client_status in CLIENT_TERMINAL
    return {
        "Index": result["index"],
        "NodeID": alloc.node_id,
        "AllocID": alloc.id,
        "Terminal": terminal,
    }
