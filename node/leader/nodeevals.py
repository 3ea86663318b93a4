"""The evals a node change needs, and how many of them fit one raft entry.

One home for the rule "a node that went down gets an eval for every job
with live allocs on it" (the heartbeat monitor writes them with the
mark-down; the lifecycle's tail fills in any that did not fit), for the
system-job evals of a node that became usable, and for the size budget of
the leader's own eval writes.

``down_batches`` is what keeps a mass expiry cheap. Nomad writes one
entry per node, each with one eval per job on it: 2,000 silent nodes
running 159 jobs each are 2,000 entries and 318,000 evals, nearly all of
which the broker then cancels as superseded. Here a batch of nodes goes
down in one ``NodeBatchUpdateStatus`` entry with one eval per affected job,
and only as many entries as the entry size limit needs.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsm import codec
from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import NODE_DOWN, Evaluation, Job
from scheduler.evals import new_eval

TRIGGER_NODE_UPDATE = "node-update"
TRIGGER_NODE_DRAIN = "node-drain"  # the drainer's evals
NODES_PER_BATCH = 1000  # most nodes one mark-down entry names
DOWN_DESCRIPTION = "node heartbeat missed"
_NODE_ID_COST = 48  # encoded bytes a node id adds to a batch (a 36-character id and framing)


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


class _Batch:
    """One mark-down entry being filled: its nodes, and one eval per job they run."""

    def __init__(self) -> None:
        self.node_ids: list[str] = []
        self.evals: dict[str, Evaluation] = {}
        self.used = 0

    def fresh(self, node_id: str, jobs: list[Job]) -> tuple[list[Evaluation], int]:
        """The evals a node with these jobs adds (jobs not yet covered), and the bytes it adds."""
        evals = [new_eval(j, TRIGGER_NODE_UPDATE, node_id=node_id) for j in jobs if j.id not in self.evals]
        return evals, _NODE_ID_COST + sum(len(codec.encode(ev)) for ev in evals)

    def add(self, node_id: str, evals: list[Evaluation], cost: int) -> None:
        self.node_ids.append(node_id)
        for ev in evals:
            self.evals[ev.job_id] = ev
        self.used += cost

    def entry(self, budget: int) -> m.NodeBatchUpdateStatus:
        evals = list(self.evals.values())
        if self.used > budget:  # one node alone with more jobs than an entry holds
            chunks = eval_chunks(evals, budget - _NODE_ID_COST)
            evals = chunks[0] if chunks else []
        return m.NodeBatchUpdateStatus(node_ids=self.node_ids, status=NODE_DOWN, status_description=DOWN_DESCRIPTION, evals=evals)


def down_batches(
    reader: StateReader, node_ids: Iterable[str], *, budget: int, most: int = NODES_PER_BATCH
) -> list[m.NodeBatchUpdateStatus]:
    """Mark-down entries for ``node_ids`` (in order): each under ``budget`` bytes, one eval per job per entry.

    A node whose jobs alone need more evals than one entry holds goes in an
    entry of its own with the evals that fit; the leader's tail gives every
    other job on it an eval when it sees the node go down, as for a single
    node. Each eval names the first node of its batch that the job ran on.
    """
    out: list[m.NodeBatchUpdateStatus] = []
    batch = _Batch()
    for node_id in node_ids:
        jobs = jobs_on_node(reader, node_id)
        evals, cost = batch.fresh(node_id, jobs)
        if batch.node_ids and (batch.used + cost > budget or len(batch.node_ids) >= most):
            out.append(batch.entry(budget))
            batch = _Batch()
            evals, cost = batch.fresh(node_id, jobs)
        batch.add(node_id, evals, cost)
    if batch.node_ids:
        out.append(batch.entry(budget))
    return out
