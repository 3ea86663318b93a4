"""Batched node-down: a few entries with one eval per job leave what one entry per node leaves.

The heartbeat monitor marks a pass's silent nodes down with
``NodeBatchUpdateStatus`` entries built by ``down_batches``; before, each
node went down in its own ``NodeUpdateStatus`` with one eval per job on it.
Property: from the same state, both ways end with the same nodes, the same
allocs, and — once the broker's rule has cancelled every pending eval a
newer one of its job supersedes, and the scheduler has run the rest — the
same allocs again, replacements included. The batched way writes at most
one eval per affected job per entry, and every entry fits its budget.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm import messages as m
from fsm.messages import encode_entry
from fsm.structs import EVAL_CANCELED, EVAL_PENDING, NODE_DOWN, Evaluation
from node.leader.nodeevals import DOWN_DESCRIPTION, down_batches, mark_down_budget, node_down_evals
from raft.config import DEFAULT_MAX_ENTRY_BYTES
from raft.node import encoded_entry_size
from tests.fsm.support import Harness
from tests.lifecycle.support import alloc, job, node, register, run_eval

ENTRY_OVERHEAD = 256  # bytes of a batch entry beyond its node ids and evals


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    nodes = [f"n{i}" for i in range(draw(st.integers(2, 7)))]
    counts = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    placements = [[draw(st.sampled_from(nodes)) for _ in range(c)] for c in counts]
    expired = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=len(nodes) - 1, unique=True))
    return {
        "nodes": nodes,
        "placements": placements,
        "expired": expired,
        "budget": draw(st.sampled_from([4_000, 8_000, 1_000_000])),
        "most": draw(st.sampled_from([1, 2, 3, 1000])),
    }


def _build(s: dict[str, Any]) -> Harness:
    """Nodes, and jobs whose allocs run where the scenario put them (their register evals done)."""
    h = Harness.temp()
    for n in s["nodes"]:
        h.ok(m.NodeRegister(node=node(n, cpu=100_000, mem=100_000)))
    for i, where in enumerate(s["placements"]):
        j = job(f"j{i}", count=len(where))
        ev = register(h, j)
        allocs = [alloc(j, k, n, alloc_id=f"{j.id}-{k}") for k, n in enumerate(where)]
        for a in allocs:
            a.eval_id = ev.id
        h.ok(m.PlanApply(eval_id=ev.id, job_id=j.id, allocs_to_place=allocs))
        with h.reader() as r:
            done = r.eval(ev.id)
        done.status = "complete"
        h.ok(m.EvalUpsert(evals=[done]))
    return h


def _one_at_a_time(h: Harness, expired: list[str]) -> None:
    for node_id in expired:
        with h.reader() as r:
            evals = node_down_evals(r, node_id)
        h.ok(m.NodeUpdateStatus(node_id=node_id, status=NODE_DOWN, status_description=DOWN_DESCRIPTION, evals=evals))


def _batched(h: Harness, expired: list[str], budget: int, most: int) -> list[m.NodeBatchUpdateStatus]:
    with h.reader() as r:
        batches = down_batches(r, expired, budget=budget, most=most)
    for msg in batches:
        h.ok(msg)
    return batches


def _pending(h: Harness) -> list[Evaluation]:
    with h.reader() as r:
        return sorted((e for e in r.evals() if e.status == EVAL_PENDING), key=lambda e: e.create_index)


def _supersede_and_schedule(h: Harness) -> None:
    """What the broker and workers do: cancel all but each job's newest pending eval, then run it."""
    newest: dict[str, Evaluation] = {}
    for ev in _pending(h):
        older = newest.get(ev.job_id)
        if older is not None:
            older.status = EVAL_CANCELED
            h.ok(m.EvalUpsert(evals=[older]))
        newest[ev.job_id] = ev
    for ev in newest.values():
        run_eval(h, ev)


def _schedule_both_alike(single: Harness, batched: Harness, down: set[str]) -> None:
    """Schedule both sides as the broker and workers would; they end with the same allocs, none left on a down node.

    Ties between equal nodes are broken at random: a replacement's node is compared as down or not.
    """
    _supersede_and_schedule(single)
    _supersede_and_schedule(batched)
    assert _placed(batched, down) == _placed(single, down)
    assert not [a for a in _placed(batched, down) if a[2] and a[4] == "run" and a[3] != "lost"]


def _nodes(h: Harness) -> list[tuple[str, str, str]]:
    with h.reader() as r:
        return [(n.id, n.status, n.status_description) for n in r.nodes()]


def _allocs(h: Harness) -> list[tuple[str, str, str, str, str]]:
    """Every alloc by what it is, not its id (replacements get fresh ids on each side)."""
    with h.reader() as r:
        return sorted((a.job_id, a.name, a.node_id, a.client_status, a.desired_status) for a in r.allocs())


def _placed(h: Harness, down: set[str]) -> list[tuple[str, str, bool, str, str]]:
    return sorted((job_id, name, node_id in down, client, desired) for job_id, name, node_id, client, desired in _allocs(h))


def _newest_pending(h: Harness) -> dict[str, tuple[str, str, int]]:
    return {ev.job_id: (ev.triggered_by, ev.type, ev.priority) for ev in _pending(h)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_batched_node_down_ends_as_one_node_at_a_time_less_the_superseded_evals(s: dict[str, Any]) -> None:
    single = _build(s)
    batched = single.clone()
    try:
        _one_at_a_time(single, s["expired"])
        batches = _batched(batched, s["expired"], s["budget"], s["most"])
        assert _nodes(batched) == _nodes(single)
        assert _allocs(batched) == _allocs(single)
        assert _newest_pending(batched) == _newest_pending(single)

        with batched.reader() as r:
            for msg in batches:
                jobs = {a.job_id for n in msg.node_ids for a in r.allocs_by_node(n) if not a.terminal()}
                assert sorted(ev.job_id for ev in msg.evals) == sorted(jobs), "one eval per affected job per entry"
                assert len(msg.node_ids) <= s["most"]
                assert len(codec.encode(msg)) <= s["budget"] + ENTRY_OVERHEAD
        assert sum(len(b.node_ids) for b in batches) == len(s["expired"])

        _schedule_both_alike(single, batched, set(s["expired"]))
    finally:
        single.destroy()
        batched.destroy()


def test_a_batch_skips_nodes_that_are_gone_or_already_down() -> None:
    h = _build({"nodes": ["n0", "n1", "n2"], "placements": [["n0", "n1"]]})
    try:
        h.ok(m.NodeUpdateStatus(node_id="n1", status=NODE_DOWN))
        got = h.ok(m.NodeBatchUpdateStatus(node_ids=["n0", "n1", "gone"], status=NODE_DOWN))
        assert (got["node_ids"], got["skipped"]) == (["n0"], ["n1", "gone"])
        assert [n[1] for n in _nodes(h)] == [NODE_DOWN, NODE_DOWN, "ready"]
    finally:
        h.destroy()


def test_a_bad_batch_is_refused_whole_and_changes_nothing() -> None:
    h = _build({"nodes": ["n0", "n1"], "placements": [["n0"]]})
    try:
        before = _nodes(h)
        for msg, words in [
            (m.NodeBatchUpdateStatus(node_ids=[], status=NODE_DOWN), "names no nodes"),
            (m.NodeBatchUpdateStatus(node_ids=["n0", "n0"], status=NODE_DOWN), "more than once"),
            (m.NodeBatchUpdateStatus(node_ids=["n0"], status="gone"), "status 'gone'"),
        ]:
            result = h.apply(msg)
            assert not result.ok and result.code == "bad_request" and words in result.error
        assert _nodes(h) == before
    finally:
        h.destroy()


def test_a_node_running_190_jobs_goes_down_in_one_flagged_entry_that_raft_accepts() -> None:
    """At the default entry size a busy client's evals fit one entry: it is not cut, so the tail need not read it."""
    h = Harness.temp()
    for n in ("busy", "other"):
        h.ok(m.NodeRegister(node=node(n, cpu=1_000_000, mem=1_000_000)))
    for i in range(190):
        j = job(f"job-{i:07d}-with-a-realistic-name", count=1)
        ev = register(h, j)
        placed = alloc(j, 0, "busy", alloc_id=f"{j.id}-0")
        placed.eval_id = ev.id
        h.ok(m.PlanApply(eval_id=ev.id, job_id=j.id, allocs_to_place=[placed]))
    budget = mark_down_budget(DEFAULT_MAX_ENTRY_BYTES)
    with h.reader() as r:
        batches = down_batches(r, ["busy", "other"], budget=budget)
    assert len(batches) == 1
    (msg,) = batches
    assert msg.evals_complete and len(msg.evals) == 190
    entry = encode_entry(msg, time=time.time_ns(), rid=uuid.uuid4().hex)
    assert encoded_entry_size(entry) <= DEFAULT_MAX_ENTRY_BYTES


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(1, 3))
def test_a_held_pass_gives_each_job_one_eval_and_ends_as_one_node_at_a_time(s: dict[str, Any], shares: int) -> None:
    """Under the broker's hold no eval runs before the pass's last entry: one eval per job per pass suffices."""
    single = _build(s)
    batched = single.clone()
    try:
        _one_at_a_time(single, s["expired"])
        with batched.reader() as r:
            affected = {a.job_id for n in s["expired"] for a in r.allocs_by_node(n) if not a.terminal()}
        given: set[str] = set()
        batches: list[m.NodeBatchUpdateStatus] = []
        size = -(-len(s["expired"]) // shares)
        for start in range(0, len(s["expired"]), size):  # the monitor's shares, each read after the last committed
            with batched.reader() as r:
                share = down_batches(r, s["expired"][start : start + size], budget=s["budget"], most=s["most"], given=given)
            for msg in share:
                batched.ok(msg)
            batches += share
        assert sorted(ev.job_id for msg in batches for ev in msg.evals) == sorted(affected), "one eval per job per pass"
        assert given == affected
        assert _nodes(batched) == _nodes(single)
        assert _allocs(batched) == _allocs(single)

        _schedule_both_alike(single, batched, set(s["expired"]))
    finally:
        single.destroy()
        batched.destroy()
