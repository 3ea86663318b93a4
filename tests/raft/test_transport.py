"""The raft link's frames (raft/transport.py) and follower commit deferral
(raft/node.py): cheaper than pysyncobj's, and still what a stock peer reads."""

from __future__ import annotations

import pickle
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raft import RaftConfig, RaftNode
from raft.auth import LinkAuthenticator
from raft.transport import CaravanConnection, zlib_stored
from tests.raft.cluster import free_ports, wait_for
from tests.raft.conftest import MemTarget


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000) | st.integers(0, 3).map(lambda k: b"\x9c" * (0xFFFF * k + k)))
def test_stored_zlib_stream_is_what_zlib_decompresses(data: bytes) -> None:
    """Including empty data and sizes on the 65,535-byte block boundary."""
    stream = zlib_stored(data)
    assert zlib.decompress(stream) == data
    assert len(stream) <= len(data) + 6 + 5 * (len(data) // 0xFFFF + 1)


class _Poller:
    """Just enough of pysyncobj's poller for a connection on a socketpair."""

    def subscribe(self, *args: Any) -> None:
        pass

    def unsubscribe(self, *args: Any) -> None:
        pass


def test_a_frame_is_what_a_stock_pysyncobj_peer_decodes() -> None:
    """Stock TcpConnection reads: length, auth tag, zlib.decompress, pickle.loads."""
    auth = LinkAuthenticator("pw")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        conn = CaravanConnection(poller=_Poller(), socket=ours)
        conn.encryptor = auth
        conn.sendRandKey = b"rand-key"
        message = {"type": "append_entries", "entries": [(b"\x00\xff" * 500, 7, 2)], "term": 2}
        conn.send(message)
        raw = theirs.recv(1 << 20)
    (length,) = struct.unpack("i", raw[:4])
    assert length == len(raw) - 4
    body = auth.decrypt(raw[4:])  # raises on a bad tag
    assert pickle.loads(zlib.decompress(body)) == (b"rand-key", message)
    # Binary entries stay binary: protocol 2 would have stored them as text, ~1.5x.
    assert length < 1000 + 200


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[Any]:
    """Factory for three raft nodes in this process, torn down at the end."""
    made: list[RaftNode] = []

    def make(**kw: Any) -> tuple[list[RaftNode], list[Any]]:
        addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
        targets = [_CommitTracking() for _ in addrs]
        for i, addr in enumerate(addrs):
            cfg = RaftConfig(
                self_address=addr, peers=addrs, data_dir=tmp_path / f"n{i}", password="pw", **kw
            )
            made.append(RaftNode(cfg, targets[i]))
        nodes = made[-3:]
        wait_for(lambda: any(n.status()["leader_ready"] for n in nodes), 15, "a leader")
        return nodes, targets

    yield make
    for n in made:
        n.destroy()


class _CommitTracking(MemTarget):
    """Remembers the applied index each commit made durable."""

    def __init__(self) -> None:
        super().__init__()
        self.committed = 0

    def commit(self) -> None:
        super().commit()
        self.committed = self._applied


def _leader(nodes: list[RaftNode]) -> RaftNode:
    return next(n for n in nodes if n.is_leader)


def test_every_raft_connection_uses_the_cheap_frames(trio: Any) -> None:
    nodes, targets = trio()
    _, index = _leader(nodes).submit_sync(b"x" * 100)
    wait_for(lambda: all(t.applied_index >= index for t in targets), 10, "replication")
    for n in nodes:
        conns = list(n._obj._SyncObj__transport._connections.values())
        assert len(conns) == 2  # outgoing and accepted alike
        assert all(type(c) is CaravanConnection for c in conns)


def test_followers_commit_a_last_write_without_more_traffic(trio: Any) -> None:
    """A follower commits what it applied in the same tick: nothing waits for later traffic."""
    nodes, targets = trio()
    leader = _leader(nodes)
    followers = [t for n, t in zip(nodes, targets, strict=True) if n is not leader]
    _, last = leader.submit_sync(b"x")
    wait_for(lambda: all(t.committed >= last for t in followers), 10, "followers to commit")


def _dial(source: str | None, listen_host: str) -> tuple[str, str]:
    """A CaravanConnection with source host ``source`` dials a listener on ``listen_host``.

    Returns (the connection's own local IP, the IP the listener saw it come from).
    """
    with socket.socket() as server:
        server.bind((listen_host, 0))
        server.listen()
        conn = CaravanConnection(poller=_Poller())
        conn.caravan_source_host = source
        assert conn.connect(*server.getsockname())
        server.settimeout(5)
        accepted, (peer_ip, _) = server.accept()
        with accepted:
            local_ip = conn._TcpConnection__socket.getsockname()[0]  # type: ignore[attr-defined]
            conn.disconnect()
    return local_ip, peer_ip


def test_an_outgoing_raft_connection_leaves_from_the_bind_host() -> None:
    """The source bind: a peer sees the dialer's configured raft host, not the route's default."""
    assert _dial("127.0.0.7", "127.0.0.9") == ("127.0.0.7", "127.0.0.7")
    # without a source host the kernel's route picks it (on Linux loopback: 127.0.0.1)
    local_ip, peer_ip = _dial(None, "127.0.0.9")
    assert local_ip == peer_ip != "127.0.0.7"


def test_the_source_host_is_the_bind_hosts_unless_it_is_a_wildcard() -> None:
    from raft.transport import source_host

    assert source_host("127.0.2.3:4648") == "127.0.2.3"
    assert source_host("0.0.0.0:4648") is None
    assert source_host("[::]:4648") is None
    assert source_host(None) is None and source_host("") is None
    assert source_host("localhost:4648") == "127.0.0.1"
