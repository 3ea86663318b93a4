"""The client GC's eviction decisions against a reference model (``client.gc``).

The model is written the way Nomad's client loop reads
(``keepUsageBelowThreshold``): look at the node, name the first limit it
is over (disk, inodes, count), pop the oldest-finished terminal alloc,
look again. ``plan_evictions`` must agree with it exactly, and each
property says one thing the issue asks for.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from client import gc as rules
from client.gc import GCConfig, Held, NodeUsage


def model(node: NodeUsage, cfg: GCConfig, count_only: bool = False) -> list[tuple[str, str]]:
    """The reference: a literal loop over a mutable copy of the node."""
    heap = sorted(node.held, key=lambda h: (h.finished, h.alloc_id))
    out = []
    while heap:
        used = node.fixed_bytes + sum(h.bytes for h in heap)
        inodes = node.fixed_inodes + sum(h.inodes for h in heap)
        count = node.fixed_count + len(heap)
        reason = None
        if count_only:
            reason = "count" if count > cfg.max_allocs else None
        elif node.disk_bytes and used * 100 > cfg.disk_usage_threshold * node.disk_bytes:
            reason = "disk"
        elif node.inodes and inodes * 100 > cfg.inode_usage_threshold * node.inodes:
            reason = "inodes"
        elif count > cfg.max_allocs:
            reason = "count"
        if reason is None:
            break
        victim = heap.pop(0)
        out.append((victim.alloc_id, reason))
    return out


def over(node: NodeUsage, cfg: GCConfig, held: list[Held]) -> str | None:
    used = node.fixed_bytes + sum(h.bytes for h in held)
    inodes = node.fixed_inodes + sum(h.inodes for h in held)
    return rules.pressure(used, inodes, node.fixed_count + len(held), node, cfg)


helds = st.lists(
    st.builds(
        Held,
        alloc_id=st.uuids().map(str),
        finished=st.integers(0, 50).map(float),
        bytes=st.integers(0, 400),
        inodes=st.integers(0, 40),
    ),
    max_size=30,
    unique_by=lambda h: h.alloc_id,
)
nodes = st.builds(
    NodeUsage,
    held=helds.map(tuple),
    fixed_count=st.integers(0, 20),
    fixed_bytes=st.integers(0, 2000),
    fixed_inodes=st.integers(0, 200),
    disk_bytes=st.integers(1, 5000),
    inodes=st.integers(1, 500),
)
configs = st.builds(
    GCConfig,
    interval=st.just(60.0),
    max_allocs=st.integers(1, 40),
    disk_usage_threshold=st.integers(0, 100).map(float),
    inode_usage_threshold=st.integers(0, 100).map(float),
    parallel_destroys=st.integers(1, 4),
)


@settings(max_examples=400, deadline=None)
@given(nodes, configs, st.booleans())
def test_the_plan_is_the_models(node: NodeUsage, cfg: GCConfig, count_only: bool) -> None:
    plan = rules.plan_evictions(node, cfg, count_only=count_only)
    assert [(h.alloc_id, r) for h, r in plan] == model(node, cfg, count_only)


@settings(max_examples=300, deadline=None)
@given(nodes, configs)
def test_oldest_finished_go_first_and_only_terminal_ones(node: NodeUsage, cfg: GCConfig) -> None:
    plan = rules.plan_evictions(node, cfg)
    order = rules.eviction_order(node.held)
    assert [h for h, _ in plan] == order[: len(plan)]  # a prefix of oldest-finished-first
    held_ids = {h.alloc_id for h in node.held}
    assert all(h.alloc_id in held_ids for h, _ in plan)  # never a live (fixed) alloc


@settings(max_examples=300, deadline=None)
@given(nodes, configs)
def test_it_stops_exactly_when_under_every_limit(node: NodeUsage, cfg: GCConfig) -> None:
    plan = rules.plan_evictions(node, cfg)
    order = rules.eviction_order(node.held)
    for k, (_, reason) in enumerate(plan):
        # Each eviction was needed: before it, the node was over this limit, the first in order.
        assert over(node, cfg, order[k:]) == reason
    left = order[len(plan) :]
    assert over(node, cfg, left) is None or not left  # under every limit, or nothing left to evict


@settings(max_examples=200, deadline=None)
@given(nodes, configs)
def test_the_reasons_come_in_nomads_order(node: NodeUsage, cfg: GCConfig) -> None:
    reasons = [r for _, r in rules.plan_evictions(node, cfg)]
    rank = {"disk": 0, "inodes": 1, "count": 2}
    assert reasons == sorted(
        reasons, key=rank.__getitem__
    )  # evicting only lowers usage: disk, then inodes, then count


@given(helds)
def test_without_pressure_nothing_is_evicted(held: list[Held]) -> None:
    node = NodeUsage(held=tuple(held), disk_bytes=10**9, inodes=10**9)
    assert rules.plan_evictions(node, GCConfig(max_allocs=len(held) + 1)) == []


def test_make_room_checks_only_the_count() -> None:
    held = (Held("a", 1.0, bytes=900), Held("b", 2.0, bytes=900))
    node = NodeUsage(held=held, fixed_count=2, disk_bytes=1000)  # 180% disk
    plan = rules.plan_evictions(node, GCConfig(max_allocs=3), count_only=True)
    assert [(h.alloc_id, r) for h, r in plan] == [("a", "count")]
