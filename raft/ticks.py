"""How late the tick thread runs: the raft thread's own stalls, measured and reported.

Everything raft does happens on pysyncobj's tick thread: a leader whose tick
thread cannot run sends no heartbeat, and its followers elect another leader
although nothing failed; a follower whose thread stalls campaigns against a
leader that was talking all along. In one Python process that thread shares
the GIL and the machine with the server's other work, so under load this is
the usual cause of an election nobody asked for. etcd says so in its log
("leader failed to send out heartbeat on time; took too long, leader is
overloaded"); so does this:

- a tick that starts more than ``stall`` after the previous one is logged as
  ``raft_tick_stalled`` (at most once per ``LOG_EVERY_S``, with how many
  were not logged in between);
- ``longest`` gives the longest gap of the last seconds, which the role
  change log line carries, so an election can be told apart: this server's
  own thread stalled, or it heard nothing from a leader that was running.
"""

from __future__ import annotations

import collections
from time import monotonic

LOG_EVERY_S = 10.0
WINDOW_S = 5.0  # how far back ``longest`` looks by default


class TickGaps:
    """The gaps between tick starts; tick thread only (``longest`` may be read from any thread)."""

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.stalls = 0  # ticks that started late, in all
        self._last: float | None = None
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=256)  # (at, gap) of late ticks
        self._logged_at = -float("inf")
        self._unlogged = 0

    def note(self, now: float) -> float | None:
        """A tick starts at ``now``; the gap before it when it is a stall to log now, else None."""
        last, self._last = self._last, now
        if last is None:
            return None
        gap = now - last
        if gap <= self.stall:
            return None
        self.stalls += 1
        self._recent.append((now, gap))
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return None
        self._logged_at = now
        return gap

    def take_unlogged(self) -> int:
        """Stalls not logged since the last line (reset)."""
        count, self._unlogged = self._unlogged, 0
        return count

    def longest(self, window: float = WINDOW_S, now: float | None = None) -> float:
        """The longest gap between ticks that ended in the last ``window`` seconds (0 when none was late)."""
        now = monotonic() if now is None else now
        return max((gap for at, gap in list(self._recent) if now - at <= window), default=0.0)


class TickLoad:
    """The share of the last second or so the tick thread spent working rather than waiting in poll.

    A tick that keeps up waits in poll most of the time; one that does not
    delays every write by whole ticks. In bench-failover's node-loss storm
    the leader's tick thread worked 80-84% of the time and a client's write
    waited three ticks (issue #34): this is that figure, for ``raft status``
    and the ``caravan_raft_tick_busy_ratio`` gauge. ``started``/``finished``
    run on the tick thread; ``load`` may be read from any thread.
    """

    def __init__(self, window: float = 1.0, now: float | None = None) -> None:
        self.window = window
        self.load = 0.0
        self._busy = 0.0
        self._start: float | None = None
        self._at = monotonic() if now is None else now

    def started(self, now: float) -> None:
        """A tick starts working."""
        self._start = now

    def finished(self, now: float) -> None:
        """The tick is done and about to wait in poll (a second call before the next start is ignored)."""
        if self._start is None:
            return
        self._busy += now - self._start
        self._start = None
        span = now - self._at
        if span >= self.window / 4:
            # An average weighted by elapsed time: a window's worth of ticks replaces the old value.
            weight = min(1.0, span / self.window)
            self.load = (1 - weight) * self.load + weight * min(1.0, self._busy / span)
            self._busy, self._at = 0.0, now
