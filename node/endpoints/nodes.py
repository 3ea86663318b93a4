"""RPC methods for client nodes: register, status, eligibility and reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsm import codec
from fsm import messages as m
from fsm.errors import CodecError
from fsm.structs import (
    NODE_DOWN,
    NODE_ELIGIBLE,
    NODE_INELIGIBLE,
    NODE_READY,
    NODE_STATUSES,
    DrainStrategy,
    Node,
)
from node.core.acl import Need, check_node_secret, hash_secret
from node.core.api import Forward
from node.core.context import RequestContext
from node.core.paging import table_rows
from node.core.writes import CLIENT
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, bad, by_prefix, found, id_arg, method
from node.spec.nomadjson import from_nomad, to_nomad
from node.wire.errors import BAD_REQUEST, NOT_FOUND, RPCError
from node.wire.messages import MAX_HEARTBEAT_IDS

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- nodes ---------------------------------------------------------------------------
@method("node.register")
async def node_register(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Register (or re-register) a node; as Nomad's Node.Register, it counts as a heartbeat.

    The client chooses the node's ``SecretID`` (as Nomad's client does) and
    only its hash is stored; a node registered with one must present the
    same one to register again, and is refused otherwise, ACLs on or off. A
    registration without one (older callers) needs node:write once ACLs are on.
    The answer's ``HeartbeatTTL`` is the TTL granted (the write ran on the
    leader: a follower forwards the whole request).
    """
    raw = args.get("node")
    secret = None
    if isinstance(raw, dict):
        raw = dict(raw)
        secret = raw.pop("SecretID", None)
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise bad("node SecretID must be a non-empty string")
    if isinstance(raw, dict) and isinstance(raw.get("Resources"), dict):
        raw["Resources"] = {**raw["Resources"], "Devices": device_counts(raw["Resources"].get("Devices"))}
    try:
        node = codec.from_wire(Node, from_nomad(raw), "Node")
    except CodecError as exc:
        raise bad(f"invalid node: {exc}") from None
    node.status = node.status if node.status in NODE_STATUSES else NODE_READY
    node.secret_hash = hash_secret(secret) if secret else ""
    server.ensure_leader()
    old = await server.local(lambda r: r.node(node.id))
    if old is not None and old.secret_hash:
        check_node_secret(old, secret)
    need = Need.NONE if secret else Need.WRITE
    result = await server.write(ctx, need, m.NodeRegister(node=node))
    answer = {"Index": result["index"], "NodeID": node.id}
    if node.status != NODE_DOWN:
        answer["HeartbeatTTL"] = server.heartbeats.grant((node.id,), server.config.scheduler)
    return answer


def device_counts(devices: Any) -> Any:
    """A node's devices as the ``vendor/type[/model]`` -> count map it is kept as.

    The map is taken as it is (what ``caravan client sim --device`` sends);
    Nomad's NodeDeviceResource list (``{"Vendor", "Type", "Name", "Instances"}``,
    as ``/v1/node/:id`` serves it) counts each group's healthy instances, named
    ``vendor/type/name``, or ``vendor/type`` when the name is empty or the type
    (how a node that names no model is served). Anything else is left for the
    decoder to refuse.
    """
    if devices is None:
        return {}
    if not isinstance(devices, list):
        return devices
    out: dict[str, int] = {}
    for group in devices:
        if not isinstance(group, dict):
            raise bad("node Resources.Devices: expected a list of {Vendor, Type, Name, Instances}")
        vendor, kind, name = (str(group.get(k) or "") for k in ("Vendor", "Type", "Name"))
        key = f"{vendor}/{kind}" if name in ("", kind) else f"{vendor}/{kind}/{name}"
        instances = group.get("Instances") or []
        healthy = sum(1 for i in instances if isinstance(i, dict) and i.get("Healthy", True))
        out[key] = out.get(key, 0) + healthy
    return out


@method("node.status")
async def node_status(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A heartbeat (status ready) or an operator marking a node down.

    A heartbeat of a node with a secret needs that secret (the request's
    token); marking a node down takes its secret or an operator's node:write.
    Served by the leader (a follower forwards it): heartbeat TTLs live only
    on the leader, and the leader's state already has a just-registered node.
    """
    node_id = id_arg(args, "node_id")
    new = arg(args, "status", required=False, default=NODE_READY)
    if new not in (NODE_READY, NODE_DOWN):
        raise bad("argument 'status' must be ready or down")
    server.ensure_leader()
    node = await server.local(lambda r: r.node(node_id))
    by_node = bool(node is not None and node.secret_hash and ctx.token and node.secret_hash == hash_secret(ctx.token))
    if node is not None and node.secret_hash and new == NODE_READY:
        check_node_secret(node, ctx.token)
    elif not by_node:
        await server.authorize(ctx, Need.WRITE)
    if node is None:
        raise RPCError(NOT_FOUND, f"node {node_id} not found; register it first")
    index = node.modify_index
    if node.status != new:
        entry = m.NodeUpdateStatus(node_id=node_id, status=new)
        index = (await server.write(ctx, Need.NONE if by_node else Need.WRITE, entry))["index"]
    if new == NODE_DOWN:
        server.heartbeats.forget(node_id)  # down already: nothing to expire
        return {"Index": index, "NodeID": node_id}
    return {"Index": index, "NodeID": node_id, "HeartbeatTTL": server.heartbeats.grant((node_id,), server.config.scheduler)}


@method("node.eligibility")
async def node_eligibility(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    node_id = id_arg(args, "node_id")
    value = arg(args, "eligibility")
    if value not in (NODE_ELIGIBLE, NODE_INELIGIBLE):
        raise bad("argument 'eligibility' must be eligible or ineligible")
    result = await server.write(ctx, Need.WRITE, m.NodeUpdateEligibility(node_id=node_id, eligibility=value))
    return {"Index": result["index"], "NodeID": node_id}


@method("node.get")
async def node_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    node_id = id_arg(args, "node_id")
    return await server.read(
        ctx, args, ("nodes",), lambda r: _view(found(by_prefix(r.node, r.nodes, node_id), f"node {node_id}")), point=True
    )


@method("node.list")
async def node_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of nodes in id order (``prefix``, ``per_page``, ``next_token``, ``filter``, ``reverse``)."""
    rows = lambda r, req: table_rows(r, "nodes", req)  # noqa: E731
    return await list_page(server, ctx, args, ("nodes",), rows, view=lambda n: _view(to_nomad(n)))


@method("node.heartbeat")
async def node_heartbeat(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Heartbeat many nodes at once: {node_ids: [...]} -> {HeartbeatTTL, Unknown, Index}.

    Served by the leader (followers forward), since only the leader keeps
    TTLs. ``HeartbeatTTL`` is the TTL granted to every node of the call
    (``node.core.heartbeats``: it grows with the cluster, with jitter);
    the leader marks a node down once that TTL plus the grace has passed
    without another beat. A node that was marked down and heartbeats again
    is marked ready.
    """

    ids = args.get("node_ids")
    if not isinstance(ids, list) or not ids or len(ids) > MAX_HEARTBEAT_IDS or not all(isinstance(i, str) and i for i in ids):
        raise RPCError(BAD_REQUEST, f"argument 'node_ids' must be a non-empty list of at most {MAX_HEARTBEAT_IDS} node IDs")
    if not server.raft.is_leader:
        raise Forward(server.leader_rpc())
    with server.fsm.read() as reader:
        nodes = {node_id: reader.node(node_id) for node_id in ids}
        index = reader.table_index("nodes")
    await _check_node_secrets(server, ctx, [n for n in nodes.values() if n is not None])
    unknown = [node_id for node_id, node in nodes.items() if node is None]
    down = [node_id for node_id, node in nodes.items() if node is not None and node.status == NODE_DOWN]
    # Granted before the revivals commit: a down node with a deadline is still
    # down to the monitor, and one that is revived has its deadline already.
    ttl = server.heartbeats.grant([node_id for node_id, node in nodes.items() if node is not None], server.config.scheduler)
    for node_id in down:
        result = await server.propose(
            m.NodeUpdateStatus(node_id=node_id, status=NODE_READY, status_description="node heartbeat received"),
            lane=CLIENT,
        )
        index = max(index, result["index"])
    return {"HeartbeatTTL": ttl, "Unknown": unknown, "Index": index}


async def _check_node_secrets(server: ServerAPI, ctx: RequestContext, nodes: list[Node]) -> None:
    """Every node with a secret must have the request's token as its secret; the others need node:write.

    All or nothing: one wrong secret refuses the whole call before it changes anything.
    """
    secured = [n for n in nodes if n.secret_hash]
    if secured:
        hashed = hash_secret(ctx.token) if ctx.token else ""
        for node in secured:
            if node.secret_hash != hashed:
                check_node_secret(node, ctx.token)  # raises, naming the node
    if len(secured) < len(nodes):
        await server.authorize(ctx, Need.WRITE)


def _view(node: dict[str, Any]) -> dict[str, Any]:
    """A node as reads show it: never its secret, not even hashed."""
    node.pop("SecretHash", None)
    return node


def _drain_spec(args: dict[str, Any]) -> DrainStrategy | None:
    spec = args.get("drain_spec")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise RPCError(BAD_REQUEST, "argument 'drain_spec' must be a map with Deadline and IgnoreSystemJobs, or null")
    unknown = set(spec) - {"Deadline", "IgnoreSystemJobs"}
    if unknown:
        raise RPCError(BAD_REQUEST, f"drain_spec: unknown fields {sorted(unknown)}; known: Deadline, IgnoreSystemJobs")
    deadline = spec.get("Deadline", 0)
    if not isinstance(deadline, int) or isinstance(deadline, bool):
        raise RPCError(BAD_REQUEST, "drain_spec.Deadline must be an integer of nanoseconds (< 0 forces, 0 has none)")
    ignore = spec.get("IgnoreSystemJobs", False)
    if not isinstance(ignore, bool):
        raise RPCError(BAD_REQUEST, "drain_spec.IgnoreSystemJobs must be a bool")
    return DrainStrategy(deadline=deadline, ignore_system_jobs=ignore)


@method("node.drain")
async def node_drain(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Start or change a node's drain (``drain_spec``), or end it (null), as Nomad's Node.UpdateDrain.

    ``mark_eligible`` opens the node again when the drain ends.
    """
    node_id = id_arg(args, "node_id")
    strategy = _drain_spec(args)
    mark_eligible = args.get("mark_eligible", False)
    if not isinstance(mark_eligible, bool):
        raise RPCError(BAD_REQUEST, "argument 'mark_eligible' must be a bool")
    if strategy is not None and mark_eligible:
        raise RPCError(BAD_REQUEST, "mark_eligible only applies when a drain ends (drain_spec null)")
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists
    node = await server.local(lambda r: by_prefix(r.node, r.nodes, node_id))
    if node is None:
        raise RPCError(NOT_FOUND, f"node {node_id} not found")
    entry = m.NodeUpdateDrain(node_id=node.id, strategy=strategy, mark_eligible=mark_eligible)
    result = await server.write(ctx, Need.WRITE, entry)
    return {"NodeID": node.id, "NodeModifyIndex": result["index"], "EvalIDs": [], "Index": result["index"]}
