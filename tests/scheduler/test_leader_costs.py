"""The shortcuts that cut the leader's cost per placement (issue 36) equal the work they replace.

- a small plan is measured whole and, when it fits, is the one body that
  packing record by record would have made;
- the eval's new status is a copy that shares no map with the eval read;
- the policy's rules are built once per list, and stay the rules it names.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.messages import AllocStop
from scheduler import plan as plan_mod
from scheduler.generic import schedule
from scheduler.plan import approx_size, logged_size, to_entries
from scheduler.policy import Policy, Preference
from tests.lifecycle.support import job, node, snapshot


@settings(max_examples=60, deadline=None)
@given(n_place=st.integers(0, 40), n_stop=st.integers(0, 20), with_dep=st.booleans(), limit_kb=st.integers(4, 64))
def test_a_small_plan_that_fits_is_the_body_packing_would_make(n_place: int, n_stop: int, with_dep: bool, limit_kb: int) -> None:
    j = job(count=n_place)
    plan = schedule(snapshot(j, [node(f"n{i}", cpu=100_000, mem=100_000) for i in range(10)]))
    plan.stop = [AllocStop(id=f"s{i}") for i in range(n_stop)]
    if not with_dep:
        plan.deployment = None
    limit = limit_kb * 1024
    for kw in ({}, {"item_size": logged_size}):
        fast = to_entries(plan, limit, approx_size, **kw)
        saved = plan_mod.WHOLE_MAX_RECORDS
        plan_mod.WHOLE_MAX_RECORDS = -1  # record by record, as before the shortcut
        try:
            packed = to_entries(plan, limit, approx_size, **kw)
        finally:
            plan_mod.WHOLE_MAX_RECORDS = saved
        assert all(approx_size(b) <= limit for b in fast)
        if len(packed) == 1 or len(fast) > 1:
            assert fast == packed
        else:  # the whole plan fits where the per-record estimate split it: the same records, in order
            assert [a.id for b in packed for a in b.allocs_to_place] == [a.id for a in fast[0].allocs_to_place]
            assert [e.id for e in packed[-1].evals] == [e.id for e in fast[0].evals]


def test_the_finished_eval_shares_no_map_with_the_eval_read() -> None:
    j = job(count=2)
    snap = snapshot(j, [node("a", cpu=150, mem=100)])  # room for one of two: a blocked eval too
    snap.eval.queued_allocations = {"g": 9}
    plan = schedule(snap)
    done = plan.evals[0]
    assert done.id == snap.eval.id and done is not snap.eval
    assert snap.eval.queued_allocations == {"g": 9} and snap.eval.failed_tg_allocs == {}
    assert done.queued_allocations == {"g": 1} and done.failed_tg_allocs
    done.failed_tg_allocs["x"] = "y"
    assert "x" not in snap.eval.failed_tg_allocs


def test_a_policy_builds_its_rules_once_and_they_are_the_ones_it_names() -> None:
    a = Policy(preference=(Preference("best-fit", 5), Preference("job-anti-affinity")))
    b = Policy(preference=(Preference("best-fit", 5), Preference("job-anti-affinity")), cluster_top=2)
    assert a.preference_rules() is b.preference_rules()  # the same list: built once
    assert [(r.name, getattr(r, "buckets", 0)) for r in a.preference_rules()] == [("best-fit", 5), ("job-anti-affinity", 0)]
    c = Policy(preference=(Preference("best-fit", 3),))
    assert [r.buckets for r in c.preference_rules()] == [3]
    assert [r.name for r in a.validation_rules()] == list(a.validation)
