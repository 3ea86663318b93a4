"""The numbered change journal, written by apply.

Each applied entry's change records form one batch keyed by its raft index,
written in the same transaction as the state change. Retention is trimmed
inside apply from the retention settings (cluster-wide constants), so every
replica holds the identical journal; it is part of the state digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lmdb

from fsm.digest import cursor_delete
from fsm.keys import from_u64, u64
from fsm.store import META_JOURNAL_BYTES, META_JOURNAL_TRIMMED


@dataclass(frozen=True)
class Retention:
    """Bounds of the journal window. Must be identical on every server."""

    max_batches: int = 100_000
    max_bytes: int = 256 << 20


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def append(txn: lmdb.Transaction, dbs: dict[str, Any], index: int, records: list, retention: Retention) -> None:
    """Write one batch and trim the oldest batches past the retention bounds.

    ``records`` are the entry's change records, each already packed (see
    ``StateWriter.records``); the batch is their msgpack array.

    The highest trimmed index is kept in ``meta`` (``journal_trimmed``): the
    oldest retained batch alone cannot tell a subscriber at index N whether
    batches after N were trimmed (indexes without records have no batch), so
    followers compare N with this mark to know they must reset.
    """
    appender = Appender(txn, dbs, retention)
    appender.append(index, records)
    appender.flush()


class Appender:
    """``append`` for every entry of one write transaction (the FSM's group).

    The journal's byte total (in ``meta``) and batch count are read at the
    first append and kept here, and the byte total is written once, by
    ``flush`` before the transaction commits, instead of a read, a count and
    a write per entry. Nothing else reads them inside the transaction, so the
    committed rows are the same as ``append``'s for each entry in turn.
    """

    __slots__ = ("_put", "_get", "_txn", "_journal", "_meta", "_retention", "_size", "_count")

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, Any], retention: Retention) -> None:
        self._txn = txn
        self._put = txn.put
        self._get = txn.get
        self._journal, self._meta = dbs["journal"], dbs["meta"]
        self._retention = retention
        self._size = -1  # not read yet: nothing appended in this transaction
        self._count = 0

    def append(self, index: int, records: list) -> None:
        if not records:
            return
        journal = self._journal
        raw = _array_header(len(records)) + b"".join(records)
        size = self._size
        if size < 0:
            size_raw = self._get(META_JOURNAL_BYTES, None, self._meta)
            size = 0 if size_raw is None else from_u64(size_raw)
            self._count = self._txn.stat(journal)["entries"]
        k = u64(index)
        if self._put(k, raw, True, False, False, journal):  # a new batch (overwrite=False)
            self._count += 1
        else:  # the index already has a batch: replaced, the count stays
            self._put(k, raw, True, True, False, journal)
        size += len(raw)
        count = self._count
        retention = self._retention
        if count > retention.max_batches or size > retention.max_bytes:
            cursor = self._txn.cursor(db=journal)
            cursor.first()
            trimmed = 0
            while (count > retention.max_batches or size > retention.max_bytes) and count > 1:
                trimmed = from_u64(cursor.key())
                size -= len(cursor.value())
                cursor_delete(self._txn, cursor, journal)
                count -= 1
            if trimmed:
                self._put(META_JOURNAL_TRIMMED, u64(trimmed), True, True, False, self._meta)
            self._count = count
        self._size = size

    def flush(self) -> None:
        """Write the byte total, if anything was appended (before the transaction commits)."""
        if self._size >= 0:
            self._put(META_JOURNAL_BYTES, u64(self._size), True, True, False, self._meta)
