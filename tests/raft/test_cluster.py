"""Real 3-process clusters on loopback: replication, leader kill under load
(defect 1), fatal apply (defect 5), fsync ordering (defect 6), barrier,
leadership transfer, restart replay."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest

from raft import encoded_entry_size
from raft.config import UNSAFE_DISABLE_TRUNCATION_FIX_ENV
from raft.node import EXIT_FATAL
from tests.raft.cluster import Cluster, LoadStream, wait_for

pytestmark = pytest.mark.cluster


def followers(c: Cluster, leader: int) -> list[int]:
    return [i for i in range(c.n) if i != leader]


def run_load(
    c: Cluster, node: int, n: int, window: int, size: int = 128, tag: str = "w"
) -> LoadStream:
    ls = LoadStream(c, node, n, window, size, tag)
    wait_for(ls.finished, 180, f"{n} pipelined writes")
    ls.join(5)
    assert ls.done is not None and not ls.done["errors"], ls.done
    return ls


def assert_acked_entries_present(c: Cluster, node: int, acks: dict[int, int], tag: str) -> None:
    entries = c.call(node, "entries", start=0, prefix_len=32)["entries"]
    missing = [
        (seq, idx)
        for seq, idx in acks.items()
        if not entries.get(idx, b"").startswith(f"{tag}:{seq}:".encode())
    ]
    assert not missing, f"node {node} lost {len(missing)} acknowledged entries, e.g. {missing[:5]}"


def converge(c: Cluster, nodes: list[int], leader: int) -> int:
    """Barrier on the leader, then wait until every node applied it and all digests match."""
    idx = c.call(leader, "barrier", timeout=10)["index"]
    for i in nodes:
        c.wait_applied(i, idx, timeout=30)
    digests = {i: c.call(i, "digest", upto=idx)["digest"] for i in nodes}
    assert len(set(digests.values())) == 1, digests
    return idx


def cut_off_with_tail(c: Cluster, old: int, n: int, size: int) -> tuple[LoadStream, int]:
    """Cut the leader ``old`` off, have it append ``n`` entries nobody else gets, and wait for a new leader.

    Returns the tail's load stream and the new leader; the caller heals the
    cut (``isolate`` off) when it is done with the partition.
    """
    assert c.call(old, "isolate", on=True)["ok"]
    try:
        tail = LoadStream(c, old, n=n, window=n, size=size, tag="x")
        wait_for(
            lambda: (lambda st: st["last_log_index"] - st["commit_index"] >= n - n // 15)(c.status(old)),
            60,
            "the cut-off leader to append an uncommitted tail",
        )
        return tail, c.wait_leader(timeout=30, among=followers(c, old))
    except BaseException:
        c.call(old, "isolate", on=False)
        raise


def test_replication_group_commit_and_status(cluster: Any) -> None:
    c = cluster()
    leader = c.wait_leader()
    st = c.status(leader)
    assert st["role"] == "leader" and st["leader"] == c.addrs[leader]
    assert {p["address"] for p in st["peers"]} == {c.addrs[i] for i in followers(c, leader)}
    for f in followers(c, leader):
        # A follower that voted knows its role before the new leader's first append names the leader.
        wait_for(lambda f=f: c.status(f)["leader"] == c.addrs[leader], 10, f"node {f} to learn the leader")
        fst = c.status(f)
        assert fst["role"] == "follower" and fst["leader"] == c.addrs[leader]
        res = c.call(f, "submit", entry=b"x")
        assert (
            not res["ok"] and res["error"] == "NotLeaderError" and res["leader"] == c.addrs[leader]
        )

    r = c.call(leader, "submit", entry=b"first")
    assert r["ok"] and r["result"] == r["index"]  # the FSM's result comes back with the raft index
    # The largest entry that fits (defect 2 cap) replicates to every follower.
    big = b"b" * (
        c.status(leader)["last_log_index"] * 0
        + 48 * 1024
        - (encoded_entry_size(b"b" * 1000) - 1000)
    )
    assert encoded_entry_size(big) == 48 * 1024
    rb = c.call(leader, "submit", entry=big)
    assert rb["ok"], rb

    ls = run_load(c, leader, n=5000, window=500)
    assert len(ls.acks) == 5000 and len(set(ls.acks.values())) == 5000
    idx = converge(c, list(range(3)), leader)
    st = c.status(leader)
    assert st["commit_index"] >= idx and all(p["match_index"] >= idx for p in st["peers"])
    for i in range(3):
        s = c.status(i)
        assert s["fsm_commits"] < s["fsm_applied"] / 2, "one LMDB txn per tick, not per entry"
        assert s["truncation"]["ack_regressions"] == 0
    for f in followers(c, leader):
        big_on_f = c.call(f, "entries", start=rb["index"], prefix_len=64 * 1024)["entries"][
            rb["index"]
        ]
        assert big_on_f == big


def _truncation_counters(c: Cluster, nodes: list[int]) -> tuple[int, int]:
    regress = sum(c.status(i)["truncation"]["ack_regressions"] for i in nodes)
    past_end = sum(c.status(i)["truncation"]["commit_past_end"] for i in nodes)
    return regress, past_end


def test_followers_never_drop_acknowledged_entries_under_pipelined_load(cluster: Any) -> None:
    """Defect 1 with the reproduction's instrumentation: both counters stay zero."""
    c = cluster()
    leader = c.wait_leader()
    run_load(c, leader, n=20000, window=2000, size=256)
    regress, past_end = _truncation_counters(c, followers(c, leader))
    assert (regress, past_end) == (0, 0)
    avoided = sum(c.status(i)["truncation"]["truncations_avoided"] for i in followers(c, leader))
    print(f"truncations the fix avoided: {avoided}")


def test_without_the_fix_followers_drop_acknowledged_entries(cluster: Any) -> None:
    """The anomaly itself (CARAVAN_UNSAFE_DISABLE_TRUNCATION_FIX=1): shows what the fix prevents."""
    c = cluster(env={UNSAFE_DISABLE_TRUNCATION_FIX_ENV: "1"})
    leader = c.wait_leader()
    assert c.status(leader)["truncation_fix"] is False
    seen = (0, 0)
    for round_no in range(5):
        run_load(c, leader, n=20000, window=2000, size=256, tag=f"r{round_no}")
        seen = _truncation_counters(c, followers(c, leader))
        print(f"round {round_no}: ack regressions {seen[0]}, commit past log end {seen[1]}")
        if seen[0] > 0:
            break
    assert seen[0] > 0, "pysyncobj's truncation did not show up in 5 rounds"


def _kill_leader_under_load(c: Cluster, leader: int, tag: str) -> tuple[dict[int, int], int]:
    """Pipeline writes through `leader`, kill -9 it mid-stream; return (acked, new leader)."""
    ls = LoadStream(c, leader, n=200_000, window=2000, size=128, tag=tag)
    wait_for(lambda: len(ls.acks) >= 8000 or ls.finished(), 120, "8000 acknowledged writes")
    c.kill(leader)
    ls.join(10)
    acked = dict(ls.acks)
    assert len(acked) >= 8000
    survivors = [i for i in range(c.n) if i != leader and c.alive(i)]
    new = c.wait_leader(timeout=20, among=survivors)
    converge(c, survivors, new)
    for i in survivors:
        assert_acked_entries_present(c, i, acked, tag)
        assert c.status(i)["truncation"]["ack_regressions"] == 0
    return acked, new


def test_kill9_leader_under_pipelined_load_keeps_every_acknowledged_write(cluster: Any) -> None:
    c = cluster()
    first = c.wait_leader()
    acked1, second = _kill_leader_under_load(c, first, "k1")
    # The old leader comes back, replays its journal and converges...
    c.start(first)
    r = c.call(second, "submit", entry=b"after-restart")
    assert r["ok"], r
    converge(c, list(range(3)), second)
    assert_acked_entries_present(c, first, acked1, "k1")
    # ...and the next leader is killed the same way.
    acked2, third = _kill_leader_under_load(c, second, "k2")
    for i in (first, third):
        assert_acked_entries_present(c, i, acked1, "k1")
    c.start(second)
    converge(c, list(range(3)), third)
    assert_acked_entries_present(c, second, acked2, "k2")


def test_restart_replays_the_journal_into_a_lost_fsm(cluster: Any) -> None:
    """The FSM commits once per tick; losing any committed suffix (here: the
    whole LMDB) is repaired by pysyncobj's journal replay on restart."""
    c = cluster()
    leader = c.wait_leader()
    ls = run_load(c, leader, n=3000, window=300, tag="j")
    f = followers(c, leader)[0]
    converge(c, list(range(3)), leader)
    c.kill(f)
    shutil.rmtree(c.dir(f) / "fsm")
    c.start(f)
    converge(c, list(range(3)), leader)
    assert_acked_entries_present(c, f, ls.acks, "j")


def test_fatal_apply_error_stops_only_the_failing_node(cluster: Any) -> None:
    c = cluster()
    leader = c.wait_leader()
    bad, good = followers(c, leader)
    c.kill(bad)
    c.start(bad, boom=True)  # this node's FSM "fails the disk" on BOOM entries
    c.wait_raft_applied(bad, c.status(leader)["applied_index"], timeout=20)
    r = c.call(leader, "submit", entry=b"BOOM-1")
    assert r["ok"], r
    assert c.wait_exit(bad, timeout=15) == EXIT_FATAL  # stopped, not wedged
    assert "raft_fatal_apply_error" in c.log_text(bad)
    r2 = c.call(leader, "submit", entry=b"after-boom")
    assert r2["ok"], r2  # the rest of the cluster keeps committing
    c.start(bad, boom=False)  # operator fixed the disk: the entry replays
    converge(c, list(range(3)), leader)


def test_fsync_mode_acks_only_synced_entries(cluster: Any) -> None:
    c = cluster(fsync=True)
    leader = c.wait_leader()
    run_load(c, leader, n=4000, window=400)
    converge(c, list(range(3)), leader)
    for i in range(3):
        fs = c.status(i)["fsync_stats"]
        assert fs["syncs"] > 0
        assert fs["unsynced_acks"] == 0, fs
    assert c.status(leader)["fsync"] is True


@pytest.mark.parametrize("op, readers, most", [("barriers", 32, 8), ("barriers_async", 200, 20)])
def test_barrier_is_shared_by_concurrent_readers(cluster: Any, op: str, readers: int, most: int) -> None:
    """Threads calling barrier(), or tasks of one loop awaiting barrier_async() (what a
    linearizable RPC read waits on), share barrier entries instead of one each."""
    c = cluster()
    leader = c.wait_leader()
    w = c.call(leader, "submit", entry=b"before-read")
    res = c.call(leader, op, n=readers)
    idxs = res["indexes"]
    assert all(isinstance(i, int) and i > w["index"] for i in idxs), idxs
    print(f"barrier entries used by {readers} readers ({op}):", res["entries_used"])
    assert 1 <= res["entries_used"] <= most, res
    f = followers(c, leader)[0]
    assert c.call(f, op, n=3)["indexes"] == ["NotLeaderError"] * 3


def test_an_async_barrier_without_a_quorum_fails_at_its_timeout(cluster: Any) -> None:
    c = cluster()
    leader = c.wait_leader()
    for other in followers(c, leader):
        c.kill(other)
    started = time.monotonic()
    res = c.call(leader, "barriers_async", n=3, timeout=1.0)
    assert set(res["indexes"]) <= {"UnknownOutcomeError", "NotLeaderError"}, res
    assert time.monotonic() - started < 5.0
    assert time.monotonic() - started < 5.0


def transfer_to(c: Cluster, leader: int, target: int, attempts: int = 3) -> None:
    """Move leadership to ``target``, as an operator would: again from the new leader if it went elsewhere.

    Transfer is best effort in raft (etcd and hashicorp/raft say so too):
    while the target runs its election another follower's timer may fire
    first -- seen on a CPU-starved 2-core machine. The answer must then say
    where leadership went, and a second transfer from there must work.
    """
    for _ in range(attempts):
        r = c.call(leader, "transfer", target=c.addrs[target], timeout=10)
        if r["ok"]:
            return
        assert r["error"] == "LeadershipTransferError" and "leadership went to" in r["message"], r
        leader = c.wait_leader(timeout=10)
        if leader == target:
            return
    raise AssertionError(f"leadership did not reach {c.addrs[target]} in {attempts} transfers")


def test_a_truncated_tail_fails_its_callbacks_without_waiting_for_new_entries(cluster: Any) -> None:
    """Entries a cut-off leader appended are dropped when it rejoins; their writers hear so at once.

    pysyncobj fails a waiting write only when the log reaches its index
    again. A new leader that gets no writes never grows its log past the
    dropped tail, so without raft/node.py's discard those writers waited
    forever (a server's client until its timeout, as "unknown outcome").
    This also was the cause of a rare hang in the leadership-transfer test.
    """
    c = cluster()
    old = c.wait_leader()
    run_load(c, old, n=200, window=50, tag="a")
    tail, new = cut_off_with_tail(c, old, n=300, size=64)
    assert c.call(old, "isolate", on=False)["ok"]
    wait_for(tail.finished, 20, "every write of the dropped tail to get its answer")
    tail.join(5)
    assert tail.done is not None and not tail.acks, tail.done
    assert set(tail.done["errors"]) == {"NotLeaderError"}, tail.done
    converge(c, list(range(3)), new)


def test_leadership_transfer_to_a_chosen_peer(cluster: Any) -> None:
    c = cluster()
    leader = c.wait_leader()
    target = followers(c, leader)[1]
    ls = LoadStream(c, leader, n=3000, window=100, size=64, tag="t")
    transfer_to(c, leader, target)
    ls.join(30)
    assert c.wait_leader(timeout=10) == target
    assert c.call(target, "submit", entry=b"on-new-leader")["ok"]
    bad = c.call(target, "transfer", target="127.0.0.1:1")
    assert not bad["ok"] and bad["error"] == "LeadershipTransferError"
    converge(c, list(range(3)), target)
    assert_acked_entries_present(c, target, ls.acks, "t")


def test_cut_off_leader_with_a_long_uncommitted_tail_catches_up(cluster: Any) -> None:
    """The pause nemesis's livelock (jepsen_like seed 106), on raft alone and deterministic.

    The leader is cut off (every raft message to and from it dropped, TCP
    connections kept) while it appends entries nobody else gets, so its log
    ends with a long uncommitted tail of its term. The others elect a new
    leader, which appends many append_entries batches more. After the cut
    heals, the ex-leader must find the index where the logs agree, drop its
    tail and catch up. Without the leader-side rule of raft/catchup.py the
    new leader's pipelined batches make the follower's "beyond my log"
    rejects undo its "term mismatch" reject every round and the ex-leader
    never moves; without the follower's conflict hint it would back up one
    entry per round (about 1,500 rounds here).
    """
    c = cluster()
    old = c.wait_leader()
    run_load(c, old, n=2000, window=500, tag="a")
    tail, new = cut_off_with_tail(c, old, n=1500, size=128)
    try:
        run_load(c, new, n=5000, window=1000, tag="b")  # many batches past the tail
    finally:
        c.call(old, "isolate", on=False)
    idx = c.call(new, "barrier", timeout=10)["index"]
    c.wait_applied(old, idx, timeout=45)
    converge(c, list(range(3)), new)
    tail.join(30)  # its entries were replaced: every callback got an error
    assert tail.done is not None and not tail.acks, tail.done
    st = c.status(new)
    print(f"leader catch-up stats: {st['catchup']}; ex-leader: {c.status(old)['catchup']}")


@pytest.mark.parametrize(
    ("tag", "what"),
    [("SLOW", "an election happened during the long apply"), ("FSLOW", "the leader stepped down while its followers applied")],
    ids=["every-node", "followers-only"],
)
def test_a_long_apply_does_not_cost_the_leader_its_leadership(cluster: Any, tag: str, what: str) -> None:
    """A tick that applies for seconds (40 entries of 60 ms) still shows every node the leader is alive.

    ``SLOW``, on every node: pysyncobj applies everything committed in one
    tick, and checks a follower's election deadline at the start of the next
    one, before it reads the leader's messages that arrived meanwhile; the
    leader sends nothing while it applies. Without keep-alives during the
    apply, the followers time out and the cluster holds an election under its
    own load.

    ``FSLOW``, on followers only: the leader has applied and waits for
    replies while the followers' tick threads are deep in their apply and read
    nothing. Check-quorum (raft/quorum.py) would step the leader down after
    its lease (0.5 s) of silence from a majority, so a busy follower says it
    is alive between apply slices.
    """
    c = cluster(n=3)
    leader = c.wait_leader()
    terms = {i: c.status(i)["term"] for i in range(c.n)}
    run_load(c, leader, n=40, window=40, size=64, tag=tag)
    assert c.wait_leader(timeout=30) == leader
    assert {i: c.status(i)["term"] for i in range(c.n)} == terms, what
    assert converge(c, list(range(c.n)), leader) > 40
