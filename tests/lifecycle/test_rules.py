"""Unit and property tests of the scheduler's pure rules: feasibility, ranking, reconcile, reschedule, plans."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm.messages import PlanApply
from fsm.record import copy_record
from fsm.structs import (
    HOUR,
    MINUTE,
    SECOND,
    Constraint,
    DeploymentStatus,
    Evaluation,
    RescheduleEvent,
    ReschedulePolicy,
    RescheduleTracker,
    Resources,
    TaskState,
    UpdateStrategy,
)
from node.leader.nodeevals import eval_chunks
from scheduler import feasibility as fz
from scheduler import reschedule as rs
from scheduler.feasibility import PlacementContext, ask_for, constraint_met
from scheduler.generic import schedule
from scheduler.plan import Plan, approx_size, logged_size, to_entries
from scheduler.ranking import BestFit, Request, Selector, bucket, rank_key
from scheduler.reconcile import STOP_LOST, Rollout, name_index, reconcile_group
from tests.lifecycle.support import NOW, alloc, job, node, snapshot


# -- feasibility ---------------------------------------------------------------------
def ctx(**usage: Resources) -> PlacementContext:
    return PlacementContext(usage=dict(usage))


def test_static_rules_filter_with_a_reason() -> None:
    j = job()
    ask = ask_for(j, j.task_groups[0])
    cases = {
        "node down": node("a", status="down"),
        "node draining": node("b"),
        "node ineligible": node("c"),
        "missing datacenter": node("d", dc="dc2"),
    }
    cases["node draining"].drain = True
    cases["node ineligible"].scheduling_eligibility = "ineligible"
    for reason, n in cases.items():
        assert fz.check_static(n, ask, ctx()) == reason
    nodriver = node("e")
    nodriver.attributes = {}
    assert fz.check_static(nodriver, ask, ctx()) == "missing driver sim"
    assert fz.check_static(node("f"), ask, ctx()) is None


def test_constraints_over_attributes() -> None:
    n = node("n1", **{"kernel.name": "linux", "cpu.cores": "8", "meta.rack": "r1", "tags": "a,b,c"})
    n.node_class = "big"

    def met(left: str, op: str, r: str = "") -> bool:
        return constraint_met(Constraint(l_target=left, operand=op, r_target=r), n)

    assert met("${attr.kernel.name}", "=", "linux")
    assert not met("${attr.kernel.name}", "!=", "linux")
    assert met("${attr.cpu.cores}", ">=", "4") and not met("${attr.cpu.cores}", "<", "4")
    assert met("${attr.cpu.cores}", ">", "10") is False  # numeric, not lexical
    assert met("${attr.kernel.name}", "regexp", "^lin")
    assert met("${meta.rack}", "=", "r1")
    assert met("${node.class}", "=", "big")
    assert met("${node.datacenter}", "=", "dc1")
    assert met("${attr.tags}", "set_contains", "a,c") and not met("${attr.tags}", "set_contains", "a,z")
    assert met("${attr.tags}", "set_contains_any", "z,c")
    assert met("${attr.gpu}", "is_not_set") and not met("${attr.gpu}", "is_set")
    assert not met("${attr.gpu}", "=", "x")  # a missing attribute matches nothing
    assert not met("${attr.kernel.name}", "frobnicate", "linux")  # unknown operands never match


def test_resources_fit_and_distinct_hosts_are_dynamic() -> None:
    j = job(cpu=1000, mem=1024, constraints=[Constraint(operand="distinct_hosts")])
    ask = ask_for(j, j.task_groups[0])
    assert ask.distinct_hosts and not ask.constraints
    n = node("n1", cpu=2000, mem=4096)
    c = ctx(n1=Resources(cpu=1500, memory_mb=0, disk_mb=0))
    assert fz.check_dynamic(n, ask, c) == "resources exhausted: cpu"
    c = ctx(n1=Resources(cpu=0, memory_mb=3500, disk_mb=0))
    assert fz.check_dynamic(n, ask, c) == "resources exhausted: memory"
    c = ctx()
    c.job_allocs["n1"] = 1
    assert "distinct_hosts" in (fz.check_dynamic(n, ask, c) or "")


def test_explain_says_when_an_ask_is_larger_than_any_node() -> None:
    j = job(mem=100_000)
    ask = ask_for(j, j.task_groups[0])
    nodes = [node("a"), node("b", status="down")]
    text = fz.explain(nodes, ask, ctx(), 2).describe()
    assert "asks more memory (100000 MB) than any node has" in text
    assert "node down: 1 node" in text and "resources exhausted (memory): 1 node" in text


# -- ranking -------------------------------------------------------------------------
def test_best_fit_prefers_a_fuller_bucket_over_an_empty_node() -> None:
    j = job(cpu=500, mem=512)
    ask = ask_for(j, j.task_groups[0])
    busy, empty = node("busy"), node("empty")
    c = ctx(busy=Resources(cpu=2000, memory_mb=4096, disk_mb=0))
    sel = Selector([busy, empty], c, rng=random.Random(1))
    assert sel.select(Request(ask)).id == "busy"


def test_quantized_best_fit_leaves_ties_to_anti_affinity() -> None:
    # Both nodes stay in the lowest bucket: the job's allocs spread instead of piling up.
    j = job(cpu=100, mem=64, count=10)
    ask = ask_for(j, j.task_groups[0])
    nodes = [node(f"n{i}") for i in range(5)]
    sel = Selector(nodes, ctx(), rng=random.Random(7))
    chosen = []
    for _ in range(10):
        n = sel.select(Request(ask))
        sel.claim(n, ask)
        chosen.append(n.id)
    assert Counter(chosen) == {f"n{i}": 2 for i in range(5)}
    # With unlimited buckets BestFit breaks every tie: everything packs on one node.
    assert bucket(0.5, 3) == 1 and bucket(1.0, 3) == 2 and bucket(0.0, 3) == 0


def test_a_rescheduled_alloc_avoids_its_previous_node() -> None:
    j = job()
    ask = ask_for(j, j.task_groups[0])
    a, b = node("a"), node("b")
    c = ctx(a=Resources(cpu=3000, memory_mb=6000, disk_mb=0))  # "a" would win on BestFit
    sel = Selector([a, b], c, rng=random.Random(3))
    assert sel.select(Request(ask)).id == "a"
    assert sel.select(Request(ask, previous_node="a")).id == "b"


@settings(max_examples=60, deadline=None)
@given(
    caps=st.lists(st.tuples(st.integers(500, 4000), st.integers(512, 8192)), min_size=1, max_size=8),
    used=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 6000)), min_size=8, max_size=8),
    ask_cpu=st.integers(50, 900),
    ask_mem=st.integers(32, 900),
    k=st.integers(1, 25),
    seed=st.integers(0, 1000),
)
def test_selector_heap_equals_a_full_scan(caps, used, ask_cpu, ask_mem, k, seed) -> None:
    """The heap-based selector picks exactly what scoring every node each time would."""
    nodes = [node(f"n{i}", cpu=c, mem=m) for i, (c, m) in enumerate(caps)]
    usage = {f"n{i}": Resources(cpu=min(u[0], caps[i][0]), memory_mb=min(u[1], caps[i][1]), disk_mb=0) for i, u in enumerate(used[: len(caps)])}
    j = job(cpu=ask_cpu, mem=ask_mem)
    ask = ask_for(j, j.task_groups[0])
    fast = Selector(nodes, PlacementContext(usage={k2: copy_record(v) for k2, v in usage.items()}), rng=random.Random(seed))
    slow_ctx = PlacementContext(usage={k2: copy_record(v) for k2, v in usage.items()})
    tiebreak = dict(fast.tiebreak)
    for _ in range(k):
        got = fast.select(Request(ask))
        best, best_key = None, None
        for n in sorted(nodes, key=lambda n: n.id):
            if fz.check_static(n, ask, slow_ctx) or fz.check_dynamic(n, ask, slow_ctx):
                continue
            key = rank_key(n, Request(ask), slow_ctx, fast.node_rules, tiebreak[n.id])
            if best_key is None or key > best_key:
                best, best_key = n, key
        assert (got.id if got else None) == (best.id if best else None)
        if got is None:
            break
        fast.claim(got, ask)
        u = slow_ctx.used(got.id)
        u.cpu += ask.resources.cpu
        u.memory_mb += ask.resources.memory_mb
        slow_ctx.job_allocs[got.id] += 1


def test_best_fit_score_is_monotone_in_usage() -> None:
    n = node("n")
    rule = BestFit(buckets=5)
    j = job(cpu=100, mem=100)
    ask = ask_for(j, j.task_groups[0])
    scores = [rule.score(n, ask, ctx(n=Resources(cpu=c, memory_mb=c * 2, disk_mb=0)), Request(ask)) for c in range(0, 3900, 300)]
    assert scores == sorted(scores) and scores[0] == 0 and scores[-1] == 4


# -- reconcile -------------------------------------------------------------------------
def test_a_new_job_places_count_with_names() -> None:
    j = job(count=3)
    gp = reconcile_group(j, j.task_groups[0], "g", [], {"a": node("a")}, NOW, "e1")
    assert sorted(name_index(p.name) for p in gp.place) == [0, 1, 2] and not gp.stop


def test_scale_down_stops_the_highest_indexes() -> None:
    j = job(count=2)
    allocs = [alloc(j, i, "a") for i in range(4)]
    gp = reconcile_group(j, j.task_groups[0], "g", allocs, {"a": node("a")}, NOW, "e1")
    assert sorted(name_index(s.alloc.name) for s in gp.stop) == [2, 3] and not gp.place


def test_allocs_on_a_down_node_are_lost_and_replaced() -> None:
    j = job(count=2)
    allocs = [alloc(j, 0, "down"), alloc(j, 1, "up")]
    nodes = {"down": node("down", status="down"), "up": node("up")}
    gp = reconcile_group(j, j.task_groups[0], "g", allocs, nodes, NOW, "e1")
    assert [(s.alloc.id, s.client_status, s.description) for s in gp.stop] == [(allocs[0].id, "lost", STOP_LOST)]
    assert len(gp.place) == 1 and gp.place[0].previous is allocs[0] and gp.place[0].name == allocs[0].name


def test_a_lost_alloc_stopped_without_a_replacement_is_still_replaced_later() -> None:
    """The eval that found the alloc lost had no room (every node down) and stopped it; the next one
    replaces it, linked, even while the rollout is failed (else the group stays short for good)."""
    j = job(count=2)
    lost = [alloc(j, i, "gone", desired="stop", client="lost", desired_description=STOP_LOST) for i in range(2)]
    nodes = {"up": node("up")}
    for rollout in (Rollout(), Rollout(failed="d1"), Rollout(paused=True)):
        gp = reconcile_group(j, j.task_groups[0], "g", lost, nodes, NOW, "e2", rollout=rollout)
        assert [(p.name, p.previous) for p in gp.place] == [(a.name, a) for a in lost], rollout
        assert not gp.stop
    replaced = copy_record(lost[0])
    replaced.next_allocation = "r0"
    live = alloc(j, 0, "up", alloc_id="r0")
    gp = reconcile_group(j, j.task_groups[0], "g", [replaced, lost[1], live], nodes, NOW, "e3")
    assert [(p.name, p.previous) for p in gp.place] == [(lost[1].name, lost[1])]  # each is owed once
    full = [*lost, alloc(j, 0, "up", alloc_id="f0"), alloc(j, 1, "up", alloc_id="f1")]
    assert not reconcile_group(j, j.task_groups[0], "g", full, nodes, NOW, "e4").place  # bounded by the count
    assert not reconcile_group(None, None, "g", lost, nodes, NOW, "e5").place  # a stopped job owes nothing


def test_batch_complete_allocs_keep_their_slots_service_ones_do_not() -> None:
    b = job(type="batch", count=2)
    done = [alloc(b, 0, "a", client="complete"), alloc(b, 1, "a", client="complete")]
    assert not reconcile_group(b, b.task_groups[0], "g", done, {"a": node("a")}, NOW, "e1").place
    s = job(count=2)
    done = [alloc(s, 0, "a", client="complete"), alloc(s, 1, "a")]
    gp = reconcile_group(s, s.task_groups[0], "g", done, {"a": node("a")}, NOW, "e1")
    assert [p.name for p in gp.place] == [done[0].name]


def _failed(j, index, *, finished: int, events: list[RescheduleEvent] | None = None, **kw):
    a = alloc(j, index, "a", client="failed", **kw)
    a.task_states = {"t": TaskState(state="dead", failed=True, finished_at=finished)}
    if events:
        a.reschedule_tracker = RescheduleTracker(events=events)
    return a


def test_failed_allocs_reschedule_now_later_or_never() -> None:
    policy = ReschedulePolicy(attempts=1, interval=HOUR, delay=5 * SECOND, delay_function="constant", unlimited=False)
    j = job(type="batch", count=3, reschedule_policy=policy)
    now_alloc = _failed(j, 0, finished=NOW - 10 * SECOND)
    later_alloc = _failed(j, 1, finished=NOW - 1 * SECOND)
    used_up = _failed(j, 2, finished=NOW - 60 * SECOND, events=[RescheduleEvent(NOW - 120 * SECOND, "x", "a", 5 * SECOND)])
    gp = reconcile_group(j, j.task_groups[0], "g", [now_alloc, later_alloc, used_up], {"a": node("a")}, NOW, "e1")
    assert [(p.previous.id, p.reschedule) for p in gp.place] == [(now_alloc.id, True)]
    assert [(f.alloc.id, f.at) for f in gp.followups] == [(later_alloc.id, NOW + 4 * SECOND)]
    # The follow-up eval itself replaces the alloc even a moment early.
    later_alloc.followup_eval_id = "e9"
    gp = reconcile_group(j, j.task_groups[0], "g", [later_alloc], {"a": node("a")}, NOW, "e9")
    assert [p.previous.id for p in gp.place if p.previous] == [later_alloc.id]


def test_a_client_finish_time_is_moved_by_the_skew_of_the_states_time() -> None:
    """After a leader whose clock ran an hour ahead, the state's time (the scheduler's ``now``)
    stays an hour ahead of the wall clock. A task that a client saw finish 1 s ago (its wall
    clock) failed 1 s ago in the state's time too: 4 s of its 5 s delay are left, neither none
    (its raw stamp is an hour old) nor an hour more."""
    policy = ReschedulePolicy(attempts=1, interval=HOUR, delay=5 * SECOND, delay_function="constant", unlimited=False)
    j = job(type="batch", count=1, reschedule_policy=policy)
    wall = NOW
    crashed = _failed(j, 0, finished=wall - SECOND)
    state_now = wall + HOUR
    decision = rs.decide(policy, crashed, state_now, "e1", skew=state_now - wall)
    assert (decision.decision, decision.at) == ("later", state_now + 4 * SECOND)
    assert rs.decide(policy, crashed, state_now, "e1").decision == "now"  # unmoved, the delay would be lost
    # Without a finish time the modify time is already in the state's time.
    recorded = _failed(j, 0, finished=0)
    recorded.modify_time = state_now
    assert rs.decide(policy, recorded, state_now, "e1", skew=HOUR).at == state_now + 5 * SECOND


def test_new_version_updates_destructively_up_to_the_limit_or_in_place() -> None:
    v0 = job(count=3, config={"v": 1})
    v1 = job(count=3, config={"v": 2}, version=1)
    allocs = [alloc(v0, i, "a") for i in range(3)]
    gp = reconcile_group(v1, v1.task_groups[0], "g", allocs, {"a": node("a")}, NOW, "e1", versions={0: v0, 1: v1}, limit=1)
    assert len(gp.stop) == 1 and len(gp.place) == 1 and gp.place[0].destructive and gp.pending_updates == 2
    # Only the count changed: allocs are updated in place and one more is placed.
    v1b = job(count=4, config={"v": 1}, version=1)
    gp = reconcile_group(v1b, v1b.task_groups[0], "g", allocs, {"a": node("a")}, NOW, "e1", versions={0: v0, 1: v1b})
    assert len(gp.inplace) == 3 and all(a.job_version == 1 for a in gp.inplace) and len(gp.place) == 1 and not gp.stop


def test_a_new_version_replaces_failed_service_allocs_at_once_instead_of_after_their_backoff() -> None:
    """As Nomad: a failed alloc of an older version waiting for its reschedule (or out of
    attempts) is updated destructively, failed ones first; its later reschedule is dropped."""
    policy = ReschedulePolicy(attempts=1, interval=HOUR, delay=HOUR, delay_function="constant", unlimited=False)
    v0 = job(count=3, config={"v": 0}, reschedule_policy=policy)
    v1 = job(count=3, config={"v": 1}, reschedule_policy=policy, version=1)
    waiting = _failed(v0, 2, finished=NOW - SECOND)
    given_up = _failed(v0, 1, finished=NOW - SECOND, events=[RescheduleEvent(NOW - 60 * SECOND, "x", "a", HOUR)])
    running = alloc(v0, 0, "a")
    versions = {0: v0, 1: v1}
    gp = reconcile_group(v0, v0.task_groups[0], "g", [running, waiting, given_up], {"a": node("a")}, NOW, "e1", versions=versions)
    assert not gp.place and [f.alloc.id for f in gp.followups] == [waiting.id]  # the same version waits
    gp = reconcile_group(v1, v1.task_groups[0], "g", [running, waiting, given_up], {"a": node("a")}, NOW, "e1", versions=versions, limit=2)
    assert [s.alloc.id for s in gp.stop] == [given_up.id, waiting.id] and not gp.followups
    assert [p.previous.id for p in gp.place] == [given_up.id, waiting.id] and gp.pending_updates == 1


def test_a_stopped_job_stops_everything() -> None:
    j = job(count=2)
    j.stop = True
    allocs = [alloc(j, 0, "a"), alloc(j, 1, "a", client="pending")]
    gp = reconcile_group(j, None, "g", allocs, {"a": node("a")}, NOW, "e1")
    assert len(gp.stop) == 2 and not gp.place


alloc_states = st.sampled_from(["pending", "running", "complete", "failed", "lost", "stop-running"])


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(0, 6),
    kind=st.sampled_from(["service", "batch"]),
    specs=st.lists(st.tuples(st.integers(0, 7), alloc_states, st.booleans(), st.booleans()), max_size=12),
    limit=st.integers(0, 4),
)
def test_reconcile_never_wants_more_than_count(count, kind, specs, limit) -> None:
    """Whatever exists, live allocs after the plan never exceed count; with no limit they reach it."""
    j0 = job(type=kind, count=count, config={"v": 0})
    j1 = job(type=kind, count=count, config={"v": 1}, version=1)
    nodes = {"up": node("up"), "down": node("down", status="down")}
    allocs = []
    for i, (index, state, on_down, old) in enumerate(specs):
        desired, client = ("stop", "running") if state == "stop-running" else ("run", state)
        a = alloc(j0 if old else j1, index, "down" if on_down else "up", client=client, desired=desired, alloc_id=f"x{i}")
        if client == "failed":
            a.task_states = {"t": TaskState(finished_at=NOW - 3600 * SECOND)}
        allocs.append(a)
    gp = reconcile_group(j1, j1.task_groups[0], "g", allocs, nodes, NOW, "e1", versions={0: j0, 1: j1}, limit=limit)
    stopped = {s.alloc.id for s in gp.stop}
    live_after = [a for a in allocs if not a.terminal() and a.id not in stopped]
    assert len(live_after) + len(gp.place) <= count
    # Finished batch allocs of this version keep their slots; everything else (failed ones long
    # past their reschedule delay, lost ones, finished service ones, an older batch version's
    # ended ones) is replaced: the group reaches count.
    held = [a for a in allocs if a.desired_status == "run" and a.client_status == "complete" and kind == "batch"
            and a.job_version == j1.version]
    assert len(live_after) + len(gp.place) == max(0, count - len(held))
    # Lost allocs are always marked lost, never just left running on a down node.
    for a in allocs:
        if a.node_id == "down" and not a.terminal():
            assert a.id in stopped


# -- reschedule ------------------------------------------------------------------------
def _with_delays(delays: list[int]):
    j = job()
    a = alloc(j, 0, "a", client="failed")
    a.reschedule_tracker = RescheduleTracker(events=[RescheduleEvent(NOW - 10 * SECOND, "p", "a", d) for d in delays])
    return a


def test_delay_functions() -> None:
    fib = ReschedulePolicy(delay=5 * SECOND, delay_function="fibonacci", max_delay=HOUR)
    seq, delays = [], []
    for _ in range(5):
        d = rs.next_delay(fib, _with_delays(delays))
        seq.append(d // SECOND)
        delays.append(d)
    assert seq == [5, 5, 10, 15, 25]
    exp = ReschedulePolicy(delay=5 * SECOND, delay_function="exponential", max_delay=30 * SECOND)
    seq, delays = [], []
    for _ in range(5):
        d = rs.next_delay(exp, _with_delays(delays))
        seq.append(d // SECOND)
        delays.append(d)
    assert seq == [5, 10, 20, 30, 30]
    const = ReschedulePolicy(delay=7 * SECOND, delay_function="constant")
    assert rs.next_delay(const, _with_delays([7 * SECOND, 7 * SECOND])) == 7 * SECOND


def test_eligibility_counts_attempts_inside_the_interval() -> None:
    policy = ReschedulePolicy(attempts=2, interval=HOUR, unlimited=False)
    a = _with_delays([5 * SECOND])
    assert rs.eligible(policy, a, NOW)
    a = _with_delays([5 * SECOND, 5 * SECOND])
    assert not rs.eligible(policy, a, NOW)
    assert not rs.eligible(None, a, NOW)
    assert rs.eligible(ReschedulePolicy(unlimited=True), a, NOW)
    old = _with_delays([5 * SECOND, 5 * SECOND])
    for e in old.reschedule_tracker.events:
        e.reschedule_time = NOW - 2 * HOUR
    assert rs.eligible(policy, old, NOW)


def test_a_limited_policys_next_delay_must_fit_in_its_interval() -> None:
    """Nomad's nextRescheduleTime: with attempts left, a delay that grew to the interval ends it."""
    policy = ReschedulePolicy(attempts=5, interval=MINUTE, delay=20 * SECOND, delay_function="exponential",
                              max_delay=HOUR, unlimited=False)
    assert rs.decide(policy, _with_delays([]), NOW, "e").decision != "never"  # a first delay of 20 s
    assert rs.decide(policy, _with_delays([20 * SECOND]), NOW, "e").decision != "never"  # 40 s
    assert rs.decide(policy, _with_delays([20 * SECOND, 40 * SECOND]), NOW, "e").decision == "never"  # 80 s
    unlimited = ReschedulePolicy(interval=MINUTE, delay=20 * SECOND, delay_function="exponential", max_delay=HOUR)
    assert rs.decide(unlimited, _with_delays([20 * SECOND, 40 * SECOND]), NOW, "e").decision != "never"


def test_followups_share_an_eval_within_five_seconds() -> None:
    groups = rs.batch_followups([("a", 10 * SECOND), ("b", 12 * SECOND), ("c", 16 * SECOND), ("d", 30 * SECOND)])
    assert groups == [(10 * SECOND, ["a", "b"]), (16 * SECOND, ["c"]), (30 * SECOND, ["d"])]


# -- whole evaluations --------------------------------------------------------------------
def test_an_ask_larger_than_any_node_blocks_with_a_reason() -> None:
    j = job(count=2, mem=100_000)
    plan = schedule(snapshot(j, [node("a"), node("b")]))
    done, blocked = plan.evals
    assert done.status == "complete" and done.blocked_eval == blocked.id and done.queued_allocations == {"g": 2}
    assert blocked.status == "blocked" and "than any node has" in blocked.failed_tg_allocs["g"]
    assert not plan.place and plan.deployment is None
    # Processing the blocked eval itself re-blocks it instead of creating another.
    again = schedule(snapshot(j, [node("a")], eval_id=blocked.id, status="blocked"))
    assert [(e.id, e.status) for e in again.evals] == [(blocked.id, "blocked")]


def test_partial_capacity_places_what_fits() -> None:
    j = job(count=5, cpu=1000, mem=100)
    plan = schedule(snapshot(j, [node("a", cpu=3000)]))
    assert len(plan.place) == 3 and plan.failed == {"g": 2}
    assert plan.evals[0].queued_allocations == {"g": 2}


def test_a_service_version_rolls_out_through_a_deployment() -> None:
    strategy = UpdateStrategy(max_parallel=2, min_healthy_time=SECOND)
    v0 = job(count=4, config={"v": 0}, update=strategy)
    v1 = job(count=4, config={"v": 1}, update=strategy, version=1)
    allocs = [alloc(v0, i, f"n{i}") for i in range(4)]
    plan = schedule(snapshot(v1, [node(f"n{i}") for i in range(4)], allocs, versions={0: v0, 1: v1}))
    dep = plan.deployment
    assert dep is not None and dep.job_version == 1 and dep.task_groups["g"].desired_total == 4
    assert len(plan.place) == 2 and all(a.deployment_id == dep.id for a in plan.place)
    assert plan.evals[0].deployment_id == dep.id  # as Nomad's eval.DeploymentID (what `job run` prints)
    assert len([s for s in plan.stop if s.desired_status == "stop"]) == 2
    # A first version of a service job gets a deployment too; a batch job never does.
    assert schedule(snapshot(job(count=2), [node("a")])).deployment is not None
    batch = schedule(snapshot(job(type="batch", count=2), [node("a")]))
    assert batch.deployment is None and batch.evals[0].deployment_id == ""


def test_allocs_updated_in_place_join_the_new_rollout_with_health_unknown() -> None:
    """As Nomad's scheduler: an in-place update moves the alloc into the new version's
    deployment, which then counts every alloc of the version."""
    strategy = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND)
    v0 = job(count=2, update=strategy)
    v1 = job(count=3, update=strategy, version=1)  # only the count changed
    allocs = [alloc(v0, i, f"n{i}", deployment_id="d0", deployment_status=DeploymentStatus(healthy=True)) for i in range(2)]
    plan = schedule(snapshot(v1, [node(f"n{i}") for i in range(3)], allocs, versions={0: v0, 1: v1}))
    dep = plan.deployment
    assert dep is not None and dep.task_groups["g"].desired_total == 3
    moved = [a for a in plan.place if a.id in plan.inplace]
    assert len(moved) == 2 and len(plan.place) == 3
    assert all(a.deployment_id == dep.id and a.deployment_status is None for a in plan.place)
    # A version changed only in place still gets a deployment of its own.
    v1_same = job(count=2, update=strategy, version=1)
    plan = schedule(snapshot(v1_same, [node("n0"), node("n1")], allocs, versions={0: v0, 1: v1_same}))
    assert plan.deployment is not None and plan.deployment.task_groups["g"].desired_total == 2
    assert len(plan.place) == 2 and all(a.deployment_id == plan.deployment.id for a in plan.place)
    # A batch job has no rollout: its allocs keep what they had.
    b0, b1 = job(type="batch", count=2), job(type="batch", count=2, version=1)
    plan = schedule(snapshot(b1, [node("n0"), node("n1")], [alloc(b0, i, f"n{i}") for i in range(2)], versions={0: b0, 1: b1}))
    assert plan.deployment is None and all(a.deployment_id == "" for a in plan.place)


def test_failed_alloc_later_gets_a_followup_eval_and_annotation() -> None:
    policy = ReschedulePolicy(attempts=3, interval=HOUR, delay=30 * SECOND, delay_function="constant", unlimited=False)
    j = job(type="batch", count=1, reschedule_policy=policy)
    a = _failed(j, 0, finished=NOW - SECOND)
    plan = schedule(snapshot(j, [node("a")], [a]))
    done, follow = plan.evals
    assert follow.wait_until == NOW + 29 * SECOND and follow.status == "pending" and done.next_eval == follow.id
    assert [(s.id, s.desired_status, s.followup_eval_id) for s in plan.stop] == [(a.id, "run", follow.id)]


def test_system_job_runs_once_per_eligible_node() -> None:
    j = job(type="system", count=1)
    nodes = [node("a"), node("b"), node("c", status="down"), node("d", dc="dc9")]
    plan = schedule(snapshot(j, nodes))
    assert sorted(a.node_id for a in plan.place) == ["a", "b"]
    # The alloc on a node that went down is lost and not replaced elsewhere.
    existing = [alloc(j, 0, "a"), alloc(j, 0, "b", alloc_id="on-b")]
    nodes[1].status = "down"
    plan = schedule(snapshot(j, nodes, existing))
    assert not plan.place and [(s.id, s.client_status) for s in plan.stop] == [("on-b", "lost")]


def test_a_system_group_with_count_0_is_switched_off() -> None:
    """Nomad's materializeSystemTaskGroups: count 0 places nothing and stops what runs."""
    on = job(type="system", count=1)
    off = job(type="system", count=0, version=1)
    plan = schedule(snapshot(off, [node("a"), node("b")], [alloc(on, 0, "a", alloc_id="on-a")]))
    assert not plan.place and [(s.id, s.desired_description) for s in plan.stop] == [("on-a", "alloc not needed due to job update")]


def test_an_alloc_ending_asks_for_an_eval_only_where_nomad_would() -> None:
    """A failed system alloc is left failed (system groups have no reschedule policy, so Nomad's
    UpdateAlloc makes no eval); a completed batch alloc needs none; a stopped job needs none."""
    from node.leader.lifecycle import TRIGGER_ALLOC_FAILURE, TRIGGER_ALLOC_STOP, _evaluates

    assert _evaluates(job(type="service"), TRIGGER_ALLOC_FAILURE)
    assert _evaluates(job(type="batch"), TRIGGER_ALLOC_FAILURE)
    assert not _evaluates(job(type="system"), TRIGGER_ALLOC_FAILURE)
    assert not _evaluates(job(type="batch"), TRIGGER_ALLOC_STOP)
    assert not _evaluates(job(type="service", stop=True), TRIGGER_ALLOC_FAILURE)


# -- plans as raft entries ------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(n_place=st.integers(0, 300), n_stop=st.integers(0, 100), with_dep=st.booleans(), limit_kb=st.integers(8, 64))
def test_entries_are_bounded_and_evals_come_last(n_place, n_stop, with_dep, limit_kb) -> None:
    j = job(count=n_place)
    plan = schedule(snapshot(j, [node(f"n{i}", cpu=100_000, mem=100_000) for i in range(10)]))
    from fsm.messages import AllocStop

    plan.stop = [AllocStop(id=f"s{i}") for i in range(n_stop)]
    if not with_dep:
        plan.deployment = None
    limit = limit_kb * 1024
    # Packed by exact probes, and by a per-item estimate that undercounts (re-split by the check).
    for bodies in (to_entries(plan, limit, approx_size), to_entries(plan, limit, approx_size, item_size=logged_size)):
        assert all(approx_size(b) <= limit for b in bodies)
        assert [e.id for b in bodies for e in b.evals] == [e.id for e in plan.evals] and bodies[-1].evals
        assert all(not b.evals for b in bodies[:-1])
        assert [a.id for b in bodies for a in b.allocs_to_place] == [a.id for a in plan.place]
        assert sum(len(b.allocs_to_stop) for b in bodies) == n_stop
        if plan.deployment is not None:
            assert bodies[0].deployment is plan.deployment and all(b.deployment is None for b in bodies[1:])
        # Stops before placements: no entry stops anything after an entry that placed.
        seen_place = False
        for b in bodies:
            if b.allocs_to_stop:
                assert not seen_place
            seen_place |= bool(b.allocs_to_place)


def test_an_empty_plan_still_writes_its_eval() -> None:
    plan = Plan(eval_id="e", job_id="j")
    from fsm.structs import Evaluation

    plan.evals = [Evaluation(id="e", job_id="j", status="complete")]
    bodies = to_entries(plan, 4096)
    assert len(bodies) == 1 and isinstance(bodies[0], PlanApply) and bodies[0].evals


def test_top_k_spreads_choices_among_the_best_few() -> None:
    """While plans conflict the selector picks at random among the best few (Protean)."""
    j = job(cpu=100, mem=64)
    ask = ask_for(j, j.task_groups[0])
    nodes = [node(f"n{i}") for i in range(8)]
    usage = {f"n{i}": Resources(cpu=2000 - 200 * i, memory_mb=4000 - 400 * i, disk_mb=0) for i in range(8)}
    best = Selector(nodes, PlacementContext(usage=dict(usage)), rng=random.Random(1)).select(Request(ask)).id
    picks = {Selector(nodes, PlacementContext(usage=dict(usage)), rng=random.Random(s), top_k=4).select(Request(ask)).id
             for s in range(40)}
    assert best in picks and 1 < len(picks) <= 4


def test_eval_chunks_fit_one_raft_entry_each() -> None:
    """Evals the leader writes (node down, failed evals) are split to fit its entry size limit."""
    evals = [Evaluation(id=f"e{i:03d}", job_id=f"job-{i:03d}", status="pending") for i in range(50)]
    size = len(codec.encode(evals[0]))
    chunks = eval_chunks(evals, budget=10 * size + 5, most=200)
    assert [len(c) for c in chunks] == [10, 10, 10, 10, 10] and [e for c in chunks for e in c] == evals
    assert [len(c) for c in eval_chunks(evals, budget=1 << 20, most=20)] == [20, 20, 10]
    big = Evaluation(id="big", job_id="j" * 500)
    assert eval_chunks([big, evals[0]], budget=size) == [[big], [evals[0]]]  # too large alone: still written
    assert eval_chunks([], budget=100) == []
