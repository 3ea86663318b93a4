"""Log repair: the hooks that keep followers' logs right while they catch up.

1. Follower truncation (defect 1, shared/reference/pysyncobj.md):
   :mod:`raft.truncation` rewrites append_entries in front of pysyncobj's
   handler (switch: ``CARAVAN_UNSAFE_DISABLE_TRUNCATION_FIX=1``, test only).
2. Catch-up livelock (found by jepsen_like): the leader lets a failed append
   reply only lower a follower's nextIndex, never raise it, and a follower's
   mismatch reject skips the conflicting term's run (:mod:`raft.catchup`).
3. Snapshot installs: a follower advances its commit index to its own log end
   on every install chunk, so a rejoining ex-leader applied (and
   acknowledged) its own discarded tail before the snapshot replaced it;
   :func:`raft.truncation.hold_commit_during_snapshot` keeps the commit index
   still until an ordinary append_entries proves the log matches. And an
   install keeps the log after an entry the follower already holds (Raft's
   InstallSnapshot rule, which pysyncobj lacks).
4. Lost writes: pysyncobj answers a leader's write only when it applies that
   index, so writes in a tail a rejoining ex-leader truncates waited until
   the new log grew past them (on an idle cluster, forever);
   :meth:`LogRepair._answer_lost_writes` answers them as discarded at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

from raft.catchup import SnapshotFloors, filter_reply
from raft.config import RaftConfig
from raft.replica_base import ReplicaBase
from raft.truncation import TruncationStats, hold_commit_during_snapshot, rewrite_append_entries

#: rewrite_append_entries actions that kept entries pysyncobj would have truncated.
_AVOIDED = ("append_only", "present", "present_unproven_tail", "below_first")


class LogRepair(ReplicaBase):
    """Mixin: the catch-up and truncation hooks on received and sent messages."""

    def setup_repair(self, config: RaftConfig) -> None:
        """Before ``SyncObj.__init__`` (the transport may deliver during it)."""
        self._fix_enabled = config.truncation_fix_enabled
        self._tstats = TruncationStats()
        self._ack_override: int | None = None
        self._reject_hint: int | None = None
        # installs_retained: snapshot installs that kept the log after the snapshot (Raft's rule)
        self._cstats = {"stale_rejects_ignored": 0, "conflict_hints": 0, "installs_retained": 0}
        self._snapshot_floors = SnapshotFloors()
        # next_node_idx of the confirmation of an install that kept the log
        self._install_ack: int | None = None

    def repair_stats(self) -> dict[str, Any]:
        """The truncation fix's switch and counters, for status (in status's key order)."""
        return {
            "truncation_fix": self._fix_enabled,
            "truncation": self._tstats.as_dict(),
            "catchup": dict(self._cstats),
        }

    # -- received messages ------------------------------------------------------

    def caravan_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[..., None]
    ) -> None:
        """CaravanTransport's receive hook: repair, then hand to pysyncobj's handler."""
        mtype = message.get("type")
        if mtype == "next_node_idx":
            if self._SyncObj__raftState == _RAFT_STATE.LEADER:
                message = self._filter_leader_reply(node, message)
            deliver(node, message)
            return
        if mtype != "append_entries":
            deliver(node, message)
            return
        message = hold_commit_during_snapshot(message, self.raftCurrentTerm, self.raftCommitIndex)
        if self._fix_enabled:
            self._deliver_rewritten(node, message, deliver)
        else:
            deliver(node, message)
        if "prevLogIdx" in message:
            self._tstats.on_append_processed(message.get("commit_index", 0), self.view.last_index())
        if self._SyncObj__commandsWaitingCommit and not self._isLeader():
            self._answer_lost_writes()

    def _filter_leader_reply(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """Leader: a failed reply only lowers nextIndex (raft/catchup.py)."""
        match = self._snapshot_floors.match_index(
            node, self._SyncObj__raftMatchIndex.get(node, 0), self.raftCurrentTerm, monotonic()
        )
        replaced = filter_reply(message, self._SyncObj__raftNextIndex.get(node), match)
        if replaced is not None:
            self._cstats["stale_rejects_ignored"] += 1
            message = replaced
        self._snapshot_floors.on_reply(node, message)
        return message

    def _deliver_rewritten(
        self, node: Any, message: dict[str, Any], deliver: Callable[..., None]
    ) -> None:
        """Follower: the truncation fix rewrites append_entries; its ack is rewritten on send."""
        rw = rewrite_append_entries(message, self.view, self.raftCurrentTerm, self.raftCommitIndex)
        if rw.action in _AVOIDED:
            self._tstats.truncations_avoided += 1
        elif rw.action == "conflict":
            self._tstats.conflict_truncations += 1
        self._ack_override = rw.ack_override
        self._reject_hint = rw.reject_hint
        try:
            deliver(node, rw.message)
        finally:
            self._ack_override = None
            self._reject_hint = None

    def _answer_lost_writes(self) -> None:
        """Answer the writes this ex-leader's log no longer holds, instead of never.

        pysyncobj answers a write it appended only when it applies that
        index. A conflict truncates the tail this node appended as leader;
        until the new leader's log grows past it (an idle cluster: never)
        its writers hear nothing, and a server's client waits out its
        timeout. With the truncation fix a deletion is always a real
        conflict, so by log matching a dropped entry can never commit: its
        writer is told it was discarded (safe to retry anywhere). An index
        a snapshot install skipped over was never applied here, and may or
        may not be committed: its writer gets an unknown outcome.
        """
        waiting = self._SyncObj__commandsWaitingCommit
        last = self.view.last_index()
        applied = self.raftLastApplied
        lost = [i for i in waiting if (i > last and self._fix_enabled) or i <= applied]
        for idx in sorted(lost):
            reason = FAIL_REASON.DISCARDED if idx > last else FAIL_REASON.LEADER_CHANGED
            for _term, callback in waiting.pop(idx):
                callback(None, reason)

    # -- sent messages ------------------------------------------------------------

    def rewrite_outgoing(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """Tick thread, for every outgoing message: the message as it must leave."""
        mtype = message.get("type")
        if mtype == "append_entries" and "serialized" in message:
            self._note_snapshot_chunk(node, message["serialized"])
        elif mtype == "next_node_idx":
            message = self._rewrite_ack(message)
            self._tstats.on_ack(
                self.raftCurrentTerm,
                self.view.last_index(),
                message["next_node_idx"],
                bool(message.get("success")),
            )
        return message

    def _note_snapshot_chunk(self, node: Any, chunk: Any) -> None:
        if chunk is not None and chunk[2]:  # the last chunk: pysyncobj now sets nextIndex past it
            floor = self._SyncObj__raftLog[1][1] + 1  # the same index pysyncobj's sender uses
            self._snapshot_floors.sent(node, floor, self.raftCurrentTerm, monotonic())

    def _rewrite_ack(self, message: dict[str, Any]) -> dict[str, Any]:
        """Follower: the ack the repair decided on for the message just handled."""
        if self._install_ack is not None and message.get("success"):
            message = dict(message, next_node_idx=self._install_ack)  # sent right after the install
            self._install_ack = None
        elif self._ack_override is not None and message.get("success"):
            message = dict(message, next_node_idx=self._ack_override)
        elif (
            self._reject_hint is not None
            and not message.get("success")
            and message.get("reset")
            and self._reject_hint < message["next_node_idx"]
        ):
            # Term mismatch: skip back over the conflicting term's run.
            message = dict(message, next_node_idx=self._reject_hint)
            self._cstats["conflict_hints"] += 1
        return message

    # -- pysyncobj overrides --------------------------------------------------------

    def _SyncObj__onNodeConnected(self, node: Any) -> None:  # noqa: N802 - overrides pysyncobj's private callback
        """A peer (re)connected: forget what it had acknowledged.

        It may have restarted with a shorter log; the leader's catch-up rule
        never lowers nextIndex to matchIndex (raft/catchup.py), so a stale
        matchIndex would keep it from ever being sent what it lost. Lowering
        matchIndex is always safe: the commit index only moves up.
        """
        SyncObj._SyncObj__onNodeConnected(self, node)
        match = self._SyncObj__raftMatchIndex
        if node in match:
            match[node] = 0
        self._snapshot_floors.forget(node)  # a snapshot sent on the old link may never have arrived

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802,N803 - overrides pysyncobj's private loader
        """pysyncobj's dump loader, with Raft's InstallSnapshot rule for the log.

        pysyncobj clears the log on every install. The Raft paper (Figure
        13, step 6): "If existing log entry has same index and term as
        snapshot's last included entry, retain log entries following it".
        A follower that already holds the snapshot's last entry (a snapshot
        sent twice, or one it has overtaken) keeps the entries after it --
        acknowledged ones among them -- instead of dropping them and
        answering with a nextIndex below what it acknowledged. The state
        machine is loaded as before (the store keeps itself when it is
        newer); the applied index never moves back.
        """
        try:
            data = self._SyncObj__serializer.deserialize()
            if data[0] is not None:  # pysyncobj's own pickled state (no custom serializer)
                self._load_pickled_state(data[0])
            self._install_log(data[1], data[2], clearJournal)
            self._clamp_commit_index()
            if self._SyncObj__conf.dynamicMembershipChange:
                self_node = self._SyncObj__selfNode
                self._SyncObj__updateClusterConfiguration([n for n in data[3] if n != self_node])
            self._SyncObj__onSetCodeVersion(0)
        except Exception:  # noqa: BLE001 - as pysyncobj: a dump that cannot be loaded is logged, not raised
            self.log.exception("raft_dump_load_failed")

    def _load_pickled_state(self, state: Any) -> None:
        consumers = self._SyncObj__consumers
        own, rest = (state[0], state[1:]) if consumers else (state, [])
        for k, v in own.items():
            self.__dict__[k] = v
        for i, consumer in enumerate(consumers):
            consumer._deserialize(rest[i])

    def _install_log(self, last: Any, prev: Any, clear_journal: bool) -> None:
        """Keep the log after the snapshot's last entry if this node holds it, else replace it."""
        journal = self._SyncObj__raftLog
        if clear_journal and self.view.holds(last[1], last[2]):
            self._cstats["installs_retained"] += 1
            self._SyncObj__raftLastApplied = max(self._SyncObj__raftLastApplied, last[1])
            # The entries after the snapshot may not be the leader's (log matching
            # holds only up to a shared entry): the confirmation claims the
            # snapshot, and appends then check the rest as usual.
            self._install_ack = last[1] + 1
            return
        if clear_journal or len(journal) < 2 or journal[0] != prev or journal[1] != last:
            journal.clear()
            journal.add(*prev)
            journal.add(*last)
        self._SyncObj__raftLastApplied = last[1]

    def _clamp_commit_index(self) -> None:
        journal = self._SyncObj__raftLog
        end = journal[-1][1]
        if self._SyncObj__raftCommitIndex > end:
            self.log.warning(
                "raft_commit_index_clamped_after_dump",
                commit_index=self._SyncObj__raftCommitIndex,
                journal_end=end,
            )
            self._SyncObj__raftCommitIndex = end
            journal.setRaftCommitIndex(end)
