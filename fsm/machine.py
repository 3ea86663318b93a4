"""The replicated state machine: decode, dedupe, dispatch, journal, commit.

Invariants (DESIGN.md): apply is deterministic (time comes from the entry);
exactly once across restarts (``applied_index`` is written in the same LMDB
transaction as the effects, and older indexes are skipped); it never raises
for anything an entry contains; unknown types with the ignore flag are
skipped and other unknown types stop the node.

Group commit: ``apply`` works inside one pending write transaction that the
caller (the raft adapter, once per tick) ends with ``commit``. Entries are
not isolated in nested transactions (too slow): an entry rejected after it
wrote is undone by aborting the group and applying its earlier entries
again, after which ``apply`` commits the group itself. Committed state is
always a prefix of the applied entries, so this changes nothing for crash
recovery.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

import lmdb
import structlog

from fsm import codec, journal
from fsm.digest import DigestTxn, full_digest, hexdigest, stored
from fsm.errors import ApplyRejected, CodecError, FatalApplyError
from fsm.handlers import HANDLERS
from fsm.keys import SEP, u64
from fsm.messages import IGNORE_FLAG, Entry, MessageType, decode_entry
from fsm.store import (
    DEFAULT_MAP_SIZE,
    DIGEST_DBS,
    META_APPLIED,
    META_LAST_TIME,
    META_SCHEMA,
    STORE_SCHEMA,
    StateReader,
    StateStore,
)
from fsm.writer import StateWriter

_KNOWN_TYPES = frozenset(int(t) for t in MessageType)
_BATCH = MessageType.BATCH

log = structlog.get_logger("caravan.fsm")

DEFAULT_REQUEST_TTL = 10 * 60 * 1_000_000_000  # how long a retried request id is remembered
#: ...and for at least this many raft indices, whatever the entries' times
#: say: a leader's wall clock that steps forward by more than the TTL would
#: otherwise expire every remembered id at once, and the retries that follow
#: a leader change (exactly when clients resend) would apply a second time.
#: 100k indices last about 8 s at raw pysyncobj's peak entry rate (12k/s on
#: a 2-core machine; the leader batches client writes, so far fewer indices
#: than writes), minutes at ordinary rates; on an idle cluster they cost
#: about 15 MB of request rows.
DEFAULT_REQUEST_MIN_ENTRIES = 100_000

#: ``requests_by_time`` keys: u64(time) + IDS_OF_INDEX + u64(index), holding
#: the msgpack list of the request ids applied at that index. Rows written
#: before ids were noted per index have SEP there: u64(time) + SEP + id ->
#: u64(index). Both order by time first, so expiry takes them in turn.
IDS_OF_INDEX = b"\x01"
assert IDS_OF_INDEX != SEP

#: TEST ONLY -- a deliberate bug for jepsen_like's must-fail campaign
#: (tests/jepsen/test_must_fail.py). With ``=1`` in the environment of a
#: server, its FSM re-applies, after a restart, the entries it had already
#: applied (as if ``applied_index`` were not persisted and requests were not
#: deduplicated), breaking exactly-once: a replayed job registration bumps the
#: job's version again, so the restarted replica's digest diverges. Read once,
#: at construction, never inside apply. Never set it outside that test.
UNSAFE_REAPPLY_ENV = "CARAVAN_UNSAFE_SKIP_APPLIED_INDEX_CHECK"


@dataclass
class ApplyResult:
    index: int
    ok: bool
    value: dict[str, Any] = field(default_factory=dict)
    code: str = ""
    error: str = ""
    duplicate: bool = False  # a retried request id: this is the first attempt's result
    skipped: bool = False  # already applied before a restart, or an ignorable unknown type
    batch: list[ApplyResult] | None = None  # a Batch entry: each item's own result, in order

    def to_wire(self) -> dict[str, Any]:
        return {"index": self.index, "ok": self.ok, "value": self.value, "code": self.code, "error": self.error}


@dataclass
class _BatchItem:
    """An item of the batch being applied, as it went (for replaying the batch after a rollback)."""

    entry: bytes
    result: ApplyResult
    now: int | None  # the clock it was applied with (None: it did not decode)
    undone: bool = False  # rejected after writing: its writes were rolled back


@dataclass
class _Batch:
    index: int
    time: int
    items: list[_BatchItem] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)  # journal records of its applied items
    rids: list[bytes] = field(default_factory=list)  # request ids of its applied items (one time row at its end)
    rolled_back: bool = False


def _exit_on_fatal(exc: BaseException) -> NoReturn:
    log.critical("fatal apply error; stopping the node so it cannot diverge", error=str(exc))
    sys.stderr.write(f"caravan: fatal apply error, stopping: {exc}\n")
    sys.stderr.flush()
    os._exit(70)


class FSM:
    def __init__(
        self,
        path: str,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        retention: journal.Retention | None = None,
        request_ttl: int = DEFAULT_REQUEST_TTL,
        request_min_entries: int = DEFAULT_REQUEST_MIN_ENTRIES,
        on_fatal: Callable[[BaseException], Any] = _exit_on_fatal,
        sync: bool = False,
    ) -> None:
        self.store = StateStore(path, map_size=map_size, sync=sync)
        # Bumped when ``reopen`` swaps the store: a read that failed meanwhile
        # failed because of the swap (see ``read_interrupted``).
        self.generation = 0
        self.reopening = False
        self.retention = retention or journal.Retention()
        self.request_ttl = request_ttl
        self.request_min_entries = request_min_entries
        self.on_fatal = on_fatal
        self._txn: DigestTxn | None = None
        # (correction, generation): true digest - stored sum, found by a full
        # scan of an untrusted store (see fsm.digest); the next group stores it.
        self._digest_fix: tuple[int, int] | None = None
        self._scan_lock = threading.Lock()
        self._journal: journal.Appender | None = None  # the open transaction's, shared by its entries
        self._touched: dict[str, int] = {}
        # Entries applied in the open group, and (applied, last_time) before
        # it: a rejected entry that already wrote is undone by replaying them.
        self._pending: list[tuple[int, bytes]] = []
        self._group_start = (0, 0)
        self._batch: _Batch | None = None  # the Batch entry being applied
        self._listeners: list[Callable[[int], None]] = []
        # (time, index) <= the oldest remembered request's (None: unknown).
        # While either is still young enough nothing can expire, so
        # ``_remember`` skips its scan. Reset whenever the store may hold rows
        # it did not see go in (abort, rollback, reopen).
        self._oldest_request: tuple[int, int] | None = None
        with self.store.read() as r:
            self._applied = r.applied_index
            self._last_time = r.last_time
            schema = r.meta_int(META_SCHEMA)
        # TEST ONLY (see UNSAFE_REAPPLY_ENV): entries up to this index are applied again.
        self._unsafe_reapply_upto = self._applied if os.environ.get(UNSAFE_REAPPLY_ENV) == "1" else 0
        if self._unsafe_reapply_upto:
            log.warning("TEST ONLY: re-applying entries after restart (exactly-once disabled)", env=UNSAFE_REAPPLY_ENV)
        if schema not in (0, STORE_SCHEMA):
            raise FatalApplyError(f"store schema {schema} is newer than this build reads ({STORE_SCHEMA})")

    # -- public --------------------------------------------------------------
    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def last_time(self) -> int:
        return self._last_time

    def apply(self, index: int, entry: bytes) -> ApplyResult:
        """Apply one committed entry inside the pending write transaction. Never raises."""
        try:
            if index <= self._applied and index > self._unsafe_reapply_upto:
                return ApplyResult(index, True, skipped=True)
            return self._apply(index, entry)
        except FatalApplyError as exc:
            self._abort()
            self.on_fatal(exc)
            raise
        except lmdb.Error as exc:  # disk full, map full, I/O: not deterministic
            self._abort()
            self.on_fatal(FatalApplyError(f"storage failure at index {index}: {exc}"))
            raise

    def commit(self) -> None:
        """End the group: write applied index, time and table indexes; commit."""
        txn = self._txn
        if txn is None:
            return
        try:
            self._journal.flush()  # type: ignore[union-attr]
            meta = self.store.dbs["meta"]
            txn.put(META_APPLIED, u64(self._applied), db=meta)
            txn.put(META_LAST_TIME, u64(self._last_time), db=meta)
            txn.put(META_SCHEMA, u64(STORE_SCHEMA), db=meta)
            index_db = self.store.dbs["index"]
            for table, idx in self._touched.items():
                txn.put(table.encode(), u64(idx), db=index_db)
            txn.seal(self._applied)
            txn.commit()
        except lmdb.Error as exc:
            self._txn = None
            self.on_fatal(FatalApplyError(f"commit failed: {exc}"))
            raise
        self._txn = None
        self._touched = {}
        self._pending = []
        if txn.trusted and self._digest_fix is not None:
            self._digest_fix = None  # stored now
        for listener in list(self._listeners):
            listener(self._applied)

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[ApplyResult]:
        """Apply and commit a group of entries (tests, benchmarks, replay tools)."""
        results = [self.apply(i, e) for i, e in entries]
        self.commit()
        return results

    def on_commit(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(applied_index)`` after every commit (blocking queries, journal)."""
        self._listeners.append(listener)

    def read_interrupted(self, generation: int) -> bool:
        """Whether a read begun at ``generation`` may have failed only because the store was swapped."""
        return self.reopening or self.generation != generation

    @contextmanager
    def read(self) -> Iterator[StateReader]:
        """A consistent read of committed state (from any thread)."""
        with self.store.read() as r:
            yield r

    def digest(self, *, full: bool = False) -> tuple[str, int]:
        """(state digest, index it reflects). Commits a pending group first (same thread as apply)."""
        self.commit()
        return self.committed_digest(full=full)

    def committed_digest(self, *, full: bool = False) -> tuple[str, int]:
        """(state digest, index) of committed state, from any thread: the stored sum when it is trusted.

        Otherwise (an old data directory, a restored snapshot; or ``full``)
        every record is hashed once. The difference from the stored sum holds
        for every later state of this store (writes keep the sum in step), so
        it is kept and the next group commit stores the corrected sum: later
        calls are cheap again, and no write transaction is opened here.
        """
        if not full:
            found = self._stored_digest()
            if found is not None:
                return found
        with self._scan_lock:  # one scan at a time: callers waiting here then find its result
            found = None if full else self._stored_digest()
            if found is not None:
                return found
            generation = self.generation
            with self.store.read() as r:
                applied = r.applied_index
                trusted, total = stored(r.txn, r.dbs["meta"], applied)
                true = full_digest(r.txn, r.dbs, DIGEST_DBS)
            if not trusted and generation == self.generation:
                self._digest_fix = (true - total, generation)
            return hexdigest(true), applied

    def _stored_digest(self) -> tuple[str, int] | None:
        """(digest, index) from the stored sum if trusted, or corrected by a scan's finding; else None."""
        generation = self.generation
        with self.store.read() as r:
            applied = r.applied_index
            trusted, total = stored(r.txn, r.dbs["meta"], applied)
            if trusted:
                return hexdigest(total), applied
            fix = self._digest_fix
            if fix is not None and fix[1] == generation:
                return hexdigest(total + fix[0]), applied
        return None

    def close(self) -> None:
        self.commit()
        self.store.close()

    def reopen(self, replace: Callable[[str], None] | None = None) -> None:
        """Close the store, let ``replace(path)`` swap its files, and open it again.

        Snapshot restore swaps a fully written LMDB file in with one rename
        while the environment is closed (LMDB must not be opened twice in one
        process). Applied index and time are re-read from whatever is there
        afterwards; if ``replace`` raises, the old store is reopened unchanged
        and the error propagates. Reads still open on the old environment fail.
        """
        self.commit()
        path = self.store.path
        map_size = self.store.env.info()["map_size"]
        sync = self.store.env.flags()["sync"]
        self.reopening = True
        self.generation += 1
        self.store.close()
        try:
            if replace is not None:
                replace(path)
        finally:
            self.store = StateStore(path, map_size=map_size, sync=sync)
            self.generation += 1
            self.reopening = False
            self._oldest_request = None
            self._digest_fix = None
            with self.store.read() as r:
                self._applied = r.applied_index
                self._last_time = r.last_time
        for listener in list(self._listeners):
            listener(self._applied)

    # -- internals -----------------------------------------------------------
    def _begin(self) -> DigestTxn:
        if self._txn is None:
            txn = self._txn = DigestTxn(self.store.begin_write(), self.store.dbs, self._applied, DIGEST_DBS)
            fix = self._digest_fix
            if fix is not None and not txn.trusted and fix[1] == self.generation:
                txn.total += fix[0]
                txn.trusted = True
            self._journal = journal.Appender(self._txn, self.store.dbs, self.retention)
            self._group_start = (self._applied, self._last_time)
        return self._txn

    def _abort(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
            self._touched = {}
            self._pending = []
            self._oldest_request = None
            with self.store.read() as r:
                self._applied, self._last_time = r.applied_index, r.last_time

    def _consume(self, index: int, entry: bytes, result: ApplyResult, now: int | None = None) -> ApplyResult:
        self._applied = index
        batch = self._batch
        if batch is None:
            self._pending.append((index, entry))
        else:
            batch.items.append(_BatchItem(entry, result, now))
        return result

    def _rollback(self) -> DigestTxn:
        """Undo a rejected entry's writes: abort the group and apply its entries again.

        Entries are not applied in nested transactions (LMDB copies every page
        an entry touches into a child); rejections after a write are rare, so
        undoing the whole group and replaying it (deterministically: the same
        results) is cheaper overall. The caller commits right after (after the
        batch, for an item of one), so a group is replayed at most once per
        such rejection. Inside a batch, the items before the rejected one are
        replayed too; an earlier item that was itself undone is not applied
        again, only its answer remembered, as the first time.
        """
        pending = self._pending
        batch, self._batch = self._batch, None
        assert self._txn is not None
        self._txn.abort()
        self._txn = None
        self._touched = {}
        self._pending = []
        self._oldest_request = None
        self._applied, self._last_time = self._group_start
        txn = self._begin()
        for index, entry in pending:
            self._apply(index, entry)
        if batch is not None:
            self._last_time = max(self._last_time, batch.time)
            items, batch.items, batch.records, batch.rids = batch.items, [], [], []
            self._batch = batch
            for item in items:
                if item.undone:
                    self._redo_undone(batch.index, item)
                else:
                    self._apply(batch.index, item.entry)
        return txn

    def _redo_undone(self, index: int, item: _BatchItem) -> None:
        """Replay a batch item that was rejected after writing: its answer and clock, not its writes."""
        assert item.now is not None and self._txn is not None
        self._last_time = max(self._last_time, item.now)
        rid = decode_entry(item.entry).rid
        if rid:
            self._remember(self._txn, rid, index, item.now, item.result)
        self._consume(index, item.entry, item.result, item.now)
        self._batch.items[-1].undone = True  # type: ignore[union-attr]

    def _apply(self, index: int, entry: bytes) -> ApplyResult:
        """Apply one entry (or an item of a Batch) in the group's transaction.

        The hot path: every replica runs it for every entry, so the common
        case (a known type, a new request, accepted) stays inline here and
        only ``_run`` is a call; the rare cases have helpers of their own.
        """
        txn = self._txn
        if txn is None:
            txn = self._begin()
        if not entry or entry[0] not in _KNOWN_TYPES:
            return self._apply_unknown(index, entry)
        try:
            decoded = decode_entry(entry)
        except CodecError as exc:
            return self._consume(index, entry, ApplyResult(index, False, code="bad_request", error=str(exc)))
        if decoded.type is _BATCH and self._batch is None:
            return self._apply_batch(index, entry, decoded)
        now = self._last_time
        if decoded.time > now:
            now = self._last_time = decoded.time
        rid = decoded.rid
        if rid and index > self._unsafe_reapply_upto:
            prior = txn.get(rid.encode(), None, self.store.dbs["requests"])
            if prior is not None:
                data = codec.unpack(prior)
                return self._consume(index, entry, ApplyResult(duplicate=True, **data), now)
        result = self._run(txn, index, now, decoded)
        if not result.ok and txn.wrote:
            return self._undo(index, entry, decoded, now, result)
        if rid:
            self._remember(txn, rid, index, now, result)
        return self._consume(index, entry, result, now)

    def _apply_unknown(self, index: int, entry: bytes) -> ApplyResult:
        """An entry without a type byte, or of a type this build does not know.

        Empty is malformed (not an unknown type from a newer version): an
        error result. An unknown type with the ignore flag is skipped; any
        other would make this replica diverge from newer ones, so it is fatal.
        """
        if not entry:
            return self._consume(index, entry, ApplyResult(index, False, code="bad_request", error="empty entry"))
        code = entry[0]
        if code & IGNORE_FLAG:
            log.warning("skipping unknown entry type with the ignore flag", index=index, type=code)
            return self._consume(index, entry, ApplyResult(index, True, skipped=True))
        raise FatalApplyError(
            f"unknown entry type {code} at index {index}; upgrade this server before it can apply the log"
        )

    def _run(self, txn: DigestTxn, index: int, now: int, decoded: Entry) -> ApplyResult:
        """Run the entry's handler; if it succeeds, journal its records and note the tables it touched.

        A rejection, or a bug in a handler (the same on every replica),
        becomes an error result; a storage error propagates (it is fatal).
        """
        writer = StateWriter(self.store, txn, index, now)
        try:
            value = HANDLERS[decoded.type](writer, decoded.body)
            writer.finish()
            records = writer.records
            batch = self._batch
            if batch is None:
                self._journal.append(index, records)  # type: ignore[union-attr]
            else:  # one journal batch per raft index: the batch writes its items' records at its end
                batch.records.extend(records)
            result = ApplyResult(index, True, value=value)
            touched = self._touched
            for table in writer.touched:
                touched[table] = index
            if records:
                touched["journal"] = index
        except ApplyRejected as exc:
            result = ApplyResult(index, False, code=exc.code, error=exc.message)
        except lmdb.Error:
            raise
        except Exception as exc:  # a bug in a handler: the same on every replica
            log.error("apply handler failed", index=index, type=decoded.type.name, error=repr(exc))
            result = ApplyResult(index, False, code="internal", error=f"apply failed: {exc!r}")
        return result

    def _undo(self, index: int, entry: bytes, decoded: Entry, now: int, result: ApplyResult) -> ApplyResult:
        """Finish an entry that was rejected after it wrote: roll its writes back, keep its answer.

        Its clock and request id still count (a retry gets the same
        rejection). Outside a batch the replayed group is committed at once;
        a batch's item is marked undone and the batch commits at its end.
        """
        txn = self._rollback()
        self._last_time = max(self._last_time, decoded.time)
        if decoded.rid:
            self._remember(txn, decoded.rid, index, now, result)
        self._consume(index, entry, result, now)
        if self._batch is None:
            self.commit()
        else:
            self._batch.items[-1].undone = True
            self._batch.rolled_back = True
        return result

    def _apply_batch(self, index: int, entry: bytes, decoded: Entry) -> ApplyResult:
        """Apply a leader's batch of client writes at one index, each item on its own.

        Items keep their own request ids (dedupe), times, results and
        rejections. Their journal records form the index's one journal batch.
        A crash can only lose the whole batch (it is one raft entry; the group
        is not committed inside it), which raft then re-applies.
        """
        self._last_time = max(self._last_time, decoded.time)
        batch = self._batch = _Batch(index, decoded.time)
        results = []
        try:
            for item in decoded.body.entries:
                results.append(self._apply(index, item))
        finally:
            self._batch = None
        txn = self._txn
        assert txn is not None
        if batch.rids:
            self._note_requests(txn, index, self._last_time, batch.rids)
        if batch.records:
            self._journal.append(index, batch.records)  # type: ignore[union-attr]
            self._touched["journal"] = index
        # The items' results are in ``batch``; nothing reads them as one wire
        # map (building one cost about 0.3 us a registration, on every server).
        result = ApplyResult(index, True, batch=results)
        self._consume(index, entry, result)
        if batch.rolled_back:
            self.commit()
        return result

    def _remember(self, txn: DigestTxn, rid: str, index: int, now: int, result: ApplyResult) -> None:
        """Keep a request's result so a retry returns it instead of re-applying.

        The ids of one raft index share one row in ``requests_by_time``: a
        Batch's items note theirs at its end (one put for all of them; a row
        per item cost every server about 0.7 us a registration).
        """
        rid_key = rid.encode()
        txn.put(rid_key, codec.pack(result.to_wire()), db=self.store.dbs["requests"])
        batch = self._batch
        if batch is not None:
            batch.rids.append(rid_key)
        else:
            self._note_requests(txn, index, now, [rid_key])

    def _note_requests(self, txn: DigestTxn, index: int, now: int, rids: list[bytes]) -> None:
        """Note when the requests of ``index`` were applied, and forget the expired ones.

        An id is forgotten once it is both older than ``request_ttl`` (by the
        entries' times) and more than ``request_min_entries`` indices old.
        Rows are ordered by time, which never goes back along the log, so
        the oldest row by time is also the oldest by index. A Batch's row
        takes its newest item's time: its ids are kept a little longer, never
        shorter.
        """
        dbs = self.store.dbs
        txn.put(u64(now) + IDS_OF_INDEX + u64(index), codec.pack(rids), db=dbs["requests_by_time"])
        cutoff = now - self.request_ttl
        young_from = index - self.request_min_entries
        oldest = self._oldest_request
        if oldest is not None and (cutoff <= oldest[0] <= now or oldest[1] > young_from):
            return  # still a lower bound (rows since are newer), and nothing is old enough to expire
        self._oldest_request = None
        cursor = txn.cursor(db=dbs["requests_by_time"])
        while cursor.first():
            k = cursor.key()
            since = int.from_bytes(k[:8], "big")
            per_index = k[8:9] == IDS_OF_INDEX
            if per_index:
                at = int.from_bytes(k[9:], "big")
            else:  # a row of one id, written before ids were noted per index: key(now, rid) -> index
                at = int.from_bytes(cursor.value(), "big")  # 0 in rows written before the index was kept
            if since >= cutoff or at > young_from:
                self._oldest_request = (since, at)
                break
            ids = codec.unpack(cursor.value()) if per_index else [k[9:]]
            for rid_key in ids:
                txn.delete(rid_key, db=dbs["requests"])
            txn.cursor_delete(cursor, dbs["requests_by_time"])
