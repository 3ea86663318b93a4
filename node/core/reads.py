"""Reads of this server's committed state, safe against a snapshot restore swapping the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lmdb

from fsm.machine import FSM
from fsm.store import StateReader
from node.wire.errors import UNAVAILABLE, RPCError


def read_committed(fsm: FSM, fn: Callable[[StateReader], Any]) -> Any:
    """``fn`` on the committed state; a read cut off by a snapshot restore is ``unavailable``.

    Restoring a snapshot closes the store under open reads. Those reads
    failed with LMDB's "closed/deleted/dropped object" as an internal error
    (and a traceback in the log); they were not executed, so the client may
    send them again, here or to another server.
    """
    generation = fsm.generation
    try:
        with fsm.read() as reader:
            return fn(reader)
    except lmdb.Error:
        if fsm.read_interrupted(generation):
            raise RPCError(UNAVAILABLE, "this server was loading a snapshot during the read; retry it") from None
        raise
