"""Devices in placement: feasibility, accounting, failure reasons and the plan applier, over a real FSM.

A task group that asks for devices lands only on nodes with that many free
(named as Nomad names a request: ``type``, ``vendor/type``, ``vendor/type/model``);
its alloc claims the node's own device names, so the usage cache, the
placement index and the plan applier count them like cpu; an ask that finds
too few says which device in the eval's failed-placement reason.
"""

from __future__ import annotations

from fsm import messages as m
from fsm.caches import NodeUsageCache
from fsm.structs import Job, Node, Resources
from node.leader.plan_apply import check_plan
from scheduler.generic import schedule
from scheduler.index import PlacementIndex
from scheduler.plan import Plan, approx_size, to_entries
from scheduler.state import load_snapshot
from tests.fsm.support import Harness
from tests.lifecycle.support import job, live, node, register, run_eval


def gpu_node(node_id: str, devices: dict[str, int]) -> Node:
    n = node(node_id)
    n.resources = Resources(cpu=4000, memory_mb=8192, disk_mb=0, devices=devices)
    return n


def gpu_job(job_id: str, count: int, devices: dict[str, int], **kw: object) -> Job:
    j = job(job_id, count=count, **kw)
    j.task_groups[0].tasks[0].resources.devices = dict(devices)
    return j


def apply(h: Harness, plan: Plan) -> None:
    for body in to_entries(plan, 48 * 1024, approx_size):
        h.ok(body)


def failure(h: Harness, eval_id: str) -> str:
    with h.reader() as r:
        return r.eval(eval_id).failed_tg_allocs.get("g", "")


def test_a_two_gpu_job_lands_only_on_nodes_with_two_free(h: Harness) -> None:
    nodes = {
        "one": {"nvidia/gpu": 1},
        "two-a": {"nvidia/gpu": 2},
        "two-b": {"nvidia/gpu": 2},
        "none": {},
        "amd": {"amd/gpu": 4},
    }
    for node_id, devices in nodes.items():
        h.ok(m.NodeRegister(node=gpu_node(node_id, devices)))
    ev = register(h, gpu_job("train", 3, {"nvidia/gpu": 2}))
    plan = run_eval(h, ev)
    assert sorted(a.node_id for a in plan.place) == ["two-a", "two-b"]
    assert all(a.resources.devices == {"nvidia/gpu": 2} for a in plan.place)
    reason = failure(h, ev.id)
    assert reason.startswith("1 allocation unplaced")
    assert "resources exhausted (device nvidia/gpu): 5 nodes" in reason, reason


def test_a_third_one_gpu_alloc_on_a_full_two_gpu_node_is_not_placed(h: Harness) -> None:
    h.ok(m.NodeRegister(node=gpu_node("n", {"nvidia/gpu": 2})))
    first = run_eval(h, register(h, gpu_job("a", 2, {"nvidia/gpu": 1})))
    assert [a.node_id for a in first.place] == ["n", "n"]
    ev = register(h, gpu_job("b", 1, {"nvidia/gpu": 1}))
    second = run_eval(h, ev)
    assert second.place == []
    assert (
        failure(h, ev.id)
        == "1 allocation unplaced; 1 node evaluated; resources exhausted (device nvidia/gpu): 1 node"
    )
    # Once one of the first job's allocs ends, its GPU is free again.
    done = live(h, "a")[0]
    h.ok(m.AllocClientUpdate(allocs=[m.AllocClientState(id=done.id, client_status="complete")]))
    again = run_eval(h, register(h, gpu_job("b", 1, {"nvidia/gpu": 1}, version=1)))
    assert [a.node_id for a in again.place] == ["n"]


def test_an_ask_larger_than_any_node_says_so(h: Harness) -> None:
    for i in range(3):
        h.ok(m.NodeRegister(node=gpu_node(f"n{i}", {"nvidia/gpu": 2})))
    ev = register(h, gpu_job("big", 1, {"nvidia/gpu": 3}))
    assert run_eval(h, ev).place == []
    assert "asks more device nvidia/gpu (3) than any node has" in failure(h, ev.id)


def test_a_generic_ask_takes_the_nodes_named_devices_and_they_are_counted(h: Harness) -> None:
    """ "gpu" matches any vendor's GPU; the alloc holds the node's name for it, so a later
    "nvidia/gpu" ask sees it taken (in the usage cache and the leader's placement index alike)."""
    h.ok(m.NodeRegister(node=gpu_node("n", {"nvidia/gpu/a100": 1, "intel/gpu": 1})))
    plan = run_eval(h, register(h, gpu_job("any", 1, {"gpu": 1, "nvidia/gpu": 1})))
    (placed,) = plan.place
    assert placed.resources.devices == {"nvidia/gpu/a100": 1, "intel/gpu": 1}
    ev = register(h, gpu_job("more", 1, {"nvidia/gpu": 1}))
    assert run_eval(h, ev).place == []
    assert "device nvidia/gpu" in failure(h, ev.id)
    cache, index = NodeUsageCache(), PlacementIndex()
    with h.reader() as r:
        cache.catch_up(r)
        index.catch_up(r)
    assert cache.usage("n").devices == {"nvidia/gpu/a100": 1, "intel/gpu": 1}
    assert index.usage["n"].devices == {"nvidia/gpu/a100": 1, "intel/gpu": 1}


def test_the_placement_index_path_places_devices_as_a_fresh_read_does(h: Harness) -> None:
    """The leader's workers read nodes and usage from the journal-fed index and rank from its trait cache."""
    for node_id, devices in {"small": {"nvidia/gpu": 1}, "big": {"nvidia/gpu": 4}}.items():
        h.ok(m.NodeRegister(node=gpu_node(node_id, devices)))
    index = PlacementIndex()
    placed: list[str] = []
    for i in range(3):
        ev = register(h, gpu_job(f"j{i}", 1, {"nvidia/gpu": 2}))
        with h.reader() as r, index.lock:
            plan = schedule(load_snapshot(r, r.eval(ev.id), h.time, index=index))
        apply(h, plan)
        placed += [a.node_id for a in plan.place]
    assert placed == ["big", "big"]  # the third finds 0 of 4 left on big and 1 on small
    assert index.usage["big"].devices == {"nvidia/gpu": 4}


def test_the_plan_applier_refuses_device_over_commit(h: Harness) -> None:
    """Two plans made on one snapshot each take the node's only GPU: the second is refused."""
    h.ok(m.NodeRegister(node=gpu_node("n", {"nvidia/gpu": 1})))
    ev_a = register(h, gpu_job("a", 1, {"nvidia/gpu": 1}))
    ev_b = register(h, gpu_job("b", 1, {"nvidia/gpu": 1}))
    with h.reader() as r:
        plan_a = schedule(load_snapshot(r, r.eval(ev_a.id), h.time))
        plan_b = schedule(load_snapshot(r, r.eval(ev_b.id), h.time))
    assert [a.node_id for a in plan_a.place] == [a.node_id for a in plan_b.place] == ["n"]
    cache = NodeUsageCache()
    with h.reader() as r:
        accepted, rejected = check_plan(r, plan_a, cache)
    assert rejected == {}
    apply(h, accepted)
    with h.reader() as r:
        accepted, rejected = check_plan(r, plan_b, cache)
    assert rejected == {"n": "resources exhausted: device nvidia/gpu"}
    assert accepted.place == []


def test_a_system_job_asking_for_a_gpu_runs_only_where_there_is_one(h: Harness) -> None:
    for node_id, devices in {"gpu": {"nvidia/gpu": 1}, "plain": {}}.items():
        h.ok(m.NodeRegister(node=gpu_node(node_id, devices)))
    ev = register(h, gpu_job("sys", 1, {"gpu": 1}, type="system"))
    plan = run_eval(h, ev)
    assert [(a.node_id, a.resources.devices) for a in plan.place] == [("gpu", {"nvidia/gpu": 1})]
    assert "resources exhausted (device gpu): 1 node" in failure(h, ev.id)
