"""The selector against a brute-force oracle, under any policy, with and without two-level selection;
and the conflict rate that sets how many of the best nodes a placement picks among.

The oracle scores every node each time with the plan's usage, the job's
allocs and cluster loads computed from scratch (PreferEmptierClusters), and
for two-level selection ranks the clusters that still have a feasible node
by the best their nodes offer, rule by rule, keeping the top ``cluster_top``.
The selector must pick exactly the oracle's node, so in particular never an
infeasible one, and never None while any cluster has room.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.structs import Constraint, Node, Resources
from node.leader.workers import CONFLICT_PLANS, WorkerStats
from scheduler.feasibility import PlacementContext, ask_for, check_static
from scheduler.policy import BUCKETED, Policy, Preference
from scheduler.preferences import cluster_of, rank_key
from scheduler.ranking import MASK, Request, Selector
from scheduler.traits import cluster_totals, node_hash
from tests.lifecycle.support import job, node

PREFERENCES = ["avoid-previous-node", "best-fit", "job-anti-affinity", "prefer-non-empty-machines", "prefer-emptier-clusters"]
VALIDATION = ("node-status", "node-eligibility", "datacenter", "drivers", "constraints", "distinct-hosts", "resources")

node_spec = st.tuples(
    st.integers(0, 3),  # cluster
    st.sampled_from([1000, 2000, 4000]),
    st.sampled_from([1024, 4096, 8192]),
    st.floats(0, 1),  # used share of cpu
    st.floats(0, 1),  # used share of memory
    st.sampled_from(["ready", "ready", "ready", "down"]),
    st.booleans(),  # eligible (or else draining)
)
preference = st.permutations(PREFERENCES).flatmap(
    lambda names: st.tuples(*(st.tuples(st.just(n), st.integers(1, 5) if n in BUCKETED else st.just(0)) for n in names))
).flatmap(lambda prefs: st.integers(0, len(prefs)).map(lambda k: prefs[:k]))


def build(specs: list[tuple[Any, ...]]) -> tuple[list[Node], dict[str, Resources]]:
    nodes, usage = [], {}
    for i, (cluster, cpu, mem, ucpu, umem, status, eligible) in enumerate(specs):
        n = node(f"n{i}", cpu=cpu, mem=mem, status=status, **({"meta.cluster": f"c{cluster}"} if cluster else {}))
        if not eligible:
            n.drain = True
        nodes.append(n)
        usage[n.id] = Resources(cpu=int(cpu * ucpu * 0.9), memory_mb=int(mem * umem * 0.9), disk_mb=0)
    return nodes, usage


def oracle(nodes: list[Node], request: Request, ctx: PlacementContext, policy: Policy, sel: Selector) -> Node | None:
    """Score every node from scratch (cluster loads too) and pick as the policy says."""
    ask = request.ask
    ctx.cluster_load = {c: t.load() for c, t in cluster_totals({n.id: n for n in nodes}, ctx.usage).items()}
    rules = policy.preference_rules()
    feasible = [n for n in sorted(nodes, key=lambda n: n.id) if check_static(n, ask, ctx, policy.validation_rules()) is None]
    if policy.cluster_top and feasible:
        node_rules = [r for r in rules if not r.per_request]
        best: dict[str, tuple[int, ...]] = {}
        for n in feasible:
            key = tuple(r.score(n, ask, ctx, Request(ask)) for r in node_rules)
            c = cluster_of(n)
            best[c] = tuple(map(max, best[c], key)) if c in best else key
        ranked = sorted(best, key=lambda c: (tuple(-x for x in best[c]), (node_hash(c) - sel.rotation) & MASK))
        kept = set(ranked[: policy.cluster_top])
        feasible = [n for n in feasible if cluster_of(n) in kept]
    if not feasible:
        return None
    return max(feasible, key=lambda n: rank_key(n, request, ctx, rules, sel.tiebreak[n.id]))


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(node_spec, min_size=1, max_size=12),
    prefs=preference,
    validation=st.permutations(VALIDATION),
    cluster_top=st.integers(0, 3),
    ask_cpu=st.integers(100, 1500),
    ask_mem=st.integers(64, 3000),
    distinct=st.booleans(),
    running=st.lists(st.integers(0, 11), max_size=4),
    steps=st.lists(st.integers(-1, 11), min_size=1, max_size=20),
    seed=st.integers(0, 10_000),
)
def test_the_selector_picks_what_scoring_every_node_would(
    specs: list[Any], prefs: Any, validation: Any, cluster_top: int, ask_cpu: int, ask_mem: int, distinct: bool,
    running: list[int], steps: list[int], seed: int,
) -> None:
    nodes, usage = build(specs)
    policy = Policy(validation=tuple(validation), preference=tuple(Preference(n, b) for n, b in prefs), cluster_top=cluster_top)
    j = job(cpu=ask_cpu, mem=ask_mem, constraints=[Constraint(operand="distinct_hosts")] if distinct else [])
    ask = ask_for(j, j.task_groups[0])
    job_allocs = Counter(f"n{i}" for i in running if i < len(nodes))
    sel = Selector(nodes, PlacementContext(usage={k: v.copy() for k, v in usage.items()}, job_allocs=Counter(job_allocs)),
                   rng=random.Random(seed), rules=policy.preference_rules(), validation=policy.validation_rules(), cluster_top=cluster_top)
    slow = PlacementContext(usage={k: v.copy() for k, v in usage.items()}, job_allocs=Counter(job_allocs))
    for step in steps:
        request = Request(ask, previous_node=f"n{step}" if 0 <= step < len(nodes) else "")
        got = sel.select(request)
        want = oracle(nodes, request, slow, policy, sel)
        if got is not None:  # never an infeasible node
            assert check_static(got, ask, slow, policy.validation_rules()) is None
        else:  # never None while any node has room
            assert not any(check_static(n, ask, slow, policy.validation_rules()) is None for n in nodes)
        assert (got.id if got else None) == (want.id if want else None)
        if got is None:
            break
        sel.claim(got, ask)
        slow.used(got.id).add(ask.resources)
        slow.job_allocs[got.id] += 1


def test_two_level_selection_widens_past_full_clusters() -> None:
    """The only room left is in the least preferred cluster: it is found, not missed."""
    nodes = [node(f"a{i}", cpu=1000, mem=1024, **{"meta.cluster": "a"}) for i in range(4)]
    nodes += [node(f"b{i}", cpu=1000, mem=1024, **{"meta.cluster": "b"}) for i in range(4)]
    usage = {n.id: Resources(cpu=900, memory_mb=900, disk_mb=0) for n in nodes}
    usage["b3"] = Resources.zero()
    policy = Policy(cluster_top=1, preference=(Preference("prefer-emptier-clusters", 3), Preference("best-fit", 3)))
    j = job(cpu=500, mem=500)
    ask = ask_for(j, j.task_groups[0])
    sel = Selector(nodes, PlacementContext(usage=usage), rng=random.Random(1), rules=policy.preference_rules(),
                   validation=policy.validation_rules(), cluster_top=1)
    assert sel.select(Request(ask)).id == "b3"


def test_prefer_emptier_clusters_moves_on_as_the_plan_fills_a_cluster() -> None:
    """A claim changes the load of the whole cluster: the selector re-ranks the cluster, and the
    next placement goes to the other cluster once this one is no longer the emptier."""
    nodes = [node(f"{c}{i}", cpu=1000, mem=1000, **{"meta.cluster": c}) for c in "ab" for i in range(3)]
    policy = Policy(preference=(Preference("prefer-emptier-clusters", 10), Preference("best-fit", 3)))
    j = job(cpu=400, mem=400, count=6)
    ask = ask_for(j, j.task_groups[0])
    sel = Selector(nodes, PlacementContext(usage={}), rng=random.Random(3), rules=policy.preference_rules(),
                   validation=policy.validation_rules())
    clusters = []
    for _ in range(6):
        n = sel.select(Request(ask))
        sel.claim(n, ask)
        clusters.append(n.attributes["meta.cluster"])
    assert Counter(clusters) == {"a": 3, "b": 3}
    assert all(clusters[i] != clusters[i + 1] for i in range(0, 6, 2)), clusters


def test_the_conflict_rate_sets_top_k_and_decays() -> None:
    stats = WorkerStats()
    assert stats.top_k(4, now=0.0) == 1
    for i in range(3):
        stats.record_plan(conflict=True, now=float(i))
    grown = stats.top_k(4, now=3.0)
    assert 1 < grown <= 4 and stats.rate(3.0) > 0
    for i in range(10):
        stats.record_plan(conflict=True, now=3.0 + i)
    assert stats.top_k(4, now=13.0) == 4 and stats.top_k(2, now=13.0) == 2, "never more than the policy's top_k_max"
    for i in range(4 * CONFLICT_PLANS):
        stats.record_plan(conflict=False, now=13.0 + i * 0.01)
    assert stats.top_k(4, now=14.0) == 1, "calm plans bring it back to the single best"
    stats.record_plan(conflict=True, now=20.0)
    stats.record_plan(conflict=True, now=20.0)
    assert stats.top_k(4, now=20.0) > 1 and stats.top_k(4, now=200.0) == 1, "and so does time without plans"
    assert stats.to_nomad()["Placement"]["Placements"] == 0
