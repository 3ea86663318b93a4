"""Requests for client nodes: a forced client GC, journalled for the clients to act on.

Nothing in the state changes: the entry's effect is its journal record
(``TOPIC_CLIENT_GC``), which every replica writes alike, so a client
following any server reads it exactly once.
"""

from __future__ import annotations

from typing import Any

from fsm import messages as m
from fsm.apply.rejects import not_found
from fsm.topics import CLIENT_GC_REQUESTED, TOPIC_CLIENT_GC
from fsm.validate import bad
from fsm.writer import StateWriter


def client_gc(w: StateWriter, msg: m.ClientGC) -> dict[str, Any]:
    """Journal a client GC request for one node ("" for every node), or for one alloc on its node."""
    node_id = msg.node_id
    if node_id and w.node(node_id) is None:
        raise not_found(f"node {node_id} not found")
    if msg.alloc_id:
        alloc = w.alloc(msg.alloc_id)
        if alloc is None:
            raise not_found(f"allocation {msg.alloc_id} not found")
        if node_id and alloc.node_id != node_id:
            raise bad(f"allocation {msg.alloc_id} is on node {alloc.node_id}, not {node_id}")
        node_id = alloc.node_id
    w.record(
        TOPIC_CLIENT_GC,
        CLIENT_GC_REQUESTED,
        node_id,
        {"node_id": node_id, "alloc_id": msg.alloc_id, "index": w.index},
    )
    return {"node_id": node_id, "alloc_id": msg.alloc_id}
