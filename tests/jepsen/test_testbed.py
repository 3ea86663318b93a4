"""The harness's cluster: configs routed through per-link proxies, and partitions that work."""

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
def test_configs_follow_pysyncobj_dialing_rule(testbed_factory: Callable[..., Testbed], count: int) -> None:
    """Each pair has exactly one dialer (the greater address), which dials through the pair's proxy."""
    tb = testbed_factory(count)
    identity = {n.id: n.raft_addr for n in tb.cluster.nodes}
    proxies_seen: set[str] = set()
    for node in tb.cluster.nodes:
        config = load_config(node.config_file)
        assert config.raft_addr == identity[node.id]
        rpc = {s.id: s.rpc_addr for s in config.servers}
        assert rpc == {n.id: n.rpc_addr for n in tb.cluster.nodes}  # RPC addresses agree everywhere
        for peer in config.peers:
            mine, theirs = config.raft_addr, peer.raft_addr
            lower = identity[peer.id] < mine
            if lower:  # we dial it: through a proxy that still sorts below us
                assert theirs != identity[peer.id] and theirs < mine
                proxies_seen.add(theirs)
            else:  # it dials us and announces its identity, which we must know it by
                assert theirs == identity[peer.id] and theirs > mine
    assert len(proxies_seen) == count * (count - 1) // 2


def _echo_server() -> tuple[socket.socket, str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def echo(c: socket.socket = conn) -> None:
                with c:
                    while data := c.recv(4096):
                        c.sendall(data)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    host, port = server.getsockname()
    return server, f"{host}:{port}"


def _roundtrip(address: str) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(b"ping")
            return sock.recv(4)
        except ConnectionResetError:  # a cut link aborts (RST), like a rejecting firewall
            return b""


def test_proxy_cut_closes_connections_and_heal_restores() -> None:
    server, target = _echo_server()
    proxies = LinkProxies()
    try:
        via = proxies.add("b", "a", target)
        assert _roundtrip(via) == b"ping"
        host, port = via.rsplit(":", 1)
        held = socket.create_connection((host, int(port)), timeout=5)
        held.sendall(b"x")
        assert held.recv(1) == b"x"
        assert proxies.isolate("a") == [("a", "b")]
        held.settimeout(5)
        try:
            assert held.recv(1) == b""  # the open connection was cut
        except ConnectionResetError:
            pass
        assert _roundtrip(via) == b""  # and new ones are refused
        proxies.heal()
        assert _roundtrip(via) == b"ping"
        assert proxies.stats()["b->a"]["refused"] >= 1
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
    tb.partition([[old], majority])

    leader = wait_for_new_leader(tb, majority, old_term)
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
