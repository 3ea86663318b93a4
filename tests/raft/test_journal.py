"""Crash-safe compaction of pysyncobj's journal (raft/journal.py).

A kill -9 keeps whatever the process wrote into the mmap'd journal (the page
cache survives), so "the process died here" is simulated faithfully by
stopping at a point and reading the file from a new journal object, or --
for whole nodes -- by freezing the tick thread at that point and copying
the data directory while it is frozen.
"""

from __future__ import annotations

import os
import pickle
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal

import raft.journal as rj
from raft import RaftConfig, RaftNode
from raft.errors import JournalSwitchError
from raft.journal import AtomicFileJournal
from raft.replica import Replica as _Replica
from tests.raft.cluster import free_ports, wait_for
from tests.raft.conftest import MemTarget


class Crash(Exception):
    """Stands in for the process dying at this point."""


def _entries(n: int, start: int = 1, term: int = 1, size: int = 20) -> list[tuple[bytes, int, int]]:
    return [(bytes([i % 251]) * size, i, term) for i in range(start, start + n)]


def _journal(path: Path, entries: list[tuple[bytes, int, int]], atomic: bool) -> FileJournal:
    j = FileJournal(str(path))
    for e in entries:
        j.add(*e)
    if atomic:
        assert AtomicFileJournal.adopt(j)
    return j


def _on_disk(path: Path) -> list[tuple[bytes, int, int]]:
    """What a restarted process reads (the page cache is shared)."""
    j = FileJournal(str(path))
    try:
        return [tuple(j[i]) for i in range(len(j))]  # type: ignore[misc]
    finally:
        j._destroy()


@pytest.fixture
def crash_at() -> Iterator[Any]:
    def arm(stage: str) -> None:
        def hook(s: str) -> None:
            if s == stage:
                raise Crash(s)

        rj.crash_hook = hook

    yield arm
    rj.crash_hook = None


# -- the defect and the fix, journal level ------------------------------------------


def test_pysyncobj_compaction_killed_midway_loses_entries_after_the_snapshot(
    tmp_path: Path,
) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=False)
    added = [0]
    real_add = j.add

    def dying_add(*entry: Any) -> None:
        if added[0] == 7:
            raise Crash("killed while re-adding")
        added[0] += 1
        real_add(*entry)

    j.add = dying_add  # type: ignore[method-assign]  # deleteEntriesTo re-adds through self.add
    with pytest.raises(Crash):
        j.deleteEntriesTo(60)  # keep 61..100
    disk = _on_disk(tmp_path / "j")
    assert disk == old[60:67]  # 68..100 are gone: appended, acknowledged, lost


@pytest.mark.parametrize("stage", ["partial", "written"])
def test_atomic_compaction_killed_before_the_rename_leaves_the_old_journal(
    tmp_path: Path, crash_at: Any, stage: str
) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=True)
    crash_at(stage)
    with pytest.raises(Crash):
        j.deleteEntriesTo(60)
    assert _on_disk(tmp_path / "j") == old
    assert os.path.exists(str(tmp_path / "j") + rj.COMPACT_SUFFIX)
    again = FileJournal(str(tmp_path / "j"))
    assert AtomicFileJournal.adopt(again)  # a restart removes the half-written file
    assert not os.path.exists(str(tmp_path / "j") + rj.COMPACT_SUFFIX)
    again._destroy()


def test_atomic_compaction_killed_after_the_rename_leaves_the_new_journal(
    tmp_path: Path, crash_at: Any
) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=True)
    crash_at("renamed")
    with pytest.raises(Crash):
        j.deleteEntriesTo(60)
    assert _on_disk(tmp_path / "j") == old[60:]


def test_atomic_compaction_then_appends_and_sync(tmp_path: Path) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=True)
    (tmp_path / "dump").write_bytes(b"dump")
    j.sync_compaction = True  # the node's fsync mode: temp file, dump and directory synced
    j.durable_first = (str(tmp_path / "dump"), str(tmp_path / "missing"))
    j.deleteEntriesTo(98)
    more = _entries(50, start=101, term=2, size=300)  # grows the new file's mapping
    for e in more:
        j.add(*e)
    j.sync()
    j.deleteEntriesFrom(40)  # pysyncobj's conflict truncation on the new file
    assert [tuple(j[i]) for i in range(len(j))] == old[98:] + more[:38]
    assert _on_disk(tmp_path / "j") == old[98:] + more[:38]
    j._destroy()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=2, max_size=60),
    cut=st.integers(0, 59),
    stage=st.sampled_from([None, "partial", "written", "renamed"]),
    extra=st.integers(0, 5),
)
def test_compaction_leaves_the_old_or_the_new_journal_never_a_mix(
    tmp_path_factory: Any, sizes: list[int], cut: int, stage: str | None, extra: int
) -> None:
    path = tmp_path_factory.mktemp("j") / "journal"
    old = [(os.urandom(s), i + 1, 1 + i // 7) for i, s in enumerate(sizes)]
    cut = min(cut, len(old) - 2)  # pysyncobj always keeps at least two entries
    j = _journal(path, old, atomic=True)

    def hook(s: str) -> None:
        if s == stage:
            raise Crash(s)

    rj.crash_hook = hook
    try:
        try:
            j.deleteEntriesTo(cut)
            crashed = False
        except Crash:
            crashed = True
    finally:
        rj.crash_hook = None
    disk = _on_disk(path)
    assert disk in (old, old[cut:])
    if not crashed:
        assert disk == old[cut:] == [tuple(j[i]) for i in range(len(j))]
        tail = _entries(extra, start=len(old) + 1, term=9)
        for e in tail:
            j.add(*e)
        assert _on_disk(path) == old[cut:] + tail
    j._destroy()


def test_align_to_dump_keeps_what_follows_the_dump(tmp_path: Path) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=True)
    assert not j.align_to_dump(old[99], (b"other", 99, 1))  # not the dump's pair
    assert not j.align_to_dump(_entries(1, start=200)[0], _entries(1, start=199)[0])  # beyond
    assert not j.align_to_dump(old[1], old[0])  # already starts with it
    assert j.align_to_dump(old[60], old[59])
    assert [tuple(j[i]) for i in range(len(j))] == old[59:]
    assert _on_disk(tmp_path / "j") == old[59:]
    j._destroy()


# -- whole node: freeze the tick thread at the crash point, copy the disk, restart --


class Dumper:
    """A serializer that writes the dump at once but reports it finished only
    when told (pysyncobj's serializeChecker, as the background snapshotter
    does), so entries appended meanwhile sit after the dump in the journal."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.finish = threading.Event()
        self._state = 0  # pysyncobj SERIALIZER_STATE: 0 idle, 1 busy, 2 success

    def serializer(self, file_name: str, raft_data: Any) -> None:
        with open(file_name, "wb") as f:
            pickle.dump(raft_data, f)
        self._state = 1
        self.started.set()

    def checker(self) -> int:
        if self._state == 1 and self.finish.is_set():
            self._state = 0
            return 2
        return self._state

    @staticmethod
    def deserializer(file_name: str) -> Any:
        with open(file_name, "rb") as f:
            return pickle.load(f)


class Frozen:
    """Blocks the tick thread at a crash point until released (then aborts the compaction)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, stage: str = "") -> None:
        self.reached.set()
        self.release.wait(30)
        raise Crash(stage)


def _node(data_dir: Path, target: Any, dumper: Dumper | None = None) -> RaftNode:
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    dumper = dumper or Dumper()
    cfg = RaftConfig(
        self_address=addr,
        peers=[addr],
        data_dir=data_dir,
        password="pw",
        serializer=dumper.serializer,
        deserializer=dumper.deserializer,
        serialize_checker=dumper.checker,
    )
    node = RaftNode(cfg, target)
    wait_for(lambda: node.status()["leader_ready"], 15, "single node to lead")
    return node


def _write(node: RaftNode, seqs: range) -> dict[int, bytes]:
    """Pipelined writes; returns {index: entry} once every one is acknowledged."""
    acked: dict[int, bytes] = {}
    done = threading.Semaphore(0)

    def cb(entry: bytes) -> Any:
        def on_result(result: Any, index: int | None, error: Any) -> None:
            if error is None and index is not None:
                acked[index] = entry
            done.release()

        return on_result

    for i in seqs:
        node.submit(b"e%d" % i, cb(b"e%d" % i))
    for _ in seqs:
        assert done.acquire(timeout=15), "a write was never acknowledged"
    assert len(acked) == len(seqs)
    return acked


def _crash_during_compaction(tmp_path: Path, freeze: Frozen) -> tuple[dict[int, bytes], Path]:
    """Write, dump, write more, compact; freeze at the crash point and copy the data dir."""
    dumper = Dumper()
    node = _node(tmp_path / "live", MemTarget(), dumper)
    try:
        acked = _write(node, range(300))
        node._obj.forceLogCompaction()
        assert dumper.started.wait(15), "no dump started"
        acked.update(_write(node, range(300, 500)))  # after the dump: only the journal has these
        dumper.finish.set()
        assert freeze.reached.wait(15), "the compaction never reached the crash point"
        # The tick thread is stopped inside the compaction: what is on disk
        # now is what a kill -9 at this point leaves behind.
        shutil.copytree(tmp_path / "live", tmp_path / "dead")
    finally:
        freeze.release.set()
        node.destroy()
    return acked, tmp_path / "dead"


def _restart_and_check(dead: Path, acked: dict[int, bytes]) -> RaftNode:
    target = MemTarget()
    node = _node(dead, target)
    st = node.status()
    assert st["last_log_index"] > max(acked), (st, max(acked))  # acked entries + its new no-op
    with open(node.config.dump_file, "rb") as f:
        dump_index = pickle.load(f)[0][1]
    replayed = {i: e for i, e in target.entries.items() if i in acked}
    expected = {i: e for i, e in acked.items() if i > dump_index}
    assert len(expected) >= 200 and replayed == expected  # every entry after the dump came back
    return node


@pytest.mark.parametrize("stage", ["partial", "written", "renamed"])
def test_node_killed_inside_compaction_keeps_every_entry_after_the_dump(
    tmp_path: Path, stage: str
) -> None:
    freeze = Frozen()
    rj.crash_hook = lambda s: freeze(s) if s == stage else None
    try:
        acked, dead = _crash_during_compaction(tmp_path, freeze)
    finally:
        rj.crash_hook = None
    node = _restart_and_check(dead, acked)
    try:
        node.submit_sync(b"after restart")
    finally:
        node.destroy()


def test_node_killed_between_the_dump_and_the_compaction_keeps_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj's own window: the dump is renamed in, the journal not yet compacted."""
    freeze = Frozen()
    real = AtomicFileJournal.deleteEntriesTo

    def frozen_before_compaction(self: Any, entry_to: int) -> None:
        freeze("before")
        real(self, entry_to)

    monkeypatch.setattr(AtomicFileJournal, "deleteEntriesTo", frozen_before_compaction)
    acked, dead = _crash_during_compaction(tmp_path, freeze)
    monkeypatch.undo()
    _restart_and_check(dead, acked).destroy()


def test_without_the_guard_a_node_killed_inside_compaction_loses_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The anomaly itself: pysyncobj's journal (no adoption, no alignment),
    killed after re-adding a few entries; the restarted node's log ends
    before entries it had acknowledged."""
    monkeypatch.setattr(_Replica, "caravan_before_start", lambda self: None)
    freeze = Frozen()

    def dying_delete_entries_to(self: Any, entry_to: int) -> None:
        kept = self._FileJournal__journal[entry_to:]
        self.clear()
        for entry in kept[:2]:  # pysyncobj's loop, killed after two entries
            self.add(*entry)
        freeze("re-adding")

    monkeypatch.setattr(FileJournal, "deleteEntriesTo", dying_delete_entries_to)
    acked, dead = _crash_during_compaction(tmp_path, freeze)
    monkeypatch.undo()
    monkeypatch.setattr(_Replica, "caravan_before_start", lambda self: None)
    node = _node(dead, MemTarget())
    try:
        assert node.status()["last_log_index"] < max(acked)
    finally:
        node.destroy()


def test_real_fsm_with_the_background_snapshotter_survives_a_kill_inside_compaction(
    tmp_path: Path,
) -> None:
    """The server's shape: fsm.machine.FSM (LMDB) with snapshot.raft_hooks'
    BackgroundSnapshotter (thread mode) through RaftConfig.serialize_checker.
    Killed after the dump, before the journal's rename: on restart the
    journal must still reach every applied entry, so the next write gets a
    new index instead of one the FSM already applied (and would skip)."""
    from fsm import messages as m
    from snapshot import BackgroundSnapshotter
    from tests.snapshot.support import T0, example_entries, new_fsm

    def encoded(seed: int, n: int, t: int) -> list[bytes]:
        return [
            m.encode_entry(body, time=T0 + t + i, rid=f"r{seed}-{i}")
            for i, (body, _, _, _) in enumerate(example_entries(seed=seed, n=n))
        ]

    def start(files: Path, store: Path, gate: threading.Event) -> tuple[RaftNode, Any, Any]:
        fsm = new_fsm(str(store))
        bg = BackgroundSnapshotter(fsm, str(files / "raft.dump"), mode="thread")

        def checker() -> int:  # hold the finished dump back until told (entries pile up after it)
            return bg.serialize_checker() if gate.is_set() else (1 if bg._state == 1 else 0)

        addr = f"127.0.0.1:{free_ports(1)[0]}"
        cfg = RaftConfig(
            self_address=addr,
            peers=[addr],
            data_dir=files,
            password="pw",
            serializer=bg.serializer,
            deserializer=bg.deserializer,
            serialize_checker=checker,
        )
        node = RaftNode(cfg, fsm)
        wait_for(lambda: node.status()["leader_ready"], 15, "single node to lead")
        return node, fsm, bg

    freeze = Frozen()
    gate = threading.Event()
    rj.crash_hook = lambda s: freeze(s) if s == "written" else None
    node, fsm, bg = start(tmp_path / "live", tmp_path / "store", gate)
    try:
        for e in encoded(7, 60, 0):
            node.submit_sync(e)
        node._obj.forceLogCompaction()
        wait_for(lambda: bg._state == 1, 15, "the background dump to start")
        assert bg.wait(15)
        after = [node.submit_sync(e)[1] for e in encoded(3, 30, 1000)]  # only the journal has these
        gate.set()
        assert freeze.reached.wait(15), "the compaction never reached the crash point"
        shutil.copytree(tmp_path / "live", tmp_path / "dead")
        shutil.copytree(tmp_path / "store", tmp_path / "dead-store")
    finally:
        rj.crash_hook = None
        freeze.release.set()
        node.destroy()
        fsm.close()
    assert min(after) > 0
    gate2 = threading.Event()
    gate2.set()
    node, fsm, _ = start(tmp_path / "dead", tmp_path / "dead-store", gate2)
    try:
        applied_before = fsm.applied_index
        assert applied_before >= max(after)
        assert node.status()["last_log_index"] > max(after)
        _, index = node.submit_sync(encoded(11, 1, 5000)[0])
        assert index > applied_before  # a new index: the FSM applies it, nothing is skipped
        wait_for(lambda: fsm.applied_index >= index, 10, "the new write to apply")
    finally:
        node.destroy()
        fsm.close()


def test_a_compaction_that_cannot_write_leaves_the_journal_as_it_was(tmp_path: Path) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=True)
    os.mkdir(str(tmp_path / "j") + rj.COMPACT_SUFFIX)  # the temp file cannot be created
    j.deleteEntriesTo(60)  # logged and skipped: a longer journal is always safe
    assert [tuple(j[i]) for i in range(len(j))] == old
    j.add(*_entries(1, start=101)[0])
    assert _on_disk(tmp_path / "j") == old + _entries(1, start=101)
    j._destroy()


def test_a_journal_that_cannot_be_reopened_after_the_rename_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _entries(100)
    j = _journal(tmp_path / "j", old, atomic=True)
    stopped: list[BaseException] = []
    j.on_switch_failure = stopped.append

    def no_more_files(*_: Any, **__: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(rj, "ResizableFile", no_more_files)
    with pytest.raises(JournalSwitchError):
        j.deleteEntriesTo(60)
    assert len(stopped) == 1 and isinstance(stopped[0], JournalSwitchError)
    assert _on_disk(tmp_path / "j") == old[60:]  # what a restart reads: complete
