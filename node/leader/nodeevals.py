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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fsm import codec
from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import NODE_DOWN, Evaluation, Job
from scheduler.evals import new_eval

TRIGGER_NODE_UPDATE = "node-update"
TRIGGER_NODE_DRAIN = "node-drain"  # the drainer's evals
# Most nodes one mark-down entry names. Its apply (every server, in log order)
# delays the client writes behind it: ~20 us per node, so ~5 ms at 250.
NODES_PER_BATCH = 250
DOWN_DESCRIPTION = "node heartbeat missed"
_NODE_ID_COST = 48  # encoded bytes a node id adds to a batch (a 36-character id and framing)


def job_ids_on_node(reader: StateReader, node_id: str) -> list[str]:
    """Ids of the jobs with live allocs on ``node_id``, in order."""
    return sorted({a.job_id for a in reader.alloc_statuses_by_node(node_id, terminal=False)})


def jobs_on_node(reader: StateReader, node_id: str) -> list[Job]:
    """Jobs with live allocs on ``node_id``."""
    return [j for j in map(reader.job, job_ids_on_node(reader, node_id)) if j is not None]


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

    def __init__(self, given: set[str]) -> None:
        self.node_ids: list[str] = []
        self.evals: dict[str, Evaluation] = {}
        self.given = given  # jobs an earlier entry of the pass gave an eval
        self.used = 0

    def fresh(
        self, reader: StateReader, node_id: str, job_ids: list[str]
    ) -> tuple[list[Evaluation], int]:
        """The evals a node with these jobs adds (jobs not yet covered), and the bytes it adds.

        A job is covered by this entry's eval, or by one an earlier entry of
        the pass gave it (``given``). Only jobs not yet covered are read: in a storm most of a node's jobs
        already have the batch's eval, and decoding each again for every
        node was most of the monitor's (GIL-holding) work.
        """
        todo = [job_id for job_id in job_ids if job_id not in self.evals and job_id not in self.given]
        jobs = [j for j in map(reader.job, todo) if j is not None]
        evals = [new_eval(j, TRIGGER_NODE_UPDATE, node_id=node_id) for j in jobs]
        return evals, _NODE_ID_COST + sum(len(codec.encode(ev)) for ev in evals)

    def add(self, node_id: str, evals: list[Evaluation], cost: int) -> None:
        self.node_ids.append(node_id)
        for ev in evals:
            self.evals[ev.job_id] = ev
        self.used += cost

    def entry(self, budget: int) -> m.NodeBatchUpdateStatus:
        """The entry; flagged ``evals_complete`` unless its one node's evals had to be cut to fit."""
        evals = list(self.evals.values())
        complete = True
        if self.used > budget:  # one node alone with more jobs than an entry holds
            chunks = eval_chunks(evals, budget - _NODE_ID_COST)
            complete = len(chunks) <= 1
            evals = chunks[0] if chunks else []
        return m.NodeBatchUpdateStatus(
            node_ids=self.node_ids,
            status=NODE_DOWN,
            status_description=DOWN_DESCRIPTION,
            evals=evals,
            evals_complete=complete,
        )


def mark_down_budget(max_entry_bytes: int) -> int:
    """Bytes of node ids and evals one mark-down entry may carry: most of an entry.

    One node's evals must fit: a client running allocs of 190 jobs needs
    ~28 KB of them, and a node that fits no entry goes alone with its evals
    cut, which the leader's tail then reads again (at 1M objects, 2,000 such
    entries for 2,000 lost nodes). The eighth left over covers the envelope
    and the framing the size estimate leaves out.
    """
    return max_entry_bytes * 7 // 8


def down_batches(
    reader: StateReader,
    node_ids: Iterable[str],
    *,
    budget: int,
    most: int = NODES_PER_BATCH,
    given: set[str] | None = None,
) -> list[m.NodeBatchUpdateStatus]:
    """Mark-down entries for ``node_ids`` (in order): each under ``budget`` bytes, one eval per job per entry.

    ``given``: the jobs earlier entries of the same pass gave an eval, which
    this call adds to. A job in it gets no eval again: one eval per job per
    pass, however many entries the pass takes (nodes that ran many jobs fill
    an entry with evals each, and would repeat the same jobs' evals in every
    one). It is only right while no eval reaches the scheduler until the
    pass's last entry has committed, so that each sees every node of the
    pass down: the heartbeat monitor passes it only under the broker's hold.

    A node whose jobs alone need more evals than one entry holds goes in an
    entry of its own with the evals that fit, not flagged ``evals_complete``;
    the leader's tail gives every other job on it an eval when it sees the
    node go down, as for a single node. Every other entry is flagged, so the
    tail need not read its nodes' allocs again (see ``CoveredDowns``). Each
    eval names the first node of its batch that the job ran on.
    """
    out: list[m.NodeBatchUpdateStatus] = []

    def close(batch: _Batch) -> None:
        msg = batch.entry(budget)
        if given is not None:
            given.update(ev.job_id for ev in msg.evals)
        out.append(msg)

    def fresh_batch() -> _Batch:
        return _Batch(set() if given is None else given)  # without ``given``: each entry on its own

    batch = fresh_batch()
    for node_id in node_ids:
        job_ids = job_ids_on_node(reader, node_id)
        evals, cost = batch.fresh(reader, node_id, job_ids)
        if batch.node_ids and (batch.used + cost > budget or len(batch.node_ids) >= most):
            close(batch)
            batch = fresh_batch()
            evals, cost = batch.fresh(reader, node_id, job_ids)
        batch.add(node_id, evals, cost)
    if batch.node_ids:
        close(batch)
    return out


@dataclass
class _Claim:
    """A flagged mark-down of one node: the index its evals were read at, and the entry's once committed."""

    read_at: int
    index: int = 0  # 0 while the entry is in flight


class CoveredDowns:
    """Which down nodes already got every eval they need, so the leader's tail skips reading their allocs.

    A flagged mark-down entry (``evals_complete``) carries an eval for every
    job with live allocs on its nodes, as the monitor read them at
    ``read_at``; after a storm the tail would otherwise read every down
    node's allocs again (``node_down_evals``) only to find those evals queued.
    The flag reaches the tail through this per-term object, not the journal:
    the journal shows subscribers the same records either way, and the FSM
    ignores the flag (it only spares the leader work). The monitor ``open``s
    a claim per node before it proposes a flagged entry and ``confirm``s it
    with the entry's index (or ``drop``s it if the proposal failed); the tail
    skips a node only if it went down at exactly that index, and no live
    alloc landed on it after ``read_at`` (a plan committed between the
    monitor's read and its entry: that job has no eval in the entry). Claims
    still in flight make the tail wait (``waiting``); anything it cannot
    prove covered is read as before, so an unflagged entry (every old one)
    is handled exactly as it was.
    """

    def __init__(self) -> None:
        self._claims: dict[str, _Claim] = {}
        self._live_at: dict[str, int] = {}  # node id -> newest index with a live alloc record on it
        self._since: int | None = None  # the tail saw every journal batch after this index

    # -- the heartbeat monitor's side -------------------------------------------
    def open(self, msg: m.NodeBatchUpdateStatus, read_at: int) -> None:
        """Before proposing ``msg`` (built from state at ``read_at``): claim its nodes if it is flagged."""
        if msg.evals_complete:
            for node_id in msg.node_ids:
                self._claims[node_id] = _Claim(read_at)

    def confirm(self, msg: m.NodeBatchUpdateStatus, index: int, changed: Sequence[str]) -> None:
        """``msg`` committed at ``index`` and changed ``changed``; a node it skipped keeps no claim."""
        went_down = set(changed)
        for node_id in msg.node_ids:
            claim = self._claims.get(node_id)
            if claim is None or claim.index:
                continue
            if node_id in went_down:
                claim.index = index
            else:
                del self._claims[node_id]

    def drop(self, node_ids: Iterable[str]) -> None:
        """The proposal failed: its claims go (should it commit after all, the tail reads those nodes)."""
        for node_id in node_ids:
            claim = self._claims.get(node_id)
            if claim is not None and not claim.index:
                del self._claims[node_id]

    # -- the tail's side ------------------------------------------------------------
    def following_from(self, index: int) -> None:
        """The tail rebuilt at ``index``: it has seen no alloc record before it."""
        self._since = index
        self._live_at.clear()

    def live_alloc(self, node_id: str, index: int) -> None:
        """A live alloc record on ``node_id`` at ``index`` (a placement the monitor may not have read)."""
        self._live_at[node_id] = index

    def forget_node(self, node_id: str) -> None:
        self._live_at.pop(node_id, None)
        self._claims.pop(node_id, None)

    def waiting(self, node_id: str) -> bool:
        """Whether a flagged entry for ``node_id`` is still in flight (the tail decides once it is answered)."""
        claim = self._claims.get(node_id)
        return claim is not None and not claim.index

    def covered(self, node_id: str, down_at: int) -> bool:
        """Whether the entry that marked ``node_id`` down at ``down_at`` carried every eval the node needs.

        Consumes the claim of that entry (and drops one older than it).
        """
        claim = self._claims.get(node_id)
        if claim is None or not claim.index or claim.index > down_at:
            return False
        del self._claims[node_id]
        if claim.index < down_at or self._since is None or claim.read_at < self._since:
            return False
        return self._live_at.get(node_id, 0) <= claim.read_at
