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
    if not records:
        return
    journal, meta = dbs["journal"], dbs["meta"]
    raw = _array_header(len(records)) + b"".join(records)
    txn.put(u64(index), raw, db=journal)
    size_raw = txn.get(META_JOURNAL_BYTES, db=meta)
    size = (0 if size_raw is None else from_u64(size_raw)) + len(raw)
    count = txn.stat(journal)["entries"]
    if count > retention.max_batches or size > retention.max_bytes:
        cursor = txn.cursor(db=journal)
        cursor.first()
        trimmed = 0
        while (count > retention.max_batches or size > retention.max_bytes) and count > 1:
            trimmed = from_u64(cursor.key())
            size -= len(cursor.value())
            cursor.delete()
            count -= 1
        if trimmed:
            txn.put(META_JOURNAL_TRIMMED, u64(trimmed), db=meta)
    txn.put(META_JOURNAL_BYTES, u64(size), db=meta)
