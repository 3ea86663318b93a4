"""pysyncobj hooks: serializer/deserializer round trip, the safe restore rule, background compaction.

The background path is exercised through pysyncobj's own ``Serializer`` (the
class that calls our hooks and renames the file) and through a real
single-node ``SyncObj`` that compacts, restarts from its dump and replays.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading

import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode
from pysyncobj.serializer import Serializer

import snapshot.writer as writer_mod
from fsm import messages as m
from snapshot import (
    BackgroundSnapshotter,
    SnapshotError,
    SnapshotWriteError,
    inspect,
    make_deserializer,
    make_serializer,
    write_file,
)
from tests.snapshot.support import T0, apply_entries, example_entries, new_fsm

LAST = (b"\x13last", 120, 3)
PREV = (b"\x13prev", 119, 3)
CLUSTER = {TCPNode("127.0.0.1:4001"), TCPNode("127.0.0.1:4002"), TCPNode("127.0.0.1:4003")}
RAFT = (LAST, PREV, CLUSTER)


def _same_raft(got: tuple, want: tuple) -> None:
    assert got[0] == want[0] and got[1] == want[1]
    assert got[2] == want[2] and all(isinstance(n, TCPNode) for n in got[2])
    assert {n.address for n in got[2]} == {n.address for n in want[2]}


def test_sync_serializer_round_trip(tmp_path) -> None:
    src = new_fsm(str(tmp_path / "src"))
    apply_entries(src, example_entries())
    src.apply(
        10_000, m.encode_entry(m.Barrier(), time=T0, rid="")
    )  # left pending: the serializer commits it
    dump = str(tmp_path / "dump.bin.tmp")
    make_serializer(src, cluster_id="c1")(dump, RAFT)
    info = inspect(dump)
    assert (
        info.raft_index == 120
        and info.term == 3
        and info.index == 10_000
        and info.cluster_id == "c1"
    )
    assert "Raft Index" in __import__("snapshot").format_info(info)

    dst = new_fsm(str(tmp_path / "dst"))
    _same_raft(make_deserializer(dst)(dump), RAFT)
    assert dst.digest() == src.digest()


def test_deserializer_keeps_a_store_that_is_not_older(tmp_path) -> None:
    fsm = new_fsm(str(tmp_path / "s"))
    nxt = apply_entries(fsm, example_entries(n=10))
    dump = str(tmp_path / "dump.bin")
    make_serializer(fsm)(dump, RAFT)
    reopened: list[int] = []
    fsm.on_commit(reopened.append)
    deserialize = make_deserializer(fsm)

    # equal index (a restart right after compaction): nothing to do
    before = fsm.digest()
    _same_raft(deserialize(dump), RAFT)
    assert fsm.digest() == before and reopened == []

    # store ahead of the dump (restart later: the journal replay will be skipped)
    apply_entries(fsm, example_entries(seed=4, n=5), start=nxt)
    ahead = fsm.digest()
    reopened.clear()
    _same_raft(deserialize(dump), RAFT)
    assert fsm.digest() == ahead and reopened == []

    # a store behind the dump (snapshot install on a lagging follower) is replaced
    behind = new_fsm(str(tmp_path / "behind"))
    apply_entries(behind, example_entries(n=2))
    _same_raft(make_deserializer(behind)(dump), RAFT)
    assert behind.digest() == before


def test_deserializer_refuses_a_damaged_dump(tmp_path) -> None:
    src = new_fsm(str(tmp_path / "src"))
    apply_entries(src, example_entries(n=5))
    dump = str(tmp_path / "dump.bin")
    make_serializer(src)(dump, RAFT)
    data = bytearray(open(dump, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(dump, "wb").write(data)
    dst = new_fsm(str(tmp_path / "dst"))
    before = dst.digest()
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        make_deserializer(dst)(dump)
    assert dst.digest() == before


def test_operator_snapshot_is_not_a_raft_dump(tmp_path) -> None:
    src = new_fsm(str(tmp_path / "src"))
    path = str(tmp_path / "op.snap")
    with src.read() as r:
        write_file(r, path)
    with pytest.raises(SnapshotError, match="not a raft dump"):
        make_deserializer(new_fsm(str(tmp_path / "dst")))(path)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_background_serializer_through_pysyncobj_serializer(tmp_path, mode) -> None:
    fsm = new_fsm(str(tmp_path / "src"))
    nxt = apply_entries(fsm, example_entries())
    at_dump = fsm.digest()
    dump = str(tmp_path / "dump.bin")
    bg = BackgroundSnapshotter(fsm, dump, cluster_id="c1", mode=mode)
    ser = Serializer(dump, 1 << 16, False, bg.serializer, bg.deserializer, bg.serialize_checker)
    assert ser.checkSerializing()[0] == SERIALIZER_STATE.NOT_SERIALIZING

    ser.serialize((None, LAST, PREV, CLUSTER), LAST[1])
    assert bg.last_stall < 1.0
    # The tick goes on applying while the writer runs.
    more = example_entries(seed=8, n=20)
    apply_entries(fsm, more, start=nxt)
    final = fsm.digest()
    assert bg.wait(60)
    assert not os.path.exists(dump)  # installed only by the checker, in the tick thread
    assert ser.checkSerializing() == (SERIALIZER_STATE.SUCCESS, LAST[1]), bg.last_error
    assert ser.checkSerializing()[0] == SERIALIZER_STATE.NOT_SERIALIZING
    assert not os.path.exists(dump + ".tmp") and not os.path.exists(bg.partial)
    info = inspect(dump)
    assert info.raft_index == LAST[1] and info.cluster_id == "c1"
    if mode == "thread":
        assert info.index == at_dump[1]  # pinned at exactly the serializer's index
    else:
        assert at_dump[1] <= info.index <= final[1]  # the child may see a later commit
    first = ser.getTransmissionData("follower")  # transmissions resume after SUCCESS
    assert first is not None and first[1] is True

    other = new_fsm(str(tmp_path / "other"))
    bg2 = BackgroundSnapshotter(other, dump, mode=mode)
    data = Serializer(
        dump, 1 << 16, False, bg2.serializer, bg2.deserializer, bg2.serialize_checker
    ).deserialize()
    assert data[0] is None
    _same_raft(data[1:], RAFT)
    if mode == "thread":
        assert other.digest() == at_dump
    # pysyncobj then replays the log after the raft index; the FSM skips what the
    # dump already holds, so both modes converge on the source.
    apply_entries(other, more, start=nxt)
    assert other.digest() == final


def test_cancelled_background_write_reports_failure_and_leaves_no_file(tmp_path) -> None:
    fsm = new_fsm(str(tmp_path / "src"))
    apply_entries(fsm, example_entries())
    dump = str(tmp_path / "dump.bin")
    bg = BackgroundSnapshotter(fsm, dump, mode="process")
    bg.serializer(dump + ".tmp", RAFT)
    bg.cancel()
    assert bg.serialize_checker() == SERIALIZER_STATE.FAILED
    assert bg.last_error == "cancelled"  # said as such, not as a failed write ("exit status -9")
    assert bg.serialize_checker() == SERIALIZER_STATE.NOT_SERIALIZING
    assert not os.path.exists(dump) and not os.path.exists(bg.partial)


def test_pysyncobj_bare_dump_warning_is_dropped_as_ours_says_why(tmp_path, caplog) -> None:
    """pysyncobj warns "Failed to store full dump" after any FAILED, cancelled ones too;
    ours already logged the cause at its level, so only its other lines get through."""
    BackgroundSnapshotter(new_fsm(str(tmp_path / "src")), str(tmp_path / "dump.bin"), mode="process")
    pysyncobj_log = logging.getLogger("pysyncobj.syncobj")
    with caplog.at_level(logging.INFO):
        pysyncobj_log.warning("Failed to store full dump")
        pysyncobj_log.warning("some other pysyncobj warning")
    assert [r.getMessage() for r in caplog.records if r.name == "pysyncobj.syncobj"] == ["some other pysyncobj warning"]


def test_background_write_failure_is_reported(tmp_path) -> None:
    fsm = new_fsm(str(tmp_path / "src"))
    dump = str(tmp_path / "no-such-dir" / "dump.bin")
    bg = BackgroundSnapshotter(fsm, dump, mode="process")
    bg.serializer(dump + ".tmp", RAFT)
    assert bg.wait(60)
    assert bg.serialize_checker() == SERIALIZER_STATE.FAILED
    assert "raft dump failed" in bg.last_error and "\n" not in bg.last_error


def test_a_dump_that_fails_to_start_is_reported_once_and_the_next_one_runs(tmp_path, monkeypatch) -> None:
    """The serializer raising (no process could be spawned) must end in FAILED, not in a state
    pysyncobj never leaves: it keeps its own 'dump running' mark until the checker says
    SUCCESS or FAILED, and never starts another dump (log compaction stops for good)."""
    fsm = new_fsm(str(tmp_path / "src"))
    apply_entries(fsm, example_entries())
    dump = str(tmp_path / "dump.bin")
    bg = BackgroundSnapshotter(fsm, dump, mode="process")
    ser = Serializer(dump, 1 << 16, False, bg.serializer, bg.deserializer, bg.serialize_checker)

    def no_process(_raft: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(bg, "_spawn", no_process)
    ser.serialize((None, LAST, PREV, CLUSTER), LAST[1])
    assert ser.checkSerializing()[0] == SERIALIZER_STATE.FAILED
    assert "Too many open files" in bg.last_error
    assert ser.checkSerializing()[0] == SERIALIZER_STATE.NOT_SERIALIZING
    monkeypatch.undo()
    ser.serialize((None, LAST, PREV, CLUSTER), LAST[1])  # the next compaction gets its dump
    assert bg.wait(60)
    assert ser.checkSerializing() == (SERIALIZER_STATE.SUCCESS, LAST[1]), bg.last_error
    assert inspect(dump).raft_index == LAST[1]


def test_cancel_stops_a_write_and_removes_the_file(tmp_path, monkeypatch) -> None:
    fsm = new_fsm(str(tmp_path / "src"))
    apply_entries(fsm, example_entries())
    monkeypatch.setattr(writer_mod, "CHUNK_TARGET", 64)  # many chunk boundaries in a small state
    cancel = threading.Event()
    cancel.set()
    path = str(tmp_path / "x.snap")
    with fsm.read() as r, pytest.raises(SnapshotWriteError, match="cancelled"):
        write_file(r, path, cancel=cancel)
    assert not os.path.exists(path)


# -- a real single-node pysyncobj cluster ------------------------------------------
class _Node(SyncObj):
    def __init__(self, addr: str, fsm, conf: SyncObjConf) -> None:
        self.fsm = fsm  # before SyncObj starts ticking
        super().__init__(addr, [], conf)

    @replicated
    def submit(self, entry: bytes) -> bool:
        result = self.fsm.apply(self.raftLastApplied + 1, entry)
        self.fsm.commit()
        return result.ok


class _Watched(BackgroundSnapshotter):
    """Signals when pysyncobj has been told a dump succeeded (it then drops log entries)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.succeeded = threading.Event()

    def serialize_checker(self) -> int:
        state = super().serialize_checker()
        if state == SERIALIZER_STATE.SUCCESS:
            self.succeeded.set()
        return state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(bg: BackgroundSnapshotter, journal: str, addr: str) -> SyncObjConf:
    return SyncObjConf(
        bindAddress=addr,
        journalFile=journal,
        logCompactionMinEntries=10**9,
        logCompactionMinTime=10**9,
        **bg.conf_kwargs(),
    )


def _restart(tmp_path, name: str, store: str, addr: str) -> tuple[str, int]:
    """Start a node on ``store`` with a private copy of the first run's journal and dump; barrier; digest."""
    files = tmp_path / name
    files.mkdir()
    for f in (tmp_path / "run1").iterdir():
        shutil.copy(f, files / f.name)
    fsm = new_fsm(store)
    node = _Node(
        addr,
        fsm,
        _conf(
            BackgroundSnapshotter(fsm, str(files / "raft.dump")), str(files / "raft.journal"), addr
        ),
    )
    try:
        node.waitReady()
        # A barrier commits after everything replayed from the journal.
        node.submit(m.encode_entry(m.Barrier(), time=T0 + 1000, rid=""), sync=True, timeout=10)
        return fsm.digest()
    finally:
        node.destroy_synchronous()
        fsm.close()


def test_single_node_syncobj_compacts_restarts_and_replays(tmp_path) -> None:
    addr = f"127.0.0.1:{_free_port()}"
    run1 = tmp_path / "run1"
    run1.mkdir()
    dump = str(run1 / "raft.dump")
    fsm = new_fsm(str(tmp_path / "a"))
    bg = _Watched(fsm, dump)
    node = _Node(addr, fsm, _conf(bg, str(run1 / "raft.journal"), addr))
    try:
        node.waitReady()
        for i, (body, _, _, _) in enumerate(example_entries(n=12)):
            assert (
                node.submit(m.encode_entry(body, time=T0 + i, rid=f"r{i}"), sync=True, timeout=10)
                is not None
            )
        node.forceLogCompaction()
        assert bg.succeeded.wait(30), bg.last_error
        assert node._getRaftLogSize() <= 3  # pysyncobj dropped the compacted entries
        for i, (body, _, _, _) in enumerate(example_entries(seed=3, n=4)):
            node.submit(m.encode_entry(body, time=T0 + 100 + i, rid=f"s{i}"), sync=True, timeout=10)
        final = fsm.digest()
    finally:
        node.destroy_synchronous()
        fsm.close()
    info = inspect(dump)
    assert info.raft_index is not None and info.index < final[1]

    # Fresh store: the dump is restored, then the journal tail replayed.
    fresh = _restart(tmp_path, "run2", str(tmp_path / "b"), addr)
    # Original store, ahead of the dump: kept, and the replayed entries are skipped.
    kept = _restart(tmp_path, "run3", str(tmp_path / "a"), addr)
    assert fresh == kept
    assert fresh[1] > final[1]


def test_loading_a_dump_cancels_a_dump_in_progress(tmp_path) -> None:
    """After pysyncobj loads a dump its log changed; our own half-done dump must not be installed."""
    leader = new_fsm(str(tmp_path / "leader"))
    apply_entries(leader, example_entries())
    received = str(tmp_path / "follower.dump")
    make_serializer(leader)(received, RAFT)  # what the leader sent, already in place

    follower = new_fsm(str(tmp_path / "follower"))
    apply_entries(follower, example_entries(n=3))
    bg = BackgroundSnapshotter(follower, received, mode="process")
    bg.serializer(received + ".tmp", ((b"x", 7, 1), (b"y", 6, 1), set()))
    _same_raft(bg.deserializer(received), RAFT)
    assert bg.serialize_checker() == SERIALIZER_STATE.FAILED
    assert follower.digest() == leader.digest()
    assert inspect(received).raft_index == LAST[1]  # the received dump was not replaced
    assert not os.path.exists(bg.partial)


def test_lagging_follower_is_brought_back_by_snapshot_install(tmp_path) -> None:
    """Three in-process pysyncobj nodes: a follower that missed compacted entries
    receives the leader's dump through pysyncobj's transfer, restores it, and converges."""
    addrs = [f"127.0.0.1:{_free_port()}" for _ in range(3)]

    def start(i: int, store: str) -> tuple[_Node, _Watched]:
        fsm = new_fsm(store)
        bg = _Watched(fsm, str(tmp_path / f"dump-{i}-{os.path.basename(store)}"))
        conf = SyncObjConf(
            bindAddress=addrs[i],
            logCompactionMinEntries=10**9,
            logCompactionMinTime=10**9,
            **bg.conf_kwargs(),
        )
        node = _Node.__new__(_Node)
        node.fsm = fsm
        SyncObj.__init__(node, addrs[i], [a for a in addrs if a != addrs[i]], conf)
        return node, bg

    nodes = [start(i, str(tmp_path / f"n{i}")) for i in range(3)]
    try:
        first = nodes[0][0]
        first.waitReady()

        def write(via: _Node, tag: str, n: int) -> None:
            for i, (body, _, _, _) in enumerate(example_entries(seed=len(tag), n=n)[:n]):
                res = via.submit(
                    m.encode_entry(body, time=T0 + i, rid=f"{tag}{i}"), sync=True, timeout=10
                )
                assert res is not None

        write(first, "a", 8)
        leader_addr = str(first._getLeader())
        leader = next(n for n, _ in nodes if str(n.selfNode) == leader_addr)
        victim = next(i for i, (n, _) in enumerate(nodes) if n is not leader)
        nodes[victim][0].destroy_synchronous()
        nodes[victim][0].fsm.close()

        write(leader, "b", 10)
        leader_bg = next(bg for n, bg in nodes if n is leader)
        leader.forceLogCompaction()
        assert leader_bg.succeeded.wait(30), leader_bg.last_error
        write(leader, "c", 3)

        # The follower comes back with an empty store: the leader's log no longer
        # reaches back far enough, so it must send its dump.
        nodes[victim] = start(victim, str(tmp_path / f"n{victim}-fresh"))
        follower = nodes[victim][0]
        follower.submit(m.encode_entry(m.Barrier(), time=T0 + 999, rid=""), sync=True, timeout=30)
        leader.submit(m.encode_entry(m.Barrier(), time=T0 + 1000, rid=""), sync=True, timeout=30)
        target = leader.fsm.applied_index
        for n, _ in nodes:  # wait (on commit notifications) until every node applied it
            reached = threading.Event()
            n.fsm.on_commit(lambda index, ev=reached: index >= target and ev.set())
            if n.fsm.applied_index < target:
                assert reached.wait(30), (n.fsm.applied_index, target)
        digests = {n.fsm.digest() for n, _ in nodes}
        assert len(digests) == 1, digests
        assert follower.fsm.applied_index == leader.fsm.applied_index
    finally:
        for n, _ in nodes:
            n.destroy_synchronous()
