"""What the replica reports up to the node: leadership changes and fatal failures.

Leadership changes are delivered on their own thread, in order, so a slow
callback (starting leader loops) never delays heartbeats. A fatal failure
(defect 5, shared/reference/pysyncobj.md) stops the node: retrying wedges
pysyncobj and skipping diverges.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

from raft.errors import FatalApplyError
from raft.waiters import safe_call

#: Exit status after a fatal apply/commit failure (EX_SOFTWARE).
EXIT_FATAL = 70

LeadershipCallback = Callable[[bool], None]
FatalHandler = Callable[[BaseException], None]


class Destroyable(Protocol):
    """What a fatal failure stops: the replica."""

    def destroy(self) -> None: ...


class LeadershipNotifier:
    """Delivers leadership changes on their own thread, in order, so a slow
    callback (starting leader loops) never delays heartbeats."""

    def __init__(self, callback: LeadershipCallback | None, log: Any) -> None:
        self._callback = callback
        self._log = log
        self._queue: collections.deque[bool | None] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        if callback is not None:
            self._thread = threading.Thread(target=self._run, name="raft-leadership", daemon=True)
            self._thread.start()

    def post(self, value: bool) -> None:
        if self._callback is None:
            return
        with self._cv:
            self._queue.append(value)
            self._cv.notify()

    def stop(self) -> None:
        if self._thread is None:
            return
        with self._cv:
            self._queue.append(None)
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        assert self._callback is not None
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                value = self._queue.popleft()
            if value is None:
                return
            safe_call(self._log, self._callback, value)


class NodeEvents:
    """The replica's owner (:class:`raft.replica_base.ReplicaOwner`) on the node's behalf.

    ``replica`` returns the node's replica once its constructor has returned
    (None before): pysyncobj ticks, and may fail, inside that constructor.
    """

    def __init__(
        self,
        log: Any,
        on_leadership: LeadershipCallback | None,
        on_fatal: FatalHandler | None,
        replica: Callable[[], Destroyable | None],
    ) -> None:
        self._log = log
        self._on_fatal = on_fatal
        self._replica = replica
        self._notifier = LeadershipNotifier(on_leadership, log)

    def leadership_changed(self, is_leader: bool, term: int) -> None:
        """Tick thread: log the change and queue it for ``on_leadership``."""
        self._log.info("raft_leadership", is_leader=is_leader, term=term)
        self._notifier.post(is_leader)

    def fatal(self, what: str, index: int, exc: BaseException) -> None:
        """Defect 5: the target failed in a way that is not a deterministic
        error result. Retrying wedges pysyncobj and skipping diverges, so the
        only safe move is to stop; on restart the journal replays the entry."""
        self._log.critical(
            "raft_fatal_apply_error",
            stage=what,
            index=index,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        if self._on_fatal is not None:
            self._on_fatal(FatalApplyError(f"{what} failed at index {index}: {type(exc).__name__}"))
            obj = self._replica()
            if obj is not None:
                obj.destroy()
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(EXIT_FATAL)

    def stop(self) -> None:
        """Stop the leadership notifier's thread (after the last change was queued)."""
        self._notifier.stop()
