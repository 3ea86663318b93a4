"""Merged plans: non-overlapping plans committed in one raft entry commit what they would apart.

The plan applier checks each plan against the newest state and proposes it;
while earlier entries are still committing, the leader's write queue
(node/core/writes.py) merges the plans that wait into one Batch entry, up to
the entry size limit. That is only safe if a Batch of PlanApply items leaves
the state each plan would have left on its own: the same allocs, evals,
summaries and journal records, differing only in the raft index and time
they were stamped with.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm import messages as m
from fsm.messages import encode_batch, encode_entry
from fsm.structs import Allocation, Evaluation, JobSummary, Resources
from tests.fsm.support import T0, Harness, make_alloc, make_eval, make_job, make_node

NODES = ("n1", "n2", "n3")
STAMPS = ("create_index", "modify_index", "alloc_modify_index", "create_time", "modify_time", "job_modify_index")


def _setup(h: Harness, jobs: int) -> None:
    for node in NODES:
        h.ok(m.NodeRegister(node=make_node(node, resources=Resources(cpu=100_000, memory_mb=100_000))))
    for j in range(jobs):
        h.ok(m.JobRegister(job=make_job(f"j{j}", count=5), eval=make_eval(f"e{j}", f"j{j}")))


def _plan(job: int, placements: list[str]) -> m.PlanApply:
    allocs = [
        make_alloc(f"a{job}-{i}", eval_id=f"e{job}", job_id=f"j{job}", node_id=node, resources=Resources(cpu=10, memory_mb=10))
        for i, node in enumerate(placements)
    ]
    return m.PlanApply(allocs_to_place=allocs, evals=[make_eval(f"e{job}", f"j{job}", status="complete")])


def _unstamped(obj: Any) -> dict[str, Any]:
    wire = codec.dump(obj)
    return {k: v for k, v in wire.items() if k not in STAMPS}


def _state(h: Harness) -> dict[str, Any]:
    """What the plans decided, without the raft index and time each entry was stamped with."""
    with h.reader() as r:
        return {
            "allocs": {k: _unstamped(codec.load(Allocation, v)) for k, v in r.iter_raw("allocs")},
            "evals": {k: _unstamped(codec.load(Evaluation, v)) for k, v in r.iter_raw("evals")},
            "summaries": {k: _unstamped(codec.load(JobSummary, v)) for k, v in r.iter_raw("job_summary")},
            "nodes": {k: _unstamped(n) for k, n in ((n.id, n) for n in r.nodes())},
        }


def _journal_records(h: Harness, since: int) -> list[tuple[str, str, str]]:
    """(topic, type, key) of every journal record after ``since``, in order."""
    with h.reader() as r:
        return [(rec[0], rec[1], rec[2]) for _index, records in r.journal_batches(since) for rec in records]


plans_strategy = st.lists(
    st.lists(st.sampled_from(NODES), min_size=1, max_size=5),
    min_size=2,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(plans_strategy)
def test_a_batch_of_non_overlapping_plans_commits_what_the_plans_would_apart(placements: list[list[str]]) -> None:
    apart, merged = Harness.temp(), Harness.temp()
    try:
        for h in (apart, merged):
            _setup(h, len(placements))
        start = apart.index
        assert merged.index == start
        plans = [_plan(j, nodes) for j, nodes in enumerate(placements)]
        for plan in plans:
            apart.ok(plan)
        items = [encode_entry(plan, time=T0 + 100 + j, rid=f"p{j}") for j, plan in enumerate(plans)]
        result = merged.raw(encode_batch(items, time=T0 + 100 + len(plans)))
        assert result.ok and all(item.ok for item in result.batch), [(i.code, i.error) for i in result.batch]
        assert _state(merged) == _state(apart)
        assert _journal_records(merged, start) == _journal_records(apart, start)
    finally:
        apart.destroy()
        merged.destroy()
