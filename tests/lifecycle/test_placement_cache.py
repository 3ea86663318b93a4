"""The placement index and its trait caches equal a fresh computation at the same index.

Hypothesis plays random logs of node and alloc changes (registrations with
topology, heartbeats that change nothing, status, eligibility, drain,
placements, stops, client updates, reaps; sometimes with a journal window so
small the index must rebuild) into a real FSM. A ``PlacementIndex`` follows
it after every commit and another only now and then. At each check, for
several asks and policies, the cached rankings, brought forward from the
journal, must equal rankings built from scratch from the same read; the
selector must choose the same nodes in the same order from either (same
seed), with the same explanation; and the scheduler must make the same plan.
"""

from __future__ import annotations

import gc
import random
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.journal import Retention
from fsm.structs import (
    CLIENT_STATUSES,
    DESIRED_STOP,
    Allocation,
    Constraint,
    DrainStrategy,
    Evaluation,
    Job,
    Node,
    Resources,
    Task,
    TaskGroup,
)
from scheduler.feasibility import Ask, PlacementContext, ask_for
from scheduler.generic import schedule
from scheduler.index import PlacementIndex
from scheduler.policy import Policy, Preference
from scheduler.ranking import Request, Selector
from scheduler.state import load_snapshot, scan_usage
from scheduler.traits import FreshSource, cluster_totals
from tests.fsm.support import Harness

NODES = [f"n{i}" for i in range(6)]
ALLOCS = [f"a{i}" for i in range(10)]
CLUSTERS = ["", "c1", "c2"]
NOW = 1_800_000_000 * 10**9


def _job(job_id: str, groups: list[TaskGroup]) -> Job:
    return Job(id=job_id, type="service", datacenters=["dc1", "dc2"], task_groups=groups, job_modify_index=1)


def _group(name: str, count: int, cpu: int, mem: int, constraints: list[Constraint] | None = None) -> TaskGroup:
    task = Task(name="t", driver="sim", resources=Resources(cpu=cpu, memory_mb=mem))
    return TaskGroup(name=name, count=count, tasks=[task], constraints=constraints or [])


WEB = _job("web", [_group("g", 1, 100, 64)])
PROBE = _job("probe", [
    _group("small", 4, 500, 256),
    _group("spread", 2, 1500, 2048, [Constraint(operand="distinct_hosts"), Constraint(l_target="${meta.cluster}", r_target="c2", operand="!=")]),
])
ASKS = [ask_for(PROBE, g) for g in PROBE.task_groups] + [ask_for(WEB, WEB.task_groups[0])]
POLICIES = [
    Policy(),
    Policy(
        validation=("resources", "node-status", "node-eligibility", "datacenter", "drivers", "constraints", "distinct-hosts"),
        preference=(Preference("prefer-emptier-clusters", 2), Preference("best-fit", 5), Preference("prefer-non-empty-machines"),
                    Preference("avoid-previous-node"), Preference("job-anti-affinity")),
    ),
    Policy(cluster_top=1, preference=(Preference("avoid-previous-node"), Preference("best-fit", 3), Preference("prefer-emptier-clusters", 3),
                                      Preference("job-anti-affinity"))),
]


def register(node_id: str, cpu: int, mem: int, cluster: str, dc: str) -> m.NodeRegister:
    attrs = {"driver.sim": "1", **({"meta.cluster": cluster} if cluster else {})}
    return m.NodeRegister(node=Node(id=node_id, name=node_id, datacenter=dc, status="ready", attributes=attrs,
                                    resources=Resources(cpu=cpu, memory_mb=mem, disk_mb=0)))


BY_KIND: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "register": st.tuples(st.just("register"), st.sampled_from(NODES), st.sampled_from([1000, 2000, 4000]),
                          st.sampled_from([1024, 4096, 8192]), st.sampled_from(CLUSTERS), st.sampled_from(["dc1", "dc2", "dc3"])),
    "heartbeat": st.tuples(st.just("heartbeat"), st.sampled_from(NODES)),
    "status": st.tuples(st.just("status"), st.sampled_from(NODES), st.sampled_from(["ready", "down"])),
    "eligibility": st.tuples(st.just("eligibility"), st.sampled_from(NODES), st.sampled_from(["eligible", "ineligible"])),
    "drain": st.tuples(st.just("drain"), st.sampled_from(NODES), st.booleans()),
    "place": st.tuples(st.just("place"), st.sampled_from(ALLOCS), st.sampled_from(["web", "probe"]), st.sampled_from(NODES),
                       st.integers(0, 3000), st.integers(0, 6000)),
    "stop": st.tuples(st.just("stop"), st.sampled_from(ALLOCS)),
    "client": st.tuples(st.just("client"), st.sampled_from(ALLOCS), st.sampled_from(CLIENT_STATUSES)),
    "reap_node": st.tuples(st.just("reap_node"), st.sampled_from(NODES)),
    "commit": st.just(("commit",)),
    "laggard": st.just(("laggard",)),
}
WEIGHTS = {"place": 6, "register": 3, "client": 3, "commit": 4, "laggard": 2}
ops = st.sampled_from([k for k in BY_KIND for _ in range(WEIGHTS.get(k, 1))]).flatmap(lambda kind: BY_KIND[kind])


def body_for(op: tuple[Any, ...], h: Harness) -> Any:
    kind = op[0]
    with h.reader() as r:
        if kind == "register":
            return register(*op[1:])
        if kind == "heartbeat":  # the same node again: a new record, nothing placement reads changed
            n = r.node(op[1])
            return m.NodeRegister(node=n) if n is not None else register(op[1], 2000, 4096, "", "dc1")
        if kind == "status":
            return m.NodeUpdateStatus(node_id=op[1], status=op[2])
        if kind == "eligibility":
            return m.NodeUpdateEligibility(node_id=op[1], eligibility=op[2])
        if kind == "drain":
            return m.NodeUpdateDrain(node_id=op[1], strategy=DrainStrategy() if op[2] else None, mark_eligible=not op[2])
        if kind == "place":
            alloc_id, job_id, node_id, cpu, mem = op[1:]
            alloc = Allocation(id=alloc_id, eval_id=f"eval-{job_id}", job_id=job_id, node_id=node_id, task_group="g",
                               name=f"{job_id}.g[{ALLOCS.index(alloc_id)}]", resources=Resources(cpu=cpu, memory_mb=mem, disk_mb=0))
            return m.PlanApply(job_id=job_id, allocs_to_place=[alloc])
        if kind == "stop":
            return m.PlanApply(allocs_to_stop=[m.AllocStop(id=op[1], desired_status=DESIRED_STOP)])
        if kind == "client":
            return m.AllocClientUpdate(allocs=[m.AllocClientState(id=op[1], client_status=op[2])])
        if kind == "reap_node":
            n = r.node(op[1])
            return m.NodeReap(nodes=[m.Reap(id=op[1], modify_index=n.modify_index if n else 0)])
    raise AssertionError(kind)


def setup(h: Harness) -> None:
    for i, node_id in enumerate(NODES):
        h.apply(register(node_id, 4000, 8192, CLUSTERS[i % 3], "dc1"))
    h.apply(m.JobRegister(job=WEB, eval=Evaluation(id="eval-web", job_id="web", type="service", status="pending")))
    h.apply(m.JobRegister(job=PROBE, eval=Evaluation(id="eval-probe", job_id="probe", type="service", status="pending")))


def rules_of(policy: Policy) -> tuple[Any, Any]:
    """(validation rules, the rules a trait ranking scores with) of a policy, as the selector splits them."""
    rules = tuple(r for r in policy.preference_rules() if not r.per_request and not r.cluster_level)
    return policy.validation_rules(), rules


def picks(source: Any, policy: Policy, ask: Ask, job_allocs: Counter[str], seed: int) -> list[Any]:
    """What a selector over ``source`` chooses for six placements (some rescheduled), then why it fails."""
    ctx = PlacementContext(usage={}, base=source.usage, job_allocs=Counter(job_allocs))
    sel = Selector(source.nodes, ctx, rng=random.Random(seed), rules=policy.preference_rules(), validation=policy.validation_rules(),
                   cluster_top=policy.cluster_top, source=source)
    out: list[Any] = []
    for i in range(6):
        node = sel.select(Request(ask, previous_node=NODES[i] if i % 3 == 2 else ""))
        out.append(node.id if node is not None else None)
        if node is not None:
            sel.claim(node, ask)
    out.append(sel.failure(ask, 1).describe())
    return out


def placed(plan: Any) -> list[Any]:
    return [sorted((a.name, a.node_id) for a in plan.place), dict(plan.failed), sorted(
        (e.status, sorted(e.failed_tg_allocs.items())) for e in plan.evals)]


def check(index: PlacementIndex, h: Harness, seed: int) -> None:
    with h.reader() as r, index.lock:
        assert index.catch_up(r) and index.index == r.applied_index
        nodes = {n.id: n for n in r.nodes()}
        usage = {node_id: scan_usage(r, node_id) for node_id in nodes}
        assert index.nodes == nodes
        assert {k: v for k, v in index.usage.items() if k in nodes} == usage
        assert index.cluster_totals() == cluster_totals(nodes, usage)
        fresh = FreshSource(nodes, usage)
        for ask in ASKS:
            for policy in POLICIES:
                for by_cluster in (False, True):
                    cached = index.ranking(ask, *rules_of(policy), by_cluster)[0]
                    assert cached.signature() == fresh.ranking(ask, *rules_of(policy), by_cluster)[0].signature()
        job_allocs = Counter(a.node_id for a in r.allocs_by_job("probe") if not a.terminal())
        for policy in POLICIES:
            for ask in ASKS[:2]:
                assert picks(index, policy, ask, job_allocs, seed) == picks(FreshSource(nodes, usage), policy, ask, job_allocs, seed)
            ev = r.eval("eval-probe")
            with_index = load_snapshot(r, ev, NOW, index=index)
            without = load_snapshot(r, ev, NOW)
            assert with_index.rankings is index and without.rankings is None
            with_index.policy = without.policy = policy
            assert placed(schedule(with_index)) == placed(schedule(without))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=st.lists(ops, min_size=5, max_size=60), tiny_window=st.booleans(), seed=st.integers(0, 1000))
def test_a_cached_ranking_brought_forward_equals_a_fresh_one(log: list[tuple[Any, ...]], tiny_window: bool, seed: int) -> None:
    h = Harness.temp(retention=Retention(max_batches=3) if tiny_window else None)
    try:
        setup(h)
        follower, laggard = PlacementIndex(max_traits=4), PlacementIndex()
        check(follower, h, seed)
        check(laggard, h, seed)
        pending = False
        for op in log:
            if op[0] == "commit":
                h.fsm.commit()
                pending = False
                check(follower, h, seed)
            elif op[0] == "laggard":
                check(laggard, h, seed)
            else:
                h.apply(body_for(op, h), commit=False)
                pending = True
        if pending:
            h.fsm.commit()
        check(follower, h, seed)
        check(laggard, h, seed)
        assert follower.stats.evictions > 0, "four traits at most: the cold ones are dropped"
    finally:
        h.destroy()


def test_the_index_never_goes_back_and_counts_only_changes_that_matter() -> None:
    h = Harness.temp()
    try:
        setup(h)
        index = PlacementIndex()
        with h.reader() as r:
            assert index.catch_up(r)
        changes = index.stats.node_changes
        with h.reader() as old:
            h.apply(register("n0", 4000, 8192, "", "dc1"))  # what n0 already was (a heartbeat's record)
            with h.reader() as new:
                assert index.catch_up(new)
            assert index.stats.node_changes == changes, "nothing placement reads changed: nothing to rescore"
            assert not index.catch_up(old), "an older read is sent back, never served from a newer index"
        h.apply(m.NodeUpdateStatus(node_id="n1", status="down"))
        with h.reader() as r:
            assert index.catch_up(r)
        assert index.stats.node_changes == changes + 1 and index.applied["n1"] == h.index
        assert index.stats.rebuilds == 1 and index.stats.stale_reads == 1
    finally:
        h.destroy()


def test_a_hit_rescores_only_the_nodes_changed_since() -> None:
    h = Harness.temp()
    try:
        setup(h)
        index = PlacementIndex()
        ask = ASKS[0]
        validation, rules = rules_of(Policy())
        with h.reader() as r, index.lock:
            index.catch_up(r)
            _, hit, scored = index.ranking(ask, validation, rules, False)
            assert (hit, scored) == (False, len(NODES))
        h.apply(body_for(("place", "a0", "web", "n2", 100, 100), h))
        h.apply(body_for(("place", "a1", "web", "n2", 100, 100), h))
        with h.reader() as r, index.lock:
            index.catch_up(r)
            _, hit, scored = index.ranking(ask, validation, rules, False)
            assert (hit, scored) == (True, 1)
    finally:
        h.destroy()


def test_an_index_keeps_no_per_alloc_object_in_the_cyclic_collector() -> None:
    """Its claims are (node, Resources) pairs and Resources is untracked: at 1M allocs, tracked, they
    were two million objects every full pass walked (0.4-1.1 s with every thread stopped, issue #34)."""
    h = Harness.temp()
    try:
        setup(h)
        ev = Evaluation(id="ev-wide", job_id="wide", type="batch", status="complete")
        wide = _job("wide", [_group("g", 2000, 1, 1)])
        h.apply(m.JobRegister(job=wide))
        allocs = [
            Allocation(id=f"wide-{i}", eval_id=ev.id, job_id="wide", task_group="g", node_id="n0",
                       name=f"wide.g[{i}]", resources=Resources(cpu=1, memory_mb=1))
            for i in range(2000)
        ]
        h.apply(m.PlanApply(eval_id=ev.id, job_id="wide", allocs_to_place=allocs, evals=[ev]))
        assert not gc.is_tracked(Resources())
        gc.collect()
        before = len(gc.get_objects())
        index = PlacementIndex()
        with h.reader() as r:
            assert index.catch_up(r)
        gc.collect()  # pairs of untracked objects leave the collector at their first pass
        assert index.usage["n0"].cpu >= 2000
        assert len(gc.get_objects()) - before < 500, "per-alloc objects are tracked again"
    finally:
        h.destroy()
