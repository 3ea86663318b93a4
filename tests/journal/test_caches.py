"""Journal-driven caches equal a from-scratch rebuild at the same index, whatever the log.

Hypothesis plays random logs (placements, stops, client updates, in-place
moves, GC deletions of allocations, jobs and nodes, group commits) into a
real FSM. Two caches follow it: one refreshed after every commit, one only
now and then (so it catches up over many batches, and with a tiny retention
falls out of the window and must rebuild). After every refresh each cache
must equal (a) a cache rebuilt from scratch in the same read transaction and
(b) an independent oracle summing the allocations table.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.caches import NodeUsageCache
from fsm.journal import Retention
from fsm.store import StateReader
from fsm.structs import CLIENT_STATUSES, DESIRED_STOP, Resources
from tests.journal.support import Harness, job, node, place

NODES = ["n1", "n2", "n3"]
JOBS = ["web", "api"]
ALLOCS = [f"a{i}" for i in range(8)]
CACHES = (NodeUsageCache,)  # every journal-driven cache is checked the same way


def oracle(reader: StateReader) -> dict[str, tuple[int, int, int, int]]:
    """Per-node usage computed from the allocations table alone."""
    out: dict[str, list[int]] = {}
    for alloc in reader.allocs():
        if alloc.terminal():
            continue
        row = out.setdefault(alloc.node_id, [0, 0, 0, 0])
        row[0] += alloc.resources.cpu
        row[1] += alloc.resources.memory_mb
        row[2] += alloc.resources.disk_mb
        row[3] += 1
    return {k: tuple(v) for k, v in sorted(out.items())}  # type: ignore[misc]


BY_KIND: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "node": st.tuples(st.just("node"), st.sampled_from(NODES)),
    "job": st.tuples(st.just("job"), st.sampled_from(JOBS)),
    "place": st.tuples(
        st.just("place"),
        st.sampled_from(ALLOCS),
        st.sampled_from(JOBS),
        st.sampled_from(NODES),
        st.integers(0, 4000),
        st.integers(0, 4096),
        st.integers(0, 500),
    ),
    "stop": st.tuples(st.just("stop"), st.sampled_from(ALLOCS)),
    "client": st.tuples(st.just("client"), st.sampled_from(ALLOCS), st.sampled_from(CLIENT_STATUSES)),
    "reap_allocs": st.just(("reap_allocs",)),
    "stop_job": st.tuples(st.just("stop_job"), st.sampled_from(JOBS)),
    "reap_job": st.tuples(st.just("reap_job"), st.sampled_from(JOBS)),
    "node_down": st.tuples(st.just("node_down"), st.sampled_from(NODES)),
    "reap_node": st.tuples(st.just("reap_node"), st.sampled_from(NODES)),
    "commit": st.just(("commit",)),
    "refresh_laggard": st.just(("refresh_laggard",)),
}
# Placements dominate so that nodes carry several allocations; the rest move them around and delete them.
WEIGHTS = {"place": 10, "client": 4, "stop": 2, "commit": 4, "refresh_laggard": 2}
KINDS = [k for k in BY_KIND for _ in range(WEIGHTS.get(k, 1))]
ops = st.sampled_from(KINDS).flatmap(lambda kind: BY_KIND[kind])


def body_for(op: tuple[Any, ...], h: Harness) -> Any:
    kind = op[0]
    with h.fsm.read() as r:  # committed state is enough to aim reaps at real objects
        if kind == "node":
            return node(op[1])
        if kind == "job":
            return job(op[1])
        if kind == "place":
            return place(*op[1:])
        if kind == "stop":
            return m.PlanApply(allocs_to_stop=[m.AllocStop(id=op[1], desired_status=DESIRED_STOP)])
        if kind == "client":
            return m.AllocClientUpdate(allocs=[m.AllocClientState(id=op[1], client_status=op[2])])
        if kind == "reap_allocs":
            reaps = [m.Reap(id=a.id, modify_index=a.modify_index) for a in r.allocs() if a.terminal()]
            return m.EvalReap(allocs=reaps)
        if kind == "stop_job":
            return m.JobDeregister(job_id=op[1])
        if kind == "reap_job":
            j = r.job(op[1])
            return m.JobBatchDeregister(jobs=[m.Reap(id=op[1], modify_index=j.modify_index if j else 0)])
        if kind == "node_down":
            return m.NodeUpdateStatus(node_id=op[1], status="down")
        if kind == "reap_node":
            n = r.node(op[1])
            return m.NodeReap(nodes=[m.Reap(id=op[1], modify_index=n.modify_index if n else 0)])
    raise AssertionError(kind)


def setup(h: Harness) -> None:
    """Every node and job exists at first, so most placements succeed (the log may still remove them)."""
    for node_id in NODES:
        h.apply(node(node_id))
    for job_id in JOBS:
        h.apply(job(job_id))


def check(cache: NodeUsageCache, h: Harness) -> None:
    with h.fsm.read() as r:
        index = cache.catch_up(r)
        assert index == r.applied_index
        fresh = type(cache)()
        fresh.rebuild(r)
        assert cache.dump() == fresh.dump(), f"cache diverged from a rebuild at index {index}"
        expected = oracle(r)
        assert cache.dump()["nodes"] == expected
        for node_id in NODES:
            cpu, mem, disk, count = expected.get(node_id, (0, 0, 0, 0))
            assert cache.usage(node_id) == Resources(cpu=cpu, memory_mb=mem, disk_mb=disk)
            assert cache.alloc_count(node_id) == count


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=st.lists(ops, min_size=5, max_size=80), tiny_window=st.booleans())
def test_caches_equal_a_rebuild_after_any_log(log: list[tuple[Any, ...]], tiny_window: bool) -> None:
    h = Harness(retention=Retention(max_batches=3) if tiny_window else None)
    try:
        setup(h)
        for cls in CACHES:
            follower, laggard = cls(), cls()
            check(follower, h)
            check(laggard, h)
            pending = False
            for op in log:
                if op[0] == "commit":
                    h.commit()
                    pending = False
                    check(follower, h)
                elif op[0] == "refresh_laggard":
                    check(laggard, h)
                else:
                    h.apply(body_for(op, h), commit=False)
                    pending = True
            if pending:
                h.commit()
            check(follower, h)
            check(laggard, h)
    finally:
        h.close()


def test_cursor_applies_only_new_batches_and_rebuilds_after_a_trimmed_gap() -> None:
    h = Harness(retention=Retention(max_batches=4))
    try:
        cache = NodeUsageCache()
        h.apply(node("n1"))
        h.apply(job("web"))
        cache.refresh(h.fsm)
        assert cache.cursor.stats.rebuilds == 1
        h.apply(place("a1", "web", "n1", cpu=500, memory_mb=256))
        h.apply(place("a2", "web", "n1", cpu=250, memory_mb=128))
        cache.refresh(h.fsm)
        assert cache.cursor.stats.rebuilds == 1, "a follower inside the window must not rebuild"
        assert cache.cursor.stats.batches == 2
        assert cache.usage("n1") == Resources(cpu=750, memory_mb=384, disk_mb=0)
        for i in range(6):  # push the cache's position out of the 4-batch window
            h.apply(node(f"x{i}"))
        h.apply(m.AllocClientUpdate(allocs=[m.AllocClientState(id="a1", client_status="complete")]))
        with h.fsm.read() as r:
            assert r.journal_trimmed() > (cache.index or 0)
        cache.refresh(h.fsm)
        assert cache.cursor.stats.rebuilds == 2
        assert cache.usage("n1") == Resources(cpu=250, memory_mb=128, disk_mb=0)
        assert cache.index == h.index
    finally:
        h.close()


def test_cursor_rebuilds_when_asked_for_an_older_snapshot() -> None:
    h = Harness()
    try:
        h.apply(node("n1"))
        h.apply(job("web"))
        with h.fsm.read() as old:
            h.apply(place("a1", "web", "n1", cpu=100))
            cache = NodeUsageCache()
            cache.refresh(h.fsm)
            assert cache.usage("n1").cpu == 100
            assert cache.catch_up(old) == old.applied_index  # behind the cache: rebuild, never "apply backwards"
            assert cache.usage("n1").cpu == 0
    finally:
        h.close()
