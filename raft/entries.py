"""Log entries as pysyncobj stores them, and the barrier entry.

Callers that batch (GC reaps, plans) size their batches with
:func:`encoded_entry_size`, so the encoding lives apart from the node: it is
the one piece of the adapter that the rest of Caravan computes with.
"""

from __future__ import annotations

import pickle
import time
import uuid

import msgpack

#: Message type of a barrier entry in fsm/messages.py (never reused).
BARRIER_MESSAGE_TYPE = 19


def encode_barrier(now_ns: int | None = None) -> bytes:
    """The barrier entry the FSM recognises (message type 19)."""
    payload = {
        "v": 1,
        "time": time.time_ns() if now_ns is None else now_ns,
        "rid": uuid.uuid4().hex,
    }
    return bytes([BARRIER_MESSAGE_TYPE]) + msgpack.packb(payload)


def encode_command(func_id: int, entry: bytes) -> bytes:
    """The command as pysyncobj stores and applies it: a pickled call.

    Protocol 5, not pysyncobj's protocol 2: protocol 2 stores ``bytes`` as a
    UTF-8 encoded latin-1 string, so every byte >= 0x80 took two and each
    replica paid a decode and an encode per entry. ``pickle.loads`` reads
    either, so journals written by older builds still replay.
    """
    return pickle.dumps((func_id, (entry,)), 5)


def encoded_entry_size(entry: bytes) -> int:
    """Size of ``entry`` as stored in the raft log (what ``max_entry_bytes`` limits).

    Its length plus a few bytes of pickle framing. Callers that batch (GC
    reaps, plans) should size batches with this function.
    """
    return 1 + len(encode_command(0, entry))
