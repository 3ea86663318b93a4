"""Following the change journal from inside a process: the cursor API for caches.

A cache that is derived from the state (per-node usage for placement, say)
should not rescan a table on every use, and must never drift from the state
it was derived from. It follows the journal instead, the way Protean's
caches follow its change journal:

* the cache remembers the last raft index it reflects (``Cursor.index``);
* ``catch_up(reader)`` applies only the batches after that index, read in
  the *same* read transaction as ``reader``, so afterwards the cache equals a
  from-scratch build at exactly ``reader.applied_index``;
* when the batches it needs are gone (retention trimmed past it — the
  journal's reset-required case — or the store was replaced by an older one
  after a snapshot restore), it rebuilds from that same read transaction,
  which is a known index, and carries on from there.

A cache implements ``Follower`` (``rebuild`` + ``apply``) and owns a
``Cursor``. Nothing here touches apply: caches read committed state only, so a
slow cache can never slow the FSM down.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fsm.store import StateReader

# A change record as the journal stores it: [topic, type, key, object-or-None].
Record = Sequence[Any]


class Follower(Protocol):
    """What a journal-driven cache provides to its cursor."""

    def rebuild(self, reader: StateReader) -> None:
        """Forget everything and build from the state ``reader`` sees."""

    def apply(self, index: int, records: Sequence[Record]) -> None:
        """Apply one batch (already filtered to the cursor's topics)."""


class Source(Protocol):
    """Anything with a consistent ``read()`` context: ``FSM`` or ``StateStore``."""

    def read(self) -> Any: ...


@dataclass
class CursorStats:
    """Counters for tests and benchmarks: how a cache kept up."""

    batches: int = 0
    records: int = 0
    rebuilds: int = 0


class Cursor:
    """The journal position of one ``Follower``; safe to use from several threads.

    ``topics`` limits which records reach ``Follower.apply`` (batches left
    empty by the filter are skipped, but the position still advances).

    A follower owns its cursor (``self.cursor = Cursor(self)``), so the
    cursor holds it weakly: a strong reference back would make a cycle, and
    a follower dropped by its owner (a leader's lifecycle and placement
    index when its term ends) would wait for the collector's full pass
    instead of being freed at once. At 1M allocs that pass met 2.4 million
    objects and stopped every thread, raft's tick thread included, for 1.3 s.
    """

    def __init__(self, follower: Follower, topics: Collection[str] | None = None) -> None:
        self._follower = weakref.ref(follower)
        self.topics = frozenset(topics) if topics is not None else None
        self.lock = threading.RLock()
        self.stats = CursorStats()
        self._index: int | None = None  # None: never built

    @property
    def follower(self) -> Follower:
        follower = self._follower()
        if follower is None:
            raise ReferenceError("the cursor's follower is gone (a cursor is kept by the follower it moves)")
        return follower

    @property
    def index(self) -> int | None:
        """The raft index the follower reflects (None before the first catch-up)."""
        return self._index

    def needs_rebuild(self, reader: StateReader) -> bool:
        """Whether the journal in ``reader`` can no longer bring the follower forward."""
        index = self._index
        return index is None or index > reader.applied_index or reader.journal_trimmed() > index

    def catch_up(self, reader: StateReader) -> int:
        """Bring the follower to exactly ``reader.applied_index``; return that index."""
        with self.lock:
            target = reader.applied_index
            if self._index == target:
                return target
            try:
                if self.needs_rebuild(reader):
                    self.follower.rebuild(reader)
                    self.stats.rebuilds += 1
                else:
                    self._apply_after(reader, self._index or 0)
            except BaseException:
                # A half-applied batch would leave the cache wrong for good:
                # force a rebuild next time instead.
                self._index = None
                raise
            self._index = target
            return target

    def refresh(self, source: Source) -> int:
        """Catch up with the newest committed state of ``source`` (an FSM or a StateStore)."""
        with source.read() as reader:
            return self.catch_up(reader)

    def reset(self) -> None:
        """Forget the position: the next catch-up rebuilds."""
        with self.lock:
            self._index = None

    def _apply_after(self, reader: StateReader, after: int) -> None:
        topics = self.topics
        stats = self.stats
        for index, records in reader.journal_batches(after=after, topics=topics):
            if topics is not None and not records:
                continue
            self.follower.apply(index, records)
            stats.batches += 1
            stats.records += len(records)
