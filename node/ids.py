"""Process-unique ids without a system call each: object UUIDs and request ids.

``uuid.uuid4()`` reads ``os.urandom`` on every call. On the leader's event
loop that is a system call per job registration, and while the loop is in
the kernel the raft tick thread takes the GIL: the loop then waits for it
(a cProfile of the loop showed ~30 us per call, nearly all of it that wait).
These ids must be unique, not secret (ACL secrets still come from
``uuid.uuid4``). Object ids (evaluations) are version-4 UUIDs from a
generator seeded from ``os.urandom`` per process; request ids (which
servers deduplicate retries by) are a 96-bit random per-process prefix and
a counter. Both are re-seeded in a forked child.
"""

from __future__ import annotations

import itertools
import os
import random
import secrets
from collections.abc import Iterator


class UUIDSource:
    """Version-4 UUID strings from a per-process generator seeded by the OS."""

    def __init__(self) -> None:
        self._rng = random.Random()
        self.reseed()

    def reseed(self) -> None:
        """New seed from the OS (at start and in a forked child, which would otherwise repeat the parent)."""
        self._rng.seed(os.urandom(32))

    def uuid4(self) -> str:
        bits = self._rng.getrandbits(128)
        # RFC 4122: version 4 in bits 76-79, variant 10 in bits 62-63.
        bits = (bits & ~(0xF << 76) | (0x4 << 76)) & ~(0x3 << 62) | (0x2 << 62)
        h = f"{bits:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_source = UUIDSource()
os.register_at_fork(after_in_child=_source.reseed)


def new_uuid() -> str:
    """A random version-4 UUID string, unique across processes and restarts."""
    return _source.uuid4()


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
