"""The harness's cluster: one raft address per server behind its own proxy, and partitions that work."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jepsen_like.proxy import LinkProxies
from jepsen_like.testbed import Testbed
from jepsen_like.workloads import _job
from node.core.config import load_config
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient
from tests.jepsen.sockets import connect, echo_server


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def wait_for_new_leader(tb: Testbed, majority: list[str], old_term: int) -> str:
    def new_leader() -> str | None:
        for name in majority:
            st = tb.status(name)
            if st and st.get("Role") == "leader" and st["Term"] > old_term:
                return name
        return None

    return wait_until(new_leader, 30, "the majority to elect a new leader")


@pytest.fixture
def testbed_factory(tmp_path: Path) -> Iterator[Callable[..., Testbed]]:
    made: list[Testbed] = []

    def make(count: int = 3, **options: Any) -> Testbed:
        tb = Testbed.create(tmp_path / f"cluster{len(made)}", count, **options)
        made.append(tb)
        return tb

    yield make
    for tb in made:
        tb.teardown()


@pytest.mark.parametrize("count", [3, 5])
def test_every_server_knows_every_server_by_one_raft_address(testbed_factory: Callable[..., Testbed], count: int) -> None:
    """One raft identity per server in every config (what membership changes and snapshots carry);
    each server binds an address of its own, and its harness proxy listens at the identity."""
    tb = testbed_factory(count)
    identity = {n.id: n.raft_addr for n in tb.cluster.nodes}
    assert len(set(identity.values())) == count
    for k, node in enumerate(tb.cluster.nodes, start=1):
        config = load_config(node.config_file)
        assert config.raft_addr == identity[node.id] and identity[node.id].startswith(f"127.0.1.{k}:")
        assert {s.id: s.raft_addr for s in config.servers} == identity  # the same in every config
        rpc = {s.id: s.rpc_addr for s in config.servers}
        assert rpc == {n.id: n.rpc_addr for n in tb.cluster.nodes}  # RPC addresses agree everywhere
        # it listens (and dials from) its own bind address; its proxy holds the identity
        assert config.raft_bind == tb.raft_binds[node.id] and config.raft_bind.startswith(f"127.0.2.{k}:")
        host, port = config.raft_addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5):
            pass  # the proxy accepts (and refuses it: 127.0.0.1 is no server's address)
    assert tb.proxies is not None and tb.proxies.names == sorted(identity)


def _roundtrip(address: str, source: str = "127.0.0.1") -> bytes:
    with connect(address, source) as sock:
        try:
            sock.sendall(b"ping")
            return sock.recv(4)
        except ConnectionResetError:  # a cut link aborts (RST), like a rejecting firewall
            return b""


def test_proxies_cut_pairs_by_the_dialers_source_address() -> None:
    """Server a's proxy forwards b's and c's dials; cutting a-b closes b's connection and refuses b only."""
    server, a_bind = echo_server("127.0.2.201")
    proxies = LinkProxies()
    try:
        a = proxies.add_server("a", "127.0.1.201:0", a_bind)
        proxies.add_server("b", "127.0.1.202:0", "127.0.2.202:1")
        proxies.add_server("c", "127.0.1.203:0", "127.0.2.203:1")
        b, c = "127.0.2.202", "127.0.2.203"  # the dialers' bind hosts
        assert _roundtrip(a, b) == b"ping" and _roundtrip(a, c) == b"ping"
        assert _roundtrip(a, "127.0.0.1") == b""  # no server's address: refused
        held = connect(a, b)
        held.sendall(b"x")
        assert held.recv(1) == b"x"
        assert proxies.partition([["a", "c"], ["b"]]) == [("a", "b"), ("b", "c")]
        held.settimeout(5)
        try:
            assert held.recv(1) == b""  # the open connection was cut
        except ConnectionResetError:
            pass
        held.close()
        assert _roundtrip(a, b) == b""  # and new ones from b are refused
        assert _roundtrip(a, c) == b"ping"  # c's pair with a is not cut
        assert proxies.isolate("a") == [("a", "b"), ("a", "c")]
        assert _roundtrip(a, c) == b""
        proxies.heal()
        assert proxies.cut_links() == []
        assert _roundtrip(a, b) == b"ping" and _roundtrip(a, c) == b"ping"
        stats = proxies.stats()
        assert stats["b->a"]["refused"] >= 1 and stats["c->a"]["refused"] >= 1
        assert stats["unknown->a"]["refused"] == 1
        proxies.remove_server("c")  # retired: its proxy goes, and so does its address
        assert proxies.names == ["a", "b"] and _roundtrip(a, c) == b""
    finally:
        proxies.close()
        server.close()


@pytest.mark.cluster
def test_isolated_leader_is_replaced_and_rejoins(testbed_factory: Callable[..., Testbed]) -> None:
    tb = testbed_factory(3)
    tb.start_all()
    old = tb.wait_for_leader(30)
    old_term = tb.status(old)["Term"]  # type: ignore[index]
    majority = [n for n in tb.names if n != old]
    assert tb.partition([[old], majority]) == sorted(tuple(sorted((old, n))) for n in majority)

    leader = wait_for_new_leader(tb, majority, old_term)
    # its raft traffic stopped: the cut-off leader loses its quorum and steps down (check-quorum)
    wait_until(lambda: (tb.status(old) or {}).get("Role") != "leader", 15, "the isolated leader to step down")
    stats = tb.proxies.stats()  # type: ignore[union-attr]
    assert any(stats.get(f"{a}->{b}", {}).get("refused") for a, b in [(old, n) for n in majority] + [(n, old) for n in majority])
    job = _job("p1", {})
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        index = client.call("job.register", {"job": job})["Index"]
    assert (tb.digest(old) or {}).get("index", 0) < index  # the isolated server cannot have it
    tb.heal_network()

    def converged() -> bool:
        digests = [tb.digest(n) for n in tb.names]
        if not all(digests):
            return False
        return len({(d["digest"], d["index"]) for d in digests}) == 1 and digests[0]["index"] >= index  # type: ignore[index]

    wait_until(converged, 30, "the healed server to catch up")
    with RPCClient([tb.node(old).rpc_addr], timeout=15) as client:
        try:
            assert client.call("job.get", {"job_id": "p1", "stale": True})["data"]["ID"] == "p1"
        except RPCError as exc:  # pragma: no cover - message for the failure report
            raise AssertionError(f"healed server does not have the write: {exc}") from None


@pytest.mark.cluster
def test_writes_on_a_cut_off_leader_are_answered_and_land_exactly_once(testbed_factory: Callable[..., Testbed]) -> None:
    """Writes in flight on a cut-off leader are answered at once and land exactly once.

    The leader steps down when it loses its quorum (check-quorum) and answers
    its uncommitted writes with ``unknown_outcome`` at once: the next leader may
    still commit an entry it replicated before the cut. A client that resends
    on an unknown outcome (writes carry a request id the cluster deduplicates)
    sends each write on to the new leader, where it is applied exactly once.
    Before check-quorum the writes waited for the heal, however long it took.
    """
    tb = testbed_factory(3)
    tb.start_all()
    old = tb.wait_for_leader(30)
    old_term = tb.status(old)["Term"]  # type: ignore[index]
    majority = [n for n in tb.names if n != old]
    addresses = [tb.node(n).rpc_addr for n in [old, *majority]]
    results: dict[str, Any] = {}

    def register(job_id: str) -> None:
        job = _job(job_id, {})
        try:
            with RPCClient(addresses, timeout=40) as client:
                results[job_id] = client.call("job.register", {"job": job})
        except RPCError as exc:
            results[job_id] = exc

    def last_log_index() -> int:
        return int((tb.status(old) or {}).get("LastLogIndex", 0))

    tb.partition([[old], majority])
    threads = []
    for job_id in ("cut-1", "cut-2"):  # two entries in flight on the cut-off leader
        before = last_log_index()
        threads.append(threading.Thread(target=register, args=(job_id,), daemon=True))
        threads[-1].start()
        wait_until(lambda b=before: last_log_index() > b, 5, f"the cut-off leader to append {job_id}")

    leader = wait_for_new_leader(tb, majority, old_term)
    tb.heal_network()
    for t in threads:
        t.join(45)
    assert {k: v for k, v in results.items() if isinstance(v, RPCError)} == {}
    assert set(results) == {"cut-1", "cut-2"}
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        for job_id in results:
            assert client.call("job.get", {"job_id": job_id})["data"]["Version"] == 0  # applied once


@pytest.mark.cluster
def test_a_cut_off_leader_caught_up_by_snapshot_never_acknowledges_its_dropped_tail(
    testbed_factory: Callable[..., Testbed],
) -> None:
    """An ex-leader's uncommitted tail is never applied while a snapshot brings it up to date.

    Found by a fault campaign (seeds 132 and 135: partition + snapshot-lag):
    an acknowledged job registration was missing from every server. The
    cut-off leader appended it; the new leader had compacted past that
    index, so it sent a snapshot. pysyncobj advances a follower's commit
    index to ``min(leader commit, own log end)`` on every append_entries
    message, snapshot chunks included; the ex-leader's log end was its own
    unproven tail, so it applied those entries, answered their writers
    "ok" and served reads from them, until the snapshot replaced its state.
    """
    tb = testbed_factory(3, compaction_entries=50)
    tb.start_all()
    old = tb.wait_for_leader(30)
    with RPCClient([tb.node(old).rpc_addr], timeout=15) as client:
        for k in range(120):  # state of about 1 MB: the snapshot goes out in many chunks
            client.call("job.register", {"job": _job(f"state-{k}", {"pad": "p" * 2000})})

        def scheduler_idle() -> bool:
            # The leader's own writes (eval updates) in flight would hold the test's writes in its queue.
            evals = client.call("eval.list", {})["data"]
            st = tb.status(old) or {}
            return all(e["Status"] == "complete" for e in evals) and st.get("CommitIndex") == st.get("LastLogIndex")

        wait_until(scheduler_idle, 30, "the scheduler to finish the state jobs' evaluations")
    assert tb.wait_for_leader(30) == old
    old_term = tb.status(old)["Term"]  # type: ignore[index]
    majority = [n for n in tb.names if n != old]
    results: dict[str, Any] = {}

    def register(job_id: str) -> None:
        job = _job(job_id, {})
        try:  # the cut-off leader only: a resend elsewhere would hide what it answers
            with RPCClient([tb.node(old).rpc_addr], timeout=40) as client:
                results[job_id] = client.call("job.register", {"job": job}, idempotent=False)
        except RPCError as exc:
            results[job_id] = exc

    def last_log_index(name: str) -> int:
        return int((tb.status(name) or {}).get("LastLogIndex", 0))

    tb.partition([[old], majority])
    before = last_log_index(old)
    threads = [threading.Thread(target=register, args=(job_id,), daemon=True) for job_id in ("tail-1", "tail-2")]
    for t in threads:
        t.start()
    # Both writes may go into one Batch entry (leader-side coalescing).
    wait_until(lambda: last_log_index(old) > before, 10, "the cut-off leader to append the writes")
    tail_end = last_log_index(old)

    leader = wait_for_new_leader(tb, majority, old_term)
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        filler = 0
        while min(int((tb.status(n) or {}).get("FirstLogIndex", 0)) for n in majority) <= tail_end + 5:
            client.call("job.register", {"job": _job(f"fill-{filler}", {})})
            filler += 1
            assert filler < 2000, "the majority never compacted its log past the cut-off leader's tail"
    installs = int(tb.status(old)["SnapshotInstalls"])  # type: ignore[index]
    tb.heal_network()
    wait_until(lambda: int((tb.status(old) or {}).get("SnapshotInstalls", 0)) > installs, 30,
               "the ex-leader to be caught up by a snapshot")
    for t in threads:
        t.join(45)
    assert set(results) == {"tail-1", "tail-2"}
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        for job_id, result in results.items():
            if isinstance(result, RPCError):
                continue  # an honest failure or unknown outcome
            try:
                client.call("job.get", {"job_id": job_id})
            except RPCError as exc:
                raise AssertionError(f"{job_id} was acknowledged ({result}) but is not on the leader: {exc}") from None


@pytest.mark.cluster
def test_a_server_added_mid_run_is_behind_its_own_proxy(testbed_factory: Callable[..., Testbed]) -> None:
    """The member nemesis's replace: the new server gets a proxy before it joins, the retired one loses
    its proxy, and partitions then cut the new member like any other."""
    tb = testbed_factory(3)
    tb.start_all()
    leader = tb.wait_for_leader(30)
    gone = next(n for n in tb.names if n != leader)
    tb.kill(gone)
    tb.remove_member(gone)
    tb.retire(gone)
    new = tb.add_server(in_place_of=gone)
    assert tb.proxies is not None and tb.proxies.names == sorted(tb.names)
    assert tb.node(new).raft_addr.startswith(f"127.0.1.{new.removeprefix('server')}:")
    assert load_config(tb.node(new).config_file).raft_bind == tb.raft_binds[new]
    rest = [n for n in tb.names if n != new]
    assert tb.partition([[new], rest]) == sorted(tuple(sorted((new, n))) for n in rest)
    leader = tb.wait_for_leader(30)
    assert leader != new
    with RPCClient([tb.node(leader).rpc_addr], timeout=15) as client:
        index = client.call("job.register", {"job": _job("behind-proxy", {})})["Index"]
    time.sleep(1.0)
    assert (tb.digest(new) or {}).get("index", 0) < index  # cut off: it cannot have it
    assert any(v["refused"] for k, v in tb.proxies.stats().items() if new in k and "unknown" not in k)
    tb.heal_network()
    wait_until(lambda: (tb.digest(new) or {}).get("index", 0) >= index, 30, "the new server to catch up")


def test_a_servers_own_listen_addresses_are_its_bind_not_its_proxied_identity(
    testbed_factory: Callable[..., Testbed],
) -> None:
    """What ``health.diagnose`` probes when a server did not come back: its proxy always holds the identity."""
    tb = testbed_factory(3)
    for name in tb.names:
        node = tb.node(name)
        assert tb.listen_addresses(name) == [node.rpc_addr, tb.raft_binds[name], node.http_address]
        assert node.raft_addr not in tb.listen_addresses(name)
