"""Batched barriers: concurrent linearizable reads share one log entry.

Readers join the open batch from any thread; the tick thread closes it and
submits one barrier entry for all of them (the replica does the submitting,
see raft/replica.py). A batch closes when the tick thread takes it, so every
reader in it arrived before its entry was appended; a reader arriving later
joins the next batch. (Sharing an entry appended before a read started would
not make that read linearizable.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from raft.errors import RaftError
from raft.waiters import Waiter


class BarrierBatches:
    """The one open barrier batch, guarded for joiners on any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Waiter | None = None

    def join(self, wake: Callable[[], None]) -> Waiter:
        """Any thread: join the batch that the next tick will submit.

        The first joiner calls ``wake`` so the tick runs soon; later joiners
        ride on that wake-up, since the batch stays open until that tick.
        """
        with self._lock:
            batch = self._open
            opened = batch is None
            if opened:
                batch = self._open = Waiter()
        if opened:
            wake()
        return batch

    def take(self) -> Waiter | None:
        """Tick thread: close the open batch and return it (None if nobody joined)."""
        if self._open is None:  # unlocked peek: joiners always wake the tick after setting it
            return None
        return self._close()

    def cancel(self, error: RaftError) -> None:
        """Any thread: fail the open batch (the node is stopping)."""
        batch = self._close()
        if batch is not None:
            batch.finish(error=error)

    def _close(self) -> Waiter | None:
        with self._lock:
            batch, self._open = self._open, None
        return batch


def barrier_index(batch: Waiter) -> int:
    """A finished barrier batch's index, or its error raised."""
    if batch.error is not None:
        raise batch.error
    assert batch.index is not None
    return batch.index
