"""The drain nemesis ends its drain through a server cut off from the others."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from jepsen_like import nemesis
from jepsen_like.testbed import Testbed
from node.wire.rpc_client import RPCClient
from tests.conditions import wait_until


@pytest.fixture
def testbed(tmp_path: Path) -> Iterator[Testbed]:
    tb = Testbed.create(tmp_path / "cluster", 3)
    try:
        yield tb
    finally:
        tb.teardown()


@pytest.mark.cluster
def test_a_drain_is_ended_when_the_first_server_the_harness_asks_has_no_leader(testbed: Testbed) -> None:
    """Campaign 601:3, seed 603: a drain's undo ran while snapshot-lag cut off server1.

    The harness asks the servers in order, server1 first. Cut off, server1
    holds each write for 5 s waiting for a leader before it answers
    no_leader; the undo's calls gave up after 5 s each, so they never reached
    the other two, which had a leader all along, and the drain stayed on.
    """
    tb = testbed
    tb.start_all()
    leader = tb.wait_for_leader(30)
    first = tb.names[0]
    assert tb.rpc_addresses[0] == tb.node(first).rpc_addr
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        client.call("node.register", {"node": {"ID": "drained-node", "Status": "ready"}})
        client.call("node.drain", {"node_id": "drained-node", "drain_spec": {"Deadline": 0}})
    majority = [n for n in tb.names if n != first]
    tb.partition([[first], majority])

    def cut_off_and_leaderless() -> bool:
        mine = tb.status(first) or {}
        others = [tb.status(n) or {} for n in majority]
        return not mine.get("Leader") and any(st.get("Role") == "leader" for st in others)

    wait_until(cut_off_and_leaderless, 30, f"{first} to lose its leader and the others to have one")

    nemesis._end_drain(tb, "drained-node", timeout=nemesis.DRAIN_WAIT)

    new_leader = next(n for n in majority if (tb.status(n) or {}).get("Role") == "leader")
    with RPCClient([tb.node(new_leader).rpc_addr], timeout=15) as client:
        node = client.call("node.get", {"node_id": "drained-node"})["data"]
    assert not node.get("Drain") and node["SchedulingEligibility"] == "eligible"


@pytest.mark.cluster
def test_a_drain_is_started_and_ended_while_the_first_server_is_paused(testbed: Testbed) -> None:
    """Campaign 601:3, seed 601: the drain nemesis could not start a drain while server1 was paused.

    A paused server accepts a connection and never answers; its stale
    ``node.list`` took the call's whole 5 s. The harness now asks running
    servers first.
    """
    tb = testbed
    tb.start_all()
    leader = tb.wait_for_leader(30)
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        client.call("node.register", {"node": {"ID": "drained-node", "Status": "ready"}})
    first = tb.names[0]
    others = [n for n in tb.names if n != first]
    tb.pause(first)
    wait_until(lambda: any((tb.status(n) or {}).get("Role") == "leader" for n in others), 30, "a leader among the running servers")

    undo, targets, what = nemesis.Drain().inject(tb, random.Random(0))
    assert targets == ["node drained-"] and what.startswith("drain node drained-"), what
    assert "no answer" not in what, what
    said = undo()
    assert said.startswith("drain complete"), said

    new_leader = next(n for n in others if (tb.status(n) or {}).get("Role") == "leader")
    with RPCClient([tb.node(new_leader).rpc_addr], timeout=15) as client:
        node = client.call("node.get", {"node_id": "drained-node"})["data"]
    assert not node.get("Drain") and node["SchedulingEligibility"] == "eligible"
