"""Heartbeats on a real three-server cluster: a leader election marks no live node down, and
a dead client's nodes go down after their granted TTL plus grace, not after the failover TTL.

The cluster grants short TTLs (1-2 s, grace 2 s) and a long failover TTL
(40 s), so the two cases are far apart: a node that goes down within
seconds of its client's death was not waiting out a failover window, and
nodes whose client is silent for longer than any TTL + grace across an
election stay up only because the new leader gave them the failover TTL.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from node import devcluster as cl
from node.wire.rpc_client import RPCClient
from tests.lifecycle.conftest import Env, Sim, cluster_env, wait_until

MIN_TTL, GRACE, FAILOVER = 1.0, 2.0, 40.0
HEARTBEAT_CONFIG = f"""
[scheduler]
min_heartbeat_ttl = "{MIN_TTL:g}s"
heartbeat_grace = "{GRACE:g}s"
failover_heartbeat_ttl = "{FAILOVER:g}s"
"""
LONGEST_DEADLINE = 2 * MIN_TTL + GRACE  # the latest a node that beat just now can be marked down (small cluster)


@pytest.fixture
def hb_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A cluster of its own, with short TTLs and a long failover TTL."""
    yield from cluster_env(tmp_path_factory, "heartbeats", HEARTBEAT_CONFIG)


def _nodes(env: Env, sim: Sim) -> dict[str, dict[str, Any]]:
    return {n["ID"]: n for n in env.read("node.list", {"stale": True}) if n["ID"] in sim.nodes}


def _heartbeat_calls(sim: Sim) -> int:
    """The sim's answered heartbeat calls, from its latest status line."""
    found = re.findall(r"heartbeat_calls=(\d+)", sim.output())
    return int(found[-1]) if found else 0


def _leader_seconds(addresses: list[str]) -> float:
    with RPCClient(addresses, timeout=5) as c:
        return float(c.call("scheduler.stats", {})["LeaderSeconds"])


def test_a_leader_election_with_live_clients_marks_no_node_down(hb_env: Env) -> None:
    env = hb_env
    sim = env.start_sim(200, "live", "--heartbeat-batch", "50", "--status-interval", "0.3")
    before = wait_until(lambda: (nodes := _nodes(env, sim)) and len(nodes) == 200
                        and all(n["Status"] == "ready" for n in nodes.values()) and nodes, 30, "200 ready nodes")
    leader = cl.wait_for_leader(env.addresses)["NodeID"]
    # The client stalls across the election (as clients do while they look for the new
    # leader) for longer than any TTL + grace: only the failover TTL keeps its nodes up.
    sim.proc.send_signal(signal.SIGSTOP)
    try:
        cl.kill(env.cluster, leader)
        alive = [n.rpc_addr for n in env.cluster.nodes if n.id != leader]
        assert cl.wait_for_leader(alive)["NodeID"] != leader
        wait_until(lambda: _leader_seconds(alive) > LONGEST_DEADLINE + 2, 60,
                   "the new leader to lead longer than any granted TTL + grace")
        calls = _heartbeat_calls(sim)
    finally:
        sim.proc.send_signal(signal.SIGCONT)
    # Every chunk (4 of 50 nodes) heartbeats the new leader a few times.
    wait_until(lambda: _heartbeat_calls(sim) >= calls + 4 * 3, 60, "the client heartbeating the new leader")
    after = _nodes(env, sim)
    down = [i for i, n in after.items() if n["Status"] != "ready"]
    changed = [i for i in after if after[i]["ModifyIndex"] != before[i]["ModifyIndex"]]
    assert not down and not changed, f"{len(down)} node(s) not ready, {len(changed)} changed status across the election"
    assert sim.proc.poll() is None, sim.output()


def test_a_dead_clients_nodes_go_down_after_their_ttl_and_grace_not_the_failover_ttl(hb_env: Env) -> None:
    env = hb_env
    term = cl.wait_for_leader(env.addresses)["Term"]
    sim = env.start_sim(20, "dead", "--heartbeat-batch", "10")
    wait_until(lambda: (nodes := _nodes(env, sim)) and all(n["Status"] == "ready" for n in nodes.values()), 30, "ready nodes")
    killed = time.monotonic()
    sim.kill()
    wait_until(lambda: all(n["Status"] == "down" for n in _nodes(env, sim).values()), FAILOVER / 2,
               "the dead client's nodes marked down")
    took = time.monotonic() - killed
    assert cl.wait_for_leader(env.addresses)["Term"] == term, "an election happened: this test needs one term"
    # A node beat at most a second before the kill, and its deadline was at least the grace after that beat.
    assert GRACE - 1.0 <= took <= LONGEST_DEADLINE + 3.0, f"marked down {took:.1f}s after its client died"
    events = [e for e in env.read("node.list", {"stale": True}) if e["ID"] in sim.nodes]
    assert all(e["StatusDescription"] == "node heartbeat missed" for e in events), events[:2]
