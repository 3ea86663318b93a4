"""The paused-leader livelock (jepsen_like campaign seed 106) at the message level.

Two real pysyncobj nodes (the adapter's ``_Replica``, no tick thread, no
sockets in use): the test is the network. It takes the new leader's
append_entries from its transport, hands them to the ex-leader's transport
entry point, and hands the replies back, one round at a time, exactly as
TCP would deliver them (in order, all of a round's replies after its
messages). The logs are the trace's: the ex-leader ends at 549 with entries
of its old term past its commit index 547; the new leader is several append
batches ahead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.node import TCPNode

from raft import RaftConfig
from raft.catchup import SnapshotFloors, conflict_hint, filter_reply
from raft.replica import Replica as _Replica
from tests.raft.cluster import free_ports
from tests.raft.conftest import MemTarget

# ~1 KiB commands: pysyncobj cuts a batch at 64 KiB, so ~64 entries per message.
CMD = b"\x00" + b"c" * 1000


class _Owner:
    """What _Replica needs from its RaftNode when nothing is applied."""

    def __init__(self) -> None:
        self._log = structlog.get_logger("test")


class Wire:
    """Two unticked replicas wired through the test."""

    def __init__(self, tmp_path: Path) -> None:
        ports = free_ports(3)
        self.addrs = [f"127.0.0.1:{p}" for p in ports]
        self.nodes: list[_Replica] = []
        self.out: list[list[tuple[Any, dict[str, Any]]]] = []
        for i in range(2):
            cfg = RaftConfig(
                self_address=self.addrs[i],
                peers=self.addrs,
                data_dir=tmp_path / f"n{i}",
                password="pw",
            )
            cfg.data_path.mkdir(parents=True)
            conf = cfg.to_syncobj_conf(autoTick=False)
            obj = _Replica(_Owner(), cfg, conf, MemTarget())  # type: ignore[arg-type]
            sent: list[tuple[Any, dict[str, Any]]] = []
            # Capture what the adapter's send hook would put on the wire.
            obj._SyncObj__transport.raw_send = lambda node, msg, sent=sent: (
                sent.append((node, msg)) or True
            )
            self.nodes.append(obj)
            self.out.append(sent)
        self.leader, self.follower = self.nodes
        self.lnode, self.fnode = TCPNode(self.addrs[0]), TCPNode(self.addrs[1])

    def close(self) -> None:
        for obj in self.nodes:
            obj._doDestroy()

    def deliver(self, to: int, sender: TCPNode, messages: list[dict[str, Any]]) -> None:
        transport = self.nodes[to]._SyncObj__transport
        for msg in messages:
            transport._onMessageReceived(sender, msg)  # the adapter's hooks, then pysyncobj

    def round(self) -> list[dict[str, Any]]:
        """One leader send round; returns the follower's replies (already delivered)."""
        self.out[0].clear()
        self.leader._SyncObj__sendAppendEntries()
        sent = [m for node, m in self.out[0] if node == self.fnode]
        self.out[1].clear()
        self.deliver(1, self.lnode, sent)
        replies = [m for _, m in self.out[1]]
        self.deliver(0, self.fnode, replies)
        return replies

    @staticmethod
    def log_of(obj: _Replica) -> list[tuple[int, int]]:
        j = obj._SyncObj__raftLog
        return [(j[i][1], j[i][2]) for i in range(len(j))]


@pytest.fixture
def wire(tmp_path: Path) -> Any:
    w = Wire(tmp_path)
    yield w
    w.close()


def _setup(w: Wire, tail: int) -> None:
    """Ex-leader (follower): 2..548 term 1 committed to 547, then `tail`
    uncommitted term-1 entries. New leader: same up to 548, then term 2 and
    term 3 entries to 1000, leader of term 3."""
    f, ld = w.follower, w.leader
    for i in range(2, 549):
        f._SyncObj__raftLog.add(CMD, i, 1)
        ld._SyncObj__raftLog.add(CMD, i, 1)
    for i in range(549, 549 + tail):
        f._SyncObj__raftLog.add(CMD, i, 1)
    f._SyncObj__setCurrentTerm(1, None)
    f._SyncObj__raftCommitIndex = 547
    for i in range(549, 700):
        ld._SyncObj__raftLog.add(CMD, i, 2)
    for i in range(700, 1000):
        ld._SyncObj__raftLog.add(CMD, i, 3)
    ld._SyncObj__setCurrentTerm(3, w.addrs[0])
    ld._SyncObj__raftCommitIndex = 999
    ld._SyncObj__connectedNodes.add(w.fnode)  # pretend the link is up: it sends
    w.out[0].clear()
    ld._SyncObj__onBecomeLeader()  # appends its no-op at 1000 and sends a first round
    # The first round reached nobody (as to a paused process); the leader's
    # nextIndex for the follower ran ahead optimistically.
    w.out[0].clear()


@pytest.mark.parametrize("tail", [1, 150])
def test_ex_leader_with_an_old_term_tail_catches_up_in_a_few_rounds(wire: Wire, tail: int) -> None:
    _setup(wire, tail)
    ld = wire.leader
    rounds: list[list[dict[str, Any]]] = []
    while wire.log_of(wire.follower) != wire.log_of(ld):
        assert len(rounds) < 5, (
            f"no convergence after {len(rounds)} rounds: leader nextIndex "
            f"{ld._SyncObj__raftNextIndex[wire.fnode]}, follower log ends "
            f"{wire.log_of(wire.follower)[-1]}, replies {rounds[-1]}"
        )
        replies = wire.round()
        rounds.append([{k: r[k] for k in ("next_node_idx", "success", "reset")} for r in replies])
    assert ld._SyncObj__raftMatchIndex[wire.fnode] == 1000
    end = 549 + tail  # the follower's log end + 1
    # Round 1: a heartbeat at the leader's end, "beyond my log".
    assert rounds[0] == [{"next_node_idx": end, "success": False, "reset": True}]
    # Round 2 is the trace's: pipelined batches from nextIndex = `end`; one
    # term-mismatch reject (with the conflict hint: commit index + 1), then
    # "beyond my log" rejects that pysyncobj alone would let win.
    trace = rounds[1]
    assert len(trace) > 2 and not any(r["success"] for r in trace)
    assert trace[0]["next_node_idx"] == 548
    assert all(r["next_node_idx"] == end for r in trace[1:])
    assert ld._cstats["stale_rejects_ignored"] >= len(trace) - 1
    # Round 3 starts at 548, where the logs agree, and carries everything.
    assert len(rounds) == 3 and all(r["success"] for r in rounds[2])


def test_a_late_reject_cannot_rewind_a_caught_up_follower_until_it_reconnects(wire: Wire) -> None:
    """Seed 172: a reject sent before the follower caught up, arriving after, made the leader resend
    from far back (there, below its compacted log: an unneeded snapshot that dropped acked entries)."""
    _setup(wire, 1)
    ld = wire.leader
    while wire.log_of(wire.follower) != wire.log_of(ld):
        wire.round()
    assert ld._SyncObj__raftMatchIndex[wire.fnode] == 1000
    late = {"type": "next_node_idx", "next_node_idx": 550, "success": False, "reset": True}
    wire.deliver(0, wire.fnode, [late])
    assert ld._SyncObj__raftNextIndex[wire.fnode] == 1001  # not 550: the follower acked up to 1000
    # A reconnect may be a restart with a shorter log: what it acked is forgotten, rejects count again.
    ld._SyncObj__transport._onNodeConnected(wire.fnode)
    assert ld._SyncObj__raftMatchIndex[wire.fnode] == 0
    wire.deliver(0, wire.fnode, [late])
    assert ld._SyncObj__raftNextIndex[wire.fnode] == 550


def _send_snapshot(wire: Wire, compacted_to: int) -> list[dict[str, Any]]:
    """The leader compacted its log to ``compacted_to`` and has a dump: a round to a follower
    behind that sends the snapshot (one chunk: a small file)."""
    ld = wire.leader
    if ld._SyncObj__raftLog[0][1] < compacted_to:
        ld._SyncObj__raftLog.deleteEntriesTo(compacted_to)
    Path(ld._SyncObj__conf.fullDumpFile).write_bytes(b"dump")
    wire.out[0].clear()
    ld._SyncObj__sendAppendEntries()
    return [m for node, m in wire.out[0] if node == wire.fnode and "serialized" in m]


def test_a_reject_sent_before_a_snapshot_arrives_cannot_make_the_leader_send_it_again(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 233: a follower paused far behind; the leader sends a snapshot; a reject the follower
    sent before it got the snapshot arrives after the last chunk left (matchIndex still low),
    lowered nextIndex below the compacted log, and the follower got the same snapshot again --
    whose install dropped the entries it had received and acknowledged since."""
    _setup(wire, 1)
    ld, f = wire.leader, wire.fnode
    late = {"type": "next_node_idx", "next_node_idx": 550, "success": False, "reset": True}
    wire.deliver(0, f, [late])  # matchIndex 0: a real reject, nextIndex 550
    chunks = _send_snapshot(wire, compacted_to=900)  # the log now starts at 900: 550 needs the snapshot
    assert chunks and chunks[-1]["serialized"][2]  # through its last chunk
    floor = ld._SyncObj__raftLog[1][1] + 1  # the snapshot brings the follower to floor - 1
    assert ld._SyncObj__raftNextIndex[f] > floor  # entries after it were pipelined at once
    wire.deliver(0, f, [late])  # the stale reject, from before the snapshot
    assert ld._SyncObj__raftNextIndex[f] == floor  # without the floor: 550, and a second snapshot
    assert not _send_snapshot(wire, compacted_to=900)  # the next round sends entries, not the snapshot
    # The follower confirms: from then on matchIndex carries the rule (filter_reply).
    wire.deliver(0, f, [{"type": "next_node_idx", "next_node_idx": floor, "success": True, "reset": False}])
    assert ld._SyncObj__raftMatchIndex[f] == floor - 1 and not ld._snapshot_floors._floors

    # A reconnect drops the floor (the snapshot may not have arrived): rejects count again.
    ld._SyncObj__transport._onNodeConnected(f)  # (also forgets matchIndex)
    wire.deliver(0, f, [late])
    assert _send_snapshot(wire, compacted_to=900)
    ld._SyncObj__transport._onNodeConnected(f)
    wire.deliver(0, f, [late])
    assert ld._SyncObj__raftNextIndex[f] == 550
    # So does a follower that never confirms: after the wait, a reject counts again.
    assert _send_snapshot(wire, compacted_to=900)
    wire.deliver(0, f, [late])
    assert ld._SyncObj__raftNextIndex[f] == floor
    monkeypatch.setattr(ld._snapshot_floors, "wait", 0.0)
    wire.deliver(0, f, [late])
    assert ld._SyncObj__raftNextIndex[f] == 550


def _install(follower: _Replica, last: tuple[int, int], prev: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The follower installs a snapshot whose last entries are ``last``/``prev`` (index, term)."""
    dump = (None, (CMD, *last), (CMD, *prev), set())
    monkeypatch.setattr(follower._SyncObj__serializer, "deserialize", lambda: dump)
    follower._SyncObj__loadDumpFile(clearJournal=True)


def test_an_install_keeps_the_log_after_an_entry_the_follower_already_holds(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raft's InstallSnapshot rule (Figure 13, step 6), which pysyncobj lacks: a follower that
    holds the snapshot's last entry (same index and term) keeps the entries after it -- seed 233's
    second install of the same snapshot cut the follower back to 5352 from 5482."""
    _setup(wire, 1)
    f = wire.follower
    while wire.log_of(f) != wire.log_of(wire.leader):
        wire.round()
    f._SyncObj__raftLastApplied = 950
    _install(f, last=(900, 3), prev=(899, 3), monkeypatch=monkeypatch)
    assert wire.log_of(f)[-1] == (1000, 3) and len(wire.log_of(f)) == len(wire.log_of(wire.leader))
    assert f.raftLastApplied == 950 and f._cstats["installs_retained"] == 1  # never moves back
    # Its confirmation claims the snapshot only: the kept tail is checked by appends, as any log.
    wire.out[1].clear()
    f._SyncObj__sendNextNodeIdx(wire.lnode, success=True)  # what pysyncobj sends after an install
    assert [m["next_node_idx"] for _, m in wire.out[1]] == [901]
    f._SyncObj__sendNextNodeIdx(wire.lnode, success=True)  # later acks are the log's end again
    assert wire.out[1][-1][1]["next_node_idx"] == 1001
    # A snapshot whose last entry the log does not hold (another term): the log is replaced.
    _install(f, last=(900, 2), prev=(899, 2), monkeypatch=monkeypatch)
    assert wire.log_of(f) == [(899, 2), (900, 2)] and f.raftLastApplied == 900
    assert f.raftCommitIndex <= 900


def test_pysyncobj_alone_applies_the_replies_in_order_and_livelocks(wire: Wire) -> None:
    """The same replies through pysyncobj's handler without the leader's rule:
    nextIndex ends at the follower's log end + 1 every round, above 548."""
    _setup(wire, 1)
    ld = wire.leader
    wire.round()  # the heartbeat round: nextIndex drops to 550
    for _ in range(3):
        wire.out[0].clear()
        ld._SyncObj__sendAppendEntries()
        sent = [m for node, m in wire.out[0] if node == wire.fnode]
        wire.out[1].clear()
        wire.deliver(1, wire.lnode, sent)
        replies = [m for _, m in wire.out[1]]
        assert len(replies) > 2 and replies[0]["next_node_idx"] == 548
        for r in replies:
            ld._SyncObj__onMessageReceived(wire.fnode, r)  # bypasses raft/catchup.py
        assert ld._SyncObj__raftNextIndex[wire.fnode] == 550  # back where it started
    assert wire.log_of(wire.follower)[-1] == (549, 1)


# -- the rules themselves ------------------------------------------------------


def _reply(idx: int, success: bool = False, reset: bool = True) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": idx, "success": success, "reset": reset}


def test_filter_reply_only_lets_failures_lower_next_index() -> None:
    assert filter_reply(_reply(549), 717) is None  # lowers: pysyncobj applies it
    assert filter_reply(_reply(550), 549) == _reply(550, reset=False)  # would raise: ignored
    assert filter_reply(_reply(549), 549) is None
    assert filter_reply(_reply(900, success=True, reset=False), 549) is None  # successes untouched
    assert filter_reply(_reply(900, reset=False), 549) is None  # chunk acks: no reset
    assert filter_reply(_reply(900), None) is None  # unknown follower: pysyncobj decides


def test_filter_reply_never_lowers_next_index_to_what_the_follower_acknowledged() -> None:
    """A late reject from before the follower acknowledged up to 2260 (seed 172: an unneeded snapshot)."""
    assert filter_reply(_reply(1255), 2300, match_index=2260) == _reply(2261)  # back to match + 1 only
    assert filter_reply(_reply(1255), 2261, match_index=2260) == _reply(1255, reset=False)  # already there
    assert filter_reply(_reply(2270), 2300, match_index=2260) is None  # above matchIndex: a real reject
    assert filter_reply(_reply(1255), 2300) is None  # matchIndex 0 (just elected or reconnected)


def test_a_snapshot_floor_holds_in_its_term_until_confirmed_or_stale() -> None:
    floors = SnapshotFloors(wait=10.0)
    floors.sent("f", 902, term=3, now=100.0)
    assert floors.match_index("f", 500, term=3, now=101.0) == 901
    assert floors.match_index("f", 950, term=3, now=101.0) == 950  # acknowledged beyond it already
    assert floors.match_index("g", 500, term=3, now=101.0) == 500  # another follower
    floors.on_reply("f", _reply(901, success=True, reset=False))  # below the floor: not the confirmation
    assert floors.match_index("f", 0, term=3, now=101.0) == 901
    assert floors.match_index("f", 0, term=4, now=101.0) == 0  # a new term drops it
    floors.sent("f", 902, term=4, now=100.0)
    assert floors.match_index("f", 0, term=4, now=111.0) == 0  # unconfirmed past the wait: dropped
    floors.sent("f", 902, term=4, now=100.0)
    floors.on_reply("f", _reply(902, success=True, reset=False))
    assert floors.match_index("f", 0, term=4, now=101.0) == 0


class _Terms:
    def __init__(self, first: int, terms: list[int]) -> None:
        self.first, self.terms = first, terms

    def first_index(self) -> int:
        return self.first

    def last_index(self) -> int:
        return self.first + len(self.terms) - 1

    def term_at(self, index: int) -> int:
        return self.terms[index - self.first]


def test_conflict_hint_skips_the_conflicting_run_but_not_below_commit() -> None:
    log = _Terms(1, [0] + [1] * 547 + [1, 1] + [2] * 10)  # 1..560
    assert conflict_hint(log, 549, commit_index=547) == 548
    assert conflict_hint(log, 560, commit_index=547) == 551  # start of the term-2 run
    assert conflict_hint(log, 560, commit_index=555) == 556
    assert conflict_hint(log, 548, commit_index=547) == 548
    assert conflict_hint(_Terms(100, [5, 5, 5, 6]), 103, commit_index=0) == 103
    assert conflict_hint(_Terms(100, [5, 5, 5, 5]), 103, commit_index=0) == 101


@given(
    runs=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    first=st.integers(1, 50),
    data=st.data(),
)
def test_conflict_hint_property(runs: list[int], first: int, data: Any) -> None:
    terms = [t for t, n in enumerate(runs, start=1) for _ in range(n)]
    log = _Terms(first, terms)
    last = log.last_index()
    prev = data.draw(st.integers(first, last))
    commit = data.draw(st.integers(0, prev))
    h = conflict_hint(log, prev, commit)
    assert h <= prev
    assert h >= min(prev, max(commit + 1, first + 1))
    # Every entry skipped has the conflicting term (it conflicts as well) ...
    assert all(log.term_at(i) == log.term_at(prev) for i in range(h, prev + 1))
    # ... and the hint goes back as far as the rules allow.
    if h > max(commit + 1, first + 1):
        assert log.term_at(h - 1) != log.term_at(prev)
