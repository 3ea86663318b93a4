"""The tail reads no allocs for nodes whose mark-down entry carried every eval they need.

After a batched mark-down the lifecycle's tail used to read every down
node's allocs again (``node_down_evals``) only to find its jobs' evals
already queued. A ``NodeBatchUpdateStatus`` flagged ``evals_complete`` spares
that: the heartbeat monitor claims its nodes (``nodeevals.CoveredDowns``) and
the tail skips them. These tests run a real ``Lifecycle`` tail and heartbeat
monitor over a real FSM (the fake server applies proposals in-process) and
count the tail's per-node alloc reads through its one seam,
``lifecycle.node_down_evals``: none for a flagged entry; one per node, with
the evals it adds, for an unflagged one (every entry written before the
flag) and for a flagged one that a placement overtook.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from fsm import messages as m
from fsm.messages import encode_entry
from fsm.store import StateReader
from fsm.structs import EVAL_PENDING, NODE_DOWN, SECOND, Evaluation
from node.core.config import SchedulerConfig
from node.core.heartbeats import Heartbeats
from node.leader import heartbeat, lifecycle
from node.leader.broker import HOLD_MAX_S
from node.leader.heartbeat import HOLDER
from node.leader.lifecycle import Lifecycle
from node.leader.nodeevals import CoveredDowns, down_batches
from node.wire.errors import RPCError
from tests.fsm.support import Harness
from tests.lifecycle.support import alloc, job, node

NODES = ["n0", "n1", "n2", "n3"]
BUDGET = 48 * 1024


class _Raft:
    max_entry_bytes = 2 * BUDGET
    is_leader = True


class FakeServer:
    """The server as the lifecycle sees it, over a ``Harness``: reads run inline, proposals apply at once."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.config = type("Config", (), {"scheduler": SchedulerConfig()})()
        self.log = structlog.get_logger("test")
        self.raft = _Raft()
        self.heartbeats = Heartbeats()
        self.proposed: list[Any] = []

    def state_now(self) -> int:
        return self.h.time

    def commit_event(self) -> None:
        """As a server that is not running yet: no event, so a term's tail polls."""
        return None

    async def local(self, fn: Callable[[StateReader], Any]) -> Any:
        with self.h.reader() as r:
            return fn(r)

    async def propose(self, body: Any, rid: str | None = None, **_lane: Any) -> dict[str, Any]:
        self.proposed.append(body)
        self.h.time += SECOND
        result = self.h.raw(encode_entry(body, time=self.h.time, rid=""))
        if not result.ok:
            raise RPCError(result.code, result.error)
        return {"index": result.index, "value": result.value, "duplicate": False}


@pytest.fixture
def world() -> Iterator[tuple[Harness, FakeServer, Lifecycle, list[str]]]:
    """Four nodes, one job per node (two allocs each), a lifecycle that has caught up, and its read log."""
    h = Harness.temp()
    try:
        for n in NODES:
            h.ok(m.NodeRegister(node=node(n, cpu=100_000, mem=100_000)))
        for i, n in enumerate(NODES):
            _place(h, f"j{i}", n, 2)
        server = FakeServer(h)
        lc = Lifecycle(server)  # type: ignore[arg-type]
        asyncio.run(lc.follow())
        yield h, server, lc, []
    finally:
        h.destroy()


def _place(h: Harness, job_id: str, node_id: str, count: int) -> None:
    """A job with ``count`` running allocs on ``node_id``, placed by an eval that is complete (none queued)."""
    j = job(job_id, count=count)
    h.ok(m.JobRegister(job=j))
    ev = Evaluation(id=f"ev-{job_id}", job_id=j.id, type=j.type, status="complete")
    allocs = [alloc(j, k, node_id, alloc_id=f"{job_id}-{k}") for k in range(count)]
    for a in allocs:
        a.eval_id = ev.id
    h.ok(m.PlanApply(eval_id=ev.id, job_id=j.id, allocs_to_place=allocs, evals=[ev]))


def _count_reads(monkeypatch: pytest.MonkeyPatch, reads: list[str]) -> None:
    """Route the tail's per-node alloc reads through a counter."""
    real = lifecycle.node_down_evals

    def counted(reader: StateReader, node_id: str) -> list[Evaluation]:
        reads.append(node_id)
        return real(reader, node_id)

    monkeypatch.setattr(lifecycle, "node_down_evals", counted)


def _pending_jobs(h: Harness) -> list[str]:
    with h.reader() as r:
        return sorted(e.job_id for e in r.evals() if e.status == EVAL_PENDING)


def _down(h: Harness) -> list[str]:
    with h.reader() as r:
        return sorted(n.id for n in r.nodes() if n.status == NODE_DOWN)


def test_a_flagged_mark_down_costs_the_tail_no_alloc_reads(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, server, lc, reads = world
    _count_reads(monkeypatch, reads)

    async def scenario() -> None:
        await lc.heartbeats._mark_down(["n0", "n1", "n2"])  # noqa: SLF001 - the monitor's one pass
        await lc.follow()

    asyncio.run(scenario())
    (msg,) = [b for b in server.proposed if isinstance(b, m.NodeBatchUpdateStatus)]
    assert msg.evals_complete
    assert _down(h) == ["n0", "n1", "n2"]
    assert reads == [], "a flagged entry's nodes are not read again"
    assert _pending_jobs(h) == ["j0", "j1", "j2"]  # the entry's own evals, nothing added
    assert not [b for b in server.proposed if isinstance(b, m.EvalUpsert)]


def test_an_unflagged_mark_down_is_still_read_and_gets_its_evals(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry without the flag (as every entry before it): the tail reads each node and adds the evals."""
    h, server, lc, reads = world
    _count_reads(monkeypatch, reads)

    async def scenario() -> None:
        await server.propose(m.NodeBatchUpdateStatus(node_ids=["n0", "n1"], status=NODE_DOWN))
        await lc.follow()

    asyncio.run(scenario())
    assert sorted(reads) == ["n0", "n1"]
    assert _pending_jobs(h) == ["j0", "j1"]


def test_a_placement_between_the_monitors_read_and_its_entry_is_not_skipped(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan that lands on the node after the monitor read it: its job has no eval in the entry."""
    h, server, lc, reads = world
    _count_reads(monkeypatch, reads)

    async def scenario() -> None:
        read_at, batches = await server.local(
            lambda r: (r.applied_index, down_batches(r, ["n0", "n1"], budget=BUDGET))
        )
        _place(h, "late", "n1", 1)
        for msg in batches:
            assert msg.evals_complete
            answer = await lc.heartbeats._propose(msg, read_at)  # noqa: SLF001 - as _mark_share does
            lc.heartbeats.covered.confirm(msg, answer["index"], answer["value"]["node_ids"])
        await lc.follow()

    asyncio.run(scenario())
    assert reads == ["n1"], "only the node a placement overtook is read"
    assert _pending_jobs(h) == ["j0", "j1", "late"]


def test_a_down_record_seen_before_the_proposal_is_answered_waits_for_it(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail can see the node go down before the monitor hears back: it waits, then skips the node."""
    h, server, lc, reads = world
    _count_reads(monkeypatch, reads)
    covered = lc.heartbeats.covered

    async def scenario() -> None:
        read_at, (msg,) = await server.local(
            lambda r: (r.applied_index, down_batches(r, ["n2"], budget=BUDGET))
        )
        covered.open(msg, read_at)
        result = await server.propose(msg)
        await lc.follow()  # the record is in; the claim is not answered yet
        assert covered.waiting("n2") and reads == []
        covered.confirm(msg, result["index"], result["value"]["node_ids"])
        await lc.follow()

    asyncio.run(scenario())
    assert reads == []
    assert _pending_jobs(h) == ["j2"]


# -- CoveredDowns on its own ------------------------------------------------------------------
def _msg(*node_ids: str, complete: bool = True) -> m.NodeBatchUpdateStatus:
    return m.NodeBatchUpdateStatus(
        node_ids=list(node_ids), status=NODE_DOWN, evals_complete=complete
    )


def test_only_the_confirmed_entry_at_its_own_index_covers_a_node() -> None:
    c = CoveredDowns()
    c.following_from(5)
    c.open(_msg("a", "b", "c"), read_at=10)
    assert c.waiting("a")
    c.confirm(_msg("a", "b", "c"), index=12, changed=["a", "b"])  # c was already down: skipped
    assert not c.waiting("a") and not c.waiting("c")
    assert not c.covered("c", 12)
    assert not c.covered("a", 11), "a down record from an older entry"
    assert c.covered("a", 12), "the claim outlives an older record"
    assert c.covered("b", 12)
    assert not c.covered("b", 12), "a claim covers one record"


def test_unflagged_failed_and_unseen_entries_cover_nothing() -> None:
    c = CoveredDowns()
    c.open(_msg("a", complete=False), read_at=10)
    assert not c.waiting("a")
    c.open(_msg("b"), read_at=10)
    c.drop(["b"])
    assert not c.waiting("b") and not c.covered("b", 12)
    c.open(_msg("d"), read_at=10)
    c.confirm(_msg("d"), index=12, changed=["d"])
    assert not c.covered("d", 12), (
        "the tail never followed the journal: it cannot know what landed since"
    )
    c.following_from(11)
    c.open(_msg("e"), read_at=10)
    c.confirm(_msg("e"), index=12, changed=["e"])
    assert not c.covered("e", 12), "the tail began after the read: a placement in between is unseen"


def test_a_live_alloc_after_the_read_uncovers_the_node() -> None:
    c = CoveredDowns()
    c.following_from(0)
    for node_id in ("a", "b"):
        c.open(_msg(node_id), read_at=10)
        c.confirm(_msg(node_id), index=12, changed=[node_id])
    c.live_alloc("a", 10)
    c.live_alloc("b", 11)
    assert c.covered("a", 12)
    assert not c.covered("b", 12)


# -- the FSM ignores the flag ------------------------------------------------------------------
def test_the_flag_changes_no_state_and_no_journal_record(world: Any) -> None:
    """Flagged or not, the same mark-down leaves byte-identical stores (tables, journal, digest)."""
    h = world[0]
    other = h.clone()
    try:
        with h.reader() as r:
            (msg,) = down_batches(r, ["n0", "n1"], budget=BUDGET)
        assert msg.evals_complete
        h.ok(msg)
        other.ok(
            m.NodeBatchUpdateStatus(
                node_ids=msg.node_ids,
                status=msg.status,
                status_description=msg.status_description,
                evals=msg.evals,
            )
        )
        assert h.dump() == other.dump()
        assert h.fsm.digest() == other.fsm.digest()
    finally:
        other.destroy()


def test_an_unflagged_entry_encodes_as_before_the_flag() -> None:
    """The flag defaults to false and is left out when false: entries without it are the old bytes."""
    msg = m.NodeBatchUpdateStatus(node_ids=["n0"], status=NODE_DOWN)
    assert b"evals_complete" not in encode_entry(msg, time=1, rid="r")
    assert b"evals_complete" in encode_entry(_msg("n0"), time=1, rid="r")


def _spread(h: Harness, job_id: str, nodes: list[str]) -> None:
    """A job with one running alloc on each of ``nodes`` (its placing eval complete)."""
    j = job(job_id, count=len(nodes))
    h.ok(m.JobRegister(job=j))
    ev = Evaluation(id=f"ev-{job_id}", job_id=j.id, type=j.type, status="complete")
    allocs = [alloc(j, k, n, alloc_id=f"{job_id}-{k}") for k, n in enumerate(nodes)]
    for a in allocs:
        a.eval_id = ev.id
    h.ok(m.PlanApply(eval_id=ev.id, job_id=j.id, allocs_to_place=allocs, evals=[ev]))


def _with_wide_job(world: Any, monkeypatch: pytest.MonkeyPatch, per_share: int) -> None:
    """Job "wide" on every node, seen by the tail; reads counted from now; ``per_share`` nodes a share."""
    h, _server, lc, reads = world
    _spread(h, "wide", NODES)
    asyncio.run(lc.follow())
    _count_reads(monkeypatch, reads)
    monkeypatch.setattr(heartbeat, "NODES_PER_BATCH", per_share)


def _evals_for(server: FakeServer, job_id: str) -> int:
    return sum(ev.job_id == job_id for b in server.proposed if isinstance(b, m.NodeBatchUpdateStatus) for ev in b.evals)


def _held_pass(lc: Lifecycle, nodes: list[str]) -> None:
    """One pass of the monitor over ``nodes``, holding the broker as its run loop does."""

    async def scenario() -> None:
        lc.broker.hold(HOLDER)
        lc.heartbeats.marking.update(nodes)
        await lc.heartbeats._mark_down(nodes)  # noqa: SLF001 - one pass, as run() starts it
        await lc.follow()

    asyncio.run(scenario())


def test_a_held_pass_gives_a_job_on_many_nodes_one_eval_and_the_tail_reads_nothing(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, server, lc, reads = world
    _with_wide_job(world, monkeypatch, per_share=1)  # a share, so an entry, per node
    _held_pass(lc, NODES)
    assert len([b for b in server.proposed if isinstance(b, m.NodeBatchUpdateStatus)]) == len(NODES)
    assert _evals_for(server, "wide") == 1, "one eval per job per pass, not per entry"
    assert reads == [] and lc.broker.held_for() is None
    assert _pending_jobs(h) == ["j0", "j1", "j2", "j3", "wide"]


def test_when_the_hold_lapses_mid_pass_the_tail_reads_the_nodes_it_can_no_longer_vouch_for(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eval may have run before a later node went down: the tail reads that entry's nodes again."""
    h, server, lc, reads = world
    _with_wide_job(world, monkeypatch, per_share=2)
    now = [0.0]
    lc.broker.clock = lambda: now[0]
    propose = server.propose

    async def lapsing(body: Any, rid: str | None = None, **lane: Any) -> dict[str, Any]:
        answer = await propose(body, rid, **lane)
        if isinstance(body, m.NodeBatchUpdateStatus) and body.node_ids == ["n2", "n3"]:
            now[0] += HOLD_MAX_S  # the second share's entry is answered after the hold lapsed
        return answer

    monkeypatch.setattr(server, "propose", lapsing)
    _held_pass(lc, NODES)
    assert _evals_for(server, "wide") == 1  # the second share relied on the first's eval...
    assert reads == ["n2", "n3"]  # ...so its nodes are read again, and "wide" (still queued) gets no second eval
    assert _pending_jobs(h) == ["j0", "j1", "j2", "j3", "wide"]
