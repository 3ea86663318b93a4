"""The leader's command queue: what may enter the log, and how it is shipped.

Defect 2 (shared/reference/pysyncobj.md): pysyncobj chunks entries of 64 KiB
or more and that path corrupts them, so entries are capped (as stored in the
log) at submit and again here, at the queue every command passes -- a peer's
forwarded command never went through our submit.

Defect 4: pysyncobj never sets its "one membership change at a time" guard;
with dynamic membership enabled the leader refuses a change while another is
uncommitted (and with it disabled, refuses every change).

Without batching, pysyncobj's leader sends append_entries to every follower
after *each* command it takes from the queue: under pipelined load that is
one message (and one ack) per entry per follower. We let the command loop
run and ship what it appended every ``profile.coalesce_entries`` entries and
once at its end -- same tick, so a lone serial write still leaves at once.

pysyncobj's tick applies what committed *before* it takes new commands, so a
command queued while the tick applies waits for that apply, then for its
append_entries' round trip, then for the next tick. On a busy leader -- the
tick thread applying plan entries 80% of the time in bench-failover's
node-loss storm -- that made every client write wait for about three ticks.
A leader's tick therefore also takes the queue first (``take_commands_early``),
before it applies: the followers receive and acknowledge the new entries
while the leader applies the older ones, and the next tick can commit them.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON
from pysyncobj.syncobj import _COMMAND_TYPE

from raft.config import RaftConfig
from raft.replica_base import ReplicaBase

_MEMBERSHIP_PREFIX = bytes([_COMMAND_TYPE.MEMBERSHIP])


class CommandQueue(ReplicaBase):
    """Mixin: admission to pysyncobj's command queue and coalesced sends."""

    def setup_commands(self, config: RaftConfig, conf: Any) -> None:
        """Before ``SyncObj.__init__``: the entry cap, membership switch and coalescing."""
        self._max_entry = config.max_entry_bytes
        self._dynamic_membership = config.dynamic_membership
        self._coalesce = not conf.appendEntriesUseBatch
        self._coalesce_entries = max(1, config.resolved_profile().coalesce_entries)
        self._in_command_loop = False
        self._unsent = 0

    # -- admission (defects 2 and 4) -------------------------------------------

    def _applyCommand(self, command: bytes, callback: Any, commandType: int | None = None) -> None:  # noqa: N802,N803
        """Single entrance of every command into pysyncobj's queue: local
        submits and (on the leader) commands forwarded by followers."""
        reason = self._refusal(command, commandType)
        if reason is not None:
            self.log.warning(
                "raft_command_refused", reason=reason, forwarded=isinstance(callback, tuple)
            )
            self._SyncObj__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)
            return
        try:
            super()._applyCommand(command, callback, commandType)
        except BlockingIOError:
            pass  # wake-up pipe full: the command is queued and a wake-up is pending

    def _refusal(self, command: bytes, command_type: int | None) -> str | None:
        """Why ``command`` may not enter the queue, or None if it may."""
        if command_type is None:  # the type byte is still in front of the command
            ctype = command[0] if command else -1
            size = len(command)
        else:
            ctype = command_type
            size = len(command) + 1
        if ctype == _COMMAND_TYPE.REGULAR:
            if size > self._max_entry:
                return f"entry of {size} bytes exceeds the {self._max_entry} byte limit"
            return None
        if ctype == _COMMAND_TYPE.MEMBERSHIP:
            return None if self._dynamic_membership else "dynamic membership is disabled"
        return f"command type {ctype} is never replicated by caravan"

    def _SyncObj__changeCluster(self, request: Any) -> bool:  # noqa: N802 - overrides pysyncobj's private guard
        """Defect 4: pysyncobj never sets its "one change at a time" guard.
        Refuse a change until the leader's no-op and every earlier membership
        entry in the log are applied (committed in the current config)."""
        if not self._dynamic_membership:
            return False
        noop = self._SyncObj__noopIDx
        if noop is None or self.raftLastApplied < noop:
            return False
        if self._uncommitted_membership_entry():
            return False
        self._admitting_change = True  # raft/membership.py: a refused change must not touch the table
        try:
            return self._SyncObj__doChangeCluster(request)
        finally:
            self._admitting_change = False

    def _uncommitted_membership_entry(self) -> bool:
        journal = self._SyncObj__raftLog
        first = journal[0][1]
        start = max(0, self.raftLastApplied + 1 - first)
        for pos in range(start, len(journal)):
            cmd = journal[pos][0]
            if cmd[:1] == _MEMBERSHIP_PREFIX:
                return True
        return False

    # -- coalesced append_entries -----------------------------------------------

    def take_commands_early(self) -> None:
        """Tick thread, at the tick's start: a leader appends and ships what was queued (module doc)."""
        if self._isLeader():
            self._checkCommandsToApply()

    def _checkCommandsToApply(self) -> None:  # noqa: N802 (pysyncobj name)
        if not self._coalesce:
            super()._checkCommandsToApply()
            return
        self._in_command_loop = True
        try:
            super()._checkCommandsToApply()
        finally:
            self._in_command_loop = False
            if self._unsent:
                self._unsent = 0
                if self._isLeader():
                    SyncObj._SyncObj__sendAppendEntries(self)

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 - overrides pysyncobj's private sender
        if self._in_command_loop:
            self._unsent += 1
            if self._unsent < self._coalesce_entries:
                return
            self._unsent = 0
        SyncObj._SyncObj__sendAppendEntries(self)
