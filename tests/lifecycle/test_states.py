"""The scheduler over a real FSM: plans applied as entries, the plan applier's checks, and a lifecycle property."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.caches import NodeUsageCache
from fsm.structs import SECOND, DeploymentStatus, Evaluation, Job, TaskState, UpdateStrategy
from node.plan_apply import check_plan, claims_of
from scheduler.generic import schedule
from scheduler.plan import approx_size, to_entries
from scheduler.state import load_snapshot
from tests.fsm.support import Harness
from tests.lifecycle.support import job, node


@pytest.fixture
def h():
    harness = Harness.temp()
    yield harness
    harness.destroy()


def register(h: Harness, j: Job) -> Evaluation:
    ev = Evaluation(id=f"ev-{h.index + 1}", job_id=j.id, type=j.type, status="pending")
    h.ok(m.JobRegister(job=j, eval=ev))
    return ev


def run_eval(h: Harness, ev: Evaluation, *, max_bytes: int = 48 * 1024) -> Any:
    with h.reader() as r:
        current = r.eval(ev.id)
        plan = schedule(load_snapshot(r, current, h.time + SECOND))
    for body in to_entries(plan, max_bytes, approx_size):
        h.ok(body)
    return plan


def live(h: Harness, job_id: str) -> list[Any]:
    with h.reader() as r:
        return [a for a in r.allocs_by_job(job_id) if not a.terminal()]


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
    h.ok(m.AllocClientUpdate(allocs=[dataclasses.replace(healthy, id=i) for i in ids]))
    run_eval(h, register(h, job("s", count=3, update=update)))  # count only: two in place, one new
    with h.reader() as r:
        d1 = next(d for d in r.deployments_by_job("s") if d.id != d0.id)
        allocs = [r.alloc(i) for i in r.alloc_ids_by_job("s")]
        assert r.deployment(d0.id).task_groups["g"].placed_allocs == 2  # unchanged by the move
    state = d1.task_groups["g"]
    assert (state.desired_total, state.placed_allocs, state.healthy_allocs) == (3, 3, 0)
    assert all(a.deployment_id == d1.id and a.deployment_status is None for a in allocs)
    h.ok(m.AllocClientUpdate(allocs=[dataclasses.replace(healthy, id=a.id) for a in allocs]))
    with h.reader() as r:
        assert r.deployment(d1.id).task_groups["g"].healthy_allocs == 3


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["fail", "complete", "node-down", "node-up", "scale", "version", "stop-start"]), st.integers(0, 50)),
        max_size=12,
    ),
    kind=st.sampled_from(["service", "batch"]),
    seed=st.integers(0, 10_000),
)
def test_lifecycle_never_runs_more_than_count(steps, kind, seed) -> None:
    """Property: through failures, node loss, scaling and new versions, a group never has more
    live allocs than its count after any committed plan, and lost allocs never stay live."""
    h = Harness.temp()
    try:
        rng = random.Random(seed)
        for i in range(4):
            h.ok(m.NodeRegister(node=node(f"n{i}", cpu=2000, mem=2000)))
        count = 3
        version_config = 0
        j = job("p", type=kind, count=count, cpu=300, mem=300, config={"v": version_config})
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
            j = job("p", type=kind, count=count, cpu=300, mem=300, config={"v": version_config})
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
                assert len(lv) <= max(want, 0)
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
