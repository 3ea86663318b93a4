"""Byte keys ordered for range scans.

Composite keys join their parts with NUL, so a prefix scan over
``job_id + NUL`` finds exactly that job's rows. Integers are big-endian so
byte order equals numeric order.
"""

from __future__ import annotations

SEP = b"\x00"
# LMDB keys are at most 511 bytes. The widest composite key holds two ids
# (allocs_by_node: node_id NUL flag NUL alloc_id = 2 * MAX_ID_BYTES + 3), so
# ids are capped well below half of that; 256 overflowed it and stopped nodes.
MAX_ID_BYTES = 200


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def from_u64(data: bytes) -> int:
    return int.from_bytes(data, "big")


_JOIN = "\x00".join


def key(*parts: str | bytes | int) -> bytes:
    try:
        return _JOIN(parts).encode()  # all str: the common case, one C call
    except TypeError:
        pass
    out = []
    for part in parts:
        if isinstance(part, int):
            out.append(u64(part))
        elif isinstance(part, str):
            out.append(part.encode())
        else:
            out.append(part)
    return SEP.join(out)


def key_at(head: str, value: int, tail: str | None = None) -> bytes:
    """``key(head, value)`` or ``key(head, value, tail)``, the same bytes.

    ``key`` takes a mixed key through a raised TypeError (~0.7 us); version
    rows and GC marks are written on hot apply paths, so they use this.
    """
    out = head.encode() + SEP + value.to_bytes(8, "big")
    return out if tail is None else out + SEP + tail.encode()


def prefix(*parts: str | bytes | int) -> bytes:
    return key(*parts) + SEP


def last_part(raw: bytes) -> str:
    return raw.rsplit(SEP, 1)[-1].decode()


def valid_id(value: str) -> bool:
    """IDs become key parts, so they must be non-empty, short and NUL-free."""
    return bool(value) and "\x00" not in value and len(value.encode()) <= MAX_ID_BYTES
