"""One-shot result slots, and calling a caller's callback safely.

The tick thread finishes a :class:`Waiter`; callers wait on it from plain
threads or from asyncio loops. Kept apart from the node so the barrier,
leadership transfer and synchronous submit share one implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raft.errors import RaftError


def safe_call(log: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn``; log what it raises instead of raising it.

    A caller's bug must never break the tick thread (or the leadership
    notifier's thread) that runs its callback.
    """
    try:
        fn(*args)
    except Exception:  # a caller's bug must never break the tick thread
        log.exception("raft_callback_failed")


@dataclass
class Waiter:
    """A one-shot result slot shared by a barrier batch or a transfer.

    Threads wait on ``event``; an asyncio loop awaits ``future(loop)``, one
    future per loop however many of its tasks share the batch.
    """

    event: threading.Event = field(default_factory=threading.Event)
    index: int | None = None
    error: RaftError | None = None
    _futures: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, index: int | None = None, error: RaftError | None = None) -> None:
        """Any thread: set the result once; later calls are ignored."""
        with self._lock:
            if self.event.is_set():
                return
            self.index, self.error = index, error
            self.event.set()
            futures = list(self._futures.items())
        for loop, future in futures:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there
                loop.call_soon_threadsafe(_resolve, future)

    def future(self, loop: asyncio.AbstractEventLoop, timeout: float) -> asyncio.Future[None]:
        """On ``loop``'s thread: a future done once the result is in, or ``timeout`` s after the first call.

        One timer per batch and loop rather than one per waiter: the waiters
        of a batch all joined within one tick.
        """
        with self._lock:
            future = self._futures.get(loop)
            if future is None:
                future = self._futures[loop] = loop.create_future()
                if self.event.is_set():
                    future.set_result(None)
                else:
                    timer = loop.call_later(timeout, _resolve, future)
                    # Cancelled when the batch commits: a timer left per batch
                    # would pile up in the loop's heap under steady reads.
                    future.add_done_callback(lambda _: timer.cancel())
        return future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
