"""Live membership in the raft adapter: the member table rides the log, the dump and members.json."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from pysyncobj.node import Node, TCPNode

from raft import RaftConfig, RaftNode
from raft.members import (
    Member,
    MemberState,
    decode_cluster,
    encode_cluster,
    join_proof,
    load_state,
    member_of_request,
    proof_ok,
)
from raft.membership import Membership
from tests.raft.cluster import free_ports, wait_for
from tests.raft.conftest import MemTarget


def test_dump_cluster_set_round_trips_the_member_table() -> None:
    members = [Member("s1", "127.0.0.1:1", "127.0.0.1:11"), Member("s2", "127.0.0.1:2", "127.0.0.1:12")]
    encoded = encode_cluster(members)
    assert all(type(n) is Node for n in encoded)
    nodes, decoded = decode_cluster(encoded, {})
    assert nodes == {TCPNode("127.0.0.1:1"), TCPNode("127.0.0.1:2")}
    assert sorted(decoded, key=lambda m: m.node_id) == members
    # A dump from before member tables: bare raft addresses, ids and RPC taken from what is known.
    nodes, decoded = decode_cluster({TCPNode("127.0.0.1:1")}, {"127.0.0.1:1": members[0]})
    assert decoded == [members[0]]


def test_membership_request_carries_id_and_rpc_and_plain_pysyncobj_ones_still_parse() -> None:
    m = Member("s4", "127.0.0.1:4", "127.0.0.1:14")
    assert member_of_request(["add", m.raft_addr, TCPNode(m.raft_addr), {"id": "s4", "rpc": "127.0.0.1:14"}]) == m
    assert member_of_request(["rem", "127.0.0.1:5", TCPNode("127.0.0.1:5")]) == Member("127.0.0.1:5", "127.0.0.1:5", "")


def test_join_proof_needs_the_password() -> None:
    m = Member("s4", "127.0.0.1:4", "127.0.0.1:14")
    proof = join_proof("secret-password-1", m)
    assert proof_ok("secret-password-1", m, proof)
    assert not proof_ok("another-password", m, proof)
    assert not proof_ok("secret-password-1", Member("s5", m.raft_addr, m.rpc_addr), proof)


@pytest.fixture
def dynamic(tmp_path: Path) -> Iterator[Any]:
    """In-process dynamic-membership nodes; destroyed at teardown."""
    made: list[RaftNode] = []

    def make(name: str, addr: str, members: list[Member], **kw: Any) -> RaftNode:
        cfg = RaftConfig(
            self_address=addr,
            peers=[m.raft_addr for m in members],
            data_dir=tmp_path / name,
            password="pw",
            dynamic_membership=True,
            bootstrap_members=tuple(members),
            cluster_id="c1",
            **kw,
        )
        node = RaftNode(cfg, MemTarget())
        made.append(node)
        return node

    yield make
    for n in made:
        n.destroy()


def _leader(nodes: list[RaftNode]) -> RaftNode:
    return wait_for(lambda: next((n for n in nodes if n.is_leader and n.status()["leader_ready"]), None), 15, "a leader")


def test_add_replicates_the_member_and_a_removed_node_stops_campaigning(dynamic: Any, tmp_path: Path) -> None:
    ports = free_ports(3)
    boot = [Member(f"s{i}", f"127.0.0.1:{p}", f"127.0.0.1:{p + 1}") for i, p in enumerate(ports[:2])]
    a, b = dynamic("a", boot[0].raft_addr, boot), dynamic("b", boot[1].raft_addr, boot)
    leader = _leader([a, b])
    leader.submit_sync(b"one")
    newcomer = Member("s9", f"127.0.0.1:{ports[2]}", "127.0.0.1:9999")
    # The newcomer starts from the leader's answer: every voter, itself included.
    c = dynamic("c", newcomer.raft_addr, [*boot, newcomer], await_leader=True)
    leader.add_member(newcomer, timeout=10)
    for n in (a, b, c):
        wait_for(lambda n=n: newcomer in n.members(), 10, "the new member everywhere")
    _, index = leader.submit_sync(b"two")
    wait_for(lambda: c.status()["applied_index"] >= index, 10, "the newcomer to catch up")
    assert set(load_state(tmp_path / "a").members) == set(a.members())  # members.json follows the log
    # Remove a follower. pysyncobj's leader stops sending to it as it appends the removal, so it
    # usually never sees the entry: it campaigns once it times out (if it still has a connection),
    # or it knows it is out and stays quiet. Whichever, the members ignore it: over several of its
    # election timeouts of writes, the leader keeps leading in the same term.
    follower = next(n for n in (a, b, c) if n is not leader and n is not c)
    gone = next(m for m in leader.members() if m.raft_addr == follower.self_address)
    term = leader.status()["term"]
    leader.remove_member(gone, timeout=10)
    until = time.monotonic() + 4 * 1.2  # four of the removed node's longest election timeouts
    i = 0
    while time.monotonic() < until:
        leader.submit_sync(f"after-{i}".encode())
        assert leader.is_leader and leader.status()["term"] == term
        i += 1
    # The leader's notice (node/core/membership.py sends it over RPC): it stops campaigning.
    follower.mark_removed()
    wait_for(lambda: not follower.is_member, 10, "the removed node to take the notice")
    assert follower.leader_address is None
    settled = follower.status()["term"]
    leader.submit_sync(b"later")
    assert follower.status()["term"] == settled and follower.status()["role"] != "leader"


def test_a_restart_uses_members_json_not_the_config(dynamic: Any, tmp_path: Path) -> None:
    port = free_ports(1)[0]
    me = Member("s1", f"127.0.0.1:{port}", "127.0.0.1:1")
    node = dynamic("solo", me.raft_addr, [me])
    _leader([node])
    node.destroy()
    # A config that now lists a peer that never joined: ignored, the stored membership wins.
    ghost = Member("ghost", "127.0.0.1:2", "127.0.0.1:3")
    again = dynamic("solo", me.raft_addr, [me, ghost])
    assert again.members() == [me]
    _leader([again])
    assert load_state(tmp_path / "solo").cluster_id == "c1"


def test_a_snapshot_without_this_server_does_not_remove_it(tmp_path: Path) -> None:
    """A joiner's first snapshot predates the entry that adds it: it must not read it as its removal."""
    me, a, b = (Member(f"s{i}", f"127.0.0.1:{700 + i}", f"127.0.0.1:{800 + i}") for i in range(3))
    config = RaftConfig(
        self_address=me.raft_addr, peers=[a.raft_addr], data_dir=tmp_path, password="pw",
        dynamic_membership=True, bootstrap_members=(me, a), cluster_id="c1",
    )
    table = Membership.__new__(Membership)  # the mixin alone: no SyncObj, no sockets
    table.log = structlog.get_logger("test")
    table.setup_membership(config, MemberState(members=[me, a], cluster_id="c1", bootstrap_size=2))
    load = table.member_deserializer(lambda _name: ("data", ("prev",), encode_cluster([a, b])))
    _, _, nodes = load("dump")
    assert table.is_member, "a dump lacking this server must not remove it"
    assert {m.raft_addr for m in table.member_list()} == {me.raft_addr, a.raft_addr, b.raft_addr}
    assert nodes == {TCPNode(a.raft_addr), TCPNode(b.raft_addr)}
    assert set(load_state(tmp_path).members) == {me, a, b}
