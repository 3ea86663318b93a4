"""Waking an asyncio loop from another thread at most once per burst.

The raft tick thread commits entries many times a second. Each
``call_soon_threadsafe`` costs a pipe write, a loop wake-up and a GIL
hand-off; when the loop only needs "something changed since you last
looked", one pending call is enough however many notifications arrive
before it runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class CoalescedWake:
    """Run ``fn`` on ``loop`` after ``notify()`` — once for any number of notifies before it runs.

    ``fn`` runs after the notification that scheduled it, so it sees every
    state the notifying thread wrote before calling ``notify``. A notify
    that arrives while ``fn`` is running schedules one more call.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
        self._loop = loop
        self._fn = fn
        self._lock = threading.Lock()
        self._scheduled = False

    def notify(self) -> None:
        """Thread-safe; does nothing once the loop is closed (the process is stopping)."""
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._run)
        except RuntimeError:
            with self._lock:
                self._scheduled = False

    def _run(self) -> None:
        with self._lock:
            self._scheduled = False
        self._fn()


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set (True) or ``timeout`` passes (False).

    Not ``asyncio.wait_for``: on Python 3.11 it returns normally when a
    cancel lands after the event was set but before it resumed, so the
    cancel is lost (CPython gh-86296), and a leader loop told to stop on
    losing leadership ran on and hung. ``asyncio.timeout`` always lets a
    cancel through.
    """
    if timeout is None:
        await event.wait()
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
