"""Owned cuts: two faults held at once neither replace nor heal each other's cut links.

Real sockets through ``LinkProxies`` (a dial leaves from the dialer's bind
host, as a server's raft dials do), and the two network nemeses on a stub
testbed around real proxies.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from jepsen_like.nemesis import Partition, SnapshotLag
from jepsen_like.proxy import LinkProxies
from tests.jepsen.sockets import connect, echo_server

#: the three servers' bind hosts (their raft dials leave from these)
SOURCE = {"x": "127.0.2.221", "y": "127.0.2.222", "z": "127.0.2.223"}


def _open(address: str, source: str) -> bool:
    """One round trip from ``source`` through the proxy at ``address``: True if it got through."""
    with connect(address, source) as sock:
        try:
            sock.sendall(b"ping")
            return sock.recv(4) == b"ping"
        except (ConnectionResetError, BrokenPipeError):  # a cut link aborts (RST)
            return False


def _closed_by_proxy(sock: socket.socket) -> bool:
    """Whether a held connection was closed: waits (5 s deadline, the socket's timeout) for EOF or RST."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def proxied() -> Iterator[tuple[LinkProxies, str]]:
    """Proxies for x, y, z; x's forwards to an echo server. Yields (proxies, x's proxy address)."""
    server, x_bind = echo_server(SOURCE["x"])
    proxies = LinkProxies()
    try:
        x = proxies.add_server("x", "127.0.1.221:0", x_bind)
        proxies.add_server("y", "127.0.1.222:0", f"{SOURCE['y']}:1")
        proxies.add_server("z", "127.0.1.223:0", f"{SOURCE['z']}:1")
        assert _open(x, SOURCE["y"]) and _open(x, SOURCE["z"])
        yield proxies, x
    finally:
        proxies.close()
        server.close()


def test_two_owners_cuts_combine_and_each_heal_drops_only_its_own(
    proxied: tuple[LinkProxies, str],
) -> None:
    """A cuts x-y, B cuts x-z: both are cut; healing A opens x-y only; healing B opens the rest."""
    proxies, x = proxied
    y, z = SOURCE["y"], SOURCE["z"]
    assert proxies.cut([("x", "y")], owner="A") == [("x", "y")]
    assert not _open(x, y) and _open(x, z)
    held = connect(x, z)  # z's open connection: B's cut must close it
    held.sendall(b"z")
    assert held.recv(1) == b"z"

    assert proxies.cut([("z", "x")], owner="B") == [("x", "z")]
    assert _closed_by_proxy(held)
    held.close()
    assert proxies.cut_links() == [("x", "y"), ("x", "z")]
    assert proxies.cut_links("A") == [("x", "y")] and proxies.owners() == ["A", "B"]
    assert not _open(x, y), "B's cut replaced A's: x-y reopened"
    assert not _open(x, z)

    proxies.heal("A")
    assert proxies.cut_links() == [("x", "z")] and proxies.owners() == ["B"]
    assert _open(x, y)
    assert not _open(x, z), "healing A healed B's cut too"
    held = connect(x, y)  # opened while B still cuts x-z: healing B must not touch it
    held.sendall(b"y")
    assert held.recv(1) == b"y"

    proxies.heal("B")
    assert proxies.cut_links() == [] and proxies.owners() == []
    assert _open(x, y) and _open(x, z)
    held.sendall(b"k")
    assert held.recv(1) == b"k"  # still open: only newly cut pairs are closed
    held.close()


def test_a_pair_cut_by_two_owners_stays_cut_until_both_heal(proxied: tuple[LinkProxies, str]) -> None:
    """snapshot-lag isolates y while a partition splits x | y+z: x-y is cut by both; either heal alone leaves it cut."""
    proxies, x = proxied
    y, z = SOURCE["y"], SOURCE["z"]
    assert proxies.isolate("y", owner="snapshot-lag#1") == [("x", "y"), ("y", "z")]
    assert proxies.partition([["x"], ["y", "z"]], owner="partition#2") == [("x", "y"), ("x", "z")]
    assert proxies.cut_links() == [("x", "y"), ("x", "z"), ("y", "z")]
    assert not _open(x, y) and not _open(x, z)

    proxies.heal("partition#2")
    assert proxies.cut_links() == [("x", "y"), ("y", "z")]
    assert not _open(x, y), "the partition's heal reconnected snapshot-lag's isolated follower"
    assert _open(x, z)

    # in the other order too: cut again by the partition, healed first by snapshot-lag
    proxies.partition([["x"], ["y", "z"]], owner="partition#3")
    proxies.heal("snapshot-lag#1")
    assert proxies.cut_links() == [("x", "y"), ("x", "z")]
    assert not _open(x, y) and not _open(x, z)
    proxies.heal("partition#3")
    assert proxies.cut_links() == [] and _open(x, y) and _open(x, z)


def test_heal_all_drops_every_owners_cuts(proxied: tuple[LinkProxies, str]) -> None:
    """The run's final heal: every owner's cuts go at once."""
    proxies, x = proxied
    proxies.cut([("x", "y")], owner="A")
    proxies.isolate("x", owner="B")
    assert not _open(x, SOURCE["y"]) and not _open(x, SOURCE["z"])
    proxies.heal_all()
    assert proxies.cut_links() == [] and proxies.owners() == []
    assert _open(x, SOURCE["y"]) and _open(x, SOURCE["z"])


class _StubTestbed:
    """Just what Partition and SnapshotLag use, around real proxies (no servers: the status is canned)."""

    def __init__(self, proxies: LinkProxies, leader: str) -> None:
        self.proxies = proxies
        self._leader = leader
        self.cut_at_heal: list[list[tuple[str, str]]] = []
        self.first_index: dict[str, int] = {}  # a server's FirstLogIndex, if not 100

    @property
    def names(self) -> list[str]:
        return self.proxies.names

    def leader(self) -> str:
        return self._leader

    def wait_for_leader(self, timeout: float) -> str:
        return self._leader

    def status(self, name: str, timeout: float = 1.0) -> dict[str, Any]:
        return {
            "Role": "leader" if name == self._leader else "follower",
            "FirstLogIndex": self.first_index.get(name, 100),  # compacted past the follower
            "LastLogIndex": 5,
            "CommitIndex": 120,
            "AppliedIndex": 120,
            "SnapshotInstalls": 0,
        }

    def partition(self, groups: list[list[str]], owner: str) -> list[tuple[str, str]]:
        return self.proxies.partition(groups, owner)

    def heal_network(self, owner: str | None = None) -> None:
        if owner is None:
            self.proxies.heal_all()
        else:
            self.proxies.heal(owner)
        self.cut_at_heal.append(self.proxies.cut_links())


@pytest.fixture
def stub() -> Iterator[_StubTestbed]:
    proxies = LinkProxies()
    try:
        for k, name in enumerate(["x", "y", "z"], start=1):
            proxies.add_server(name, f"127.0.1.{230 + k}:0", f"127.0.2.{230 + k}:1")
        yield _StubTestbed(proxies, leader="x")
    finally:
        proxies.close()


def _pairs_of(name: str, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [p for p in pairs if name in p]


def test_a_partition_held_over_snapshot_lag_leaves_its_follower_isolated(stub: _StubTestbed) -> None:
    """snapshot-lag first, a partition on top, undone in reverse (as the nemesis does): the follower stays cut until snapshot-lag heals."""
    lag = SnapshotLag()
    lag_undo, [follower], _ = lag.inject(stub, random.Random(1))  # type: ignore[arg-type]
    isolated = sorted(tuple(sorted((follower, n))) for n in stub.names if n != follower)
    assert stub.proxies.cut_links() == isolated
    part_undo, _, _ = Partition().inject(stub, random.Random(2))  # type: ignore[arg-type]
    assert set(isolated) <= set(stub.proxies.cut_links())

    part_undo()
    assert stub.proxies.cut_links() == isolated, "the partition's heal reconnected the lagging follower"
    assert [o.split("#")[0] for o in stub.proxies.owners()] == ["snapshot-lag"]
    detail = lag_undo()
    assert stub.cut_at_heal[-1] == [] and stub.proxies.owners() == []
    assert "still cut off" not in detail and f"{follower} caught up" in detail, detail


def test_snapshot_lag_healed_under_a_partition_says_its_follower_is_still_cut(stub: _StubTestbed) -> None:
    """A partition isolating the follower is held across snapshot-lag's heal: that heal keeps the partition's cuts, and says so."""
    lag = SnapshotLag()
    lag_undo, [follower], _ = lag.inject(stub, random.Random(1))  # type: ignore[arg-type]
    owner = "partition#test"
    stub.partition([[follower], [n for n in stub.names if n != follower]], owner)
    detail = lag_undo()
    assert _pairs_of(follower, stub.proxies.cut_links()) == _pairs_of(follower, stub.proxies.cut_links(owner))
    assert stub.proxies.cut_links(owner) and stub.proxies.owners() == [owner]
    assert f"still cut by another fault: {owner} " in detail, detail
    stub.heal_network()  # the final heal
    assert stub.proxies.cut_links() == []


def test_snapshot_lag_does_not_wait_for_a_server_another_fault_cuts_from_the_leader(stub: _StubTestbed) -> None:
    """A partition isolating a third server (which cannot compact meanwhile) does not hold snapshot-lag's wait to its deadline."""
    lag = SnapshotLag()
    lag.compact_wait = 5.0
    lag_undo, [follower], _ = lag.inject(stub, random.Random(1))  # type: ignore[arg-type]
    third = next(n for n in stub.names if n not in (follower, "x"))
    stub.first_index[third] = 1  # cut from the leader: its log never compacts
    stub.partition([[third], [n for n in stub.names if n != third]], "partition#test")
    detail = lag_undo()
    assert "logs start at 100" in detail and f"not waited for: {third}" in detail, detail
    assert stub.proxies.owners() == ["partition#test"]
