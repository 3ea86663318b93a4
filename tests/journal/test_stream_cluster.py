"""event.stream against real 3-server clusters: etcd's six watch guarantees and the rest.

Each guarantee is checked on the leader and on followers, across kill -9 and
restarts, by comparing what subscribers received with the journal read
straight from each server's LMDB:

* ordered — batch indexes strictly increase;
* unique — no batch twice (same check, plus exact equality with the journal);
* reliable — no gap: every retained batch after the start index arrives;
* atomic — every batch arrives whole (equal to the stored batch);
* resumable — after a disconnect, and after the served server is killed and
  restarted, resubscribing with the last index loses and repeats nothing;
* bookmarkable — progress notifications say "all up to N delivered", and
  resubscribing from N is exact.

Every wait polls a condition against a generous deadline; no timing asserts
except that a blocking query returns well before its wait when data changes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node import devcluster as cl
from node.wire.errors import RPCError
from node.wire.events import FollowState, follow
from node.wire.framing import pack_frame, recv_frame, unpack_body
from node.wire.rpc_client import RPCClient
from tests.journal.support import read_journal, read_journal_raw

DEADLINE = 60.0
REPO = Path(__file__).resolve().parents[2]


# -- helpers ------------------------------------------------------------------------
def wait_for(cond: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def applied(address: str) -> int:
    st = cl.status_of(address)
    return st["AppliedIndex"] if st else -1


def role(address: str) -> str:
    st = cl.status_of(address)
    return st["Role"] if st else "down"


def leader_and_followers(c: cl.Cluster) -> tuple[cl.ClusterNode, list[cl.ClusterNode]]:
    leader_rpc = cl.wait_for_leader(c.rpc_addresses)["NodeID"]
    leader = c.node(leader_rpc)
    return leader, [n for n in c.nodes if n is not leader]


def state_dir(node: cl.ClusterNode) -> Path:
    return Path(node.data_dir) / "state"


class Writer:
    """Writes through any server: node registrations (one record) and jobs (two records)."""

    def __init__(self, c: cl.Cluster, prefix: str) -> None:
        self.client = RPCClient(c.rpc_addresses, timeout=30)
        self.prefix = prefix
        self.n = 0
        self.last_index = 0

    def write(self, count: int, *, job_every: int = 3, pad: int = 0) -> int:
        """``count`` writes; every ``job_every``-th a job, the others nodes (``pad`` bytes of attributes)."""
        for _ in range(count):
            self.n += 1
            name = f"{self.prefix}-{self.n}"
            if self.n % job_every == 0:
                out = self.client.call("job.register", {"job": {"ID": name, "Type": "batch",
                                                                "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}})
            else:
                attrs = {"pad": "x" * pad} if pad else {}
                # Down: the leader would mark a silent ready node down later (a write in some later test).
                node = {"ID": name, "Name": name, "Attributes": attrs, "Status": "down"}
                out = self.client.call("node.register", {"node": node})
            self.last_index = max(self.last_index, out["Index"])
        return self.last_index

    def close(self) -> None:
        self.client.close()


class Subscriber(threading.Thread):
    """Follows ``event.stream`` (via ``follow``) in a thread, keeping every item."""

    def __init__(self, addresses: list[str], index: int = 0, topics: list[str] | None = None) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.topics = topics
        self.state = FollowState(index=index)
        self.start_index = index
        self.items: list[dict[str, Any]] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for item in follow(self.addresses, topics=self.topics, heartbeat=0.2, give_up_after=DEADLINE, state=self.state):
                self.items.append(item)
                if self.stop_flag.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def reached(self, index: int) -> bool:
        assert self.error is None, f"subscriber failed: {self.error!r}"
        return self.state.index >= index

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(DEADLINE)
        assert not self.is_alive(), "subscriber did not stop"
        assert self.error is None, f"subscriber failed: {self.error!r}"

    def batches(self, upto: int) -> list[tuple[int, list[Any]]]:
        return [(i["index"], i["events"]) for i in self.items if "index" in i and i["index"] <= upto]


def assert_exact(got: list[tuple[int, list[Any]]], journal: dict[int, list[Any]], after: int, upto: int, who: str) -> None:
    indexes = [i for i, _ in got]
    assert indexes == sorted(set(indexes)), f"{who}: batches out of order or repeated"
    expected = [(i, journal[i]) for i in sorted(journal) if after < i <= upto]
    missing = sorted({i for i, _ in expected} - set(indexes))
    assert not missing, f"{who}: gap, missing batches {missing[:10]}"
    assert got == expected, f"{who}: a batch differs from the stored one (split or altered)"


# -- fixtures -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.Cluster]:
    c = cl.up(str(tmp_path_factory.mktemp("journal-cluster")), 3)
    try:
        yield c
    finally:
        cl.down(c)


@pytest.fixture(scope="module")
def small_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cl.Cluster]:
    c = cl.up(str(tmp_path_factory.mktemp("journal-small")), 3, extra_config="\n[journal]\nmax_batches = 8\n")
    try:
        yield c
    finally:
        cl.down(c)


def ensure_all_up(c: cl.Cluster) -> None:
    for node in c.nodes:
        if not cl.alive(node.pid):
            cl.restart(c, node.id)
    cl.wait_for_leader(c.rpc_addresses)


# -- tests ------------------------------------------------------------------------------
def test_six_guarantees_on_leader_and_followers_across_kill9_and_restarts(cluster: cl.Cluster) -> None:
    c = cluster
    leader, followers = leader_and_followers(c)
    writer = Writer(c, "g6")
    base = writer.write(3)
    # One subscriber pinned to each server (it resumes on that same server
    # after its restart), one that may move between servers.
    pinned = {n.id: Subscriber([n.rpc_addr], index=base) for n in c.nodes}
    roaming = Subscriber([followers[0].rpc_addr, *[n.rpc_addr for n in c.nodes if n is not followers[0]]], index=0)
    subs = [*pinned.values(), roaming]
    for sub in subs:
        sub.start()
    try:
        writer.write(30)
        cl.kill(c, followers[0].id)  # kill -9 a follower mid-stream
        writer.write(30)
        cl.restart(c, followers[0].id)
        writer.write(15)
        cl.kill(c, leader.id)  # kill -9 the leader mid-stream: a new one is elected
        cl.wait_for_leader([n.rpc_addr for n in c.nodes if n is not leader])
        writer.write(30)
        cl.restart(c, leader.id)
        final = writer.write(15)
        for sub in subs:
            wait_for(lambda sub=sub: sub.reached(final), f"subscriber to reach index {final}")
    finally:
        for sub in subs:
            sub.finish()
        writer.close()
    for node in c.nodes:
        journal = read_journal(state_dir(node))
        assert_exact(pinned[node.id].batches(final), journal, base, final, f"subscriber on {node.id}")
    assert_exact(roaming.batches(final), read_journal(state_dir(leader)), 0, final, "roaming subscriber")
    # Resumable: the subscribers of the two killed servers reconnected (to the same server).
    assert pinned[followers[0].id].state.reconnects >= 1 and pinned[leader.id].state.reconnects >= 1
    assert roaming.state.reconnects >= 1
    # Bookmarkable: idle moments produced progress notifications.
    assert all(any("progress" in i for i in sub.items) for sub in subs)
    # Atomic: multi-record batches (job + evaluation) were among them.
    assert any(len(ev) > 1 for _, ev in pinned[leader.id].batches(final))


def test_every_server_holds_a_byte_identical_journal(cluster: cl.Cluster) -> None:
    c = cluster
    ensure_all_up(c)
    writer = Writer(c, "same")
    final = writer.write(20)
    writer.close()
    wait_for(lambda: all(applied(n.rpc_addr) >= final for n in c.nodes), "every server to apply the writes")
    raw = {n.id: read_journal_raw(state_dir(n)) for n in c.nodes}
    first = raw[c.nodes[0].id]
    assert final in first
    for node_id, journal in raw.items():
        common = max(journal) if journal else 0
        assert {i: v for i, v in journal.items() if i <= final} == {i: v for i, v in first.items() if i <= final}, node_id
        assert common >= final
    # The same bytes through the stream of each server (encoding=msgpack passes them through).
    streamed = {}
    for node in c.nodes:
        items = []
        with RPCClient([node.rpc_addr]) as client:
            for item in client.stream("event.stream", {"index": 0, "encoding": "msgpack", "heartbeat": 1}):
                if "progress" in item and item["progress"] >= final:
                    break
                if "index" in item:
                    items.append((item["index"], item["raw"]))
        streamed[node.id] = [(i, v) for i, v in items if i <= final]
    assert streamed[c.nodes[0].id] == sorted((i, v) for i, v in first.items() if i <= final)
    assert len({tuple(v) for v in streamed.values()}) == 1

    def same_digest() -> bool:
        out = [RPCClient([n.rpc_addr]).call("debug.digest", {"stale": True}) for n in c.nodes]
        return len({(d["digest"], d["index"]) for d in out}) == 1

    wait_for(same_digest, "the three state digests (journal included) to agree")


def test_resume_after_disconnect_and_progress_bookmarks_on_a_follower(cluster: cl.Cluster) -> None:
    c = cluster
    ensure_all_up(c)
    _, followers = leader_and_followers(c)
    follower = followers[0].rpc_addr
    writer = Writer(c, "bm")
    start = writer.write(2)
    # A filter that matches nothing for now: only progress notifications come.
    progress = 0
    noise_index = writer.write(5, job_every=1000)
    with RPCClient([follower]) as client:
        for item in client.stream("event.stream", {"index": start, "topics": ["Job:bm-marker"], "heartbeat": 0.2}):
            assert "index" not in item, "a filtered-out batch was sent"
            progress = item["progress"]
            if progress >= noise_index:
                break  # disconnect, holding a bookmark
    # Everything the filter matched up to the bookmark was delivered (nothing did match).
    journal = read_journal(state_dir(c.node(follower)))
    assert not [i for i, b in journal.items() if start < i <= progress and any(r[2] == "bm-marker" for r in b)]
    marker = writer.client.call("job.register", {"job": {"ID": "bm-marker", "Type": "batch",
                                                        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}})["Index"]
    writer.write(3, job_every=1000)
    with RPCClient([follower]) as client:
        got = []
        for item in client.stream("event.stream", {"index": progress, "topics": ["Job:bm-marker"], "heartbeat": 0.2}):
            if "index" in item:
                got.append(item["index"])
            elif item["progress"] >= marker:
                end = item["progress"]
                break
    # Exactly the marker's batches after the bookmark (the scheduler may have
    # changed the job's status since: those batches count too).
    journal = read_journal(state_dir(c.node(follower)))
    expected = [i for i in sorted(journal) if progress < i <= end and any(r[0] == "Job" and r[2] == "bm-marker" for r in journal[i])]
    assert got == expected and got[0] == marker, "resuming from a bookmark must deliver exactly what came after it"
    # Resume after a plain disconnect mid-stream (unfiltered): the halves join exactly.
    with RPCClient([follower]) as client:
        first_half = []
        for item in client.stream("event.stream", {"index": start, "heartbeat": 0.2}):
            first_half.append((item["index"], item["events"]))
            if len(first_half) == 4:
                break
    last = first_half[-1][0]
    second_half = []
    with RPCClient([follower]) as client:
        for item in client.stream("event.stream", {"index": last, "heartbeat": 0.2}):
            if "progress" in item:
                break
            second_half.append((item["index"], item["events"]))
    upto = second_half[-1][0]
    assert_exact(first_half + second_half, read_journal(state_dir(c.node(follower))), start, upto, "resumed subscriber")
    writer.close()


def oldest_retained(node: cl.ClusterNode) -> int:
    return min(read_journal_raw(state_dir(node)))


def test_reset_required_names_the_oldest_retained_index(small_window: cl.Cluster) -> None:
    c = small_window
    _, followers = leader_and_followers(c)
    writer = Writer(c, "rr")
    final = writer.write(30, job_every=1000)
    writer.close()
    for node in [followers[0], *[n for n in c.nodes if n is not followers[0]]]:
        wait_for(lambda node=node: applied(node.rpc_addr) >= final, "the writes to apply")
        before = oldest_retained(node)
        assert before > 1 and len(read_journal_raw(state_dir(node))) <= 8
        with RPCClient([node.rpc_addr]) as client:
            with pytest.raises(RPCError) as info:
                next(iter(client.stream("event.stream", {"index": 0})))
            err = info.value
            assert err.code == "reset_required" and err.details["requested_index"] == 0
            # The window only moves forward (background writes may move it meanwhile).
            assert before <= err.details["oldest_index"] <= oldest_retained(node)
            # Resuming just before the oldest retained batch is exact (retry if the window moved on).
            for _ in range(5):
                start = err.details["oldest_index"] - 1
                try:
                    items = []
                    for item in client.stream("event.stream", {"index": start, "heartbeat": 0.2}):
                        if "progress" in item:
                            break
                        items.append((item["index"], item["events"]))
                    break
                except RPCError as exc:
                    assert exc.code == "reset_required"
                    err = exc
            else:
                raise AssertionError("could not resume inside the window")
        assert items and items[0][0] == start + 1, "the first batch after a reset must be the oldest retained one"
        journal = read_journal(state_dir(node))
        kept = [x for x in items if x[0] >= min(journal)]
        assert_exact(kept, journal, min(journal) - 1, kept[-1][0], f"subscriber on {node.id}")
    # The CLI says so in one line and exits non-zero.
    out = subprocess.run(
        [sys.executable, "-m", "node.cli", "event", "stream", "--index", "1", "--address", followers[0].rpc_addr],
        capture_output=True, text=True, timeout=DEADLINE, cwd=REPO,
    )
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "older than the oldest retained index" in out.stderr


def test_slow_subscriber_is_cut_off_with_a_resume_index_while_writes_go_on(cluster: cl.Cluster) -> None:
    c = cluster
    ensure_all_up(c)
    _, followers = leader_and_followers(c)
    target = followers[0]
    writer = Writer(c, "slow")
    start = writer.write(1)
    # A subscriber that reads nothing: a tiny receive buffer and a 2-batch server buffer.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = target.rpc_addr.rsplit(":", 1)
    sock.connect((host, int(port)))
    request = {"id": "slow-1", "method": "event.stream", "args": {"index": start, "buffer": 2, "heartbeat": 60}, "token": None}
    sock.sendall(pack_frame(request, 1 << 20))
    sock.settimeout(DEADLINE)
    try:
        # The caught-up bookmark: from here on the subscriber is live (fed by the hub).
        assert unpack_body(recv_frame(sock, 16 << 20))["stream"] == {"progress": start}
        # Big batches (nodes with 40 KB of attributes) overflow the socket buffers and the 2 queued batches.
        final = writer.write(120, job_every=1000, pad=40_000)
        wait_for(lambda: applied(target.rpc_addr) >= final, "the stalled subscriber's server to keep applying")
        # Now read: the buffered items, then the final error carrying the resume index.
        seen: list[int] = []
        error = None
        while error is None:
            body = recv_frame(sock, 16 << 20)
            assert body is not None, "server closed the stream without an answer"
            message = unpack_body(body)
            if "stream" in message:
                if "index" in message["stream"]:
                    seen.append(message["stream"]["index"])
            else:
                assert message["ok"] is False
                error = message["error"]
    finally:
        sock.close()
        writer.close()
    assert error["code"] == "unavailable" and error["reason"] == "slow_subscriber"
    resume = error["resume_index"]
    # The resume index is the last batch delivered -- or, when one fan-out
    # round (rounds are >= 25 ms apart) brought more batches than the buffer
    # holds before any went out, the position the subscriber started from.
    assert resume == (seen[-1] if seen else start) and resume < final
    # Resuming from the given index delivers the rest, with no gap.
    rest = []
    for item in follow([target.rpc_addr], index=resume, heartbeat=0.5, give_up_after=DEADLINE):
        if "index" in item:
            rest.append((item["index"], item["events"]))
        elif item["progress"] >= final:
            break
    journal = read_journal(state_dir(target))
    got = [(i, journal[i]) for i in seen] + rest
    assert_exact(got, journal, start, final, "slow subscriber")


def test_cli_follows_a_server_killed_and_restarted(cluster: cl.Cluster, tmp_path: Path) -> None:
    c = cluster
    ensure_all_up(c)
    _, followers = leader_and_followers(c)
    target = followers[0]
    writer = Writer(c, "cli")
    start = writer.write(2)
    out_file = tmp_path / "events.ndjson"
    with open(out_file, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "event", "stream", "--index", str(start), "--progress",
             "--heartbeat", "0.2", "--address", target.rpc_addr],
            stdout=out, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )
    try:

        def printed() -> list[dict[str, Any]]:
            complete = out_file.read_text().split("\n")[:-1]  # the last piece may be half written
            return [json.loads(line) for line in complete]

        mid = writer.write(10)
        wait_for(lambda: any(x.get("Progress", 0) >= mid for x in printed()), "the CLI to print up to the kill")
        cl.kill(c, target.id)
        writer.write(10)
        cl.restart(c, target.id)
        final = writer.write(10)
        wait_for(lambda: any(x.get("Progress", 0) >= final for x in printed()), "the CLI to resume after the restart")
        assert proc.poll() is None, "the CLI stopped instead of resuming"
    finally:
        proc.terminate()
        proc.wait(DEADLINE)
        writer.close()
    lines = [x for x in printed() if "Index" in x and x["Index"] <= final]
    journal = read_journal(state_dir(target))
    assert [x["Index"] for x in lines] == [i for i in sorted(journal) if start < i <= final]
    for line in lines:
        events = journal[line["Index"]]
        assert [(e["Topic"], e["Type"], e["Key"]) for e in line["Events"]] == [tuple(r[:3]) for r in events]
        for e, r in zip(line["Events"], events, strict=True):
            assert (e["Payload"] is None) == (r[3] is None)
            if r[3] is not None:
                assert e["Payload"][r[0]].get("ID", e["Payload"][r[0]].get("AccessorID")) == r[2]


def blocking_get(client: RPCClient, index: int, wait: float, extra: dict[str, Any]) -> tuple[dict[str, Any], float]:
    began = time.monotonic()
    out = client.call("job.get", {"job_id": "bq-job", "min_index": index, "wait": wait, **extra})
    return out, time.monotonic() - began


def test_blocking_queries_return_on_change_or_at_wait(cluster: cl.Cluster) -> None:
    c = cluster
    ensure_all_up(c)
    leader, followers = leader_and_followers(c)
    writer = Writer(c, "bq")
    spec = {"ID": "bq-job", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}
    writer.client.call("job.register", {"job": spec})
    # Leader; follower (forwarded to the leader, waiting there); follower serving a stale read itself.
    for address, extra in ((leader.rpc_addr, {}), (followers[0].rpc_addr, {}), (followers[1].rpc_addr, {"stale": True})):
        with RPCClient([address], timeout=120) as client:
            index = client.call("job.get", {"job_id": "bq-job", **extra})["index"]
            # Nothing changes: the answer comes at the wait, with the same index. (If
            # something else did touch the jobs table, that answer is right too: retry.)
            for _ in range(5):
                out, elapsed = blocking_get(client, index, 1.0, extra)
                if out["index"] == index:
                    assert elapsed >= 0.9, f"returned after {elapsed:.2f}s although nothing changed"
                    break
                index = out["index"]
            else:
                raise AssertionError("the jobs table never stayed still for 1 s")
            # The job changes: the answer comes then, long before the 60 s wait.
            changer = threading.Timer(0.5, writer.client.call, ("job.register", {"job": {**spec, "Meta": {"v": address}}}))
            changer.start()
            began = time.monotonic()
            while True:
                out, _ = blocking_get(client, index, 60.0, extra)
                assert out["index"] > index
                index = out["index"]
                if out["data"]["Meta"] == {"v": address}:
                    break
            elapsed = time.monotonic() - began
            changer.join()
            assert elapsed < 30, f"blocking query on {address} answered {elapsed:.1f}s after it began (wait 60s)"
    # The CLI: --index/--wait, the new index on stderr.
    env = {**os.environ, "CARAVAN_ADDRESS": followers[0].rpc_addr}
    index = writer.client.call("job.get", {"job_id": "bq-job"})["index"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "job", "status", "bq-job", "--json", "--index", str(index), "--wait", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )
    new = writer.client.call("job.register", {"job": {**spec, "Meta": {"v": "cli"}}})["Index"]
    stdout, stderr = proc.communicate(timeout=DEADLINE)
    writer.close()
    assert proc.returncode == 0, stderr
    assert json.loads(stdout)["Meta"] == {"v": "cli"}
    assert int(stderr.strip().split("Index: ")[1]) >= new
