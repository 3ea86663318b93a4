"""Heartbeat TTLs that scale with the cluster, per-node deadlines, and the monitor that acts on them.

Pure units with a fake clock: the TTL formula (Nomad's ``RateScaledInterval``
plus ``RandomStagger``), the deadline table, and the leader's monitor —
failover grace for a new term, per-node expiry, and what it does when a
mark-down fails (stop when not leader; back off otherwise).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import fleet
from fsm.structs import NODE_DOWN, NODE_ELIGIBLE, NODE_READY, Evaluation
from node.core.config import ConfigError, SchedulerConfig, ServerConfig
from node.core.heartbeats import Heartbeats, base_ttl, granted_ttl
from node.endpoints.nodes import MAX_HEARTBEAT_IDS
from node.leader.broker import EvalBroker
from node.leader.heartbeat import MIN_PASS_GAP, READ_AHEAD, RETRY_LOG_EVERY, HeartbeatMonitor
from node.leader.nodeevals import NODES_PER_BATCH
from node.leader.shims import NodeView
from node.wire.errors import NOT_LEADER, TIMEOUT, RPCError
from tests.conditions import wait_until_async
from tests.node.monitor_fakes import Clock, Log, Raft, State

CFG = SchedulerConfig(min_heartbeat_ttl=10.0, max_heartbeats_per_second=50.0, heartbeat_grace=10.0, failover_heartbeat_ttl=300.0)




# -- the TTL formula ---------------------------------------------------------------------------
@given(nodes=st.integers(0, 2_000_000), min_ttl=st.floats(0.01, 3600), rate=st.floats(0.01, 1e5), seed=st.integers())
def test_a_granted_ttl_is_never_below_the_minimum_and_its_jitter_is_bounded(nodes: int, min_ttl: float, rate: float, seed: int) -> None:
    base = base_ttl(nodes, min_ttl, rate)
    assert base >= min_ttl
    assert math.isclose(base, max(min_ttl, nodes / rate))
    ttl = granted_ttl(nodes, min_ttl, rate, random.Random(seed))
    assert base <= ttl < 2 * base or math.isclose(ttl, 2 * base)


@given(small=st.integers(0, 100_000), more=st.integers(1, 100_000), rate=st.floats(0.1, 1000))
def test_the_ttl_grows_with_the_cluster_so_the_rate_stays_bounded(small: int, more: int, rate: float) -> None:
    assert base_ttl(small + more, 10.0, rate) >= base_ttl(small, 10.0, rate)
    # Above the minimum, all nodes beating once per base TTL make exactly `rate` beats a second.
    n = small + more
    base = base_ttl(n, 10.0, rate)
    assert n / base <= rate * (1 + 1e-9)


def test_small_clusters_get_the_minimum_and_10000_nodes_get_200s_at_50_per_second() -> None:
    assert base_ttl(3, 10.0, 50.0) == 10.0
    assert base_ttl(500, 10.0, 50.0) == 10.0
    assert base_ttl(10_000, 10.0, 50.0) == 200.0


def test_jitter_spreads_ttls_over_the_whole_range() -> None:
    rng = random.Random(7)
    ttls = [granted_ttl(10_000, 10.0, 50.0, rng) for _ in range(2000)]
    assert min(ttls) < 205 and max(ttls) > 395  # not synchronised: [200, 400)
    assert all(200 <= t < 400 for t in ttls)


# -- the deadline table ---------------------------------------------------------------------
def test_each_node_expires_at_its_own_granted_ttl_plus_grace() -> None:
    clock = Clock()
    hb = Heartbeats(clock, random.Random(1))
    ttl_a = hb.grant(["a"], CFG)
    clock.now += 3
    ttl_b = hb.grant(["b"], CFG)
    assert hb.deadline("a") == pytest.approx(1000 + ttl_a + 10)
    assert hb.deadline("b") == pytest.approx(1003 + ttl_b + 10)
    assert hb.due(1000 + ttl_a + 9.9) == []
    assert hb.due(1000 + ttl_a + 10) == ["a"]
    assert hb.deadline("a") is None and len(hb) == 1  # it left the table; b still counts


def test_one_call_counts_its_own_nodes_when_it_scales_the_ttl() -> None:
    hb = Heartbeats(Clock(), random.Random(2))
    ttl = hb.grant([f"n{i}" for i in range(10_000)], CFG)
    assert 200 <= ttl < 400 and len(hb) == 10_000


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0, 30), st.booleans()), max_size=60))
def test_due_returns_each_node_once_when_its_latest_deadline_passes(steps: list[tuple[str, float, bool]]) -> None:
    """Beats supersede earlier deadlines; forgotten nodes never come due; nothing comes due twice."""
    clock = Clock()
    hb = Heartbeats(clock, random.Random(3))
    latest: dict[str, float] = {}
    for node_id, advance, forget in steps:
        clock.now += advance
        if forget:
            hb.forget(node_id)
            latest.pop(node_id, None)
        else:
            hb.grant([node_id], CFG)
            latest[node_id] = hb.deadline(node_id)  # type: ignore[assignment]
        expected = sorted(n for n, d in latest.items() if d <= clock.now)
        assert sorted(hb.due(clock.now)) == expected
        for n in expected:
            del latest[n]
    assert sorted(hb.due(math.inf)) == sorted(latest)


def test_hold_keeps_the_later_deadline_and_clear_starts_a_term_empty() -> None:
    clock = Clock()
    hb = Heartbeats(clock)
    hb.set("a", 1500.0)
    hb.hold("a", 1200.0)
    assert hb.deadline("a") == 1500.0
    hb.hold("a", 1600.0)
    assert hb.deadline("a") == 1600.0
    hb.clear()
    assert len(hb) == 0 and hb.due(math.inf) == []


def test_the_heap_stays_bounded_however_often_nodes_beat() -> None:
    hb = Heartbeats(Clock())
    for _ in range(300):
        hb.grant(["a", "b", "c"], CFG)
    assert len(hb._heap) <= 4 * 3 + 1024  # noqa: SLF001 - the bound is the point


@given(ops=st.lists(st.tuples(st.sampled_from(["set", "forget", "due"]), st.sampled_from("abcde"), st.floats(0, 100)), max_size=40))
def test_the_next_deadline_is_the_earliest_one_held(ops: list[tuple[str, str, float]]) -> None:
    hb = Heartbeats(Clock())
    for op, node_id, at in ops:
        if op == "set":
            hb.set(node_id, at)
        elif op == "forget":
            hb.forget(node_id)
        else:
            hb.due(at)
        held = [d for d in (hb.deadline(n) for n in "abcde") if d is not None]
        assert hb.next_deadline() == (min(held) if held else None)


# -- the monitor ----------------------------------------------------------------------------
def _monitor(
    cfg: SchedulerConfig = CFG, clock: Callable[[], float] | None = None, **views: str
) -> tuple[HeartbeatMonitor, Heartbeats, Any, Raft, Log, dict[str, Any]]:
    """A monitor over ``views`` (node id -> status) with fakes around it; a fake clock unless one is given."""
    clock = clock or Clock()
    hb = Heartbeats(clock, random.Random(5))
    raft, log = Raft(), Log()
    leader = {"yes": True}
    nodes = {n: NodeView(status, NODE_ELIGIBLE, False) for n, status in views.items()}
    mon = HeartbeatMonitor(State(), raft, hb, nodes, config=cfg, is_leader=lambda: leader["yes"],
                           max_entry_bytes=48 * 1024, log=log, clock=clock)
    return mon, hb, clock, raft, log, leader


def test_a_pass_comes_at_the_next_deadline_but_never_within_the_gap_of_the_last() -> None:
    mon, hb, clock, _, _, _ = _monitor(a=NODE_READY, b=NODE_READY)
    last = clock.now
    assert mon.read_ahead == READ_AHEAD  # a tenth of the 10 s TTL is more
    assert mon.next_pass(last) == last + mon.interval  # no deadline held
    hb.set("a", last + 0.9)
    assert mon.next_pass(last) == pytest.approx(last + 0.9 - READ_AHEAD)  # a deadline before the interval's end: its read
    hb.set("b", last + 0.1)
    assert mon.next_pass(last) == last + MIN_PASS_GAP  # not sooner than the gap
    hb.forget("b")
    hb.set("a", last + 5)
    assert mon.next_pass(last) == last + mon.interval  # a later deadline: the interval still bounds it


def test_a_new_leader_waits_the_failover_ttl_before_marking_any_node_down() -> None:
    mon, hb, clock, _, _, _ = _monitor(a=NODE_READY, b=NODE_READY, gone=NODE_DOWN)
    assert mon.start_term(clock.now) == 2
    clock.now += 300 + 10 - 0.1
    assert mon.expired(clock.now) == []
    clock.now += 0.2
    assert sorted(mon.expired(clock.now)) == ["a", "b"]


def test_the_failover_hold_is_never_shorter_than_the_longest_ttl_the_cluster_could_have_granted() -> None:
    views = {f"n{i}": NODE_READY for i in range(100_000)}  # base TTL 2,000 s at 50 a second
    mon, hb, clock, _, _, _ = _monitor(**views)
    mon.start_term(clock.now)
    assert hb.deadline("n0") == pytest.approx(1000 + 2 * 2000 + 10)
    short = replace(CFG, failover_heartbeat_ttl=2.0, min_heartbeat_ttl=2.0, heartbeat_grace=2.0)
    mon, hb, clock, _, _, _ = _monitor(short, a=NODE_READY)
    mon.start_term(clock.now)
    assert hb.deadline("a") == pytest.approx(1000 + 2 * 2 + 2)  # a 2-4 s TTL may have been granted


def test_a_node_that_beats_the_new_leader_runs_on_its_granted_ttl_not_the_failover_ttl() -> None:
    mon, hb, clock, _, _, _ = _monitor(a=NODE_READY, b=NODE_READY)
    mon.start_term(clock.now)
    clock.now += 1
    ttl = hb.grant(["a"], CFG)  # a found the new leader; b did not (yet)
    clock.now += ttl + 10 + 0.01
    assert mon.expired(clock.now) == ["a"]
    assert hb.deadline("b") == pytest.approx(1000 + 310)


def test_a_live_node_without_a_deadline_gets_the_longest_ttl_it_could_have_been_granted() -> None:
    mon, hb, clock, _, _, _ = _monitor(a=NODE_READY)
    mon.start_term(clock.now)
    hb.forget("a")
    mon.sweep(clock.now)
    assert hb.deadline("a") == pytest.approx(1000 + 2 * 10 + 10)


def test_down_and_gone_nodes_leave_the_table_so_the_ttl_counts_live_nodes() -> None:
    mon, hb, clock, _, _, _ = _monitor(a=NODE_READY, b=NODE_READY)
    mon.start_term(clock.now)
    hb.grant(["ghost"], CFG)
    mon.nodes["b"] = NodeView(NODE_DOWN, NODE_ELIGIBLE, False)  # type: ignore[index]
    mon.sweep(clock.now)
    assert set(hb) == {"a"}


def _run_until(mon: HeartbeatMonitor, done: Any, what: str) -> None:
    async def scenario() -> None:
        task = asyncio.create_task(mon.run())
        try:
            await wait_until_async(done, 10, what)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_an_expired_node_is_marked_down_once() -> None:
    cfg = replace(CFG, min_heartbeat_ttl=0.2, failover_heartbeat_ttl=0.01, heartbeat_grace=0.01)
    mon, _, _, raft, _, _ = _monitor(cfg, time.monotonic, a=NODE_READY)
    _run_until(mon, lambda: raft.proposed, "node a marked down")
    assert [(b.node_ids, b.status) for b in raft.proposed] == [(["a"], NODE_DOWN)]


def test_nodes_that_expire_together_go_down_in_a_few_entries_not_one_each() -> None:
    cfg = replace(CFG, min_heartbeat_ttl=0.2, failover_heartbeat_ttl=0.01, heartbeat_grace=0.01,
                  max_heartbeats_per_second=10_000)
    views = {f"n{i:03}": NODE_READY for i in range(300)}
    mon, _, _, raft, log, _ = _monitor(cfg, time.monotonic, **views)
    _run_until(mon, lambda: sum(len(b.node_ids) for b in raft.proposed) == len(views), "the silent nodes marked down")
    entries = -(-len(views) // NODES_PER_BATCH)
    assert len(raft.proposed) == entries
    assert all(len(b.node_ids) <= NODES_PER_BATCH for b in raft.proposed)
    assert sorted(n for b in raft.proposed for n in b.node_ids) == sorted(views)
    assert log.lines.count(("info", "nodes missed their heartbeat; marked down")) == entries


def test_losing_leadership_stops_the_monitor_with_one_line_and_no_retry() -> None:
    cfg = replace(CFG, min_heartbeat_ttl=0.2, failover_heartbeat_ttl=0.01, heartbeat_grace=0.01)
    mon, hb, _, raft, log, _ = _monitor(cfg, time.monotonic, **{f"n{i}": NODE_READY for i in range(200)})
    raft.fail = RPCError(NOT_LEADER, "this server is not the leader")
    _run_until(mon, lambda: mon.stopped and not mon.marking, "the monitor stopped")
    assert raft.proposed == [] and len(hb) == 0  # nothing re-armed for a retry
    assert log.lines.count(("info", "heartbeat monitor stopped: this server is not the leader")) == 1
    assert not [line for line in log.lines if line[0] == "warning"]


def test_the_monitor_stops_on_its_next_pass_once_this_server_is_not_the_leader() -> None:
    mon, _, _, raft, _, leader = _monitor(a=NODE_READY)
    leader["yes"] = False

    async def scenario() -> None:
        await asyncio.wait_for(mon.run(), 5)

    asyncio.run(scenario())
    assert mon.stopped and raft.proposed == []


def test_other_failures_are_retried_with_backoff_and_logged_now_and_then() -> None:
    mon, hb, clock, raft, log, _ = _monitor(a=NODE_READY, b=NODE_READY)
    raft.fail = RPCError(TIMEOUT, "the write did not commit in time")

    async def scenario() -> None:
        delays = []
        for _ in range(8):
            await mon._mark_down(["a"])  # noqa: SLF001 - one attempt at a time
            delays.append(hb.deadline("a") - clock.now)  # type: ignore[operator]
            hb.forget("a")
        await mon._mark_down(["b"])  # noqa: SLF001
        assert delays[-1] > delays[0] and max(delays) <= 30.0
        assert [line for line in log.lines if line[0] == "warning"] == [("warning", "could not mark node down; retrying with backoff")]
        clock.now += RETRY_LOG_EVERY
        hb.forget("a")
        await mon._mark_down(["a"])  # noqa: SLF001
        assert len([line for line in log.lines if line[0] == "warning"]) == 2
        raft.fail = None
        hb.forget("a")
        await mon._mark_down(["a"])  # noqa: SLF001
        assert ("info", "marking nodes down works again") in log.lines and mon._failures == 0  # noqa: SLF001

    asyncio.run(scenario())


def test_a_node_that_beats_while_its_mark_down_waits_is_left_up() -> None:
    mon, hb, _, raft, _, _ = _monitor(a=NODE_READY)
    hb.grant(["a"], CFG)
    asyncio.run(mon._mark_down(["a"]))  # noqa: SLF001
    assert raft.proposed == []


# -- configuration ---------------------------------------------------------------------------
BASE = """
node_id = "s1"
data_dir = "d"
raft_password = "0123456789abcdef0123"
[[server]]
id = "s1"
rpc_addr = "127.0.0.1:14647"
raft_addr = "127.0.0.1:14648"
"""


def test_the_heartbeat_settings_default_to_nomads_and_parse() -> None:
    default = ServerConfig.loads(BASE).scheduler
    assert default == SchedulerConfig()
    assert (default.min_heartbeat_ttl, default.max_heartbeats_per_second, default.heartbeat_grace,
            default.failover_heartbeat_ttl) == (10.0, 50.0, 10.0, 300.0)
    cfg = ServerConfig.loads(BASE + '[scheduler]\nmin_heartbeat_ttl = "2s"\nmax_heartbeats_per_second = 12.5\n'
                             'failover_heartbeat_ttl = "30s"\nheartbeat_grace = "1s"\n').scheduler
    assert (cfg.min_heartbeat_ttl, cfg.max_heartbeats_per_second, cfg.failover_heartbeat_ttl, cfg.heartbeat_grace) == (2, 12.5, 30, 1)


@pytest.mark.parametrize(("setting", "message"), [
    ('heartbeat_ttl = "10s"', "scheduler.heartbeat_ttl is now min_heartbeat_ttl"),
    ("max_heartbeats_per_second = 0", "scheduler.max_heartbeats_per_second must be a positive number"),
    ('max_heartbeats_per_second = "50"', "scheduler.max_heartbeats_per_second must be a positive number"),
    ("max_heartbeats_per_second = nan", "scheduler.max_heartbeats_per_second must be a positive number"),
    ('failover_heartbeat_ttl = "0s"', "scheduler.failover_heartbeat_ttl must be positive"),
    ('min_heartbeat_ttl = 10', "scheduler.min_heartbeat_ttl must be a duration string"),
])
def test_bad_heartbeat_settings_are_one_line_errors(setting: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        ServerConfig.loads(BASE + f"[scheduler]\n{setting}\n")
    assert message in str(err.value) and "\n" not in str(err.value)


# -- the simulated client's side ---------------------------------------------------------------
def test_the_client_never_sends_more_ids_than_the_server_takes() -> None:
    assert fleet.MAX_HEARTBEAT_IDS == MAX_HEARTBEAT_IDS


@given(ttl=st.floats(0.01, 1e5))
def test_a_chunk_beats_again_well_inside_its_ttl(ttl: float) -> None:
    wait = fleet.next_beat(ttl)
    assert 0 < wait < ttl or ttl <= 0.05
    if ttl >= 2:
        assert ttl - wait >= min(fleet.BEAT_MARGIN, 0.3 * ttl) - 1e-9


def test_a_fleet_beating_at_its_granted_ttls_stays_under_max_heartbeats_per_second() -> None:
    rng = random.Random(11)
    for nodes in (10_000, 50_000):
        rate = sum(1 / fleet.next_beat(granted_ttl(nodes, 10.0, 50.0, rng)) for _ in range(20_000)) / 20_000 * nodes
        assert 45 <= rate <= 50.5, (nodes, rate)


def test_topology_is_round_robin_over_clusters_then_racks() -> None:
    places = [fleet.topology(i, 10, 4) for i in range(80)]
    assert places[0] == ("c0", "c0-r0") and places[9] == ("c9", "c9-r0") and places[10] == ("c0", "c0-r1")
    assert len(set(places)) == 40 and all(rack.startswith(f"{cluster}-r") for cluster, rack in places)
    assert fleet.topology(5, 0, 0) == ("", "")
    node = fleet.SimNode("id", "n", "c1", "c1-r2")
    attrs = node.register_args(fleet.SimConfig(servers=["x:1"]))["node"]["Attributes"]
    assert attrs["meta.cluster"] == "c1" and attrs["meta.rack"] == "c1-r2"


def test_chunks_cover_every_node_once_within_the_batch_size() -> None:
    nodes = {f"n{i}": fleet.SimNode(f"n{i}", f"n{i}") for i in range(1234)}
    f = fleet.Fleet(fleet.SimConfig(servers=["x:1"], heartbeat_batch=500), None, nodes,  # type: ignore[arg-type]
                    error=lambda *a: None, say=lambda m: None)
    assert [len(c.ids) for c in f.chunks] == [500, 500, 234]
    assert [i for c in f.chunks for i in c.ids] == list(nodes)



class GatedRaft(Raft):
    """Holds each proposal until ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def propose(self, body: Any, rid: str | None = None, **lane: Any) -> dict[str, Any]:
        self.waiting += 1
        await self.gate.wait()
        return await super().propose(body, rid, **lane)


def test_the_broker_hands_out_no_eval_while_nodes_are_being_marked_down() -> None:
    cfg = replace(CFG, min_heartbeat_ttl=0.2, failover_heartbeat_ttl=0.01, heartbeat_grace=0.01)
    hb = Heartbeats(time.monotonic, random.Random(5))
    raft, broker = GatedRaft(), EvalBroker()
    nodes = {"a": NodeView(NODE_READY, NODE_ELIGIBLE, False)}
    mon = HeartbeatMonitor(State(), raft, hb, nodes, config=cfg, is_leader=lambda: True,
                           max_entry_bytes=48 * 1024, log=Log(), deliveries=broker)

    async def scenario() -> None:
        broker.enqueue(Evaluation(id="e1", job_id="j", status="pending"))
        task = asyncio.create_task(mon.run())
        try:
            await wait_until_async(lambda: raft.waiting, 10, "the mark-down proposed")
            assert broker.try_dequeue() is None  # held while the mark-down is in flight
            raft.gate.set()
            await wait_until_async(lambda: raft.proposed and not mon.marking, 10, "the mark-down committed")
            got = broker.try_dequeue()
            assert got is not None and got[0].id == "e1"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert broker.stats.holds == 1 and broker.held_for() is None


def test_nodes_whose_mark_down_failed_are_retried_together_in_one_pass() -> None:
    views = {f"n{i}": NODE_READY for i in range(40)}
    mon, hb, clock, raft, _, _ = _monitor(**views)
    raft.fail = RPCError(TIMEOUT, "the write did not commit in time")
    asyncio.run(mon._mark_down(sorted(views)))  # noqa: SLF001 - one attempt
    assert len({hb.deadline(n) for n in views}) == 1  # one pass, so one batch, when they come due
    raft.fail = None
    clock.now = hb.deadline("n0") + 0.01  # type: ignore[operator]
    assert sorted(mon.expired(clock.now)) == sorted(views)


def test_the_failover_hold_counts_from_the_election_not_from_a_slow_start() -> None:
    """A new leader's first read of a large state takes seconds: the nodes' grace does not grow by them."""
    mon, hb, clock, _, log, _ = _monitor(a=NODE_READY)
    clock.now += 20  # the lifecycle read its state for 20 s before the monitor ran

    async def scenario() -> None:
        task = asyncio.create_task(mon.run())
        try:
            await wait_until_async(lambda: ("info", "heartbeat monitor started") in log.lines, 10, "the monitor started")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert hb.deadline("a") == pytest.approx(1000 + 300 + 10)


def test_a_pass_reads_its_next_share_while_the_last_one_commits_and_commits_them_in_order() -> None:
    """A new leader's mass expiry: four shares' reads and commits overlap, not run one after another."""
    events: list[str] = []
    gates: list[asyncio.Event] = []

    class HeldRaft(Raft):
        async def propose(self, body: Any, rid: str | None = None, **_lane: Any) -> dict[str, Any]:
            share = len(gates)
            events.append(f"propose {share}")
            gates.append(asyncio.Event())
            await gates[share].wait()
            events.append(f"commit {share}")
            return await super().propose(body, rid)

    class CountedState(State):
        async def local(self, fn: Any) -> Any:
            events.append("read")
            return await super().local(fn)

    views = {f"n{i:04d}": NODE_READY for i in range(3 * NODES_PER_BATCH)}
    mon, _, _, raft, _, _ = _monitor(**views)
    mon.raft = HeldRaft()
    mon.state = CountedState()
    todo = sorted(views)

    async def scenario() -> None:
        task = asyncio.create_task(mon._mark_shares(todo))  # noqa: SLF001 - the overlap is the point
        for share in range(3):
            await wait_until_async(lambda s=share: len(gates) > s, 5, f"share {share} proposed")
            if share < 2:  # the next share is read while this one is still uncommitted
                await wait_until_async(lambda s=share: events.count("read") > s + 1, 5, f"share {share + 1} read")
            assert len(gates) == share + 1  # but not proposed before this one committed
            gates[share].set()
        await task

    asyncio.run(scenario())
    reads = [i for i, e in enumerate(events) if e == "read"]
    for share in range(3):
        if share:
            assert events.index(f"commit {share - 1}") < events.index(f"propose {share}")  # in order
            assert reads[share] < events.index(f"commit {share - 1}")  # read while the last one committed
    assert sum(len(body.node_ids) for body in mon.raft.proposed) == len(todo)


class _TimedState(State):
    """Records when each share is read (real monotonic time)."""

    def __init__(self) -> None:
        self.reads: list[float] = []

    async def local(self, fn: Any) -> Any:
        self.reads.append(time.monotonic())
        return await super().local(fn)


class _TimedRaft(Raft):
    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    async def propose(self, body: Any, rid: str | None = None, **lane: Any) -> dict[str, Any]:
        self.at.append(time.monotonic())
        return await super().propose(body, rid, **lane)


def _read_ahead_monitor(**views: str) -> tuple[HeartbeatMonitor, Heartbeats, _TimedState, _TimedRaft]:
    hb = Heartbeats(time.monotonic, random.Random(5))
    state, raft = _TimedState(), _TimedRaft()
    nodes = {n: NodeView(status, NODE_ELIGIBLE, False) for n, status in views.items()}
    mon = HeartbeatMonitor(state, raft, hb, nodes, config=CFG, is_leader=lambda: True,
                           max_entry_bytes=48 * 1024, log=Log())
    return mon, hb, state, raft


def test_nodes_due_together_are_read_ahead_and_go_down_at_their_deadline_not_a_read_later() -> None:
    """A new leader's failover hold lets a whole silent fleet go at one instant: a pass takes those
    nodes ``read_ahead`` early, reads their entries, and proposes the first one at the deadline."""
    views = {f"n{i:04d}": NODE_READY for i in range(2 * NODES_PER_BATCH)}
    mon, hb, state, raft = _read_ahead_monitor(**views)
    deadline = time.monotonic() + READ_AHEAD * 0.8
    for node_id in views:
        hb.set(node_id, deadline)
    taken = mon.expired(time.monotonic(), mon.read_ahead)
    assert sorted(taken) == sorted(views)
    mon.marking.update(taken)
    asyncio.run(mon._mark_down(taken))  # noqa: SLF001 - the pass's mark-down, without the loop around it
    assert state.reads[0] < deadline <= raft.at[0]  # read before the deadline, proposed once it passed
    assert sorted(n for body in raft.proposed for n in body.node_ids) == sorted(views)


def test_a_node_that_beats_before_its_deadline_is_read_out_of_its_share_and_left_up() -> None:
    mon, hb, state, raft = _read_ahead_monitor(a=NODE_READY, b=NODE_READY, c=NODE_READY)
    deadline = time.monotonic() + READ_AHEAD * 0.8
    for node_id in "abc":
        hb.set(node_id, deadline)
    taken = mon.expired(time.monotonic(), mon.read_ahead)
    mon.marking.update(taken)

    async def scenario() -> None:
        task = asyncio.create_task(mon._mark_down(taken))  # noqa: SLF001
        await wait_until_async(lambda: state.reads, 5, "the share read")
        hb.grant(["b"], CFG)  # b's client beats while its share waits for the deadline
        await task

    asyncio.run(scenario())
    assert len(state.reads) == 2  # read again without b
    assert [body.node_ids for body in raft.proposed] == [["a", "c"]]
    assert hb.deadline("b") is not None and "b" not in mon.marking


def test_a_pass_takes_a_node_only_within_a_tenth_of_the_shortest_ttl_of_its_deadline() -> None:
    """So a client that beats on time (well inside its TTL) is never taken ahead of its deadline."""
    short = replace(CFG, min_heartbeat_ttl=0.2, heartbeat_grace=0.0)
    mon, hb, _, _, _, _ = _monitor(short, a=NODE_READY)
    assert mon.read_ahead == pytest.approx(0.02)
    hb.grant(["a"], short)
    granted = hb.deadline("a")
    assert granted is not None
    assert mon.expired(granted - 0.03, mon.read_ahead) == []
    assert mon.expired(granted - 0.01, mon.read_ahead) == ["a"]


def test_a_failed_mark_down_does_not_re_arm_a_node_that_beat_meanwhile() -> None:
    """Its retry deadline would replace the one its heartbeat gave it, and could mark a live node down."""
    mon, hb, _, raft, _, _ = _monitor(a=NODE_READY, b=NODE_READY)
    raft.fail = RPCError(TIMEOUT, "the write did not commit in time")

    class BeatingState(State):
        async def local(self, fn: Any) -> Any:
            hb.grant(["b"], CFG)  # b's client beats while the pass reads
            return await super().local(fn)

    mon.state = BeatingState()
    asyncio.run(mon._mark_shares(["a", "b"]))  # noqa: SLF001 - one attempt
    granted = hb.deadline("b")
    assert granted == pytest.approx(mon.clock() + 10.0 + CFG.heartbeat_grace, abs=10.0)  # its own TTL, not a retry's
    assert hb.deadline("a") is not None and hb.deadline("a") < granted  # a is retried soon
