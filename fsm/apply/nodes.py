"""Client nodes: registration, status (heartbeats), scheduling eligibility and drains.

A GC reap of down nodes is in ``fsm.apply.reaps``.
"""

from __future__ import annotations

from typing import Any

from fsm import messages as m
from fsm.apply.evals import upsert_evals
from fsm.apply.rejects import conflict, not_found
from fsm.record import copy_record
from fsm.structs import NODE_ELIGIBLE, NODE_INELIGIBLE, DrainStrategy, Node
from fsm.validate import bad, check_eligibility, check_node, check_node_status
from fsm.writer import StateWriter


def node_register(w: StateWriter, msg: m.NodeRegister) -> dict[str, Any]:
    """Store a node as its client describes it, keeping what the operator set on it."""
    check_node(msg.node)
    old = w.node(msg.node.id)
    if old is not None:
        # As Nomad's upsertNodeTxn: a client registering again (a restart) keeps what the
        # operator set, so a node closed for maintenance does not reopen by itself.
        msg.node.scheduling_eligibility = old.scheduling_eligibility
        msg.node.drain = old.drain
        msg.node.drain_strategy = old.drain_strategy
    w.put_node(msg.node, old, "NodeRegistration")
    return {"node_id": msg.node.id}


def node_update_status(w: StateWriter, msg: m.NodeUpdateStatus) -> dict[str, Any]:
    """A node's status (ready, down, ...), with the evals that move its allocs."""
    check_node_status(msg.node_id, msg.status)
    node = w.node(msg.node_id)
    if node is None:
        raise not_found(f"node {msg.node_id} not found")
    _set_status(w, node, msg.status, msg.status_description)
    return {"node_id": node.id, "eval_ids": upsert_evals(w, msg.evals)}


def _set_status(w: StateWriter, node: Node, status: str, description: str) -> None:
    """One node's status change and its journal record (single and batched updates alike)."""
    old = copy_record(node)
    node.status = status
    node.status_description = description
    w.put_node(node, old, "NodeStatusUpdate")


def node_batch_update_status(w: StateWriter, msg: m.NodeBatchUpdateStatus) -> dict[str, Any]:
    """Many nodes to one status (the heartbeat monitor's batched mark-downs), with one eval per job.

    Nodes that are gone or already have the status are skipped and named in
    the answer; the rest change, each with its own journal record, so caches
    and the leader's tail see exactly what one entry per node would show.
    """
    if not msg.node_ids:
        raise bad("a batch status update names no nodes")
    if len(set(msg.node_ids)) != len(msg.node_ids):
        raise bad("a batch status update names a node more than once")
    for node_id in msg.node_ids:
        check_node_status(node_id, msg.status)
    changed: list[str] = []
    skipped: list[str] = []
    for node_id in msg.node_ids:
        node = w.node(node_id)
        if node is None or node.status == msg.status:
            skipped.append(node_id)
            continue
        _set_status(w, node, msg.status, msg.status_description)
        changed.append(node_id)
    return {"node_ids": changed, "skipped": skipped, "eval_ids": upsert_evals(w, msg.evals)}


def node_update_eligibility(w: StateWriter, msg: m.NodeUpdateEligibility) -> dict[str, Any]:
    """Open or close a node to new placements; a draining node cannot be opened."""
    check_eligibility(msg.node_id, msg.eligibility)
    node = w.node(msg.node_id)
    if node is None:
        raise not_found(f"node {msg.node_id} not found")
    if msg.eligibility == NODE_ELIGIBLE and (node.drain if msg.drain is None else msg.drain):
        raise bad(f"node {node.id} is draining: it cannot be made eligible until the drain ends")
    old = copy_record(node)
    node.scheduling_eligibility = msg.eligibility
    if msg.drain is not None:  # the older way to drain: no deadline
        node.drain = msg.drain
        node.drain_strategy = (node.drain_strategy or DrainStrategy(started_at=w.now)) if msg.drain else None
    w.put_node(node, old, "NodeEligibility")
    return {"node_id": node.id, "eval_ids": upsert_evals(w, msg.evals)}


def node_update_drain(w: StateWriter, msg: m.NodeUpdateDrain) -> dict[str, Any]:
    """Start, change or end a node's drain, as Nomad's UpdateNodeDrain.

    The drain's clock is the state's: it starts at the entry's time (a
    change keeps the first start) and a deadline runs from the entry that
    set it, so every replica agrees when the deadline passes.
    """
    node = w.node(msg.node_id)
    if node is None:
        raise not_found(f"node {msg.node_id} not found")
    current = node.drain_strategy
    if msg.done_started_at and (current is None or current.started_at != msg.done_started_at):
        raise conflict(f"node {node.id}: the drain that finished is no longer the node's")
    old = copy_record(node)
    if msg.strategy is None:
        node.drain = False
        node.drain_strategy = None
        if msg.mark_eligible:
            node.scheduling_eligibility = NODE_ELIGIBLE
    else:
        strategy = copy_record(msg.strategy)
        strategy.started_at = current.started_at if current is not None else w.now
        strategy.force_deadline = w.now + strategy.deadline if strategy.deadline > 0 else 0
        node.drain = True
        node.drain_strategy = strategy
        node.scheduling_eligibility = NODE_INELIGIBLE
    w.put_node(node, old, "NodeDrain")
    return {"node_id": node.id, "eval_ids": upsert_evals(w, msg.evals)}
