"""The incremental state digest equals a full recomputation, whatever wrote the store.

``fsm.digest`` keeps a multiset hash of every record up to date in the FSM's
write transactions. These tests check it against ``digest(full=True)`` (every
record hashed again): after random logs (the FSM state machine of
``test_fsm_properties``, with a small journal and request expiry on), after
journal trimming and request expiry, after a snapshot restore, and on stores
whose stored sum cannot be trusted (an old data directory, a row from another
index).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from fsm import messages as m
from fsm.digest import DIGEST_KEY, pack, unpack
from fsm.journal import Retention
from fsm.keys import u64
from fsm.machine import FSM
from fsm.structs import MINUTE, SECOND
from snapshot import restore, save
from tests.fsm.support import Harness, make_node, sample_log
from tests.fsm.test_fsm_properties import FSMMachine


def _digests(fsm: FSM) -> tuple[tuple[str, int], tuple[str, int]]:
    return fsm.digest(), fsm.digest(full=True)


def _stored(fsm: FSM) -> tuple[int, bool, int]:
    """(index, trusted, sum) of the stored row; trusted only if it also reflects the applied index."""
    with fsm.read() as r:
        index, trusted, total = unpack(r.txn.get(DIGEST_KEY, db=r.dbs["meta"]))
        return index, trusted and index == r.applied_index, total


def _apply_sample(h: Harness, *, group: int = 3) -> None:
    for index, entry in sample_log():
        h.index = index
        h.fsm.apply(index, entry)
        if index % group == 0:
            h.fsm.commit()
    h.fsm.commit()


def test_a_new_store_is_trusted_and_stays_equal_to_a_full_scan() -> None:
    h = Harness.temp()
    try:
        _apply_sample(h)
        incremental, full = _digests(h.fsm)
        assert incremental == full
        index, trusted, _ = _stored(h.fsm)
        assert trusted and index == h.fsm.applied_index
    finally:
        h.destroy()


def test_the_digest_row_is_not_part_of_the_digest() -> None:
    h = Harness.temp()
    try:
        h.ok(m.NodeRegister(node=make_node("n1")))
        before = h.fsm.digest(full=True)
        with h.fsm.store.env.begin(write=True) as txn:
            txn.put(DIGEST_KEY, pack(h.fsm.applied_index, True, 12345), db=h.fsm.store.dbs["meta"])
        assert h.fsm.digest(full=True) == before
    finally:
        h.destroy()


def test_an_old_data_directory_is_scanned_once_then_kept_incrementally() -> None:
    """A store without the row (written by an older build): the first digest scans, the next commit stores it."""
    h = Harness.temp()
    try:
        _apply_sample(h)
        want = h.fsm.digest(full=True)
        with h.fsm.store.env.begin(write=True) as txn:
            txn.delete(DIGEST_KEY, db=h.fsm.store.dbs["meta"])
        h.reopen()
        assert h.fsm.digest() == want  # full scan (untrusted), correction kept in memory
        assert not _stored(h.fsm)[1]
        h.ok(m.NodeRegister(node=make_node("late")), rid="late")
        index, trusted, _ = _stored(h.fsm)
        assert trusted and index == h.fsm.applied_index
        incremental, full = _digests(h.fsm)
        assert incremental == full
    finally:
        h.destroy()


def test_a_row_from_another_index_is_not_trusted() -> None:
    """An older build moved the applied index without keeping the sum: the stale row is ignored."""
    h = Harness.temp()
    try:
        h.ok(m.NodeRegister(node=make_node("n1")))
        with h.fsm.store.env.begin(write=True) as txn:
            dbs = h.fsm.store.dbs
            txn.put(b"n2", b"written by an old build", db=dbs["nodes"])
            txn.put(b"applied_index", u64(h.fsm.applied_index + 1), db=dbs["meta"])
        h.reopen()
        h.index += 1
        assert not _stored(h.fsm)[1]
        incremental, full = _digests(h.fsm)
        assert incremental == full
        h.ok(m.NodeRegister(node=make_node("n3")))
        assert _stored(h.fsm)[1]
        assert _digests(h.fsm)[0] == _digests(h.fsm)[1]
    finally:
        h.destroy()


def test_journal_trimming_and_request_expiry_keep_the_sum() -> None:
    h = Harness.temp(retention=Retention(max_batches=3, max_bytes=4 << 10), request_ttl=MINUTE, request_min_entries=0)
    try:
        for i in range(40):
            h.ok(m.NodeRegister(node=make_node(f"n{i % 7}")), rid=f"r{i}", step=20 * SECOND, commit=i % 4 == 3)
        h.fsm.commit()
        with h.reader() as r:
            assert r.journal_trimmed() > 0
            assert r.request_result("r0") is None  # expired
        incremental, full = _digests(h.fsm)
        assert incremental == full and _stored(h.fsm)[1]
    finally:
        h.destroy()


def test_a_restored_snapshot_is_untrusted_then_correct() -> None:
    src = Harness.temp()
    dst = Harness.temp()
    tmp = tempfile.mkdtemp(prefix="caravan-digest-")
    try:
        _apply_sample(src)
        want = src.fsm.digest()
        path = os.path.join(tmp, "s.snap")
        save(src.fsm, path)
        dst.ok(m.NodeRegister(node=make_node("other")))
        restore(path, dst.fsm)
        assert not _stored(dst.fsm)[1]  # the source's row is dropped on restore
        assert dst.fsm.digest() == want == dst.fsm.digest(full=True)
        dst.index = dst.fsm.applied_index
        src.index = src.fsm.applied_index
        for h in (src, dst):
            h.time = max(h.time, h.fsm.last_time)
            h.ok(m.NodeRegister(node=make_node("after")), rid="after", time=h.time + SECOND)
        assert _stored(dst.fsm)[1]
        assert dst.fsm.digest() == src.fsm.digest() == dst.fsm.digest(full=True)
    finally:
        src.destroy()
        dst.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


class DigestMachine(FSMMachine):
    """The FSM state machine, with the digest checked against a full scan after every step.

    Requests expire here (no minimum age in entries), so the replays of the
    parent's teardown would not match; teardown checks the digest after a
    restart and after a snapshot restore instead.
    """

    @invariant()
    def digest_equals_a_full_scan(self) -> None:
        if self.a is None:
            return
        if self.a.fsm.request_min_entries:
            self.a.fsm.request_min_entries = 0
        incremental, full = _digests(self.a.fsm)
        assert incremental == full, "incremental digest drifted from the records"

    @rule(drop=st.booleans())
    def restore_own_snapshot(self, drop: bool) -> None:
        """A snapshot install of the replica's own state (or a lost digest row): the digest is found again."""
        a = self.a
        assert a is not None
        self.flush_batch()
        want = a.fsm.digest()
        tmp = tempfile.mkdtemp(prefix="caravan-digest-")
        try:
            if drop:
                with a.fsm.store.env.begin(write=True) as txn:
                    txn.delete(DIGEST_KEY, db=a.fsm.store.dbs["meta"])
            else:
                path = os.path.join(tmp, "s.snap")
                save(a.fsm, path)
                restore(path, a.fsm)
            assert not _stored(a.fsm)[1]
            assert a.fsm.digest() == want
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def teardown(self) -> None:
        a = self.a
        if a is None:
            return
        try:
            self.flush_batch()
            want = a.fsm.digest()
            a.reopen()
            assert a.fsm.digest() == want == a.fsm.digest(full=True)
        finally:
            a.destroy()


DigestMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("DIGEST_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
TestDigestMachine = DigestMachine.TestCase

