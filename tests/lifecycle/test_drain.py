"""Node drains over a real FSM and scheduler: the drain entry, the drainer's steps, the scheduler's migrations."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.structs import (
    HOUR,
    MINUTE,
    SECOND,
    DeploymentStatus,
    DesiredTransition,
    DrainStrategy,
    Evaluation,
    Job,
    MigrateStrategy,
)
from node.leader.drainer import DrainPass, Overdue, look
from tests.fsm.support import Harness
from tests.lifecycle.support import alloc as make_alloc
from tests.lifecycle.support import job, live, node, register, run_eval


def report(h: Harness, allocs: list[Any], *, healthy: bool | None = True) -> None:
    """The client: running, and (``healthy`` not None) health reported."""
    health = None if healthy is None else DeploymentStatus(healthy=healthy, timestamp=h.time)
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=a.id, client_status="running", deployment_status=health)
                                     for a in allocs]))


def drainer_pass(h: Harness, now: int | None = None) -> DrainPass:
    """One drainer pass as the leader runs it: marks (with the evals, which are then scheduled) and ends."""
    with h.reader() as r:
        found = look(r, h.time if now is None else now)
    if found.marks:
        evals = found.evals()
        marks = {i: DesiredTransition(migrate=True) for ids in found.marks.values() for i in ids}
        h.ok(m.AllocDesiredTransition(allocs=marks, evals=evals))
        for ev in evals:
            run_eval(h, ev)
    for node_id, started in found.done:
        h.ok(m.NodeUpdateDrain(node_id=node_id, done_started_at=started))
    return found


def client_stopped(h: Harness, node_id: str) -> None:
    """The client reports what the scheduler stopped on ``node_id`` as complete."""
    with h.reader() as r:
        ids = [a.id for a in r.allocs_by_node(node_id) if a.server_terminal() and not a.client_terminal()]
    if ids:
        h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=i, client_status="complete") for i in ids]))


def on(allocs: list[Any], node_id: str) -> list[Any]:
    return [a for a in allocs if a.node_id == node_id]


def service_on_a(h: Harness, count: int = 3, max_parallel: int = 1, job_id: str = "web") -> Job:
    """``count`` healthy service allocs, all on node a (b and c join afterwards)."""
    h.ok(m.NodeRegister(node=node("a")))
    j = job(job_id, count=count)
    j.task_groups[0].migrate = MigrateStrategy(max_parallel=max_parallel)
    run_eval(h, register(h, j))
    report(h, live(h, job_id))
    for n in ("b", "c"):
        h.ok(m.NodeRegister(node=node(n)))
    return j


def drain(h: Harness, node_id: str = "a", deadline: int = HOUR, ignore_system: bool = False) -> None:
    h.ok(m.NodeUpdateDrain(node_id=node_id, strategy=DrainStrategy(deadline=deadline, ignore_system_jobs=ignore_system)))


# -- the entry --------------------------------------------------------------------------------
def test_a_drain_closes_the_node_keeps_its_start_and_counts_its_deadline_from_the_entry(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("a")))
    drain(h, deadline=MINUTE)
    with h.reader() as r:
        first = r.node("a")
    assert first.drain and first.scheduling_eligibility == "ineligible"
    started = first.drain_strategy.started_at
    assert started == h.time and first.drain_strategy.force_deadline == h.time + MINUTE
    drain(h, deadline=2 * MINUTE)  # changed: same drain, new deadline from now
    h.ok(m.NodeRegister(node=node("a")))  # the client restarts: the drain goes on
    with h.reader() as r:
        again = r.node("a")
    assert again.drain_strategy.started_at == started
    assert again.drain_strategy.force_deadline == h.time - SECOND + 2 * MINUTE
    # The drainer ends a drain only while it is the one it saw.
    h.ok(m.NodeUpdateDrain(node_id="a"))  # the operator ends it ...
    drain(h)  # ... and starts another
    stale = h.apply(m.NodeUpdateDrain(node_id="a", done_started_at=started))
    assert not stale.ok and stale.code == "conflict"
    with h.reader() as r:
        current = r.node("a").drain_strategy.started_at
    h.ok(m.NodeUpdateDrain(node_id="a", done_started_at=current))
    with h.reader() as r:
        done = r.node("a")
    assert not done.drain and done.drain_strategy is None and done.scheduling_eligibility == "ineligible"
    drain(h)
    h.ok(m.NodeUpdateDrain(node_id="a", mark_eligible=True))  # `-disable`: open again
    with h.reader() as r:
        assert r.node("a").scheduling_eligibility == "eligible" and not r.node("a").drain
    missing = h.apply(m.NodeUpdateDrain(node_id="nope", strategy=DrainStrategy()))
    assert not missing.ok and missing.code == "not_found"


def test_a_deadline_passes_on_the_leaders_clock_while_the_states_time_stands_still(h: Harness) -> None:
    """Campaign 601:3, seed 601: a clock jumped 60 s ahead pinned the state's time forward, so a drain
    with a 5 s deadline, stamped in that time, was still short of it 35 s later.

    The state's time stays at the drain's start here (as while it is pinned); the drainer's own
    monotonic clock moves. The deadline passes 5 s after the drainer first saw the drain, not
    sooner, and a changed deadline counts from when the drainer saw the change.
    """
    service_on_a(h, count=3, max_parallel=1)
    drain(h, deadline=5 * SECOND)
    started = h.time  # the drain entry's time
    tick = [1000.0]
    overdue = Overdue(lambda: tick[0])

    def forced_pass() -> DrainPass:
        with h.reader() as r:
            found = look(r, h.time, overdue)  # the state's time: before the force deadline throughout
            strategy = r.node("a").drain_strategy
            assert strategy is None or not strategy.forced(h.time)
        overdue.end_pass()
        return found

    first = forced_pass()
    assert sum(map(len, first.marks.values())) == 1 and not first.done  # a step of max_parallel 1
    tick[0] += 4.9
    assert not forced_pass().done
    tick[0] += 0.1
    late = forced_pass()
    assert sum(map(len, late.marks.values())) == 3 and late.done == [("a", started)]

    drain(h, deadline=MINUTE)  # changed: the new deadline counts from this pass on
    assert not forced_pass().done
    tick[0] += 59.9
    assert not forced_pass().done
    tick[0] += 0.1
    assert forced_pass().done
    h.ok(m.NodeUpdateDrain(node_id="a"))
    forced_pass()
    assert not overdue._first  # an ended drain is forgotten


def test_without_a_deadline_or_with_force_the_leaders_clock_changes_nothing(h: Harness) -> None:
    service_on_a(h, count=3, max_parallel=1)
    drain(h, deadline=0)
    overdue = Overdue(lambda: 1e9)
    with h.reader() as r:
        assert look(r, h.time, overdue).marks == look(r, h.time).marks
    drain(h, deadline=-1)
    with h.reader() as r:
        started = r.node("a").drain_strategy.started_at
        assert look(r, h.time, overdue).done == look(r, h.time).done == [("a", started)]


# -- service allocs ---------------------------------------------------------------------------
def test_service_allocs_move_max_parallel_at_a_time_each_step_once_replacements_are_healthy(h: Harness) -> None:
    service_on_a(h, count=3, max_parallel=1)
    drain(h)
    first = drainer_pass(h)
    assert list(first.marks) == ["web"] and len(first.marks["web"]) == 1
    now = live(h, "web")
    assert len(on(now, "a")) == 2 and len(now) == 3, "one alloc moved; the rest keep running"
    moved = [a for a in now if a.node_id != "a"]
    assert len(moved) == 1 and moved[0].previous_allocation
    assert not drainer_pass(h).marks, "the replacement's health is not known yet"
    report(h, moved, healthy=None)
    assert not drainer_pass(h).marks, "running is not enough: its health must be reported"
    report(h, moved)
    assert len(drainer_pass(h).marks["web"]) == 1
    report(h, [a for a in live(h, "web") if a.node_id != "a"])
    assert len(drainer_pass(h).marks["web"]) == 1
    assert not on(live(h, "web"), "a")
    report(h, live(h, "web"))
    assert not drainer_pass(h).done, "not done while the client still runs what was stopped"
    client_stopped(h, "a")
    last = drainer_pass(h)
    assert not last.marks and [n for n, _ in last.done] == ["a"]
    with h.reader() as r:
        a = r.node("a")
    assert not a.drain and a.scheduling_eligibility == "ineligible", "drained nodes stay closed"
    assert len(live(h, "web")) == 3


def test_allocs_marked_but_not_yet_stopped_count_as_moving(h: Harness) -> None:
    """The scheduler has not acted on the marks yet: a second pass must not mark one more."""
    service_on_a(h, count=3, max_parallel=1)
    drain(h)
    with h.reader() as r:
        first = look(r, h.time)
    h.ok(m.AllocDesiredTransition(allocs={i: DesiredTransition(migrate=True) for i in first.marks["web"]}))
    with h.reader() as r:
        assert not look(r, h.time).marks


def test_unmarked_allocs_on_a_draining_node_keep_running_when_their_job_is_evaluated(h: Harness) -> None:
    service_on_a(h, count=2, max_parallel=1)
    drain(h)
    ev = Evaluation(id="ev-any", job_id="web", status="pending")  # any eval of the job
    h.ok(m.EvalUpsert(evals=[ev]))
    run_eval(h, ev)
    assert len(on(live(h, "web"), "a")) == 2, "only the drainer decides what moves"


def test_max_parallel_two_moves_two_at_once_and_zero_waits_for_the_deadline(h: Harness) -> None:
    service_on_a(h, count=4, max_parallel=2)
    drain(h, deadline=10 * MINUTE)
    assert len(drainer_pass(h).marks["web"]) == 2
    h.ok(m.NodeRegister(node=node("z")))
    j = job("still", count=2)
    j.task_groups[0].migrate = MigrateStrategy(max_parallel=0)
    h.ok(m.NodeUpdateDrain(node_id="b", strategy=DrainStrategy(deadline=10 * MINUTE)))
    h.ok(m.NodeUpdateDrain(node_id="c", strategy=DrainStrategy(deadline=10 * MINUTE)))
    run_eval(h, register(h, j))
    report(h, live(h, "still"))
    assert all(a.node_id == "z" for a in live(h, "still"))
    drain(h, "z", deadline=10 * MINUTE)
    assert "still" not in drainer_pass(h).marks, "max_parallel 0: nothing moves before the deadline"
    assert len(drainer_pass(h, h.time + 11 * MINUTE).marks["still"]) == 2


# -- batch and system allocs, deadlines -------------------------------------------------------
def test_batch_allocs_finish_unless_the_deadline_passes_and_system_allocs_stop_last(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("a")))
    batch = job("etl", type="batch", count=1)
    system = job("logs", type="system", count=1)
    run_eval(h, register(h, batch))
    run_eval(h, register(h, system))
    report(h, live(h, "etl") + live(h, "logs"), healthy=None)
    h.ok(m.NodeRegister(node=node("b")))
    drain(h, deadline=MINUTE)
    first = drainer_pass(h)
    assert not first.marks and not first.done, "the batch alloc may finish; the system alloc waits for it"
    forced = drainer_pass(h, h.time + 2 * MINUTE)
    assert sorted(forced.marks) == ["etl", "logs"], "at the deadline everything goes, system allocs too"
    assert not live(h, "etl") or all(a.node_id == "b" for a in live(h, "etl"))
    assert not on(live(h, "logs"), "a")
    assert [a.node_id for a in live(h, "logs")] == ["b"], "the system job keeps running on the other node"


def test_a_finished_batch_alloc_ends_the_drain_and_system_allocs_go_in_the_same_pass(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("a")))
    batch, system = job("etl", type="batch", count=1), job("logs", type="system", count=1)
    run_eval(h, register(h, batch))
    run_eval(h, register(h, system))
    report(h, live(h, "etl") + live(h, "logs"), healthy=None)
    drain(h, deadline=0)  # no deadline
    assert not drainer_pass(h, h.time + 100 * HOUR).marks, "without a deadline the batch alloc runs to its end"
    (etl,) = live(h, "etl")
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=etl.id, client_status="complete")]))
    done = drainer_pass(h)
    assert list(done.marks) == ["logs"] and [n for n, _ in done.done] == ["a"]
    assert not live(h, "logs"), "stopped, and not placed on the closed node again"


def test_marked_allocs_move_even_when_the_drain_ended_before_their_eval_ran(h: Harness) -> None:
    """The drainer marks the system alloc and ends the drain in the same pass; the eval may run after
    the end. An operator may also end a drain after allocs were marked. Either way they move (Nomad)."""
    h.ok(m.NodeRegister(node=node("a")))
    service = job("web", count=1)
    run_eval(h, register(h, service))
    run_eval(h, register(h, job("logs", type="system", count=1)))
    report(h, live(h, "web") + live(h, "logs"))
    h.ok(m.NodeRegister(node=node("b")))
    drain(h)
    with h.reader() as r:
        first = look(r, h.time)
    h.ok(m.AllocDesiredTransition(allocs={i: DesiredTransition(migrate=True) for i in first.marks["web"]}))
    h.ok(m.NodeUpdateDrain(node_id="a"))  # the operator ends the drain (the node stays closed)
    ev = Evaluation(id="ev-web", job_id="web", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    run_eval(h, ev)
    assert [a.node_id for a in live(h, "web")] == ["b"], "the marked alloc moved"
    drain(h)
    client_stopped(h, "a")
    with h.reader() as r:
        done = look(r, h.time)
    assert list(done.marks) == ["logs"] and done.done
    (logs_alloc,) = on(live(h, "logs"), "a")
    h.ok(m.AllocDesiredTransition(allocs={logs_alloc.id: DesiredTransition(migrate=True)}))
    h.ok(m.NodeUpdateDrain(node_id="a", done_started_at=done.done[0][1]))  # ended before the eval runs
    ev = Evaluation(id="ev-logs", job_id="logs", type="system", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    run_eval(h, ev)
    assert not on(live(h, "logs"), "a"), "the marked system alloc stopped on the closed node"


def test_force_moves_everything_at_once_and_ignore_system_leaves_system_allocs(h: Harness) -> None:
    service_on_a(h, count=3, max_parallel=1)
    system = job("logs", type="system", count=1)
    h.ok(m.NodeUpdateEligibility(node_id="b", eligibility="ineligible"))
    h.ok(m.NodeUpdateEligibility(node_id="c", eligibility="ineligible"))
    run_eval(h, register(h, system))
    h.ok(m.NodeUpdateEligibility(node_id="b", eligibility="eligible"))
    h.ok(m.NodeUpdateEligibility(node_id="c", eligibility="eligible"))
    drain(h, deadline=-1, ignore_system=True)
    found = drainer_pass(h)
    assert len(found.marks["web"]) == 3 and "logs" not in found.marks
    assert not on(live(h, "web"), "a")
    assert [n for n, _ in found.done] == ["a"], "forced: done at once, without waiting for the client (Nomad)"
    assert [a.node_id for a in live(h, "logs")] == ["a"], "ignored: the system alloc stays"


# -- a property ---------------------------------------------------------------------------------
ALLOC_STATE = st.tuples(
    st.sampled_from(["a", "a", "b"]),  # node
    st.sampled_from(["running", "running", "pending", "complete", "failed"]),
    st.sampled_from([None, True, False]),  # health reported
    st.booleans(),  # marked already
    st.sampled_from(["run", "run", "stop"]),  # desired status (stop: the scheduler is stopping it)
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    count=st.integers(1, 5),
    max_parallel=st.integers(0, 3),
    states=st.lists(ALLOC_STATE, min_size=1, max_size=6),
    batch=st.sampled_from([None, "running", "complete"]),
    system=st.sampled_from([None, "running"]),
    deadline=st.sampled_from([-1, 0, MINUTE]),
    past_deadline=st.booleans(),
    ignore_system=st.booleans(),
)
def test_the_drainer_keeps_each_groups_healthy_floor_and_nomads_order(
    count: int, max_parallel: int, states: list[tuple[str, str, bool | None, bool, str]], batch: str | None,
    system: str | None, deadline: int, past_deadline: bool, ignore_system: bool,
) -> None:
    """Whatever the allocs' states: only live unmarked allocs of draining nodes are marked; before the
    deadline a group keeps ``count - max_parallel`` allocs with health (if it had them), batch allocs
    stay, system allocs go only with the rest gone; a drain is done at the deadline, or once the client runs
    nothing but system allocs."""
    h = Harness.temp()
    try:
        h.ok(m.NodeRegister(node=node("a")))
        h.ok(m.NodeRegister(node=node("b")))
        web = job("web", count=count)
        web.task_groups[0].migrate = MigrateStrategy(max_parallel=max_parallel)
        h.ok(m.JobRegister(job=web))
        allocs = []
        for i, (node_id, client, health, _marked, desired) in enumerate(states):
            allocs.append(make_alloc(web, i, node_id, client=client, desired=desired, alloc_id=f"w{i}",
                                     deployment_status=None if health is None else DeploymentStatus(healthy=health)))
        for kind, status in (("batch", batch), ("system", system)):
            if status is not None:
                j = job(f"{kind}-job", type=kind, count=1)
                h.ok(m.JobRegister(job=j))
                allocs.append(make_alloc(j, 0, "a", client=status, alloc_id=f"{kind}-0"))
        job_ids = sorted({a.job_id for a in allocs})
        h.ok(m.EvalUpsert(evals=[Evaluation(id=f"e-{j}", job_id=j, status="complete") for j in job_ids]))
        for a in allocs:
            a.eval_id = f"e-{a.job_id}"
        h.ok(m.PlanApply(allocs_to_place=allocs))
        marked = {f"w{i}": DesiredTransition(migrate=True) for i, s in enumerate(states) if s[3]}
        if marked:
            h.ok(m.AllocDesiredTransition(allocs=marked))
        drain(h, deadline=deadline, ignore_system=ignore_system)
        with h.reader() as r:
            before = {a.id: a for a in r.allocs()}
            start = r.node("a").drain_strategy.started_at
            now = start + (2 * MINUTE if past_deadline else 0)
            found = look(r, now)
        forced = deadline < 0 or (deadline > 0 and past_deadline)
        ids = [i for ids in found.marks.values() for i in ids]
        assert len(ids) == len(set(ids))
        for i in ids:
            a = before[i]
            assert a.node_id == "a" and not a.terminal() and not a.desired_transition.migrate, a
        if not forced:
            assert "batch-job" not in found.marks
            floor = count - max_parallel

            def reported(exclude: set[str]) -> int:
                return sum(1 for a in before.values() if a.job_id == "web" and not a.terminal()
                           and not a.desired_transition.migrate and a.id not in exclude
                           and a.deployment_status is not None and a.deployment_status.healthy is not None)

            assert reported(set(ids)) >= min(reported(set()), floor), "the group keeps its floor"
        others_live = [a for a in before.values() if a.node_id == "a" and not a.client_terminal() and a.job_id != "system-job"]
        if "system-job" in found.marks:
            assert not ignore_system and (forced or not others_live)
        if found.done:
            assert (forced or not others_live) and found.done == [("a", start)]
    finally:
        h.destroy()
