"""Crash-safe log compaction for pysyncobj's file journal.

pysyncobj 0.3.17 compacts (``FileJournal.deleteEntriesTo``) by *clearing* the
journal file -- one write that sets the "last record" offset back to the
header -- and then re-adding every entry it keeps, one ``add`` at a time, in
the same mmap'd file. A crash (kill -9; the page cache keeps whatever was
written) anywhere in that loop leaves a journal that is empty or holds a
prefix of the kept entries. Those are entries after the snapshot: appended,
acknowledged to the leader, often applied by the FSM. On restart the node
comes back with a shorter log than it acknowledged (Raft requires the log to
be durable before the ack), its commit index is clamped, and a later leader
may hand the lost indexes different entries -- which an FSM that already
applied the old ones skips.

:class:`AtomicFileJournal` replaces that one method: it writes the kept
entries to ``<journal>.compact``, renames it over the journal (atomic), and
only then switches its mmap to the new file. A crash leaves either the old
journal, complete, or the new one, complete -- never a mix. In the node's
fsync mode it also fsyncs the new file, the dump file (``durable_first``: the
new journal no longer holds the entries the dump replaces, and pysyncobj
renames the dump into place without syncing it) and the directory, so the
same holds across power loss.

The old journal is not harmless by itself: it still starts *before* the dump
that made the compaction possible, and pysyncobj's restart path keeps a
journal only if its first two entries are exactly the dump's last two;
anything else is replaced by those two entries -- every entry after the dump
is dropped. That was already a crash window in pysyncobj (between the dump's
rename and the end of the compaction, one tick with the synchronous
serializer). :meth:`AtomicFileJournal.align_to_dump` closes it: at restart,
if the journal contains the dump's last two entries, it (atomically) drops
what comes before them, so pysyncobj keeps everything after. That is Raft's
own rule for installing a snapshot (paper, Figure 13, step 6: "If existing
log entry has same index and term as snapshot's last included entry, retain
log entries following it").

The node installs the class on pysyncobj's journal object before pysyncobj's
tick thread starts (see ``CaravanTransport.__init__``); the on-disk format is
pysyncobj's, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import queue
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    LAST_RECORD_OFFSET_OFFSET,
    FileJournal,
    ResizableFile,
)
from pysyncobj.pickle import to_bytes

from raft.errors import JournalSwitchError, JournalUnchangedError

log = structlog.get_logger("raft")

#: TEST ONLY: called with a stage name at the points where a crash matters
#: ("partial": half the kept entries are in the temp file; "written": the temp
#: file is complete and synced; "renamed": the rename is done, the mmap not yet
#: switched). A test process sets it to ``os._exit`` to crash right there.
crash_hook: Callable[[str], None] | None = None

COMPACT_SUFFIX = ".compact"


def _crash_point(stage: str) -> None:
    hook = crash_hook
    if hook is not None:
        hook(stage)


def _record(entry: Sequence[Any]) -> bytes:
    """One journal record, byte for byte as ``FileJournal.add`` writes it."""
    command, idx, term = entry[0], entry[1], entry[2]
    data = struct.pack("<QQ", idx, term) + to_bytes(command)
    size = struct.pack("<I", len(data))
    return size + data + size


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str) -> None:
    """fsync a file or directory by path; a path that does not exist (yet) is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_retired: queue.SimpleQueue[Any] = queue.SimpleQueue()
_closer_lock = threading.Lock()
_closer: threading.Thread | None = None


def _close_retired() -> None:
    while True:
        rf = _retired.get()
        with contextlib.suppress(Exception):
            rf._ResizableFile__mm.close()
            rf._ResizableFile__f.close()


def _retire(rf: Any) -> None:
    """Close a replaced (unlinked) journal file on a helper thread.

    Unmapping it and the last close free its page cache: ~10-20 ms for a
    13 MB journal, which the tick need not wait for. No msync either
    (``ResizableFile._destroy`` would write the dead file's pages back)."""
    global _closer
    with _closer_lock:
        if _closer is None or not _closer.is_alive():
            _closer = threading.Thread(
                target=_close_retired, name="raft-journal-closer", daemon=True
            )
            _closer.start()
    _retired.put(rf)


class AtomicFileJournal(FileJournal):
    """pysyncobj's ``FileJournal`` with an atomic ``deleteEntriesTo``.

    Installed by changing the class of the journal pysyncobj already opened
    (:meth:`adopt`), so it keeps the open mmap and the entries it read; it
    adds methods and three settings (below), no state pysyncobj could miss.
    """

    #: Called with the error if the renamed-in journal cannot be opened (the
    #: node stops: raft/node.py). The error is raised afterwards either way.
    on_switch_failure: Callable[[BaseException], None] | None = None

    @classmethod
    def adopt(cls, journal: Any) -> bool:
        """Make pysyncobj's ``FileJournal`` an ``AtomicFileJournal`` in place.

        Returns False (and changes nothing) for any other journal type (the
        in-memory journal has nothing to protect). Removes a temp file left
        by a crash in the middle of a compaction.
        """
        if type(journal) is not FileJournal:
            return isinstance(journal, cls)
        journal.__class__ = cls
        with contextlib.suppress(FileNotFoundError):
            os.unlink(journal.path + COMPACT_SUFFIX)
        return True

    #: fsync the new journal, ``durable_first`` and the directory around the
    #: rename (the node turns it on in its fsync mode). Without it the
    #: rewrite is still atomic against a killed process -- the page cache
    #: keeps every write -- but not against power loss, like every other
    #: journal write in that mode; the syncs cost ~40 ms of tick per
    #: compaction on the project's machine.
    sync_compaction: bool = False
    #: Files that must be durable before a compacted journal replaces the old
    #: one (the node sets its dump file: the compaction drops entries only
    #: the dump holds). Only with ``sync_compaction``.
    durable_first: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return self._FileJournal__journalFile._ResizableFile__fileName

    # -- pysyncobj's interface ---------------------------------------------------

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802,N803 (pysyncobj names)
        """Drop the first ``entryTo`` entries: write the rest to a new file, rename it in.

        If the new file cannot be written (disk full, ...) the journal stays
        as it was, complete, and the compaction is skipped: pysyncobj tries
        again at its next compaction, and a longer journal is always safe.
        """
        try:
            self._rewrite(self._FileJournal__journal[entryTo:])
        except JournalUnchangedError as exc:
            log.error("raft_journal_compaction_skipped", error=str(exc))

    # -- ours ----------------------------------------------------------------------

    def sync(self) -> None:
        """Make every record written so far durable (fsync of the current file, after msync off Linux).

        pysyncobj writes records through a shared mmap. On Linux an fsync of
        the file writes back the mapping's dirty pages too (mm/msync.c: dirty
        pages of shared mappings are tracked, and ``MS_SYNC`` is itself an
        fsync of the file's range), so the msync pysyncobj's ``flush`` does
        first was a second fsync: in a node-loss storm it took 12% of the
        leader's tick thread (issue #34). Elsewhere POSIX gives no such
        promise, and the msync stays.
        """
        rf = self._FileJournal__journalFile
        if sys.platform != "linux":
            rf.flush()
        os.fsync(rf._ResizableFile__f.fileno())

    def align_to_dump(self, last: Sequence[Any], prev: Sequence[Any]) -> bool:
        """At restart: keep the entries after a dump whose pair the journal contains.

        ``last``/``prev`` are the dump's last applied entry and the one before
        (pysyncobj's raft data). If the journal holds them (same index, term
        and command) but does not start with them, drop the entries before
        them, so pysyncobj's restart check keeps the journal instead of
        replacing it with the dump's two entries. Returns True if it trimmed.
        Raises :class:`JournalUnchangedError` if the new file cannot be written.
        """
        journal = self._FileJournal__journal
        if len(journal) < 2:
            return False
        pos = int(prev[1]) - journal[0][1]
        if pos <= 0 or pos + 1 >= len(journal):
            return False
        if tuple(journal[pos]) != tuple(prev) or tuple(journal[pos + 1]) != tuple(last):
            return False
        self._rewrite(journal[pos:])
        return True

    def _rewrite(self, entries: list[Any]) -> None:
        path = self.path
        tmp = path + COMPACT_SUFFIX
        header = self._FileJournal__getDefaultHeader()[:LAST_RECORD_OFFSET_OFFSET]
        records = [_record(e) for e in entries]
        end = FIRST_RECORD_OFFSET + sum(len(r) for r in records)
        half = len(records) // 2
        try:
            with open(tmp, "wb") as f:
                f.write(header + struct.pack("<I", end))
                for i, rec in enumerate(records):
                    if i == half:
                        f.flush()
                        _crash_point("partial")
                    f.write(rec)
                f.flush()
                if self.sync_compaction:
                    os.fsync(f.fileno())
            if self.sync_compaction:
                for dep in self.durable_first:
                    fsync_path(dep)
            _crash_point("written")
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise JournalUnchangedError(
                f"could not write the compacted journal ({exc}); the journal is unchanged"
            ) from exc
        _crash_point("renamed")
        # From here the file on disk is the new journal. If we cannot switch
        # to it, this object would go on appending to the replaced (unlinked)
        # file: acknowledged entries that no restart would see. Stop instead.
        try:
            if self.sync_compaction:
                _fsync_dir(path)
            new = ResizableFile(path)
        except OSError as exc:
            err = JournalSwitchError(
                f"compacted journal renamed into place but not reopened ({exc}); "
                "the node must stop (restart reads the new journal)"
            )
            if self.on_switch_failure is not None:
                self.on_switch_failure(err)
            raise err from exc
        old = self._FileJournal__journalFile
        self._FileJournal__journalFile = new
        self._FileJournal__journal = list(entries)
        self._FileJournal__currentOffset = end
        _retire(old)
