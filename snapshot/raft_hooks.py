"""pysyncobj serializer / deserializer hooks that write and read the snapshot format.

pysyncobj 0.3.17 calls ``serializer(tmp_name, raft_data)`` synchronously in
its tick thread and renames ``tmp_name`` over ``fullDumpFile`` right after it
returns. Writing a large state there stalls heartbeats (elections start at
~0.4 s). Two modes:

- ``make_serializer`` (synchronous): commit, write the whole file, fsync,
  return. Simple; the stall grows with the state (measured in
  tests/bench/snapshot_bench.py).
- ``BackgroundSnapshotter`` (asynchronous, the default for servers): uses
  pysyncobj's ``serializeChecker`` hook. The serializer commits the pending
  group, starts a writer thread, waits only until that thread has opened its
  LMDB read transaction (so the file reflects exactly the state at
  ``raft_data``'s index), and returns. The thread writes
  ``fullDumpFile.partial``, fsyncs it and renames it over ``fullDumpFile``;
  ``serialize_checker`` reports SERIALIZING until then, SUCCESS (once) after,
  and only then does pysyncobj drop the compacted log entries. pysyncobj's own
  rename finds no ``tmp_name`` and fails harmlessly (it swallows the error
  and defers to the checker). While the thread runs, pysyncobj sends no dump
  to followers (it refuses transmissions while serializing), so a follower
  never receives a half-written file.

The deserializer follows the safe rule: restore from the dump only if the
dump's applied index is greater than the store's (pysyncobj calls it at
restart, when the store is usually ahead, and on snapshot install, and
cannot tell us which); it always returns the raft data tuple.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from snapshot.errors import SnapshotError, SnapshotWriteError
from snapshot.format import RaftData
from snapshot.reader import verify
from snapshot.restore import restore
from snapshot.writer import fsync_dir, write_file

if TYPE_CHECKING:
    from fsm.machine import FSM

log = structlog.get_logger("caravan.snapshot")

# pysyncobj.config.SERIALIZER_STATE, without importing pysyncobj at module load
NOT_SERIALIZING, SERIALIZING, SUCCESS, FAILED = 0, 1, 2, 3


def make_serializer(fsm: FSM, *, cluster_id: str = "") -> Callable[[str, tuple], None]:
    """A synchronous ``serializer(file_name, raft_data)`` for ``SyncObjConf``.

    Commits the FSM's pending group, then writes the state at this index with
    the raft data in the metadata. Blocks the tick for the whole write.
    """

    def serializer(file_name: str, raft_data: tuple) -> None:
        fsm.commit()
        raft = RaftData.from_pysyncobj(raft_data)
        with fsm.read() as reader:
            write_file(reader, file_name, raft=raft, cluster_id=cluster_id)

    return serializer


def make_deserializer(
    fsm: FSM, *, before_restore: Callable[[], None] | None = None
) -> Callable[[str], tuple]:
    """A ``deserializer(file_name) -> raft_data`` for ``SyncObjConf``.

    Verifies the file; restores it into ``fsm`` only if its applied index is
    greater than the store's; returns the raft data tuple either way.
    ``before_restore`` runs first (the background snapshotter cancels its
    writer there, since restore closes the environment it reads).
    A bad file raises ``SnapshotError``, which pysyncobj logs and swallows.
    """

    def deserializer(file_name: str) -> tuple:
        try:
            info = verify(file_name)
            meta = info.meta
            if meta is None or meta.raft is None:
                raise SnapshotError(
                    f"{os.path.basename(file_name)}: not a raft dump (no raft data)"
                )
            if info.index > fsm.applied_index:
                if before_restore is not None:
                    before_restore()
                log.info(
                    "restoring raft dump", dump_index=info.index, store_index=fsm.applied_index
                )
                restore(file_name, fsm, verified=info)
            else:
                log.info(
                    "keeping store; raft dump is not newer",
                    dump_index=info.index,
                    store_index=fsm.applied_index,
                )
            return meta.raft.to_pysyncobj()
        except SnapshotError as exc:
            log.error("raft dump rejected", error=exc.message)
            raise

    return deserializer


class BackgroundSnapshotter:
    """Asynchronous compaction for pysyncobj: serializer, checker and deserializer sharing state.

    Pass ``conf_kwargs()`` into ``SyncObjConf``. ``last_stall`` is how long
    the last ``serializer`` call held the tick thread (seconds).
    """

    def __init__(self, fsm: FSM, dump_file: str, *, cluster_id: str = "") -> None:
        self.fsm = fsm
        self.dump_file = os.path.abspath(dump_file)
        self.partial = self.dump_file + ".partial"
        self.cluster_id = cluster_id
        self.last_stall = 0.0
        self.last_duration = 0.0
        self.last_error: str = ""
        self._lock = threading.Lock()
        self._state = NOT_SERIALIZING
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._done.set()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.partial)  # left by a crash mid-write
        self._deserialize = make_deserializer(fsm, before_restore=self.cancel)

    # -- pysyncobj hooks ---------------------------------------------------------
    def serializer(self, file_name: str, raft_data: tuple) -> None:
        t0 = time.perf_counter()
        with self._lock:
            if self._state == SERIALIZING:
                return  # pysyncobj does not do this; be safe anyway
            self._state = SERIALIZING
        try:
            # pysyncobj renames file_name over the dump when we return: leave nothing to rename.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file_name)
            self.fsm.commit()
            raft = RaftData.from_pysyncobj(raft_data)
            pinned = threading.Event()
            self._cancel.clear()
            self._done.clear()
            self._thread = threading.Thread(
                target=self._run, args=(raft, pinned), name="caravan-snapshot-writer", daemon=True
            )
            self._thread.start()
        except BaseException as exc:
            self.last_error = repr(exc)
            with self._lock:
                self._state = FAILED
            self._done.set()
            raise
        # Handoff, not a sleep: return once the writer's read txn pins this index.
        pinned.wait(timeout=10.0)
        self.last_stall = time.perf_counter() - t0

    def serialize_checker(self) -> int:
        with self._lock:
            state = self._state
            if state in (SUCCESS, FAILED):
                self._state = NOT_SERIALIZING
            return state

    def deserializer(self, file_name: str) -> tuple:
        return self._deserialize(file_name)

    def conf_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``SyncObjConf`` (fullDumpFile and the three hooks)."""
        return {
            "fullDumpFile": self.dump_file,
            "serializer": self.serializer,
            "deserializer": self.deserializer,
            "serializeChecker": self.serialize_checker,
        }

    # -- control -----------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no background write is running; True if none is."""
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """Stop a running write at its next chunk and wait for the thread to exit."""
        self._cancel.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def busy(self) -> bool:
        return not self._done.is_set()

    # -- the writer thread ---------------------------------------------------------
    def _run(self, raft: RaftData, pinned: threading.Event) -> None:
        t0 = time.perf_counter()
        state = FAILED
        try:
            with self.fsm.read() as reader:
                write_file(
                    reader,
                    self.partial,
                    raft=raft,
                    cluster_id=self.cluster_id,
                    cancel=self._cancel,
                    on_ready=pinned.set,
                )
            os.replace(self.partial, self.dump_file)
            fsync_dir(os.path.dirname(self.dump_file))
            state = SUCCESS
            self.last_error = ""
        except SnapshotWriteError as exc:
            self.last_error = exc.message
            log.warning("raft dump not written", error=exc.message)
        except Exception as exc:  # never let the thread die silently
            self.last_error = repr(exc)
            log.error("raft dump failed", error=repr(exc))
        finally:
            pinned.set()
            with contextlib.suppress(FileNotFoundError):
                if state != SUCCESS:
                    os.unlink(self.partial)
            self.last_duration = time.perf_counter() - t0
            with self._lock:
                self._state = state
            self._done.set()
