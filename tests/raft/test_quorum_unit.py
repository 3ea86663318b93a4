"""Check-quorum's lease (raft/quorum.py) and the transport's keep-alives (raft/transport.py), without a cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pysyncobj.tcp_connection import CONNECTION_STATE

from raft.quorum import LeaderLease, majority
from raft.transport import KEEPALIVE, KEEPALIVE_PERIOD, CaravanTransport


def ticking(lease: LeaderLease, start: float, end: float, step: float = 0.02) -> float:
    """Tick the lease every ``step`` from ``start`` to ``end``; returns the last tick time."""
    t = start
    while t < end:
        lease.tick(t)
        t = round(t + step, 6)
    lease.tick(end)
    return end


def test_majority() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_a_leader_that_hears_no_majority_for_a_lease_loses_its_quorum() -> None:
    lease = LeaderLease(lease=0.5)
    lease.start(100.0)
    peers = ["b", "c"]
    assert not lease.lost_quorum(peers, 100.4)  # a new term gets a full lease
    ticking(lease, 100.0, 100.6)
    assert lease.lost_quorum(peers, 100.6)
    lease.heard("c", 100.6)
    assert not lease.lost_quorum(peers, 100.6)  # itself and c: two of three
    ticking(lease, 100.6, 101.2)
    assert lease.lost_quorum(peers, 101.2)


def test_five_voters_need_two_peers() -> None:
    lease = LeaderLease(lease=0.5)
    lease.start(0.0)
    ticking(lease, 0.0, 1.0)
    peers = ["b", "c", "d", "e"]
    lease.heard("b", 0.9)
    assert lease.lost_quorum(peers, 1.0)  # two of five
    lease.heard("c", 0.95)
    assert not lease.lost_quorum(peers, 1.0)  # three of five


def test_a_leader_that_did_not_run_restarts_the_count() -> None:
    """A tick gap (the leader's own stall) is not the followers' silence: it cannot have read them."""
    lease = LeaderLease(lease=0.5)
    lease.start(0.0)
    lease.heard("b", 0.1)
    lease.tick(0.1)
    lease.tick(2.0)  # the tick thread stalled for 1.9 s
    assert not lease.lost_quorum(["b", "c"], 2.0)
    ticking(lease, 2.0, 2.6)
    assert lease.lost_quorum(["b", "c"], 2.6)  # a full lease of running without replies


class FakeConn:
    def __init__(self, state: int = CONNECTION_STATE.CONNECTED, sent: float = 0.0) -> None:
        self.state = state
        self.caravan_sent = sent
        self.messages: list[Any] = []

    def send(self, message: Any) -> None:
        self.messages.append(message)
        self.caravan_sent = 99.0


def test_keepalives_go_only_to_silent_connected_peers_and_are_dropped_on_receipt() -> None:
    transport = CaravanTransport.__new__(CaravanTransport)  # no sockets: the methods alone
    silent, busy, down, reader = (
        FakeConn(),
        FakeConn(sent=10.0),
        FakeConn(CONNECTION_STATE.DISCONNECTED),
        FakeConn(),
    )
    transport._connections = {"a": silent, "b": busy, "c": down, "readonly": reader}
    handshaking = FakeConn()  # TCP is up, the key exchange is not done: nothing may go out
    transport._connections["d"] = handshaking
    transport._nodes = {"a", "b", "c", "d"}
    transport.keepalives_sent = 0
    transport._syncObj = SimpleNamespace(isNodeConnected=lambda node: node != "d")
    transport.send_keepalives(10.0 + KEEPALIVE_PERIOD / 2)
    assert silent.messages == [{"type": KEEPALIVE}]
    assert busy.messages == down.messages == reader.messages == handshaking.messages == []

    delivered: list[Any] = []
    transport._onMessageReceivedCallback = lambda node, message: delivered.append(message)
    transport._syncObj = object()  # no caravan_on_message hook
    transport._onMessageReceived("a", {"type": KEEPALIVE})
    transport._onMessageReceived("a", {"type": "append_entries"})
    assert delivered == [{"type": "append_entries"}]


def test_a_voter_just_added_gets_a_full_lease_and_a_removed_one_is_forgotten() -> None:
    lease = LeaderLease(lease=0.5)
    lease.start(0.0)
    lease.heard("b", 0.0)
    lease.tick(0.0)
    lease.track(["b"], 0.0)
    ticking(lease, 0.0, 0.4)
    lease.heard("b", 0.4)
    lease.track(["b", "c", "d"], 0.4)  # two voters added at once: four need a quorum of three
    assert set(lease.contact) == {"b", "c", "d"}
    assert not lease.lost_quorum(["b", "c", "d"], 0.8)
    ticking(lease, 0.4, 1.0)
    lease.heard("b", 1.0)
    assert lease.lost_quorum(["b", "c", "d"], 1.0)  # c and d never answered
    lease.track(["b"], 1.0)
    assert set(lease.contact) == {"b"} and not lease.lost_quorum(["b"], 1.0)
