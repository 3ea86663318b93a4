"""The scheduler over a real FSM: plans applied as entries, the plan applier's checks, and a lifecycle property."""

from __future__ import annotations

import copy
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.caches import NodeUsageCache
from fsm.record import replace
from fsm.structs import (
    HOUR,
    MINUTE,
    SECOND,
    DeploymentStatus,
    Evaluation,
    Job,
    ReschedulePolicy,
    TaskState,
    UpdateStrategy,
)
from node.leader.deployments import DeploymentError, decide, fail_by_user, pause_or_resume
from node.leader.plan_apply import check_plan, claims_of
from scheduler.generic import schedule
from scheduler.plan import approx_size, to_entries
from scheduler.state import load_snapshot
from tests.fsm.support import Harness, state_diff, without_bookkeeping
from tests.lifecycle.support import job, live, node, register, run_eval


def test_a_batch_job_is_placed_runs_and_ends_dead(h: Harness) -> None:
    for i in range(3):
        h.ok(m.NodeRegister(node=node(f"n{i}")))
    j = job("b", type="batch", count=5)
    ev = register(h, j)
    plan = run_eval(h, ev, max_bytes=4096)  # several entries
    assert len(plan.place) == 5
    with h.reader() as r:
        assert r.eval(ev.id).status == "complete"
        assert r.job("b").status == "running"
        ids = r.alloc_ids_by_job("b")
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=i, client_status="complete") for i in ids]))
    with h.reader() as r:
        assert r.job("b").status == "dead"
        assert r.job_summary("b").summary["g"].complete == 5


def test_the_plan_applier_rejects_what_no_longer_fits(h: Harness) -> None:
    # Two nodes of 1000 MHz; each job needs 3 x 400 MHz, so each plan uses both nodes.
    h.ok(m.NodeRegister(node=node("small", cpu=1000, mem=8000)))
    h.ok(m.NodeRegister(node=node("gone", cpu=1000, mem=8000)))
    a, b = job("a", count=3, cpu=400, mem=100), job("b", count=3, cpu=400, mem=100)
    ev_a, ev_b = register(h, a), register(h, b)
    with h.reader() as r:
        plan_a = schedule(load_snapshot(r, r.eval(ev_a.id), h.time))
        plan_b = schedule(load_snapshot(r, r.eval(ev_b.id), h.time))
    assert plan_b.nodes() == {"small", "gone"}
    cache = NodeUsageCache()
    # Both were planned on the same snapshot; "a" commits first.
    with h.reader() as r:
        accepted, rejected = check_plan(r, plan_a, cache)
    assert rejected == {} and accepted is plan_a
    for body in to_entries(plan_a, 48 * 1024, approx_size):
        h.ok(body)
    h.ok(m.NodeUpdateStatus(node_id="gone", status="down"))
    with h.reader() as r:
        accepted, rejected = check_plan(r, plan_b, cache)
    assert rejected["gone"] == "node is down"
    on_small = sum(x.resources.cpu for x in plan_a.place + plan_b.place if x.node_id == "small")
    assert ("small" in rejected) == (on_small > 1000)
    assert {x.node_id for x in accepted.place} == ({"small"} - set(rejected))
    assert not accepted.evals  # the eval is planned again, not marked complete


def test_in_place_update_of_a_changed_alloc_is_rejected(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("n")))
    v0 = job("s", count=1, config={"v": 1})
    run_eval(h, register(h, v0))
    v1 = job("s", count=2, config={"v": 1})  # count only: in place
    ev = register(h, v1)
    with h.reader() as r:
        plan = schedule(load_snapshot(r, r.eval(ev.id), h.time))
    assert plan.inplace
    (alloc_id,) = plan.inplace
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=alloc_id, client_status="failed")]))
    with h.reader() as r:
        _, rejected = check_plan(r, plan, NodeUsageCache())
    assert "n" in rejected


def test_a_rollout_counts_placed_and_moved_allocs_and_their_fresh_health(h: Harness) -> None:
    """Nomad's PlacedAllocs: an alloc counts once per rollout it joins, placed or moved there in
    place; a moved alloc's health from the old rollout is not carried over."""
    for i in range(3):
        h.ok(m.NodeRegister(node=node(f"n{i}")))
    update = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND)
    run_eval(h, register(h, job("s", count=2, update=update)))
    with h.reader() as r:
        (d0,) = r.deployments_by_job("s")
        ids = r.alloc_ids_by_job("s")
    assert d0.task_groups["g"].placed_allocs == 2
    healthy = m.AllocClientState(id="", client_status="running", deployment_status=DeploymentStatus(healthy=True, timestamp=1))
    h.ok(m.AllocClientUpdate(allocs=[replace(healthy, id=i) for i in ids]))
    run_eval(h, register(h, job("s", count=3, update=update)))  # count only: two in place, one new
    with h.reader() as r:
        d1 = next(d for d in r.deployments_by_job("s") if d.id != d0.id)
        allocs = [r.alloc(i) for i in r.alloc_ids_by_job("s")]
        assert r.deployment(d0.id).task_groups["g"].placed_allocs == 2  # unchanged by the move
    state = d1.task_groups["g"]
    assert (state.desired_total, state.placed_allocs, state.healthy_allocs) == (3, 3, 0)
    assert all(a.deployment_id == d1.id and a.deployment_status is None for a in allocs)
    h.ok(m.AllocClientUpdate(allocs=[replace(healthy, id=a.id) for a in allocs]))
    with h.reader() as r:
        assert r.deployment(d1.id).task_groups["g"].healthy_allocs == 3


def _rollout(h: Harness, config: dict[str, Any], *, auto_revert: bool = True) -> Any:
    """Register a version of service job "r" and plan it; its deployment.

    No progress deadline: as in Nomad, the first unhealthy alloc then fails the rollout.
    """
    update = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, auto_revert=auto_revert, progress_deadline=0)
    run_eval(h, register(h, job("r", count=1, update=update, config=config)))
    with h.reader() as r:
        return max(r.deployments_by_job("r"), key=lambda d: d.create_index)


def _report(h: Harness, dep: Any, healthy: bool) -> None:
    with h.reader() as r:
        (a,) = [a for a in r.allocs_by_job("r") if a.deployment_id == dep.id]
    health = DeploymentStatus(healthy=healthy, timestamp=h.time)
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=a.id, client_status="running", deployment_status=health)]))


def _watch(h: Harness, dep: Any) -> Any:
    with h.reader() as r:
        return decide(r, r.deployment(dep.id), h.time, None)


def test_a_failed_rollout_with_auto_revert_registers_the_newest_stable_version_again(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("n")))
    d0 = _rollout(h, {"v": 0})
    _report(h, d0, healthy=True)
    done = _watch(h, d0)
    assert done.status == "successful" and done.rollback is None
    h.ok(m.DeploymentStatusUpdate(deployment_id=d0.id, status=done.status, status_description=done.description))
    with h.reader() as r:  # a successful rollout makes its version stable, in the job and its version row
        assert r.job("r").stable and r.job_version("r", 0).stable
    d1 = _rollout(h, {"v": 1})
    with h.reader() as r:
        assert not r.job("r").stable and r.job("r").version == 1
    _report(h, d1, healthy=False)
    failed = _watch(h, d1)
    assert failed.status == "failed" and failed.rollback is not None and failed.rollback.version == 0
    assert failed.description == "Failed due to unhealthy allocations - rolling back to job version 0"
    out = h.ok(m.DeploymentStatusUpdate(deployment_id=d1.id, status=failed.status, status_description=failed.description,
                                        eval=failed.eval, job=failed.rollback))
    assert out["rollback_version"] == 2 and out["eval_ids"] == [failed.eval.id]
    with h.reader() as r:
        j = r.job("r")
        assert (j.version, j.task_groups[0].tasks[0].config, j.stable) == (2, {"v": 0}, False)
        assert r.deployment(d1.id).status == "failed" and r.job_version("r", 1).stable is False
        assert r.eval(failed.eval.id).job_modify_index == j.job_modify_index
    # The rollback's own rollout fails too: the newest stable version has its spec, so no loop.
    d2 = _rollout(h, {"v": 0})
    _report(h, d2, healthy=False)
    again = _watch(h, d2)
    assert again.rollback is None and again.description.endswith(
        "not rolling back to stable job version 0 as current job has same specification")


def test_auto_revert_needs_a_stable_version_to_go_back_to(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("n")))
    d0 = _rollout(h, {"v": 0}, auto_revert=False)
    _report(h, d0, healthy=False)
    assert _watch(h, d0).description == "Failed due to unhealthy allocations"
    d1 = _rollout(h, {"v": 1})
    _report(h, d1, healthy=False)
    failed = _watch(h, d1)
    assert failed.rollback is None
    assert failed.description == "Failed due to unhealthy allocations - no stable job version to auto revert to"


def test_a_rollback_yields_to_a_version_registered_meanwhile(h: Harness) -> None:
    h.ok(m.NodeRegister(node=node("n")))
    d0 = _rollout(h, {"v": 0})
    _report(h, d0, healthy=True)
    h.ok(m.DeploymentStatusUpdate(deployment_id=d0.id, status="successful"))
    d1 = _rollout(h, {"v": 1})
    _report(h, d1, healthy=False)
    failed = _watch(h, d1)
    assert failed.rollback is not None
    register(h, job("r", count=1, config={"v": 9}))  # the user's new version, before the watcher's entry
    before = h.dump()
    result = h.apply(m.DeploymentStatusUpdate(deployment_id=d1.id, status=failed.status, eval=failed.eval, job=failed.rollback))
    assert result.code == "conflict", result
    assert state_diff(without_bookkeeping(before), without_bookkeeping(h.dump())) == []


def _decided(h: Harness, d: Any, **kw: Any) -> dict[str, Any]:
    return h.ok(m.DeploymentStatusUpdate(deployment_id=d.deployment_id, status=d.status, status_description=d.description,
                                         eval=d.eval, **kw))


def test_a_paused_rollout_replaces_nothing_and_gets_no_verdict_until_resumed(h: Harness) -> None:
    """`nomad deployment pause|resume`: the rolling update holds where it is, its progress deadline
    stops, and a resume gives it a whole deadline again and places the next batch."""
    for i in range(3):
        h.ok(m.NodeRegister(node=node(f"n{i}")))
    update = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, progress_deadline=10 * MINUTE)
    run_eval(h, register(h, job("p", count=3, update=update, config={"v": 0})))
    with h.reader() as r:
        (d0,) = r.deployments_by_job("p")
    healthy = m.AllocClientState(id="", client_status="running", deployment_status=DeploymentStatus(healthy=True, timestamp=1))
    with h.reader() as r:
        h.ok(m.AllocClientUpdate(allocs=[replace(healthy, id=i) for i in r.alloc_ids_by_job("p")]))
    h.ok(m.DeploymentStatusUpdate(deployment_id=d0.id, status="successful"))
    ev = register(h, job("p", count=3, update=update, config={"v": 1}))
    assert len(run_eval(h, ev).place) == 1  # max_parallel 1: one destructive replacement
    with h.reader() as r:
        d1 = r.latest_deployment("p")
        with pytest.raises(DeploymentError, match="is not paused: nothing to resume"):
            pause_or_resume(r, d1, pause=False)
        paused = pause_or_resume(r, d1, pause=True)
    assert paused.eval is None
    _decided(h, paused)
    with h.reader() as r:
        d1 = r.deployment(d1.id)
        assert (d1.status, d1.status_description) == ("paused", "Deployment is paused")
        with pytest.raises(DeploymentError, match="already paused"):
            pause_or_resume(r, d1, pause=True)
        (new,) = [a for a in r.allocs_by_job("p") if a.deployment_id == d1.id]
    h.ok(m.AllocClientUpdate(allocs=[replace(healthy, id=new.id)]))  # health still counts
    with h.reader() as r:
        d1 = r.deployment(d1.id)
        assert d1.task_groups["g"].healthy_allocs == 1
        frozen = decide(r, d1, h.time + 60 * MINUTE, 0)  # long past the deadline, and progress was made
    assert (frozen.status, frozen.eval) == ("", None)
    again = Evaluation(id="ev-again", job_id="p", type="service", status="pending", triggered_by="deployment-watcher")
    h.ok(m.EvalUpsert(evals=[again]))
    assert run_eval(h, again).place == []  # the scheduler replaces nothing more while paused
    with h.reader() as r:
        resumed = pause_or_resume(r, r.deployment(d1.id), pause=False)
    assert resumed.eval is not None and resumed.eval.deployment_id == d1.id
    h.time += 60 * MINUTE  # resumed an hour later
    _decided(h, resumed)
    with h.reader() as r:
        d1 = r.deployment(d1.id)
        assert d1.status == "running" and d1.task_groups["g"].require_progress_by == h.time + 10 * MINUTE
        assert decide(r, d1, h.time + 9 * MINUTE, 1).status == ""  # a whole deadline again, not failed at once
        assert decide(r, d1, h.time + 11 * MINUTE, 1).description == "Failed due to progress deadline"
        current = r.eval(resumed.eval.id)
    assert len(run_eval(h, current).place) == 1  # the next batch
    # Stopping the job still cancels a paused rollout.
    with h.reader() as r:
        _decided(h, pause_or_resume(r, r.deployment(d1.id), pause=True))
    h.ok(m.JobRegister(job=replace(job("p", count=3, update=update, config={"v": 1}), stop=True)))
    with h.reader() as r:
        cancelled = decide(r, r.deployment(d1.id), h.time, 1)
    assert (cancelled.status, cancelled.description) == ("cancelled", "Cancelled because job is stopped")
    _decided(h, cancelled)
    with h.reader() as r, pytest.raises(DeploymentError, match="is cancelled: only a running deployment can be resumed"):
        pause_or_resume(r, r.deployment(d1.id), pause=False)


def _healthy(h: Harness, ids: list[str]) -> None:
    health = DeploymentStatus(healthy=True, timestamp=1)
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=i, client_status="running", deployment_status=health) for i in ids]))


def _canary_job(config: dict[str, Any], **update: Any) -> Job:
    strategy = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, canary=1, **update)
    return job("c", count=3, update=strategy, config=config)


def _settle_v0(h: Harness) -> None:
    for i in range(4):
        h.ok(m.NodeRegister(node=node(f"n{i}")))
    run_eval(h, register(h, _canary_job({"v": 0})))  # a first version has nothing to test canaries against
    with h.reader() as r:
        (d0,) = r.deployments_by_job("c")
        assert d0.task_groups["g"].desired_canaries == 0
        _healthy(h, r.alloc_ids_by_job("c"))
    h.ok(m.DeploymentStatusUpdate(deployment_id=d0.id, status="successful"))


def _canary_rollout(h: Harness, **update: Any) -> tuple[Any, str]:
    """v0 settled, then v1 registered and planned: v1's rollout and its one canary's id."""
    _settle_v0(h)
    run_eval(h, register(h, _canary_job({"v": 1}, **update)))
    with h.reader() as r:
        dep = r.latest_deployment("c")
        (canary,) = [a.id for a in r.allocs_by_job("c") if a.job_version == 1]
    return dep, canary


def test_canaries_run_beside_the_old_allocs_until_promoted_then_replace_them(h: Harness) -> None:
    """Nomad's canary rollout: ``canary`` new allocs run beside ``count`` old ones; nothing is
    replaced until promotion, which needs every canary healthy; then the old alloc whose name a
    canary took stops and the rest are replaced ``max_parallel`` at a time."""
    _settle_v0(h)
    ev = register(h, _canary_job({"v": 1}))
    plan = run_eval(h, ev)
    assert len(plan.place) == 1 and plan.stop == []
    with h.reader() as r:
        d1 = r.latest_deployment("c")
        state = d1.task_groups["g"]
        (canary,) = [a for a in r.allocs_by_job("c") if a.job_version == 1]
    assert (state.desired_canaries, state.desired_total, state.placed_canaries) == (1, 3, [canary.id])
    assert canary.deployment_status.canary and len(live(h, "c")) == 4  # count 3, plus the canary
    again = Evaluation(id="ev-again", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[again]))
    assert run_eval(h, again).place == []  # unpromoted: no second canary, nothing replaced
    refused = h.apply(m.DeploymentPromote(deployment_id=d1.id))
    assert refused.code == "bad_request" and "has 0/1 healthy canaries" in refused.error, refused
    with h.reader() as r:
        assert decide(r, r.deployment(d1.id), h.time, 0).promote is None
    _healthy(h, [canary.id])
    with h.reader() as r:
        assert r.alloc(canary.id).deployment_status.canary  # the client's report keeps the scheduler's flag
        # Said from the start (as Nomad); healthy and waiting is not stuck, and never successful unpromoted.
        assert r.deployment(d1.id).status_description == "Deployment is running but requires manual promotion"
        assert decide(r, r.deployment(d1.id), h.time + 60 * MINUTE, 0).status == ""
    promote = Evaluation(id="ev-promote", job_id="c", type="service", status="pending", deployment_id=d1.id)
    assert h.ok(m.DeploymentPromote(deployment_id=d1.id, eval=promote))["promoted"] == ["g"]
    # A second promotion (the watcher's auto-promote racing an operator's) is a conflict: state moved on.
    for groups in ([], ["g"]):
        late = h.apply(m.DeploymentPromote(deployment_id=d1.id, groups=groups))
        assert late.code == "conflict" and "already promoted" in late.error, late
    assert h.apply(m.DeploymentPromote(deployment_id=d1.id, groups=["x"])).code == "bad_request"
    plan = run_eval(h, promote)
    with h.reader() as r:
        stopped = {s.id: s.desired_description for s in plan.stop}
        by_id = {a.id: a for a in r.allocs_by_job("c")}
        assert r.deployment(d1.id).task_groups["g"].promoted
    # the old alloc the canary stands for, plus one destructive update (max_parallel 1)
    assert sorted(stopped.values()) == ["alloc is being updated due to job update",
                                        "alloc not needed as it was replaced by a promoted canary"]
    assert [by_id[i].name for i, why in stopped.items() if "canary" in why] == [canary.name]
    for _ in range(3):  # the client reports health, the watcher asks for the next batch
        with h.reader() as r:
            fresh = [a.id for a in r.allocs_by_job("c") if not a.terminal() and a.deployment_status is None]
        _healthy(h, fresh)
        ev = Evaluation(id=f"ev-next-{h.index}", job_id="c", type="service", status="pending")
        h.ok(m.EvalUpsert(evals=[ev]))
        run_eval(h, ev)
    with h.reader() as r:
        running = [a for a in r.allocs_by_job("c") if not a.terminal()]
        assert sorted(a.name for a in running) == ["c.g[0]", "c.g[1]", "c.g[2]"]
        assert {a.job_version for a in running} == {1}
        d1 = r.deployment(d1.id)
        assert (d1.task_groups["g"].healthy_allocs, d1.task_groups["g"].placed_allocs) == (3, 3)
        assert decide(r, d1, h.time, 3).status == "successful"


def _fail_then_schedule(h: Harness, dep_id: str) -> Any:
    """The watcher fails the rollout (an unhealthy canary); then the scheduler's plan for the job."""
    with h.reader() as r:
        failed = decide(r, r.deployment(dep_id), h.time, 0)
    assert failed.status == "failed"
    h.ok(failed.entry())
    ev = Evaluation(id=f"ev-after-{h.index}", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    return run_eval(h, ev)


def test_auto_promote_and_a_failed_canary_rollout(h: Harness) -> None:
    """``auto_promote`` promotes once every canary is healthy; a rollout that fails before
    promotion stops its canaries and leaves the old allocs running."""
    d1, canary = _canary_rollout(h, auto_promote=True)
    _healthy(h, [canary])
    with h.reader() as r:
        auto = decide(r, r.deployment(d1.id), h.time, 0)
    assert auto.promote == [] and auto.eval is not None
    h.ok(auto.entry())
    with h.reader() as r:
        assert r.deployment(d1.id).task_groups["g"].promoted
    run_eval(h, register(h, _canary_job({"v": 2}, progress_deadline=0)))  # a new version cancels v1's rollout
    with h.reader() as r:
        d2 = r.latest_deployment("c")
        (canary,) = [a for a in r.allocs_by_job("c") if a.job_version == 2]
    assert d2.task_groups["g"].desired_canaries == 1
    unhealthy = DeploymentStatus(healthy=False, timestamp=1)
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=canary.id, client_status="running", deployment_status=unhealthy)]))
    plan = _fail_then_schedule(h, d2.id)
    assert [s.id for s in plan.stop] == [canary.id] and plan.place == []
    assert len(live(h, "c")) == 3 and all(a.job_version < 2 for a in live(h, "c"))


def _followup(plan: Any) -> Evaluation:
    """The plan's follow-up eval, which reschedules a failed alloc after its delay."""
    (follow,) = [e for e in plan.evals if e.triggered_by == "alloc-failure" and e.wait_until]
    return follow


def test_a_failed_canary_is_rescheduled_as_a_canary_after_its_delay_even_while_paused(h: Harness) -> None:
    """As Nomad: with a progress deadline a crashed canary does not fail the rollout; it keeps its
    canary slot (no fresh canary, no old alloc stopped as excess) until its reschedule delay has
    passed, then a canary replaces it, paused or not, and the rollout can be promoted."""
    d1, canary = _canary_rollout(h)
    with h.reader() as r:
        _decided(h, pause_or_resume(r, d1, pause=True))
    crashed = DeploymentStatus(healthy=False, timestamp=1)
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=canary, client_status="failed", deployment_status=crashed)]))
    ev = Evaluation(id="ev-crash", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert plan.place == [] and [s.id for s in plan.stop if s.desired_status == "stop"] == []
    (again,) = run_eval(h, _followup(plan)).place
    assert again.deployment_status.canary and again.deployment_id == d1.id and again.previous_allocation == canary
    assert again.reschedule_tracker.events[-1].prev_alloc_id == canary
    with h.reader() as r:
        _decided(h, pause_or_resume(r, r.deployment(d1.id), pause=False))
        assert decide(r, r.deployment(d1.id), h.time, 0).status == ""  # not failed: replaced
        assert r.deployment(d1.id).task_groups["g"].placed_canaries == [canary, again.id]
    _healthy(h, [again.id])
    assert h.ok(m.DeploymentPromote(deployment_id=d1.id))["promoted"] == ["g"]
    assert sorted(a.name for a in live(h, "c")) == ["c.g[0]", "c.g[0]", "c.g[1]", "c.g[2]"]


def _crash(h: Harness, alloc_id: str, *, running: bool = False) -> None:
    health = DeploymentStatus(healthy=False, timestamp=h.time)
    status = "running" if running else "failed"
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=alloc_id, client_status=status, deployment_status=health)]))


def test_with_a_progress_deadline_an_unhealthy_alloc_is_replaced_until_its_attempts_run_out(h: Harness) -> None:
    """Nomad's shouldFailEarly: with a progress deadline an unhealthy alloc fails the rollout only
    once it cannot be rescheduled; until then its replacement joins the same rollout."""
    h.ok(m.NodeRegister(node=node("n")))
    policy = ReschedulePolicy(attempts=1, interval=HOUR, delay=5 * SECOND, delay_function="constant", unlimited=False)
    update = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, progress_deadline=10 * MINUTE)
    run_eval(h, register(h, job("u", count=1, update=update, reschedule_policy=policy)))
    with h.reader() as r:
        (dep,) = r.deployments_by_job("u")
        (first,) = r.alloc_ids_by_job("u")
    _crash(h, first)
    with h.reader() as r:
        assert decide(r, r.deployment(dep.id), h.time, 0).status == ""  # one attempt left: it goes on
    ev = Evaluation(id="ev-crash", job_id="u", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert plan.place == []  # after the policy's 5 s delay
    (second,) = run_eval(h, _followup(plan)).place
    assert (second.previous_allocation, second.deployment_id) == (first, dep.id)
    _crash(h, second.id)  # the one attempt is used: nothing can become healthy in its place
    with h.reader() as r:
        state = r.deployment(dep.id).task_groups["g"]
        failed = decide(r, r.deployment(dep.id), h.time, 0)
    assert (state.placed_allocs, state.unhealthy_allocs) == (2, 2)
    assert (failed.status, failed.description) == ("failed", "Failed due to unhealthy allocations")


def _stops(plan: Any) -> list[str]:
    """The ids of the allocs a plan stops (not the follow-up marks it sets on waiting ones)."""
    return [s.id for s in plan.stop if s.desired_status != "run"]


def _roll_v1(h: Harness, count: int, *, count_v1: int | None = None, policy: ReschedulePolicy | None = None) -> Any:
    """Service job "u" at v0 with ``count`` healthy allocs, then v1 (a destructive change,
    max_parallel 1, a 10 min progress deadline) registered; v1's deployment and first plan."""
    for i in range(3):
        h.ok(m.NodeRegister(node=node(f"n{i}")))
    update = UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, progress_deadline=10 * MINUTE)
    run_eval(h, register(h, job("u", count=count, update=update, config={"v": 0}, reschedule_policy=policy)))
    _healthy(h, [a.id for a in live(h, "u")])
    plan = run_eval(h, register(h, job("u", count=count_v1 or count, update=update, config={"v": 1}, reschedule_policy=policy)))
    with h.reader() as r:
        return r.latest_deployment("u"), plan


def test_a_running_alloc_reported_unhealthy_stalls_its_rollout_until_the_progress_deadline(h: Harness) -> None:
    """Nomad: only failed allocs are rescheduled. An alloc that runs but fails its checks stays,
    nothing more of the rollout is replaced while it is unhealthy (computeUnderProvisionedBy),
    and the progress deadline fails the rollout."""
    dep, first = _roll_v1(h, 2)
    assert len(first.stop) == 1 and len(first.place) == 1  # max_parallel 1
    (new,) = first.place
    _crash(h, new.id, running=True)
    ev = Evaluation(id="ev-unhealthy", job_id="u", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert (plan.place, _stops(plan), [e for e in plan.evals if e.triggered_by == "alloc-failure"]) == ([], [], [])
    assert sorted(a.job_version for a in live(h, "u")) == [0, 1]  # the other old alloc keeps running
    with h.reader() as r:
        assert decide(r, r.deployment(dep.id), h.time, 0).status == ""  # attempts left: the deadline decides
        late = decide(r, r.deployment(dep.id), h.time + 11 * MINUTE, 0)
    assert (late.status, late.description) == ("failed", "Failed due to progress deadline")


def test_a_failed_alloc_waiting_for_its_delay_stalls_its_rollout(h: Harness) -> None:
    """Nomad: the failed alloc waits in the group (untainted) for its reschedule delay, unhealthy,
    so no other old alloc is replaced meanwhile; its replacement then takes the max_parallel slot."""
    dep, first = _roll_v1(h, 2)
    (new,) = first.place
    _crash(h, new.id)
    ev = Evaluation(id="ev-crash", job_id="u", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert (plan.place, _stops(plan)) == ([], [])
    again = run_eval(h, _followup(plan))
    (second,) = again.place
    assert second.previous_allocation == new.id and _stops(again) == []  # still one at a time
    _healthy(h, [second.id])
    ev2 = Evaluation(id="ev-next", job_id="u", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev2]))
    assert len(_stops(run_eval(h, ev2))) == 1  # the healthy replacement lets the rollout go on


def test_new_placements_take_max_parallel_slots_before_destructive_updates(h: Harness) -> None:
    """Nomad: scaling 1 -> 3 with a destructive change places the two new allocs first; with
    max_parallel 1 the old alloc is replaced only once they are healthy."""
    dep, first = _roll_v1(h, 1, count_v1=3)
    (old,) = [a.id for a in live(h, "u") if a.job_version == 0]
    assert len(first.place) == 2 and _stops(first) == [] and all(p.job_version == 1 for p in first.place)
    _healthy(h, [p.id for p in first.place])
    ev = Evaluation(id="ev-next", job_id="u", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert _stops(plan) == [old] and len(plan.place) == 1


def test_a_newer_version_stops_the_unpromoted_canaries_of_the_rollout_it_replaces(h: Harness) -> None:
    """As Nomad's cancelUnneededCanaries: v1's canary does not linger as one more old alloc
    (which would stop a v0 alloc as excess and leave two allocs with one name)."""
    _, v1 = _canary_rollout(h)
    _healthy(h, [v1])
    plan = run_eval(h, register(h, _canary_job({"v": 2})))
    assert [(s.id, s.desired_description) for s in plan.stop] == [(v1, "alloc not needed as it is a canary of a replaced deployment")]
    (v2,) = plan.place
    assert v2.deployment_status.canary and v2.job_version == 2
    assert sorted((a.name, a.job_version) for a in live(h, "c")) == [
        ("c.g[0]", 0), ("c.g[0]", 2), ("c.g[1]", 0), ("c.g[2]", 0)]  # v2's canary beside count v0 allocs


def test_a_watcher_decision_made_before_a_pause_does_not_resume_the_rollout(h: Harness) -> None:
    """After a resume ("Deployment is running") the watcher says "requires manual promotion" again
    once the canaries are healthy. That is a status write (running); landing after an operator's
    second pause it would resume the rollout. It is made on "running", so it is refused."""
    d1, canary = _canary_rollout(h)
    for pause in (True, False):
        with h.reader() as r:
            _decided(h, pause_or_resume(r, r.deployment(d1.id), pause=pause))
    _healthy(h, [canary])
    with h.reader() as r:
        waiting = decide(r, r.deployment(d1.id), h.time, 0)
        paused = pause_or_resume(r, r.deployment(d1.id), pause=True)
    assert waiting.description == "Deployment is running but requires manual promotion"
    _decided(h, paused)
    late = h.apply(waiting.entry())
    assert late.code == "conflict" and "is paused now, not running" in late.error, late
    with h.reader() as r:
        assert r.deployment(d1.id).status == "paused"


def test_a_canary_that_dies_after_its_health_check_is_replaced_before_promotion(h: Harness) -> None:
    d1, first = _canary_rollout(h)
    _healthy(h, [first])
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=first, client_status="failed")]))  # then it crashed
    refused = h.apply(m.DeploymentPromote(deployment_id=d1.id))
    assert refused.code == "bad_request" and "0/1 healthy canaries" in refused.error, refused
    ev = Evaluation(id="ev-again", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert plan.place == []  # rescheduled after its policy's delay, as any failed alloc
    (second,) = run_eval(h, _followup(plan)).place  # a new canary, not an ordinary replacement
    assert second.deployment_status.canary and second.deployment_id == d1.id
    _healthy(h, [second.id])
    assert h.ok(m.DeploymentPromote(deployment_id=d1.id))["promoted"] == ["g"]


def test_each_healthy_alloc_moves_the_progress_deadline_on(h: Harness) -> None:
    """Nomad's RequireProgressBy: the FSM keeps it, so `deployment status` shows the real deadline."""
    h.ok(m.NodeRegister(node=node("n")))
    update = UpdateStrategy(max_parallel=2, min_healthy_time=SECOND, progress_deadline=10 * MINUTE)
    run_eval(h, register(h, job("q", count=2, update=update)))
    with h.reader() as r:
        (dep,) = r.deployments_by_job("q")
        first, second = r.alloc_ids_by_job("q")
    created = dep.task_groups["g"].require_progress_by
    assert created == dep.create_time + 10 * MINUTE
    health = DeploymentStatus(healthy=True, timestamp=1)
    h.time += 7 * MINUTE
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=first, client_status="running", deployment_status=health)]))
    with h.reader() as r:
        dep = r.deployment(dep.id)
        assert dep.task_groups["g"].require_progress_by == h.time + 10 * MINUTE
        assert decide(r, dep, created + MINUTE, 1).status == ""  # past the first deadline, but progress was made


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["fail", "complete", "node-down", "node-up", "scale", "version", "stop-start",
                                   "healthy", "promote"]), st.integers(0, 50)),
        max_size=12,
    ),
    kind=st.sampled_from(["service", "batch"]),
    canary=st.integers(0, 2),
    seed=st.integers(0, 10_000),
)
def test_lifecycle_never_runs_more_than_count(steps, kind, canary, seed) -> None:
    """Property: through failures, node loss, scaling, new versions and canary rollouts, a group
    never has more live allocs than its count (plus its unpromoted canaries) after any committed
    plan, and lost allocs never stay live."""
    h = Harness.temp()
    try:
        rng = random.Random(seed)
        for i in range(4):
            h.ok(m.NodeRegister(node=node(f"n{i}", cpu=2000, mem=2000)))
        count = 3
        version_config = 0
        update = UpdateStrategy(max_parallel=1, canary=canary) if kind == "service" else None

        def spec() -> Job:
            return job("p", type=kind, count=count, cpu=300, mem=300, config={"v": version_config}, update=update)

        j = spec()
        run_eval(h, register(h, j))
        for action, k in steps:
            with h.reader() as r:
                allocs = [a for a in r.allocs_by_job("p") if not a.terminal()]
                nodes = r.nodes()
            if action in ("fail", "complete") and allocs:
                a = allocs[k % len(allocs)]
                status = "failed" if action == "fail" else "complete"
                h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=a.id, client_status=status, task_states={"t": TaskState(finished_at=h.time - 3600 * SECOND)})]))
            elif action == "node-down":
                n = nodes[k % len(nodes)]
                h.ok(m.NodeUpdateStatus(node_id=n.id, status="down"))
            elif action == "node-up":
                n = nodes[k % len(nodes)]
                h.ok(m.NodeUpdateStatus(node_id=n.id, status="ready"))
            elif action == "scale":
                count = k % 6
            elif action == "version":
                version_config += 1
            elif action == "healthy" and allocs:
                health = DeploymentStatus(healthy=True, timestamp=1)
                h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=a.id, client_status="running", deployment_status=health)
                                                 for a in allocs if a.deployment_id and (a.deployment_status is None or a.deployment_status.healthy is None)]))
            elif action == "promote":
                with h.reader() as r:
                    latest = r.latest_deployment("p")
                if latest is not None:
                    h.apply(m.DeploymentPromote(deployment_id=latest.id))  # refused unless its canaries are healthy
            j = spec()
            if action == "stop-start":
                j.stop = rng.random() < 0.5
            ev = register(h, j)
            # The scheduler may need a few evals (rolling updates): run a handful.
            for _ in range(4):
                plan = run_eval(h, ev)
                with h.reader() as r:
                    got = r.job("p")
                    lv = [a for a in r.allocs_by_job("p") if not a.terminal()]
                    down = {n.id for n in r.nodes() if n.status == "down"}
                    rollouts = r.deployments_by_job("p")
                    members = Counter(a.deployment_id for a in r.allocs_by_job("p") if a.deployment_id)
                want = 0 if got.stop else got.task_groups[0].count
                current = r_latest = None
                with h.reader() as r:
                    r_latest = r.latest_deployment("p")
                if r_latest is not None and r_latest.job_version == got.version and "g" in r_latest.task_groups:
                    current = r_latest.task_groups["g"]
                beside = [a for a in lv if a.job_version == got.version and a.deployment_status is not None
                          and a.deployment_status.canary and current is not None and not current.promoted]
                assert len(lv) - len(beside) <= max(want, 0)
                assert len(beside) <= canary
                assert not [a for a in lv if a.node_id in down]
                # Every alloc of a rollout was counted into it when it joined (placed or moved in).
                for d in rollouts:
                    assert members[d.id] <= sum(s.placed_allocs for s in d.task_groups.values()), (d, members)
                assert set(members) <= {d.id for d in rollouts}
                if not plan.place and not plan.stop:
                    break
                ev = Evaluation(id=f"ev-{h.index}-x", job_id="p", type=kind, status="pending")
                h.ok(m.EvalUpsert(evals=[ev]))
    finally:
        h.destroy()


def test_in_flight_plans_count_until_the_snapshot_shows_them(h: Harness) -> None:
    """Pipelining: a plan checked while an earlier one is still committing sees its claims."""
    h.ok(m.NodeRegister(node=node("only", cpu=1000, mem=8000)))
    a, b = job("a", count=2, cpu=400, mem=100), job("b", count=2, cpu=400, mem=100)
    ev_a, ev_b = register(h, a), register(h, b)
    with h.reader() as r:
        plan_a = schedule(load_snapshot(r, r.eval(ev_a.id), h.time))
        plan_b = schedule(load_snapshot(r, r.eval(ev_b.id), h.time))
    bodies = to_entries(plan_a, 48 * 1024, approx_size)
    claims = [c for c in (claims_of(x, plan_a.inplace) for x in bodies) if c is not None]
    cache = NodeUsageCache()
    with h.reader() as r:  # "a" proposed, not applied: 800 of 1000 MHz claimed
        _, rejected = check_plan(r, plan_b, cache, claims)
    assert rejected == {"only": "resources exhausted: cpu"}
    for body in bodies:
        h.ok(body)
    with h.reader() as r:  # applied now: counted once (from state), not twice
        _, again = check_plan(r, plan_b, cache, claims)
    assert again == {"only": "resources exhausted: cpu"}
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=x.id, client_status="complete") for x in plan_a.place]))
    with h.reader() as r:
        _, free = check_plan(r, plan_b, cache, claims)
    assert free == {}


def test_a_canary_reported_unhealthy_after_its_health_check_blocks_promotion_until_the_deadline(h: Harness) -> None:
    """A running canary whose checks fail after it was judged healthy no longer vouches for the
    version: promotion is refused, it is not rescheduled (it did not fail, as in Nomad), and the
    rollout, no longer waiting on an operator, fails at its progress deadline."""
    d1, canary = _canary_rollout(h, progress_deadline=10 * MINUTE)
    _healthy(h, [canary])
    _crash(h, canary, running=True)
    refused = h.apply(m.DeploymentPromote(deployment_id=d1.id))
    assert refused.code == "bad_request" and "0/1 healthy canaries" in refused.error, refused
    ev = Evaluation(id="ev-sick", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert (plan.place, _stops(plan), [e for e in plan.evals if e.triggered_by == "alloc-failure"]) == ([], [], [])
    with h.reader() as r:
        late = decide(r, r.deployment(d1.id), h.time + 11 * MINUTE, 0)
    assert (late.status, late.description) == ("failed", "Failed due to progress deadline")


def test_a_promotion_gives_the_rest_of_the_rollout_a_whole_progress_deadline(h: Harness) -> None:
    """Nomad's UpdateDeploymentPromotion: healthy canaries may wait for an operator as long as
    it takes; the promotion restarts the deadline, so a late one does not fail the rollout (and
    auto-revert a good version) at once. It also clears "requires manual promotion"."""
    d1, canary = _canary_rollout(h, progress_deadline=10 * MINUTE)
    _healthy(h, [canary])
    with h.reader() as r:
        assert r.deployment(d1.id).status_description == "Deployment is running but requires manual promotion"
    h.time += 30 * MINUTE
    h.ok(m.DeploymentPromote(deployment_id=d1.id))
    with h.reader() as r:
        dep = r.deployment(d1.id)
        assert dep.task_groups["g"].require_progress_by == h.time + 10 * MINUTE
        assert dep.status_description == "Deployment is running"
        assert decide(r, dep, h.time + MINUTE, 0).status == ""
        late = decide(r, dep, h.time + 11 * MINUTE, 0)
    assert (late.status, late.description) == ("failed", "Failed due to progress deadline")


def test_while_canaries_await_promotion_a_scale_up_places_nothing_more(h: Harness) -> None:
    """Nomad's NewCanaries_ScaleUp: a new version that also grows the group places only its
    canaries; the new slots are filled once it is promoted, not with the version under test."""
    _settle_v0(h)
    grown = _canary_job({"v": 1})
    grown.task_groups[0].count = 5
    plan = run_eval(h, register(h, grown))
    assert [p.deployment_status.canary for p in plan.place] == [True] and _stops(plan) == []
    with h.reader() as r:
        dep = r.latest_deployment("c")
        assert dep.task_groups["g"].desired_total == 5
        (canary,) = [a.id for a in r.allocs_by_job("c") if a.job_version == 1]
    _healthy(h, [canary])
    ev = Evaluation(id="ev-wait", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    assert run_eval(h, ev).place == []
    h.ok(m.DeploymentPromote(deployment_id=dep.id))
    ev = Evaluation(id="ev-promoted", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    assert run_eval(h, ev).place  # now the rollout goes on


def test_a_failed_rollouts_own_failed_allocs_are_not_rescheduled(h: Harness) -> None:
    """Nomad's FailedDeployment_DontReschedule: once the rollout failed (here by the operator,
    without auto_revert), its crashed allocs stay dead instead of being retried on a version
    that was rejected; lost allocs are still replaced."""
    dep, first = _roll_v1(h, 2)
    (new,) = first.place
    h.ok(m.DeploymentStatusUpdate(deployment_id=dep.id, status="failed", status_description="Deployment marked as failed"))
    _crash(h, new.id)
    ev = Evaluation(id="ev-crash", job_id="u", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert (plan.place, _stops(plan), [e for e in plan.evals if e.triggered_by == "alloc-failure"]) == ([], [], [])


def test_a_new_version_of_a_finished_batch_job_runs_again(h: Harness) -> None:
    """Nomad's Batch_Rerun (filterOldTerminalAllocs): the ended allocs of an older version
    hold no slot, so re-submitting a changed batch job runs it again."""
    h.ok(m.NodeRegister(node=node("n")))
    run_eval(h, register(h, job("b", type="batch", count=2, config={"v": 0})))
    with h.reader() as r:
        ids = r.alloc_ids_by_job("b")
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=ids[0], client_status="complete"),
                                     m.AllocClientState(id=ids[1], client_status="failed")]))
    same = Evaluation(id="ev-same", job_id="b", type="batch", status="pending")
    h.ok(m.EvalUpsert(evals=[same]))
    assert len(run_eval(h, same).place) <= 1  # the same version: only the failed one may be retried
    plan = run_eval(h, register(h, job("b", type="batch", count=2, config={"v": 1})))
    assert sorted(p.name for p in plan.place if p.job_version == 1) == ["b.g[0]", "b.g[1]"]


def _two_groups(version: int) -> Job:
    """Job "two": group "web" with auto_revert, group "worker" without; ``version`` in both configs."""
    web = job("two", count=1, config={"v": version},
              update=UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, progress_deadline=10 * MINUTE, auto_revert=True))
    worker = replace(copy.deepcopy(web.task_groups[0]), name="worker",
                                 update=UpdateStrategy(max_parallel=1, min_healthy_time=SECOND, progress_deadline=10 * MINUTE))
    web.task_groups[0].name = "web"
    web.task_groups.append(worker)
    return web


def test_only_a_failing_group_with_auto_revert_rolls_the_job_back(h: Harness) -> None:
    """Nomad's watcher: a group that rolled out fine does not revert the job because another
    group without auto_revert missed its deadline; the operator's `deployment fail` still does."""
    h.ok(m.NodeRegister(node=node("n")))
    run_eval(h, register(h, _two_groups(0)))
    with h.reader() as r:
        (d0,) = r.deployments_by_job("two")
        _healthy(h, r.alloc_ids_by_job("two"))
    h.ok(m.DeploymentStatusUpdate(deployment_id=d0.id, status="successful"))  # v0 stable
    run_eval(h, register(h, _two_groups(1)))
    with h.reader() as r:
        d1 = r.latest_deployment("two")
        web = [a.id for a in r.allocs_by_job("two") if a.job_version == 1 and a.task_group == "web"]
    _healthy(h, web)
    with h.reader() as r:
        late = decide(r, r.deployment(d1.id), h.time + 11 * MINUTE, 0)
        by_user = fail_by_user(r, r.deployment(d1.id))
    assert (late.status, late.description, late.rollback) == ("failed", "Failed due to progress deadline", None)
    assert by_user.description == "Deployment marked as failed - rolling back to job version 0"


def test_while_canaries_await_promotion_a_lost_or_failed_old_alloc_comes_back_as_the_old_version(h: Harness) -> None:
    """Nomad's downgradeNonCanary: churn during a canary soak must not move allocs onto the
    version under test. A crashed v0 alloc is rescheduled as v0 (outside the rollout), and the
    promotion later replaces it like any other old alloc."""
    d1, canary = _canary_rollout(h, progress_deadline=10 * MINUTE)
    old = next(a for a in live(h, "c") if a.job_version == 0)
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(
        id=old.id, client_status="failed", task_states={"t": TaskState(state="dead", failed=True, finished_at=h.time - HOUR)})]))
    ev = Evaluation(id="ev-crash", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    (again,) = run_eval(h, ev).place
    assert (again.previous_allocation, again.job_version, again.deployment_id) == (old.id, 0, "")
    assert not (again.deployment_status and again.deployment_status.canary)
    _healthy(h, [canary])
    h.ok(m.DeploymentPromote(deployment_id=d1.id))
    ev = Evaluation(id="ev-promoted", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    plan = run_eval(h, ev)
    assert len(_stops(plan)) == 2  # the canary took g[0]'s name; one more old alloc goes now
    assert all(p.job_version == 1 for p in plan.place)


def test_a_group_runs_all_the_canaries_it_asks_for_even_with_fewer_allocs_to_replace(h: Harness) -> None:
    """Nomad's NextCanaries (its NewCanaries_CountGreater): count 2 with canary 3 runs 3 canaries,
    the third under a free name, and promotion leaves count allocs of the new version."""
    for i in range(4):
        h.ok(m.NodeRegister(node=node(f"n{i}")))
    strategy = UpdateStrategy(max_parallel=2, min_healthy_time=SECOND, canary=3)
    run_eval(h, register(h, job("k", count=2, update=strategy, config={"v": 0})))
    _healthy(h, [a.id for a in live(h, "k")])
    plan = run_eval(h, register(h, job("k", count=2, update=strategy, config={"v": 1})))
    assert sorted(p.name for p in plan.place if p.deployment_status.canary) == ["k.g[0]", "k.g[1]", "k.g[2]"]
    with h.reader() as r:
        dep = r.latest_deployment("k")
    assert dep.task_groups["g"].desired_canaries == 3
    _healthy(h, [p.id for p in plan.place])
    h.ok(m.DeploymentPromote(deployment_id=dep.id))
    ev = Evaluation(id="ev-promoted", job_id="k", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    run_eval(h, ev)
    assert sorted((a.name, a.job_version) for a in live(h, "k")) == [("k.g[0]", 1), ("k.g[1]", 1)]


def test_a_canary_rollout_says_from_the_start_who_promotes_it(h: Harness) -> None:
    """Nomad's reconciler sets the description of a new rollout with canaries at creation."""
    manual, _ = _canary_rollout(h)
    assert manual.status_description == "Deployment is running but requires manual promotion"
    run_eval(h, register(h, _canary_job({"v": 2}, auto_promote=True)))
    with h.reader() as r:
        assert r.latest_deployment("c").status_description == "Deployment is running pending automatic promotion"


def test_a_rollout_is_not_successful_while_an_old_alloc_is_left_to_replace(h: Harness) -> None:
    """A healthy canary that is lost later still counts as healthy (as in Nomad), so the health
    counts reached the total with one old alloc left, and the rollout was declared successful
    without replacing it. Nomad's reconciler also requires that nothing is left to update."""
    d1, canary = _canary_rollout(h)
    _healthy(h, [canary])
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=canary, client_status="lost")]))
    ev = Evaluation(id="ev-lost", job_id="c", type="service", status="pending")
    h.ok(m.EvalUpsert(evals=[ev]))
    (second,) = run_eval(h, ev).place
    _healthy(h, [second.id])
    h.ok(m.DeploymentPromote(deployment_id=d1.id))
    for step in range(2):  # max_parallel 1: the canary's old alloc goes, and one more is replaced per batch
        ev = Evaluation(id=f"ev-batch-{step}", job_id="c", type="service", status="pending")
        h.ok(m.EvalUpsert(evals=[ev]))
        _healthy(h, [p.id for p in run_eval(h, ev).place])
        with h.reader() as r:
            verdict = decide(r, r.deployment(d1.id), h.time, None)
        if step == 0:  # healthy: lost canary, second canary, first replacement = 3 of 3
            assert verdict.status == "" and verdict.eval is not None, verdict
    assert verdict.status == "successful", verdict
    assert sorted(a.job_version for a in live(h, "c")) == [1, 1, 1]
