"""TEST ONLY switches the fault harness sets in a server's environment, never an operator.

They live apart from the server's wiring so that nobody mistakes them for
configuration: each deliberately breaks a guarantee (a diverging snapshot
install, a skewed wall clock) so that jepsen_like can prove it notices.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import structlog

from node.core.config import ServerConfig

#: TEST ONLY -- a deliberate bug for jepsen_like's snapshot-lag must-fail run
#: (tests/jepsen/test_snapshot_lag.py): with ``=1`` in a server's environment,
#: it keeps its store when raft hands it a dump (a follower's snapshot install)
#: and only tells raft the dump's position, so the entries the dump covered
#: are never applied there and its digest diverges. Never set it elsewhere.
UNSAFE_SKIP_SNAPSHOT_RESTORE_ENV = "CARAVAN_UNSAFE_SKIP_SNAPSHOT_RESTORE"


#: TEST ONLY -- jepsen_like's clock nemesis: with ``=NAME`` in a server's
#: environment, its wall clock (``time.time`` / ``time.time_ns``, which every
#: wall-time read in the server goes through) runs ahead or behind by the
#: nanoseconds written in ``<data_dir>/NAME``; the server writes the offset it
#: applied to ``<data_dir>/NAME.ack``. Monotonic clocks (pysyncobj's timers,
#: asyncio, heartbeat TTLs) are untouched. Never set it outside the harness.
UNSAFE_WALL_CLOCK_FILE_ENV = "CARAVAN_UNSAFE_WALL_CLOCK_FILE"


def raft_data_only(file_name: str) -> tuple:
    """The raft position of a dump, without restoring its state (the UNSAFE switch above)."""
    from snapshot.reader import inspect

    meta = inspect(file_name).meta
    if meta is None or meta.raft is None:
        raise ValueError(f"{file_name}: not a raft dump")
    return meta.raft.to_pysyncobj()


def install_unsafe_wall_clock(config: ServerConfig) -> None:
    """The UNSAFE_WALL_CLOCK_FILE_ENV switch: shift this process's wall clock by the file's offset.

    A daemon thread re-reads the file every 20 ms and acknowledges each new
    offset, so the harness knows when a jump took effect.
    """
    name = os.environ.get(UNSAFE_WALL_CLOCK_FILE_ENV)
    if not name:
        return
    path = Path(config.data_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    ack = path.with_name(path.name + ".ack")
    real_ns = time.time_ns
    offset = [0]

    def read() -> str:
        try:
            return path.read_text().strip() or "0"
        except OSError:
            return "0"

    def take(text: str) -> None:
        try:
            offset[0] = int(text)
        except ValueError:
            pass  # keep the last good offset; the ack tells the harness which one holds
        tmp = ack.with_name(ack.name + ".tmp")
        tmp.write_text(f"{offset[0]}\n")
        tmp.replace(ack)

    def follow(seen: str) -> None:
        while True:
            time.sleep(0.02)
            text = read()
            if text != seen:
                take(text)
                seen = text

    first = read()
    take(first)  # a restarted server starts at the offset the harness last set
    time.time_ns = lambda: real_ns() + offset[0]
    time.time = lambda: (real_ns() + offset[0]) / 1e9
    threading.Thread(target=follow, args=(first,), name="caravan-unsafe-wall-clock", daemon=True).start()
    structlog.get_logger("caravan.server").warning(
        "wall clock offset switch on", note="TEST ONLY: this server's wall clock follows " + str(path)
    )
