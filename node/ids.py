"""Random UUIDs for new objects (evaluations, allocations) without a system call each.

``uuid.uuid4()`` reads ``os.urandom`` on every call. On the leader's event
loop that is a system call per job registration, and while the loop is in
the kernel the raft tick thread takes the GIL: the loop then waits for it
(a cProfile of the loop showed ~30 us per call, nearly all of it that wait).
These ids must be unique, not secret (ACL secrets still come from
``uuid.uuid4``): 122 random bits from a generator seeded from
``os.urandom`` once per process, and again in a forked child, give that.
"""

from __future__ import annotations

import os
import random


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
