"""The state digest, kept up to date by every write instead of recomputed by a full scan.

Replicas compare digests to prove they converged (``debug digest``, the
fault harness). Hashing the whole store in key order took 4.9 s at 1M
objects, so the digest is a multiset hash instead: the sum, mod 2**256, of a
keyed BLAKE2b of every record ``(db name, key, value)`` of the databases it
covers (``fsm.store.DIGEST_DBS``: the object tables and the system state,
not the derived indexes and journal, whose hashing cost more than the rest
of apply did).
A sum does not depend on order, so each write can subtract the hash of the
record it replaces and add the new one; the result equals a full
recomputation (``full_digest``) at every applied index, on every replica.

``DigestTxn`` wraps the FSM's write transaction and does that bookkeeping
for every put, replace, pop and delete (and ``cursor_delete`` for the cursor
deletes of journal trimming and request expiry). It is the only wrapper on
the write path: it also notes whether the current entry wrote (``wrote``,
which the FSM checks to know whether a rejected entry needs a rollback), so
each write passes one Python layer, not two. ``seal`` stores the sum in
``meta`` under ``DIGEST_KEY`` (a row that is itself left out of the sum),
with the applied index it reflects and whether it is *trusted*: a store
written by a build that did not keep the sum (an old data directory: the
index no longer matches) or freshly restored from a snapshot (restore drops
the row) is not. The sum is still maintained from then on, so a full scan
at any later read transaction yields a correction (true - stored) that stays
valid for every later state; ``FSM.committed_digest`` computes it once and
stores the corrected, trusted sum.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import lmdb

#: Row of ``meta`` holding u64(applied index) | trusted (1 byte) | sum (32 bytes, little-endian).
DIGEST_KEY = b"state_digest"
MOD = 1 << 256
_KEY = b"caravan-state-digest-v1"
_TRUSTED = b"\x01"


def _base(name: str) -> Any:
    """A keyed BLAKE2b that has absorbed the db name: each record's hash is a copy of it plus the record."""
    h = hashlib.blake2b(digest_size=32, key=_KEY)
    h.update(name.encode() + b"\x00")
    return h


#: 4-byte lengths of the usual key sizes, precomputed (``to_bytes`` per record cost ~10% of a hash).
_LENGTHS = [n.to_bytes(4, "big") for n in range(1024)]


def record_hash(base: Any, key: bytes, value: bytes) -> int:
    """Hash of one record: value, key, then the key's length (so value|key splits are unambiguous)."""
    h = base.copy()
    h.update(value)
    h.update(key)
    n = len(key)
    h.update(_LENGTHS[n] if n < 1024 else n.to_bytes(4, "big"))
    return int.from_bytes(h.digest(), "little")


def pack(index: int, trusted: bool, total: int) -> bytes:
    return index.to_bytes(8, "big") + (_TRUSTED if trusted else b"\x00") + (total % MOD).to_bytes(32, "little")


def unpack(raw: bytes | None) -> tuple[int, bool, int]:
    """(index, trusted, sum) of a stored digest row; an absent or malformed row is (0, False, 0)."""
    if raw is None or len(raw) != 41:
        return 0, False, 0
    return int.from_bytes(raw[:8], "big"), raw[8:9] == _TRUSTED, int.from_bytes(raw[9:], "little")


def stored(txn: lmdb.Transaction, meta_db: Any, applied: int) -> tuple[bool, int]:
    """(trusted, sum) as stored. Untrusted unless the row is marked so *and* reflects ``applied``
    (a build that does not keep the sum moves the applied index but not this row)."""
    index, trusted, total = unpack(txn.get(DIGEST_KEY, None, meta_db))
    return trusted and index == applied, total


def _empty(txn: lmdb.Transaction, dbs: Iterable[Any]) -> bool:
    return all(txn.stat(db)["entries"] == 0 for db in dbs)


def hexdigest(total: int) -> str:
    return (total % MOD).to_bytes(32, "big").hex()


def full_digest(txn: lmdb.Transaction, dbs: dict[str, Any], names: Iterable[str]) -> int:
    """The sum recomputed from every record (the reference the incremental sum must equal)."""
    total = 0
    for name in names:
        base = _base(name)
        copy = base.copy
        skip = DIGEST_KEY if name == "meta" else None
        for k, v in txn.cursor(db=dbs[name]).iternext():
            if k == skip:
                continue
            h = copy()
            h.update(v)
            h.update(k)
            n = len(k)
            h.update(_LENGTHS[n] if n < 1024 else n.to_bytes(4, "big"))
            total += int.from_bytes(h.digest(), "little")
    return total % MOD


class DigestTxn:
    """The FSM's write transaction: keeps the digest sum and the entry's ``wrote`` flag in step with every write.

    One object sees every write of the group transaction, so each write pays
    for one wrapper call: the digest's bookkeeping and the write tracking
    that used to be a second wrapper (``StateWriter`` resets ``wrote`` for each
    entry; a rejected entry that wrote nothing needs no rollback, the common
    case). Reads (``get``, ``cursor``, ``stat``) are the transaction's own
    bound methods, at no cost. Cursors are for reading: a delete through one
    must go through ``cursor_delete``. Writes take the replaced value from
    LMDB itself (``replace``/``pop`` return it), so a write costs one LMDB
    call plus a hash of each of the old and new records; rewriting a record
    with the bytes it already holds (index links, the schema row) costs no
    hash. ``cursors`` caches one read cursor per db for the writer's key
    probes (opening one costs about as much as a probe; LMDB keeps a write
    transaction's cursors valid across its writes).
    """

    __slots__ = (
        "txn",
        "get",
        "cursor",
        "stat",
        "_replace",
        "_put",
        "_pop",
        "_bases",
        "_meta",
        "total",
        "trusted",
        "wrote",
        "cursors",
    )

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, Any], applied: int, covered: Iterable[str]) -> None:
        self.txn = txn
        self.get = txn.get
        self.cursor = txn.cursor
        self.stat = txn.stat
        self._replace = txn.replace
        self._put = txn.put
        self._pop = txn.pop
        self._bases = {dbs[name]: _base(name) for name in covered}  # a db not here is written unhashed
        self._meta = dbs["meta"]
        self.wrote = False
        self.cursors: dict[str, lmdb.Cursor] = {}
        self.trusted, self.total = stored(txn, self._meta, applied)
        if not self.trusted and not self.total and _empty(txn, dbs.values()):
            self.trusted = True  # a new store: the sum of nothing is 0

    def _hash(self, db: Any, key: bytes, value: bytes) -> int:
        return record_hash(self._bases[db], key, value)

    def put(
        self, key: bytes, value: bytes, dupdata: bool = True, overwrite: bool = True, append: bool = False, db: Any = None
    ) -> bool:
        """``Transaction.put``, keeping the sum (the hot path: ``record_hash`` written out, no calls)."""
        self.wrote = True
        base = self._bases.get(db)
        if base is None:
            return self._put(key, value, dupdata, overwrite, append, db)
        if not overwrite or append:
            if not self._put(key, value, dupdata, overwrite, append, db):
                return False
            old = None  # a new key: nothing replaced
        else:
            old = self._replace(key, value, db)
            if old == value:
                return True
        n = len(key)
        tail = _LENGTHS[n] if n < 1024 else n.to_bytes(4, "big")
        h = base.copy()
        h.update(value)
        h.update(key)
        h.update(tail)
        delta = int.from_bytes(h.digest(), "little")
        if old is not None:
            h = base.copy()
            h.update(old)
            h.update(key)
            h.update(tail)
            delta -= int.from_bytes(h.digest(), "little")
        self.total += delta
        return True

    def replace(self, key: bytes, value: bytes, db: Any = None) -> bytes | None:
        self.wrote = True
        old = self._replace(key, value, db)
        if old != value and db in self._bases:
            self.total += self._hash(db, key, value) - (0 if old is None else self._hash(db, key, old))
        return old

    def pop(self, key: bytes, db: Any = None) -> bytes | None:
        self.wrote = True
        old = self._pop(key, db)
        if old is not None and db in self._bases:
            self.total -= self._hash(db, key, old)
        return old

    def delete(self, key: bytes, value: bytes = b"", db: Any = None) -> bool:
        """Delete ``key`` (``value`` is ignored: no database here keeps duplicates)."""
        return self.pop(key, db) is not None

    def cursor_delete(self, cursor: lmdb.Cursor, db: Any) -> None:
        """Delete the record under ``cursor`` (opened on ``db``), keeping the sum."""
        self.wrote = True
        if db in self._bases:
            key, value = cursor.item()
            self.total -= self._hash(db, key, value)
        cursor.delete()

    def seal(self, applied: int) -> None:
        """Store the sum for ``applied`` (just before commit; the row is not part of the sum)."""
        self._put(DIGEST_KEY, pack(applied, self.trusted, self.total), True, True, False, self._meta)

    def commit(self) -> None:
        self.txn.commit()

    def abort(self) -> None:
        self.txn.abort()


def cursor_delete(txn: Any, cursor: lmdb.Cursor, db: Any) -> None:
    """Delete under ``cursor`` through ``txn``'s digest bookkeeping, if it keeps one."""
    if isinstance(txn, DigestTxn):
        txn.cursor_delete(cursor, db)
    else:
        cursor.delete()
