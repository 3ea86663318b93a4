"""Process-unique ids without a system call each: object UUIDs and request ids.

``uuid.uuid4()`` reads ``os.urandom`` on every call. On the leader's event
loop that is a system call per job registration, and while the loop is in
the kernel the raft tick thread takes the GIL: the loop then waits for it
(a cProfile of the loop showed ~30 us per call, nearly all of it that wait).
These ids must be unique, not secret (ACL secrets still come from
``uuid.uuid4``). Object ids (evaluations, allocations) are time-ordered UUIDs from a
generator seeded from ``os.urandom`` per process; request ids (which
servers deduplicate retries by) are a 96-bit random per-process prefix and
a counter. Both are re-seeded in a forked child.

It lives in ``fsm`` because it is the format of the ids the records carry,
and both the scheduler and the server make them; ``fsm`` is the one package
both may import. Apply itself never calls it: every id reaches the FSM inside
an entry (the import contracts in pyproject.toml forbid the FSM's apply
modules from importing it).
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator

#: An id's first 32 bits count ticks of 2**14 ns (16.4 us); they wrap every 19.5 hours.
TICK_SHIFT = 14
TICK_MASK = 0xFFFFFFFF
# The low 96 bits of an id: version 8 in bits 76-79 and variant 10 in bits 62-63 set, the rest random.
_VERSION_VARIANT = 0x8 << 76 | 0x2 << 62
_RANDOM_MASK = (1 << 96) - 1 & ~(0xF << 76) & ~(0x3 << 62)


class UUIDSource:
    """Time-ordered UUID strings (RFC 9562 version 8) from a per-process generator seeded by the OS.

    Every id is stored as an LMDB key (``evals``, ``evals_by_status``, ...).
    Random keys put each new object on its own B-tree page, so every commit
    copied and wrote one 4 KiB page per new eval and index row: with version-4
    ids a registration's apply cost each server 72-76 us of CPU, with ordered
    ids 57-60 us (LMDB copying pages in the process, and the kernel copying
    them into the page cache).
    So an id starts with a clock tick, which makes new keys land beside each
    other at the end of each table, and ends with 90 random bits, which keep
    it unique across processes and restarts as a version-4 id would be.

    Why not UUIDv7: its first 32 bits change once a minute, so every eval of
    a minute would share the 8-character short id the CLI shows (as Nomad's
    does). Here the first 8 characters step on every id a process makes
    (a tick is taken at most once; a burst runs a few ticks ahead of the
    clock, and a clock stepped back does not step the ids back), so short
    ids stay distinct, and repeat only across the 19.5-hour wrap, as often as
    random ones would.
    """

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._rng = random.Random()
        self._last = -1
        self._lock = threading.Lock()  # the loop, executor threads and leader loops all make ids
        self.reseed()

    def reseed(self) -> None:
        """New seed from the OS (at start and in a forked child, which would otherwise repeat the parent)."""
        self._rng.seed(os.urandom(32))

    def uuid(self) -> str:
        with self._lock:
            tick = self._clock() >> TICK_SHIFT
            if tick <= self._last:
                tick = self._last + 1
            self._last = tick
            r = self._rng.getrandbits(96)
        # RFC 9562: version 8 (custom layout) in bits 76-79, variant 10 in bits
        # 62-63; 90 random bits fill the rest. bytes.hex and slices: 0.5 us a
        # format where an f-string of the 128-bit int took 1.0.
        bits = (tick & TICK_MASK) << 96 | (r & _RANDOM_MASK | _VERSION_VARIANT)
        h = bits.to_bytes(16, "big").hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_source = UUIDSource()
os.register_at_fork(after_in_child=_source.reseed)


def new_uuid() -> str:
    """A time-ordered UUID string, unique across processes and restarts."""
    return _source.uuid()


# -- request ids --------------------------------------------------------------------
_COUNTER_LIMIT = 1 << 32


def _fresh_ids() -> tuple[str, Iterator[int]]:
    """A new 96-bit random prefix and a counter to append to it."""
    return secrets.token_hex(12), itertools.count()


_ids = _fresh_ids()


def _reseed_ids() -> None:
    global _ids
    _ids = _fresh_ids()


# A forked child must not hand out its parent's ids.
os.register_at_fork(after_in_child=_reseed_ids)


def new_request_id() -> str:
    """A unique request id: 32 hex digits, as long as a uuid4's.

    Servers deduplicate retries by request id, so ids must stay unique across
    processes and restarts: 96 random bits per process (reseeded after a
    fork and whenever the counter runs out) followed by a 32-bit counter.
    That is as safe as a uuid4 each, without a getrandom call per request.
    """
    prefix, counter = _ids
    n = next(counter)  # atomic under the GIL: threads never share an n
    if n < _COUNTER_LIMIT:
        return f"{prefix}{n:08x}"
    if _ids[1] is counter:
        _reseed_ids()
    return new_request_id()
