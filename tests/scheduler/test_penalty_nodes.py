"""Every node the reschedule tracker lists is penalised, as Nomad's NodeReschedulingPenaltyIterator does.

Nomad (``getSelectOptions`` in scheduler/generic_sched.go) penalises the node
a failed alloc ran on and each ``PrevNodeID`` of its tracker's events. Here:
which nodes ``penalty_nodes`` names; that the selector, given any set of
them, picks exactly what scoring every node from scratch picks (the
brute-force oracle of ``tests.lifecycle.test_two_level``); and that a whole
scheduling run sends a twice-failed alloc to the one node it has not failed on.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.structs import (
    SECOND,
    RescheduleEvent,
    ReschedulePolicy,
    RescheduleTracker,
    Resources,
    TaskState,
)
from scheduler.feasibility import PlacementContext, ask_for, check_static
from scheduler.generic import schedule
from scheduler.policy import Policy, Preference
from scheduler.preferences import AvoidPreviousNode, Request
from scheduler.ranking import Selector
from scheduler.reschedule import penalty_nodes
from tests.lifecycle.support import NOW, alloc, job, node, snapshot
from tests.lifecycle.test_two_level import VALIDATION, build, node_spec, oracle, preference


def event(node_id: str, at: int = NOW - 600 * SECOND) -> RescheduleEvent:
    return RescheduleEvent(reschedule_time=at, prev_alloc_id=f"prev-{node_id}", prev_node_id=node_id, delay=5 * SECOND)


def test_the_failed_node_and_every_tracker_node_are_penalised() -> None:
    j = job(count=1)
    failed = alloc(j, 0, "c", client="failed", reschedule_tracker=RescheduleTracker(events=[event("a"), event("b"), event("a")]))
    assert penalty_nodes(failed) == {"a", "b", "c"}
    # A lost alloc's node is not penalised (Nomad: only a failed one's), its tracker's nodes are.
    lost = alloc(j, 0, "c", client="lost", reschedule_tracker=RescheduleTracker(events=[event("a")]))
    assert penalty_nodes(lost) == {"a"}
    assert penalty_nodes(alloc(j, 0, "c")) == frozenset()


def test_each_penalised_node_scores_the_same() -> None:
    """A set, as in Nomad: a node listed twice is not penalised twice."""
    rule = AvoidPreviousNode()
    j = job()
    request = Request(ask_for(j, j.task_groups[0]), previous_node="a", penalty_nodes=frozenset({"b", "c"}))
    scores = {n: rule.score(node(n), request.ask, PlacementContext(usage={}), request) for n in "abcd"}
    assert scores == {"a": 0, "b": 0, "c": 0, "d": 1}
    assert Request(request.ask).avoided == frozenset()


penalties = st.lists(st.integers(0, 11), max_size=6).map(lambda ids: frozenset(f"n{i}" for i in ids))


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(node_spec, min_size=1, max_size=12),
    prefs=preference,
    cluster_top=st.integers(0, 3),
    ask_cpu=st.integers(100, 1500),
    ask_mem=st.integers(64, 3000),
    steps=st.lists(st.tuples(penalties, st.sampled_from(["", "n0", "n3"])), min_size=1, max_size=12),
    seed=st.integers(0, 10_000),
)
def test_the_selector_picks_what_scoring_every_node_would_with_any_penalty_nodes(
    specs: list[Any], prefs: Any, cluster_top: int, ask_cpu: int, ask_mem: int, steps: list[Any], seed: int
) -> None:
    nodes, usage = build(specs)
    policy = Policy(validation=VALIDATION, preference=tuple(Preference(n, b) for n, b in prefs), cluster_top=cluster_top)
    j = job(cpu=ask_cpu, mem=ask_mem)
    ask = ask_for(j, j.task_groups[0])
    sel = Selector(nodes, PlacementContext(usage={k: v.copy() for k, v in usage.items()}, job_allocs=Counter()),
                   rng=random.Random(seed), rules=policy.preference_rules(), validation=policy.validation_rules(),
                   cluster_top=cluster_top)
    slow = PlacementContext(usage={k: v.copy() for k, v in usage.items()}, job_allocs=Counter())
    for avoided, previous in steps:
        request = Request(ask, previous_node=previous, penalty_nodes=avoided)
        got = sel.select(request)
        want = oracle(nodes, request, slow, policy, sel)
        assert (got.id if got else None) == (want.id if want else None)
        if got is None:
            break
        assert check_static(got, ask, slow, policy.validation_rules()) is None
        sel.claim(got, ask)
        slow.used(got.id).add(ask.resources)
        slow.job_allocs[got.id] += 1


def _failed_on_b(events: list[RescheduleEvent]) -> Any:
    """The plan for a batch alloc that failed on "b" (its tracker ``events``), with "a" the fullest node."""
    policy = ReschedulePolicy(attempts=3, interval=3600 * SECOND, delay=5 * SECOND, delay_function="constant",
                              unlimited=False)
    j = job(type="batch", count=1, reschedule_policy=policy)
    failed = alloc(j, 0, "b", client="failed", reschedule_tracker=RescheduleTracker(events=events))
    failed.task_states = {"t": TaskState(state="dead", failed=True, finished_at=NOW - 60 * SECOND)}
    snap = snapshot(j, [node("a"), node("b"), node("c")], [failed])
    snap.usage = {"a": Resources(cpu=3000, memory_mb=6000, disk_mb=0)}  # best-fit would pick "a" first
    return schedule(snap), failed


def test_a_twice_failed_alloc_goes_to_the_node_it_has_not_failed_on() -> None:
    """Failed on "a", rescheduled to "b", failed there: "c" is chosen, though "a" packs better."""
    plan, failed = _failed_on_b([])
    assert [p.node_id for p in plan.place] == ["a"]  # only "b" penalised: packing wins
    plan, failed = _failed_on_b([event("a")])
    (placed,) = plan.place
    assert placed.node_id == "c" and placed.previous_allocation == failed.id
    assert [e.prev_node_id for e in placed.reschedule_tracker.events] == ["a", "b"]
