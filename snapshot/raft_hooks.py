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
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from fsm import codec
from snapshot.errors import SnapshotError, SnapshotWriteError
from snapshot.format import RaftData
from snapshot.reader import inspect
from snapshot.restore import restore
from snapshot.writer import fsync_dir, write_file

if TYPE_CHECKING:
    from fsm.machine import FSM

log = structlog.get_logger("caravan.snapshot")


def _not_pysyncobj_dump_warning(record: logging.LogRecord) -> bool:
    """Drop pysyncobj's bare "Failed to store full dump": every failed or
    cancelled dump is already logged here, with its cause and level (a
    dump cancelled on purpose is info, not a warning)."""
    return record.getMessage() != "Failed to store full dump"


def _quiet_pysyncobj_dump_warning() -> None:
    logger = logging.getLogger("pysyncobj.syncobj")
    if _not_pysyncobj_dump_warning not in logger.filters:
        logger.addFilter(_not_pysyncobj_dump_warning)

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
    fsm: FSM, *, before_load: Callable[[], None] | None = None
) -> Callable[[str], tuple]:
    """A ``deserializer(file_name) -> raft_data`` for ``SyncObjConf``.

    Checks the file's integrity (``inspect``: checksum, metadata); restores
    it into ``fsm`` only if its applied index is greater than the store's
    (``restore`` then makes the full structural pass while it builds); returns
    the raft data tuple either way. ``before_load`` runs first: the background
    snapshotter cancels a dump in progress there, because after pysyncobj
    loads a dump its log no longer matches what that dump was cut from (and
    restore closes the environment the writer reads).
    A bad file raises ``SnapshotError``, which pysyncobj logs and swallows.
    """

    def deserializer(file_name: str) -> tuple:
        try:
            if before_load is not None:
                before_load()
            info = inspect(file_name)
            meta = info.meta
            if meta is None or meta.raft is None:
                raise SnapshotError(
                    f"{os.path.basename(file_name)}: not a raft dump (no raft data)"
                )
            if info.index > fsm.applied_index:
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

    Pass ``conf_kwargs()`` into ``SyncObjConf``. Two ways to write off the tick:

    - ``mode="process"`` (default): a child process (``snapshot.dump_worker``)
      opens the LMDB environment read-only and writes the dump, on the other
      core and outside this process's GIL, so the tick keeps its pace. The
      child's read transaction starts a little after the serializer returns,
      so the dump may hold state *newer* than ``raft_data``'s index; that is
      safe because the FSM skips every entry at or below its applied index
      when pysyncobj replays the log after the dump (the metadata records the
      FSM's index, the raft data records pysyncobj's).
    - ``mode="thread"``: a thread in this process, handed a read transaction
      pinned at exactly this index before ``serializer`` returns. Its Python
      record loop competes with the tick for the GIL (see the benchmark).

    The background work only writes ``dump_file.partial``; the rename over
    ``dump_file`` happens in ``serialize_checker``, i.e. in the tick thread,
    so it can never race pysyncobj installing a dump received from the
    leader (also in the tick thread). ``last_stall`` is how long the last
    ``serializer`` call held the tick (seconds).
    """

    def __init__(
        self, fsm: FSM, dump_file: str, *, cluster_id: str = "", mode: str = "process"
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', not {mode!r}")
        self.fsm = fsm
        self.mode = mode
        self.dump_file = os.path.abspath(dump_file)
        self.partial = self.dump_file + ".partial"
        self.cluster_id = cluster_id
        self.last_stall = 0.0
        self.last_error: str = ""
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()
        self._state = NOT_SERIALIZING
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._ok = False
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._done.set()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.partial)  # left by a crash mid-write
        self._deserialize = make_deserializer(fsm, before_load=self.cancel)
        _quiet_pysyncobj_dump_warning()

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
            self._ok = False
            self._cancel.clear()
            self._done.clear()
            if self.mode == "process":
                self._spawn(raft)
            else:
                pinned = threading.Event()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(raft, pinned),
                    name="caravan-snapshot-writer",
                    daemon=True,
                )
                self._thread.start()
                # Handoff, not a sleep: return once the writer's read txn pins this index.
                pinned.wait(timeout=10.0)
        except BaseException as exc:
            self.last_error = repr(exc)
            log.warning("raft dump not started", error=self.last_error)
            with self._lock:
                self._state = FAILED  # the checker reports it, once
            self._done.set()
            raise
        finally:
            self.last_stall = time.perf_counter() - t0

    def serialize_checker(self) -> int:
        """SERIALIZING while the write runs; then installs the file and reports SUCCESS or FAILED once."""
        with self._lock:
            if self._state == FAILED:
                # The serializer raised. pysyncobj holds its own "dump running"
                # mark until it hears SUCCESS or FAILED, and starts no other
                # dump meanwhile: answering NOT_SERIALIZING would end log
                # compaction for good.
                self._state = NOT_SERIALIZING
                return FAILED
            if self._state != SERIALIZING:
                return NOT_SERIALIZING
        if not self._finished():
            return SERIALIZING
        state = FAILED
        if self._ok:
            try:
                os.replace(self.partial, self.dump_file)
                fsync_dir(os.path.dirname(self.dump_file))
                state = SUCCESS
            except OSError as exc:
                self.last_error = f"installing the dump failed: {exc}"
                log.error("raft dump not installed", error=self.last_error)
        if state != SUCCESS:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.partial)
        with self._lock:
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
        """Wait until the background write has finished (the checker then installs it)."""
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            self._finished()
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """Stop a running write and wait for it to end; its partial file is removed."""
        self._cancel.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._finished()
        self._ok = False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.partial)

    @property
    def busy(self) -> bool:
        return not self._done.is_set()

    # -- background work -----------------------------------------------------------
    def _finished(self) -> bool:
        with self._finish_lock:
            return self._reap()

    def _reap(self) -> bool:
        proc = self._proc
        if proc is not None and not self._done.is_set():
            if proc.poll() is None:
                return False
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            if proc.stderr:
                proc.stderr.close()
            cancelled = self._cancel.is_set()
            self._ok = proc.returncode == 0 and not cancelled
            if cancelled:
                # cancel() killed it on purpose (a leader's snapshot is being
                # installed, or the server is stopping): not a failure.
                self.last_error = "cancelled"
                log.info("raft dump cancelled; its state is being replaced or the server is stopping")
            elif not self._ok:
                self.last_error = err.splitlines()[-1] if err else f"exit status {proc.returncode}"
                log.warning("raft dump not written", error=self.last_error)
            else:
                self.last_error = ""
            self._proc = None
            self._done.set()
        return self._done.is_set()

    def _spawn(self, raft: RaftData) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        store = self.fsm.store
        args = [
            sys.executable,
            "-m",
            "snapshot.dump_worker",
            "--store",
            store.path,
            "--map-size",
            str(store.env.info()["map_size"]),
            "--out",
            self.partial,
            "--raft",
            codec.pack(raft.to_wire()).hex(),
            "--cluster-id",
            self.cluster_id,
        ]
        self._proc = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def _run(self, raft: RaftData, pinned: threading.Event) -> None:
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
            self._ok = not self._cancel.is_set()
            self.last_error = ""
        except SnapshotWriteError as exc:
            self.last_error = exc.message
            log.warning("raft dump not written", error=exc.message)
        except Exception as exc:  # never let the thread die silently
            self.last_error = repr(exc)
            log.error("raft dump failed", error=repr(exc))
        finally:
            pinned.set()
            self._done.set()
