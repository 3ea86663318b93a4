"""Node heartbeats: TTLs on the leader, ``node.heartbeat`` for clients, node evals.

Clients heartbeat each of their nodes within ``heartbeat_ttl`` (the answer
tells them the TTL). The leader remembers the last heartbeat per node in
memory (``ServerAPI.heartbeat``); a node silent for ``ttl + grace`` is marked
down in one entry together with a ``node-update`` evaluation for every job
that has live allocs on it, so the scheduler marks those allocs lost and
replaces them — no window in which the node is down but nobody is asked to
act. A node that heartbeats while down is marked ready again.

The TTLs live only on the leader: a new leader starts every node with a
fresh TTL (it cannot know how long a node was silent before it took over),
which is also what happens to a node it has not heard from yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from fsm import codec
from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import NODE_DOWN, Evaluation, Job
from node.core.heartbeats import Heartbeats
from node.leader.shims import NodeView, RaftApplier, StateReads
from node.wire.errors import RPCError
from scheduler.evals import new_eval

TRIGGER_NODE_UPDATE = "node-update"
TRIGGER_NODE_DRAIN = "node-drain"


def jobs_on_node(reader: StateReader, node_id: str) -> list[Job]:
    """Jobs with live allocs on ``node_id``."""
    ids = sorted({a.job_id for a in reader.allocs_by_node(node_id, terminal=False)})
    return [j for j in map(reader.job, ids) if j is not None]


def system_jobs(reader: StateReader) -> list[Job]:
    return [j for j in reader.jobs() if j.type == "system" and not j.stop]


def node_down_evals(reader: StateReader, node_id: str) -> list[Evaluation]:
    """One eval per job with live allocs on the node (their allocs are now lost)."""
    return [new_eval(j, TRIGGER_NODE_UPDATE, node_id=node_id) for j in jobs_on_node(reader, node_id)]


def node_up_evals(reader: StateReader, node_id: str) -> list[Evaluation]:
    """One eval per system job: a node that became usable should run them."""
    return [new_eval(j, TRIGGER_NODE_UPDATE, node_id=node_id) for j in system_jobs(reader)]


def node_drain_evals(reader: StateReader, node_id: str) -> list[Evaluation]:
    return [new_eval(j, TRIGGER_NODE_DRAIN, node_id=node_id) for j in jobs_on_node(reader, node_id)]


def eval_chunks(evals: list[Evaluation], budget: int, most: int | None = None) -> list[list[Evaluation]]:
    """``evals`` in runs (of at most ``most``) whose encoded sizes add up to at most ``budget`` bytes.

    What one raft entry can carry: a node or a leader with more to say than
    one entry holds writes several (an eval larger than the budget goes alone).
    """
    chunks: list[list[Evaluation]] = []
    run: list[Evaluation] = []
    used = 0
    for ev in evals:
        size = len(codec.encode(ev))
        if run and (used + size > budget or (most is not None and len(run) >= most)):
            chunks.append(run)
            run, used = [], 0
        run.append(ev)
        used += size
    if run:
        chunks.append(run)
    return chunks


class HeartbeatMonitor:
    """Marks nodes down when their TTL (plus grace) runs out; leader only."""

    def __init__(
        self,
        state: StateReads,
        raft: RaftApplier,
        heartbeats: Heartbeats,
        nodes: Mapping[str, NodeView],
        *,
        ttl: float,
        grace: float,
        max_entry_bytes: int,
        log: Any,
    ) -> None:
        self.state = state
        self.raft = raft
        self.heartbeats = heartbeats
        self.nodes = nodes  # the lifecycle's live view, kept current from the journal
        self.ttl = ttl
        self.grace = grace
        self.max_entry_bytes = max_entry_bytes
        self.marking: set[str] = set()
        self.log = log.bind(component="heartbeat")

    def last(self, node_id: str) -> float | None:
        return self.heartbeats.last(node_id)

    def expired(self, now: float) -> list[str]:
        """Nodes past ttl + grace; nodes never heard of in this term get a fresh TTL."""
        out = []
        for node_id, view in sorted(self.nodes.items()):
            if view.status == NODE_DOWN or node_id in self.marking:
                continue
            last = self.last(node_id)
            if last is None:
                self.heartbeats.beat(node_id)
                continue
            if now - last > self.ttl + self.grace:
                out.append(node_id)
        return out

    async def run(self) -> None:
        interval = max(0.05, min(1.0, self.ttl / 4))
        while True:
            await asyncio.sleep(interval)
            for node_id in self.expired(time.monotonic()):
                self.marking.add(node_id)
                asyncio.ensure_future(self._mark_down(node_id))

    async def _mark_down(self, node_id: str) -> None:
        try:
            evals = await self.state.local(lambda r: node_down_evals(r, node_id))
            # A node running many jobs needs more evals than one raft entry holds:
            # the entry carries those that fit, and the leader's tail gives every
            # other job on the node its eval when it sees the node go down.
            chunks = eval_chunks(evals, self.max_entry_bytes // 2)
            evals = chunks[0] if chunks else []
            await self.raft.propose(
                m.NodeUpdateStatus(node_id=node_id, status=NODE_DOWN, status_description="node heartbeat missed", evals=evals)
            )
            self.log.info("node missed its heartbeat; marked down", node=node_id, evals=len(evals))
        except RPCError as exc:
            self.log.warning("could not mark node down; retrying", node=node_id, error=str(exc))
            self.heartbeats.forget(node_id)  # a fresh TTL before the next try
        finally:
            self.marking.discard(node_id)


