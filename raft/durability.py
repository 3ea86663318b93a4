"""Journal durability: fsync mode (defect 6) and crash-safe compaction (defect 7).

Defect 6 (shared/reference/pysyncobj.md): pysyncobj never fsyncs.
``fsync=True`` syncs the journal (and vote metadata) at the start of every
tick, before the leader counts its own entries towards a commit, and holds
follower acks and votes until the sync that covers them.

Defect 7: compaction is not crash-safe (pysyncobj clears the journal and
re-adds the kept entries in place; and at restart it drops a journal that
starts before the dump): :mod:`raft.journal` rewrites the journal into a
temp file renamed into place, after syncing the dump, and at restart keeps
the entries after the dump (Raft's InstallSnapshot rule).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from raft.config import RaftConfig
from raft.errors import JournalUnchangedError, RaftError
from raft.journal import AtomicFileJournal, fsync_path
from raft.replica_base import ReplicaBase

# Outgoing messages that promise durable state (an ack of appended entries,
# a vote, a vote request for a term we just persisted): in fsync mode they
# wait for the next journal sync.
_DURABLE_PROMISES = frozenset({"next_node_idx", "response_vote", "request_vote"})


class Durability(ReplicaBase):
    """Mixin: the crash-safe journal, and in fsync mode the sync before promises."""

    def setup_durability(self, config: RaftConfig) -> None:
        """Before ``SyncObj.__init__``: the journal's paths and the fsync state."""
        self._fsync = config.fsync
        self._journal_path = config.journal_file
        self._dump_path = config.dump_file
        self._held: list[tuple[Any, dict[str, Any]]] = []
        self._synced_fp: tuple[int, ...] | None = None
        self._synced_meta: tuple[Any, ...] | None = None
        self._synced_last_index = 0
        self._fstats = {
            "syncs": 0,
            "sync_seconds": 0.0,
            "max_sync_seconds": 0.0,
            "unsynced_acks": 0,
        }

    @property
    def fsync_stats(self) -> dict[str, Any]:
        """A copy of the fsync counters (for status)."""
        return dict(self._fstats)

    # -- crash-safe compaction (defect 7) ----------------------------------------

    def caravan_before_start(self) -> None:
        """Called by CaravanTransport's constructor: pysyncobj has opened the
        journal but started no thread yet. Make its compaction crash-safe."""
        journal = self._SyncObj__raftLog
        if AtomicFileJournal.adopt(journal):
            journal.sync_compaction = self._fsync
            journal.durable_first = (self._dump_path,)
            journal.on_switch_failure = lambda exc: self.owner.fatal(
                "journal compaction", self.raftLastApplied, exc
            )
        else:
            self.log.warning("raft_journal_not_atomic", journal=type(journal).__name__)

    def aligning_deserializer(self, fn: Callable[[str], Any]) -> Callable[[str], Any]:
        """At restart, keep the journal entries after the dump (raft/journal.py).

        pysyncobj keeps a journal at restart only if it starts exactly with
        the dump's last two entries; one that starts earlier (a crash between
        the dump's rename and the end of the compaction) would be replaced by
        those two entries, dropping every entry after the dump."""

        def deserializer(file_name: str) -> Any:
            data = fn(file_name)
            if getattr(self, "_SyncObj__needLoadDumpFile", False):  # restart, not an install
                self._align_journal_to_dump(data)
            return data

        return deserializer

    def _align_journal_to_dump(self, data: Any) -> None:
        journal = self._SyncObj__raftLog
        if not isinstance(journal, AtomicFileJournal):
            return
        try:
            last, prev = data[0], data[1]
            before = journal[0][1]
            if journal.align_to_dump(last, prev):
                self.log.warning(
                    "raft_journal_aligned_to_dump",
                    dropped_from=before,
                    dump_index=last[1],
                    kept_to=journal[-1][1],
                    note="restarted between a dump and its compaction; entries after the dump kept",
                )
            elif len(journal) >= 2 and journal[0][1] > prev[1]:
                self.log.error(
                    "raft_journal_starts_after_dump",
                    journal_first=journal[0][1],
                    dump_index=last[1],
                    note="pysyncobj will replace the journal with the dump's entries",
                )
        except (JournalUnchangedError, IndexError, TypeError) as exc:
            # pysyncobj will now replace the journal with the dump's two
            # entries: the entries after the dump on this node are lost.
            self.log.critical("raft_journal_align_failed", error=f"{type(exc).__name__}: {exc}")

    # -- fsync mode (defect 6) ------------------------------------------------

    def sync_journal(self) -> None:
        """Tick thread, fsync mode only: make the journal durable, then send what waited for it."""
        if not self._fsync:
            return
        j = self._SyncObj__raftLog
        fp = self._journal_fingerprint()
        meta = (self.raftCurrentTerm, self._SyncObj__votedForNodeId)
        if fp != self._synced_fp or meta != self._synced_meta:
            self._sync_files(j, fp, meta)
        self._synced_last_index = j[-1][1]
        if self._held:
            self._release_held()

    def defer_until_synced(self, node: Any, message: dict[str, Any]) -> bool:
        """Tick thread, for every outgoing message: True if it was held for the next sync.

        In fsync mode a durable promise waits for the sync that covers it,
        and anything behind a held message waits too (order is kept).
        """
        if self._fsync and (self._held or message.get("type") in _DURABLE_PROMISES):
            self._held.append((node, message))
            return True
        self._count_if_unsynced(message)
        return False

    def _journal_fingerprint(self) -> tuple[int, ...]:
        j = self._SyncObj__raftLog
        return (getattr(j, "_FileJournal__currentOffset", 0), len(j), j[-1][1], j[-1][2])

    def _sync_files(self, j: Any, fp: tuple[int, ...], meta: tuple[Any, ...]) -> None:
        t0 = time.perf_counter()
        if fp != self._synced_fp:
            # msync of the mapping + fsync of the file (size after a resize).
            # The journal's own file: a compaction renames a new one in.
            sync = getattr(j, "sync", None)
            if sync is None:
                raise RaftError("fsync mode needs pysyncobj's file journal")
            sync()
        if meta != self._synced_meta:
            fsync_path(self._journal_path + ".meta")
            fsync_path(os.path.dirname(os.path.abspath(self._journal_path)))
        dt = time.perf_counter() - t0
        self._fstats["syncs"] += 1
        self._fstats["sync_seconds"] += dt
        self._fstats["max_sync_seconds"] = max(self._fstats["max_sync_seconds"], dt)
        self._synced_fp, self._synced_meta = fp, meta

    def _release_held(self) -> None:
        held, self._held = self._held, []
        transport = self._SyncObj__transport
        for node, message in held:
            self._count_if_unsynced(message)
            transport.raw_send(node, message)

    def _count_if_unsynced(self, message: dict[str, Any]) -> None:
        """Count a successful ack that promises entries past the last sync."""
        if message.get("type") == "next_node_idx" and message.get("success"):
            if message["next_node_idx"] - 1 > self._synced_last_index:
                self._fstats["unsynced_acks"] += 1
