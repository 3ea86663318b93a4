"""The leader's node views keep what the drainer and heartbeat monitor used to scan every node for.

Issue #36: at 30,000 nodes the drainer's ``any(view.drain ...)`` on every
wake and the monitor's sweep of every node every 5 s each cost the leader
several percent of its CPU. ``NodeViews`` keeps the draining nodes and the
changed ones as views are written; the monitor settles only what changed.
These properties hold the incremental answers to a fresh scan and to the
full sweep, for any sequence of changes.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.structs import NODE_DOWN, NODE_ELIGIBLE, NODE_INELIGIBLE, NODE_READY
from node.core.config import SchedulerConfig
from node.core.heartbeats import Heartbeats, base_ttl
from node.leader.drainer import Drainer
from node.leader.heartbeat import FULL_SWEEP_INTERVAL, HeartbeatMonitor
from node.leader.nodeviews import NodeViews
from node.leader.shims import NodeView
from node.wire.errors import TIMEOUT, RPCError
from tests.node.monitor_fakes import Clock, Log, Raft, State

# A short failover hold, so deadlines come due within a few ticks.
CFG = SchedulerConfig(min_heartbeat_ttl=10.0, max_heartbeats_per_second=50.0, heartbeat_grace=10.0, failover_heartbeat_ttl=5.0)
# At this rate the TTL grows with every node, so the deadline a pass gives depends on how many it counts.
STEEP = replace(CFG, max_heartbeats_per_second=0.5)

IDS = [f"n{i}" for i in range(8)]
STATUSES = [NODE_READY, NODE_DOWN, "initializing"]


def _monitor(cfg: SchedulerConfig, views: dict[str, NodeView]) -> tuple[HeartbeatMonitor, Heartbeats, Clock, Raft]:
    clock = Clock()
    hb = Heartbeats(clock, random.Random(5))
    raft = Raft()
    mon = HeartbeatMonitor(State(), raft, hb, NodeViews(views), config=cfg, is_leader=lambda: True,
                           max_entry_bytes=48 * 1024, log=Log(), clock=clock)
    mon._rng = random.Random(7)  # retries' jitter, so an example replays the same
    return mon, hb, clock, raft


def full_sweep(deadlines: dict[str, float], views: dict[str, NodeView], marking: set[str], now: float,
               cfg: SchedulerConfig) -> dict[str, float]:
    """What a sweep of every node leaves, written out plainly (the monitor's sweep before issue #36).

    Down and gone nodes lose their deadline; each live node that has none
    and is not being marked gets the longest TTL plus grace for the nodes
    with a deadline, those given one counted. (The old sweep counted them
    one at a time, in the views' order; at ``CFG``'s rate and this many
    nodes the TTL is the minimum either way, so it is the old sweep exactly.)
    """
    kept = {n: d for n, d in deadlines.items() if n in views and views[n].status != NODE_DOWN}
    missing = [n for n, v in views.items() if v.status != NODE_DOWN and n not in marking and n not in kept]
    count = len(kept) + len(missing)
    until = now + 2 * base_ttl(count, cfg.min_heartbeat_ttl, cfg.max_heartbeats_per_second) + cfg.heartbeat_grace
    return kept | {n: until for n in missing}


def _table(hb: Heartbeats) -> dict[str, float]:
    return {n: hb.deadline(n) for n in hb}  # type: ignore[misc]


def _scan_draining(views: NodeViews) -> set[str]:
    return {n for n, v in views.items() if v.drain}


# -- the mapping ---------------------------------------------------------------------------------
views_st = st.builds(NodeView, st.sampled_from(STATUSES), st.sampled_from([NODE_ELIGIBLE, NODE_INELIGIBLE]), st.booleans())
mapping_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(IDS), views_st),
        st.tuples(st.just("pop"), st.sampled_from(IDS)),
        st.tuples(st.just("del"), st.sampled_from(IDS)),
        st.tuples(st.just("update"), st.dictionaries(st.sampled_from(IDS), views_st, max_size=4)),
        st.tuples(st.just("setdefault"), st.sampled_from(IDS), views_st),
        st.tuples(st.just("clear")),
        st.tuples(st.just("take")),
    ),
    max_size=40,
)


@given(ops=mapping_ops)
def test_node_views_act_as_a_dict_and_keep_the_draining_and_changed_nodes(ops: list[tuple[Any, ...]]) -> None:
    views, plain = NodeViews(), {}
    changed: set[str] = set()  # what take_changed owes: added, status changed, removed

    def write(node_id: str, view: NodeView) -> None:
        before = plain.get(node_id)
        if before is None or before.status != view.status:
            changed.add(node_id)
        plain[node_id] = view

    for op, *args in ops:
        if op == "set":
            write(*args)
            views[args[0]] = args[1]
        elif op in ("pop", "del"):
            if args[0] in plain:
                changed.add(args[0])
            if op == "pop":
                assert views.pop(args[0], None) == plain.pop(args[0], None)
            elif args[0] in plain:
                del plain[args[0]]
                del views[args[0]]
            else:
                with pytest.raises(KeyError):
                    del views[args[0]]
        elif op == "update":
            for node_id, view in args[0].items():
                write(node_id, view)
            views.update(args[0])
        elif op == "setdefault":
            if args[0] not in plain:
                write(*args)
            assert views.setdefault(*args) == plain[args[0]]
        elif op == "clear":
            changed |= set(plain)
            plain.clear()
            views.clear()
        else:
            assert views.take_changed() == changed
            changed = set()
        assert dict(views) == plain and len(views) == len(plain) and list(views) == list(plain)
        assert set(views.draining) == _scan_draining(views)
    assert views.take_changed() == changed
    assert views.take_changed() == set()


def test_a_plain_mapping_is_copied_once_and_a_node_views_is_shared() -> None:
    shared = NodeViews({"a": NodeView(NODE_READY, NODE_ELIGIBLE, True)})
    assert NodeViews.of(shared) is shared
    copied = NodeViews.of({"a": NodeView(NODE_READY, NODE_ELIGIBLE, True)})
    assert isinstance(copied, NodeViews) and set(copied.draining) == {"a"}


def test_a_view_cannot_change_behind_the_mapping() -> None:
    view = NodeView(NODE_READY, NODE_ELIGIBLE, False)
    with pytest.raises(AttributeError):
        view.drain = True  # type: ignore[misc]


# -- the drainer ---------------------------------------------------------------------------------
def test_the_drainer_asks_the_kept_set_and_sees_drains_start_and_end() -> None:
    nodes = NodeViews({f"n{i}": NodeView(NODE_READY, NODE_ELIGIBLE, False) for i in range(1000)})
    drainer = Drainer(State(), Raft(), nodes, log=Log())  # type: ignore[arg-type]
    assert not drainer.draining()
    nodes["n999"] = NodeView(NODE_READY, NODE_INELIGIBLE, True)
    assert drainer.draining()
    nodes["n999"] = NodeView(NODE_READY, NODE_INELIGIBLE, False)
    assert not drainer.draining()
    nodes["n5"] = NodeView(NODE_READY, NODE_INELIGIBLE, True)
    nodes.pop("n5")
    assert not drainer.draining()


# -- the heartbeat monitor -----------------------------------------------------------------------
monitor_ops = st.lists(
    st.one_of(
        st.tuples(st.just("view"), st.sampled_from(IDS), views_st),  # added, status, drain, eligibility
        st.tuples(st.just("remove"), st.sampled_from(IDS)),
        st.tuples(st.just("rebuild"), st.dictionaries(st.sampled_from(IDS), views_st, max_size=6)),
        st.tuples(st.just("beat"), st.lists(st.sampled_from(IDS), min_size=1, max_size=3)),
        st.tuples(st.just("forget_down"), st.sampled_from(IDS)),  # node.status down: the endpoint forgets
        st.tuples(st.just("tick"), st.one_of(st.sampled_from([0.5, 11.0, 31.0]), st.floats(0, 40))),  # deadlines: 20-40 s
        st.tuples(st.just("expire"), st.booleans()),  # a pass; True: its expired nodes are being marked
        st.tuples(st.just("mark_in"), st.sampled_from(IDS)),
        st.tuples(st.just("mark_out"), st.booleans()),  # the oldest mark-down ends: committed, or failed
        st.tuples(st.just("settle")),
    ),
    min_size=10,
    max_size=50,
)


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.sampled_from(IDS), views_st, max_size=8),
    ops=monitor_ops,
    steep=st.booleans(),
)
def test_an_incremental_pass_leaves_the_deadlines_a_full_sweep_would(
    initial: dict[str, NodeView], ops: list[tuple[Any, ...]], steep: bool
) -> None:
    """For any changes to the views, beats, expiries and mark-downs (committed, failed, or a node
    revived meanwhile), a pass that settles only what changed leaves the table a full sweep would,
    and the draining set is always a fresh scan's."""
    cfg = STEEP if steep else CFG
    mon, hb, clock, raft = _monitor(cfg, initial)
    mon.full_sweep_every = math.inf  # the safety net would hide a miss
    nodes = mon.nodes
    mon.start_term(clock.now)
    pending: list[list[str]] = []  # mark-downs in flight, oldest first

    def check_pass() -> None:
        expected = full_sweep(_table(hb), dict(nodes), set(mon.marking), clock.now, cfg)
        mon.settle(clock.now)
        assert _table(hb) == expected

    async def scenario() -> None:
        for op, *args in ops:
            if op == "view":
                nodes[args[0]] = args[1]
            elif op == "remove":
                nodes.pop(args[0], None)
            elif op == "rebuild":  # the lifecycle's _restore: filled in place
                nodes.clear()
                nodes.update(args[0])
            elif op == "beat":  # the endpoints grant TTLs to the live nodes they know
                live = [n for n in args[0] if n in nodes and nodes[n].status != NODE_DOWN]
                if live:
                    hb.grant(live, cfg)
            elif op == "forget_down":
                if args[0] in nodes and nodes[args[0]].status == NODE_DOWN:
                    hb.forget(args[0])
            elif op == "tick":
                clock.now += args[0]
            elif op == "expire":  # one loop pass of run(); or a caller that marks nothing
                expired = mon.expired(clock.now)
                if args[0] and expired:
                    mon.marking.update(expired)
                    pending.append(expired)
            elif op == "mark_in":
                if args[0] in nodes and args[0] not in mon.marking:
                    mon.marking.add(args[0])
                    hb.forget(args[0])  # as a due node leaves the table
                    pending.append([args[0]])
            elif op == "mark_out":
                if pending:
                    # The committed entry changes no view here: the journal (a later "view") does,
                    # and a node may be revived before or after; a failed one is re-armed for a retry.
                    raft.fail = None if args[0] else RPCError(TIMEOUT, "the write did not commit in time")
                    await mon._mark_down(pending.pop(0))
            else:
                check_pass()
            assert set(nodes.draining) == _scan_draining(nodes)
        while pending:  # every mark-down ends
            raft.fail = None
            await mon._mark_down(pending.pop(0))
        check_pass()

    asyncio.run(scenario())


def test_a_node_revived_while_its_mark_down_ran_gets_a_deadline_once_the_mark_down_ends() -> None:
    mon, hb, clock, _ = _monitor(CFG, {"a": NodeView(NODE_READY, NODE_ELIGIBLE, False)})
    mon.full_sweep_every = math.inf
    mon.start_term(clock.now)
    clock.now += 31
    assert mon.expired(clock.now) == ["a"]
    mon.marking.add("a")
    mon.nodes["a"] = NodeView(NODE_DOWN, NODE_ELIGIBLE, False)  # the mark-down committed
    mon.nodes["a"] = NodeView(NODE_READY, NODE_ELIGIBLE, False)  # revived through the log, no beat
    mon.settle(clock.now)
    assert hb.deadline("a") is None  # still being marked: left alone
    asyncio.run(mon._mark_down(["a"]))  # ends (it has no deadline, so it is proposed down again)
    mon.settle(clock.now)
    assert hb.deadline("a") == pytest.approx(clock.now + 2 * 10 + 10)


def test_a_node_found_due_but_not_marked_down_gets_a_deadline_on_the_next_pass() -> None:
    mon, hb, clock, _ = _monitor(CFG, {"a": NodeView(NODE_READY, NODE_ELIGIBLE, False)})
    mon.full_sweep_every = math.inf
    mon.start_term(clock.now)
    clock.now += 31
    assert mon.expired(clock.now) == ["a"] and hb.deadline("a") is None  # the caller marks nothing
    clock.now += 1
    assert mon.expired(clock.now) == []
    assert hb.deadline("a") == pytest.approx(clock.now + 2 * 10 + 10)


def test_a_pass_looks_only_at_what_changed_and_the_full_sweep_is_a_rare_safety_net() -> None:
    views = {f"n{i}": NodeView(NODE_READY, NODE_ELIGIBLE, False) for i in range(1000)}
    mon, hb, clock, _ = _monitor(CFG, views)
    mon.start_term(clock.now)
    mon.settle(clock.now)  # the term's first pass settles the views it was handed
    looked: list[str] = []
    swept: list[float] = []
    settle, sweep = mon._settle, mon.sweep

    def counting(node_ids: Any, now: float) -> None:
        node_ids = list(node_ids)
        looked.extend(node_ids)
        settle(node_ids, now)

    def sweeping(now: float) -> None:
        swept.append(now)
        sweep(now)

    mon._settle, mon.sweep = counting, sweeping  # type: ignore[method-assign]
    clock.now += 1
    mon.nodes["n7"] = NodeView(NODE_DOWN, NODE_ELIGIBLE, False)
    assert mon.expired(clock.now) == []
    assert looked == ["n7"] and hb.deadline("n7") is None
    looked.clear()
    assert mon.expired(clock.now) == [] and looked == []  # nothing changed: nothing looked at
    # An endpoint granted a ghost a deadline (a node removed meanwhile): no view change shows it,
    # so it waits for the safety net, which looks at every node once FULL_SWEEP_INTERVAL has passed.
    hb.set("ghost", clock.now + 1000)
    clock.now += FULL_SWEEP_INTERVAL - 1 - 0.01
    mon.expired(clock.now)
    assert hb.deadline("ghost") is not None and looked == [] and swept == []
    clock.now += 0.02
    mon.expired(clock.now)
    assert hb.deadline("ghost") is None and swept == [clock.now]
    assert {n for n in views if hb.deadline(n) is not None} == set(views) - {"n7"}
