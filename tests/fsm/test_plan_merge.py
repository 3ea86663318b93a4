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
from fsm.caches import NodeUsageCache
from fsm.messages import encode_batch, encode_entry
from fsm.structs import Allocation, Evaluation, JobSummary, Resources
from node.leader.plan_apply import Claim, check_group, check_plan
from scheduler.plan import Plan
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


# -- The applier's group check: one read for several plans, then one Batch entry ---------------------
#
# The plan applier (node/leader/plan_apply.py) checks the plans that queued
# while it was busy together, at one read, and proposes what they accepted
# together, so the write queue merges them into one Batch entry. Both steps
# together must leave what checking and applying the plans one by one would,
# less the placements the checks reject: no node overcommitted, and the same
# allocs, evals, summaries and journal records.

SMALL = Resources(cpu=100, memory_mb=100)  # each node's capacity: a few placements fill it

group_strategy = st.lists(  # per plan: (node, cpu) placements; several plans contend for the same nodes
    st.lists(st.tuples(st.sampled_from(NODES), st.sampled_from((10, 30, 60))), min_size=1, max_size=4),
    min_size=1,
    max_size=6,
)


def _setup_small(h: Harness, jobs: int) -> None:
    for node in NODES:
        h.ok(m.NodeRegister(node=make_node(node, resources=SMALL)))
    for j in range(jobs):
        h.ok(m.JobRegister(job=make_job(f"j{j}", count=5), eval=make_eval(f"e{j}", f"j{j}")))


def _scheduler_plan(job: int, placements: list[tuple[str, int]]) -> Plan:
    allocs = [
        make_alloc(f"a{job}-{i}", eval_id=f"e{job}", job_id=f"j{job}", node_id=node, resources=Resources(cpu=cpu, memory_mb=cpu))
        for i, (node, cpu) in enumerate(placements)
    ]
    return Plan(eval_id=f"e{job}", job_id=f"j{job}", place=allocs, evals=[make_eval(f"e{job}", f"j{job}", status="complete")])


def _body(plan: Plan) -> m.PlanApply:
    return m.PlanApply(eval_id=plan.eval_id, job_id=plan.job_id, allocs_to_place=plan.place, evals=plan.evals)


@settings(max_examples=60, deadline=None)
@given(group_strategy)
def test_a_checked_group_in_one_batch_commits_what_checking_and_applying_one_by_one_would(
    placements: list[list[tuple[str, int]]],
) -> None:
    apart, merged = Harness.temp(), Harness.temp()
    try:
        for h in (apart, merged):
            _setup_small(h, len(placements))
        start = apart.index
        plans = [_scheduler_plan(j, p) for j, p in enumerate(placements)]

        one_by_one = []
        cache = NodeUsageCache()
        for plan in plans:
            with apart.reader() as r:
                accepted, rejected = check_plan(r, plan, cache)
            one_by_one.append((sorted(a.id for a in accepted.place), sorted(rejected)))
            if not accepted.empty():
                apart.ok(_body(accepted))

        with merged.reader() as r:
            checked = check_group(r, plans, NodeUsageCache())
        assert [(sorted(a.id for a in acc.place), sorted(rej)) for acc, rej in checked] == one_by_one
        items = [encode_entry(_body(acc), time=T0 + 100 + j, rid=f"p{j}") for j, (acc, _rej) in enumerate(checked) if not acc.empty()]
        if items:
            result = merged.raw(encode_batch(items, time=T0 + 200))
            assert result.ok and all(item.ok for item in result.batch), [(i.code, i.error) for i in result.batch]

        assert _state(merged) == _state(apart)
        assert _journal_records(merged, start) == _journal_records(apart, start)
        with merged.reader() as r:  # no node overcommitted
            for node in NODES:
                used = sum(a.resources.cpu for a in r.allocs_by_node(node, terminal=False))
                assert used <= SMALL.cpu, (node, used)
    finally:
        apart.destroy()
        merged.destroy()


def test_a_group_member_sees_the_claims_of_plans_still_committing() -> None:
    """A claim of an in-flight plan counts for every plan of the group, as it does for a lone check."""
    h = Harness.temp()
    try:
        _setup_small(h, 2)
        plans = [_scheduler_plan(0, [("n1", 60)]), _scheduler_plan(1, [("n2", 60)])]
        in_flight = [Claim("not-yet-applied", {"n1": Resources(cpu=60, memory_mb=60)})]
        with h.reader() as r:
            checked = check_group(r, plans, NodeUsageCache(), in_flight)
        assert [sorted(rej) for _acc, rej in checked] == [["n1"], []]
    finally:
        h.destroy()
