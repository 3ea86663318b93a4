"""The raft node: one pysyncobj ``SyncObj`` with one replicated method.

Shape (see DESIGN.md, "The write path"): the leader submits opaque entries
(``type byte | msgpack``); pysyncobj replicates and commits them; on every
server the tick thread calls the single replicated method, which hands
``(index, entry)`` to ``target.apply``. The index is ``raftLastApplied + 1``
(pysyncobj increments it right after the method returns), identical on all
servers and across restarts.

Group commit and when callers see results
-----------------------------------------
``target.apply`` writes into a pending LMDB transaction; we call
``target.commit()`` once per tick, right after pysyncobj's apply loop for
that tick returns (we wrap it), and again at the end of the tick if anything
else applied. Client callbacks for successful entries are *deferred* until
right after that commit, so a caller that sees ``(result, index)`` can read the
state at ``index`` from LMDB immediately (a barrier read depends on this).
A crash can only lose the uncommitted tick: those entries are already in the
raft journal (pysyncobj writes it before applying), pysyncobj re-applies the
journal from its start (or the dump) on restart, and the FSM skips entries
``<= applied_index`` -- so nothing acknowledged is lost and nothing applies
twice (``tests/raft/test_cluster.py::test_kill9_*`` checks both).

pysyncobj defects handled here (numbers from shared/reference/pysyncobj.md)
--------------------------------------------------------------------------
1. follower truncation: :mod:`raft.truncation` rewrites append_entries in
   front of pysyncobj's handler (switch: ``CARAVAN_UNSAFE_DISABLE_TRUNCATION_FIX=1``,
   test only).
   Catch-up livelock (found by jepsen_like): the leader lets a failed
   append reply only lower a follower's nextIndex, never raise it, and a
   follower's mismatch reject skips the conflicting term's run
   (:mod:`raft.catchup`).
2. chunking of large entries: entries are capped (as stored in the log) at
   submit and again at the leader's command queue, for forwarded commands.
3. 0.0.0.0 bind and unauthenticated pickle: bind to the node's own host and
   authenticate every frame (:mod:`raft.auth`); the password is mandatory.
4. concurrent membership changes: dynamic membership is off by default; when
   enabled, the leader refuses a change while another is uncommitted.
5. an exception in the replicated method wedges pysyncobj: we catch anything
   the target raises, log it, and stop the process (exit code 70) -- a
   failure that is not a deterministic error result must not be skipped
   (that would diverge) nor retried forever (that wedges the node).
6. no fsync: ``fsync=True`` syncs the journal (and vote metadata) at the start
   of every tick, before the leader counts its own entries towards a commit,
   and holds follower acks and votes until the sync that covers them.
7. compaction is not crash-safe (pysyncobj clears the journal and re-adds
   the kept entries in place; and at restart it drops a journal that starts
   before the dump): :mod:`raft.journal` rewrites the journal into a temp
   file renamed into place, after syncing the dump, and at restart keeps the
   entries after the dump (Raft's InstallSnapshot rule).

Not in pysyncobj.md: a follower advances its commit index to its own log
end on every snapshot-install chunk, so a rejoining ex-leader applied (and
acknowledged) its own discarded tail before the snapshot replaced it;
:func:`raft.truncation.hold_commit_during_snapshot` keeps the commit index
still until an ordinary append_entries proves the log matches.
Also: pysyncobj answers a leader's write only when it applies
that index, so writes in a tail a rejoining ex-leader truncates waited until
the new log grew past them (on an idle cluster, forever);
``_Replica._answer_lost_writes`` answers them as discarded at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import os
import pickle
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import structlog
from pysyncobj import SyncObj, replicated
from pysyncobj.config import FAIL_REASON, SERIALIZER_STATE
from pysyncobj.monotonic import monotonic
from pysyncobj.node import TCPNode
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE

from raft.auth import LinkAuthenticator
from raft.catchup import SnapshotFloors, filter_reply
from raft.config import RaftConfig, _split_host_port
from raft.errors import (
    EntryTooLargeError,
    FatalApplyError,
    JournalUnchangedError,
    LeadershipTransferError,
    MembershipChangeError,
    NodeStoppedError,
    NotLeaderError,
    OverloadedError,
    RaftError,
    RequestDeniedError,
    UnknownOutcomeError,
)
from raft.journal import AtomicFileJournal, fsync_path
from raft.transport import CaravanTransport
from raft.truncation import TruncationStats, hold_commit_during_snapshot, rewrite_append_entries

#: Message type of a barrier entry in fsm/messages.py (never reused).
BARRIER_MESSAGE_TYPE = 19
#: Exit status after a fatal apply/commit failure (EX_SOFTWARE).
EXIT_FATAL = 70

_ROLES = {
    _RAFT_STATE.FOLLOWER: "follower",
    _RAFT_STATE.CANDIDATE: "candidate",
    _RAFT_STATE.LEADER: "leader",
}
# Outgoing messages that promise durable state (an ack of appended entries,
# a vote, a vote request for a term we just persisted): in fsync mode they
# wait for the next journal sync.
_DURABLE_PROMISES = frozenset({"next_node_idx", "response_vote", "request_vote"})


class ApplyTarget(Protocol):
    """What the FSM presents to the raft node (fsm.machine implements it)."""

    def apply(self, index: int, entry: bytes) -> object: ...

    def commit(self) -> None: ...

    @property
    def applied_index(self) -> int: ...


#: ``callback(result, index, error)``: exactly one of (result/index) or error is set.
SubmitCallback = Callable[[Any, "int | None", "RaftError | None"], None]
LeadershipCallback = Callable[[bool], None]
FatalHandler = Callable[[BaseException], None]


def encode_barrier(now_ns: int | None = None) -> bytes:
    """The barrier entry the FSM recognises (message type 19)."""
    payload = {
        "v": 1,
        "time": time.time_ns() if now_ns is None else now_ns,
        "rid": uuid.uuid4().hex,
    }
    return bytes([BARRIER_MESSAGE_TYPE]) + msgpack.packb(payload)


def _encode_command(func_id: int, entry: bytes) -> bytes:
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
    return 1 + len(_encode_command(0, entry))


def _safe_call(log: Any, fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a caller's bug must never break the tick thread
        log.exception("raft_callback_failed")


@dataclass
class _Waiter:
    """A one-shot result slot shared by a barrier batch or a transfer.

    Threads wait on ``event``; an asyncio loop awaits ``future(loop)``, one
    future per loop however many of its tasks share the batch.
    """

    event: threading.Event = field(default_factory=threading.Event)
    index: int | None = None
    error: RaftError | None = None
    _futures: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, index: int | None = None, error: RaftError | None = None) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.index, self.error = index, error
            self.event.set()
            futures = list(self._futures.items())
        for loop, future in futures:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there
                loop.call_soon_threadsafe(_resolve, future)

    def future(self, loop: asyncio.AbstractEventLoop, timeout: float) -> asyncio.Future[None]:
        """On ``loop``'s thread: a future done once the result is in, or ``timeout`` s after the first call.

        One timer per batch and loop rather than one per waiter: the waiters
        of a batch all joined within one tick.
        """
        with self._lock:
            future = self._futures.get(loop)
            if future is None:
                future = self._futures[loop] = loop.create_future()
                if self.event.is_set():
                    future.set_result(None)
                else:
                    timer = loop.call_later(timeout, _resolve, future)
                    # Cancelled when the batch commits: a timer left per batch
                    # would pile up in the loop's heap under steady reads.
                    future.add_done_callback(lambda _: timer.cancel())
        return future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _barrier_index(batch: _Waiter) -> int:
    """A finished barrier batch's index, or its error raised."""
    if batch.error is not None:
        raise batch.error
    assert batch.index is not None
    return batch.index


@dataclass
class _Transfer:
    target: str
    deadline: float
    waiter: _Waiter = field(default_factory=_Waiter)
    next_attempt: float = 0.0
    sent: int = 0


class _JournalView:
    """:class:`raft.truncation.LogView` over pysyncobj's in-memory journal list.

    Looks the journal up on every call: it exists as soon as SyncObj's
    constructor created it, before the transport can deliver anything."""

    __slots__ = ("_r",)

    def __init__(self, replica: Any) -> None:
        self._r = replica

    def first_index(self) -> int:
        return self._r._SyncObj__raftLog[0][1]

    def last_index(self) -> int:
        return self._r._SyncObj__raftLog[-1][1]

    def term_at(self, index: int) -> int:
        j = self._r._SyncObj__raftLog
        return j[index - j[0][1]][2]

    def holds(self, index: int, term: int) -> bool:
        """Whether the log has an entry at ``index`` of ``term`` (Raft's log matching)."""
        return self.first_index() <= index <= self.last_index() and self.term_at(index) == term


class _Replica(SyncObj):
    """The SyncObj subclass. Everything here runs on pysyncobj's tick thread
    unless marked otherwise. All attributes are assigned *before*
    ``SyncObj.__init__`` because pysyncobj starts the tick thread (and may
    receive messages) inside its constructor."""

    def __init__(self, owner: RaftNode, config: RaftConfig, conf: Any, target: ApplyTarget) -> None:
        self._owner = owner
        self._log = owner._log
        self._target = target
        self._auth = LinkAuthenticator(config.password)
        self._fix_enabled = config.truncation_fix_enabled
        self._fsync = config.fsync
        self._max_entry = config.max_entry_bytes
        self._dynamic_membership = config.dynamic_membership
        self._min_timeout = config.resolved_profile().raft_min_timeout
        self._tstats = TruncationStats()
        self._ack_override: int | None = None
        self._reject_hint: int | None = None
        # installs_retained: snapshot installs that kept the log after the snapshot (Raft's rule)
        self._cstats = {"stale_rejects_ignored": 0, "conflict_hints": 0, "installs_retained": 0}
        self._snapshot_floors = SnapshotFloors()
        self._install_ack: int | None = None  # next_node_idx of the confirmation of an install that kept the log
        self._held: list[tuple[Any, dict[str, Any]]] = []
        self._deferred: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._pending_commit = False
        self._tick_ident: int | None = None
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_pipe: PipeNotifier | None = None
        self._halted = False
        self._journal_path = config.journal_file
        self._dump_path = config.dump_file
        self._synced_fp: tuple[int, ...] | None = None
        self._synced_meta: tuple[Any, ...] | None = None
        self._synced_last_index = 0
        self._fstats = {
            "syncs": 0,
            "sync_seconds": 0.0,
            "max_sync_seconds": 0.0,
            "unsynced_acks": 0,
        }
        self._barrier_lock = threading.Lock()
        self._barrier_open: _Waiter | None = None
        self._transfer: _Transfer | None = None
        self._announced_leader = False
        self._commits = 0
        self._func_id = -1
        self._view = _JournalView(self)
        self._coalesce = not conf.appendEntriesUseBatch
        self._coalesce_entries = max(1, config.resolved_profile().coalesce_entries)
        self._in_command_loop = False
        self._unsent = 0
        if conf.deserializer is not None:
            # Wrapped here, not in RaftNode: pysyncobj may load the dump in its
            # first tick, before RaftNode has a reference to this object.
            conf.deserializer = self._aligning_deserializer(conf.deserializer)
        super().__init__(
            config.self_address,
            config.other_peers,
            conf,
            transportClass=CaravanTransport,
        )
        self._func_id = self._methodToID[self._getFuncName("caravan_apply")]

    # -- pysyncobj integration ---------------------------------------------

    def _caravan_before_start(self) -> None:
        """Called by CaravanTransport's constructor: pysyncobj has opened the
        journal but started no thread yet. Make its compaction crash-safe."""
        journal = self._SyncObj__raftLog
        if AtomicFileJournal.adopt(journal):
            journal.sync_compaction = self._fsync
            journal.durable_first = (self._dump_path,)
            journal.on_switch_failure = lambda exc: self._owner._fatal(
                "journal compaction", self.raftLastApplied, exc
            )
        else:
            self._log.warning("raft_journal_not_atomic", journal=type(journal).__name__)

    def _aligning_deserializer(self, fn: Callable[[str], Any]) -> Callable[[str], Any]:
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
                self._log.warning(
                    "raft_journal_aligned_to_dump",
                    dropped_from=before,
                    dump_index=last[1],
                    kept_to=journal[-1][1],
                    note="restarted between a dump and its compaction; entries after the dump kept",
                )
            elif len(journal) >= 2 and journal[0][1] > prev[1]:
                self._log.error(
                    "raft_journal_starts_after_dump",
                    journal_first=journal[0][1],
                    dump_index=last[1],
                    note="pysyncobj will replace the journal with the dump's entries",
                )
        except (JournalUnchangedError, IndexError, TypeError) as exc:
            # pysyncobj will now replace the journal with the dump's two
            # entries: the entries after the dump on this node are lost.
            self._log.critical("raft_journal_align_failed", error=f"{type(exc).__name__}: {exc}")

    @property
    def encryptor(self) -> LinkAuthenticator:  # read by the transport for every connection
        return self._auth

    def _getEncryptor(self) -> LinkAuthenticator:  # noqa: N802 (pysyncobj name)
        return self._auth

    @replicated
    def caravan_apply(self, entry: bytes) -> tuple[Any, int]:
        """The one replicated method: hand ``(index, entry)`` to the target."""
        index = self.raftLastApplied + 1
        if self._halted:
            # Never let pysyncobj advance past an entry the target did not apply.
            raise NodeStoppedError("raft node halted after a fatal apply error")
        try:
            result = self._target.apply(index, entry)
        except BaseException as exc:  # noqa: BLE001 - any failure here is fatal by design
            self._halted = True
            self._owner._fatal("apply", index, exc)
            raise NodeStoppedError("raft node halted after a fatal apply error") from exc
        self._pending_commit = True
        return result, index

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802,N803 (pysyncobj names)
        if self._tick_ident is None:
            self._tick_ident = threading.get_ident()
            self._wake_pipe = PipeNotifier(self._poller)
            self.addOnTickCallback(self._finish_tick)
        if self._fsync:
            # Before pysyncobj counts the leader's own log towards a commit
            # and before held acks/votes leave: make the journal durable.
            self._sync_journal()
        super()._onTick(timeToWait)
        # pysyncobj returns early (no tick callbacks) while the port is not
        # bound; make sure applied entries are committed on that path too.
        self._finish_tick()

    def _applyCommand(self, command: bytes, callback: Any, commandType: int | None = None) -> None:  # noqa: N802,N803
        """Single entrance of every command into pysyncobj's queue: local
        submits and (on the leader) commands forwarded by followers."""
        if commandType is None:
            ctype = command[0] if command else -1
            size = len(command)
        else:
            ctype = commandType
            size = len(command) + 1
        reason = None
        if ctype == _COMMAND_TYPE.REGULAR:
            if size > self._max_entry:
                reason = f"entry of {size} bytes exceeds the {self._max_entry} byte limit"
        elif ctype == _COMMAND_TYPE.MEMBERSHIP:
            if not self._dynamic_membership:
                reason = "dynamic membership is disabled"
        else:
            reason = f"command type {ctype} is never replicated by caravan"
        if reason is not None:
            self._log.warning(
                "raft_command_refused", reason=reason, forwarded=isinstance(callback, tuple)
            )
            self._SyncObj__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)
            return
        try:
            super()._applyCommand(command, callback, commandType)
        except BlockingIOError:
            pass  # wake-up pipe full: the command is queued and a wake-up is pending

    # Without batching, pysyncobj's leader sends append_entries to every
    # follower after *each* command it takes from the queue: under pipelined
    # load that is one message (and one ack) per entry per follower. We let
    # the command loop run and ship what it appended every
    # profile.coalesce_entries entries and once at its end -- same tick, so
    # a lone serial write still leaves at once.

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
                consumers = self._SyncObj__consumers
                own, rest = (data[0][0], data[0][1:]) if consumers else (data[0], [])
                for k, v in own.items():
                    self.__dict__[k] = v
                for i, consumer in enumerate(consumers):
                    consumer._deserialize(rest[i])
            journal = self._SyncObj__raftLog
            last, prev = data[1], data[2]
            retained = clearJournal and self._view.holds(last[1], last[2])
            if retained:
                self._cstats["installs_retained"] += 1
                self._SyncObj__raftLastApplied = max(self._SyncObj__raftLastApplied, last[1])
                # The entries after the snapshot may not be the leader's (log matching
                # holds only up to a shared entry): the confirmation claims the
                # snapshot, and appends then check the rest as usual.
                self._install_ack = last[1] + 1
            else:
                if clearJournal or len(journal) < 2 or journal[0] != prev or journal[1] != last:
                    journal.clear()
                    journal.add(*prev)
                    journal.add(*last)
                self._SyncObj__raftLastApplied = last[1]
            end = journal[-1][1]
            if self._SyncObj__raftCommitIndex > end:
                self._log.warning("raft_commit_index_clamped_after_dump", commit_index=self._SyncObj__raftCommitIndex, journal_end=end)
                self._SyncObj__raftCommitIndex = end
                journal.setRaftCommitIndex(end)
            if self._SyncObj__conf.dynamicMembershipChange:
                self_node = self._SyncObj__selfNode
                self._SyncObj__updateClusterConfiguration([n for n in data[3] if n != self_node])
            self._SyncObj__onSetCodeVersion(0)
        except Exception:  # noqa: BLE001 - as pysyncobj: a dump that cannot be loaded is logged, not raised
            self._log.exception("raft_dump_load_failed")

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
        return self._SyncObj__doChangeCluster(request)

    def _uncommitted_membership_entry(self) -> bool:
        journal = self._SyncObj__raftLog
        first = journal[0][1]
        start = max(0, self.raftLastApplied + 1 - first)
        for pos in range(start, len(journal)):
            cmd = journal[pos][0]
            if cmd[:1] == bytes([_COMMAND_TYPE.MEMBERSHIP]):
                return True
        return False

    # -- transport hooks (tick thread) ---------------------------------------

    def _caravan_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[..., None]
    ) -> None:
        mtype = message.get("type")
        if mtype == "next_node_idx":
            # Leader: a failed reply only lowers nextIndex (raft/catchup.py).
            if self._SyncObj__raftState == _RAFT_STATE.LEADER:
                match = self._snapshot_floors.match_index(
                    node, self._SyncObj__raftMatchIndex.get(node, 0), self.raftCurrentTerm, monotonic()
                )
                replaced = filter_reply(message, self._SyncObj__raftNextIndex.get(node), match)
                if replaced is not None:
                    self._cstats["stale_rejects_ignored"] += 1
                    message = replaced
                self._snapshot_floors.on_reply(node, message)
            deliver(node, message)
            return
        if mtype != "append_entries":
            deliver(node, message)
            return
        message = hold_commit_during_snapshot(message, self.raftCurrentTerm, self.raftCommitIndex)
        if self._fix_enabled:
            rw = rewrite_append_entries(
                message, self._view, self.raftCurrentTerm, self.raftCommitIndex
            )
            if rw.action in ("append_only", "present", "present_unproven_tail", "below_first"):
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
        else:
            deliver(node, message)
        if "prevLogIdx" in message:
            self._tstats.on_append_processed(
                message.get("commit_index", 0), self._view.last_index()
            )
        if self._SyncObj__commandsWaitingCommit and not self._isLeader():
            self._answer_lost_writes()

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
        last = self._view.last_index()
        applied = self.raftLastApplied
        lost = [i for i in waiting if (i > last and self._fix_enabled) or i <= applied]
        for idx in sorted(lost):
            reason = FAIL_REASON.DISCARDED if idx > last else FAIL_REASON.LEADER_CHANGED
            for _term, callback in waiting.pop(idx):
                callback(None, reason)

    def _caravan_on_send(
        self, node: Any, message: dict[str, Any], send: Callable[..., bool]
    ) -> bool:
        mtype = message.get("type")
        if mtype == "append_entries" and "serialized" in message:
            chunk = message["serialized"]
            if chunk is not None and chunk[2]:  # the last chunk: pysyncobj now sets nextIndex past it
                floor = self._SyncObj__raftLog[1][1] + 1  # the same index pysyncobj's sender uses
                self._snapshot_floors.sent(node, floor, self.raftCurrentTerm, monotonic())
        elif mtype == "next_node_idx":
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
            self._tstats.on_ack(
                self.raftCurrentTerm,
                self._view.last_index(),
                message["next_node_idx"],
                bool(message.get("success")),
            )
        if self._fsync and (self._held or mtype in _DURABLE_PROMISES):
            self._held.append((node, message))
            return True
        if mtype == "next_node_idx" and message.get("success"):
            if message["next_node_idx"] - 1 > self._synced_last_index:
                self._fstats["unsynced_acks"] += 1
        return send(node, message)

    # -- fsync mode (defect 6) ------------------------------------------------

    def _journal_fingerprint(self) -> tuple[int, ...]:
        j = self._SyncObj__raftLog
        return (getattr(j, "_FileJournal__currentOffset", 0), len(j), j[-1][1], j[-1][2])

    def _sync_journal(self) -> None:
        j = self._SyncObj__raftLog
        fp = self._journal_fingerprint()
        meta = (self.raftCurrentTerm, self._SyncObj__votedForNodeId)
        if fp != self._synced_fp or meta != self._synced_meta:
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
        self._synced_last_index = j[-1][1]
        if self._held:
            held, self._held = self._held, []
            transport = self._SyncObj__transport
            for node, message in held:
                if message.get("type") == "next_node_idx" and message.get("success"):
                    if message["next_node_idx"] - 1 > self._synced_last_index:
                        self._fstats["unsynced_acks"] += 1
                transport.raw_send(node, message)

    # -- end of tick: group commit, callbacks, tasks ---------------------------

    def commit_pending(self) -> bool:
        """Tick thread: commit the target's pending write txn, if any."""
        if self._pending_commit and not self._halted:
            self._pending_commit = False
            try:
                self._target.commit()
            except BaseException as exc:  # noqa: BLE001
                self._halted = True
                self._owner._fatal("commit", self.raftLastApplied, exc)
                return False
            self._commits += 1
        return not self._halted

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 - wraps pysyncobj's private apply loop
        """Group commit right where pysyncobj applied this tick's entries,
        then release their callbacks -- before the tick goes on to send
        append_entries, take new commands and compact, so callers see results
        as early as with raw pysyncobj."""
        need_send = SyncObj._SyncObj__applyLogEntries(self)
        if self.commit_pending() and self._deferred:
            self._fire_deferred()
        return need_send

    def _fire_deferred(self) -> None:
        batch, self._deferred = self._deferred, []
        for fn, args in batch:
            _safe_call(self._log, fn, *args)

    def _finish_tick(self) -> None:
        if self._fsync:
            # The leader's entries appended this tick were already sent to
            # followers; syncing now, before poll, overlaps our fsync with
            # theirs (the tick-start sync then finds nothing to do).
            self._sync_journal()
        if not self.commit_pending():
            return
        if self._deferred:
            self._fire_deferred()
        while self._tasks:
            _safe_call(self._log, self._tasks.popleft())
        self._flush_barrier_batch()
        if self._transfer is not None:
            self._drive_transfer()
        self._announce_leadership()

    def in_tick_thread(self) -> bool:
        return threading.get_ident() == self._tick_ident

    def wake(self) -> None:
        """Any thread: make the tick thread run soon instead of sleeping in poll."""
        pipe = self._wake_pipe
        if pipe is not None:
            try:
                pipe.notify()
            except BlockingIOError:
                pass

    def submit_command(self, command: bytes, callback: Callable[[Any, int], None]) -> None:
        """Any thread: queue an encoded command (size already checked)."""
        self._applyCommand(command, callback, _COMMAND_TYPE.REGULAR)

    def completion(self, user_cb: SubmitCallback) -> Callable[[Any, int], None]:
        """Wrap a caller's callback: successes wait for the tick's commit."""

        def on_result(res: Any, err: int) -> None:
            if err == FAIL_REASON.SUCCESS:
                result, index = res
                if self.in_tick_thread():
                    self._deferred.append((user_cb, (result, index, None)))
                else:
                    _safe_call(self._log, user_cb, result, index, None)
            else:
                _safe_call(self._log, user_cb, None, None, self._owner._error_for(err))

        return on_result

    # -- barrier ---------------------------------------------------------------

    def join_barrier(self) -> _Waiter:
        """Any thread: join the barrier batch that the next tick will submit.

        A batch closes when the tick thread submits it, so every reader in it
        arrived before its entry was appended; a reader arriving later joins
        the next batch. (Sharing an entry appended before a read started
        would not make that read linearizable.)"""
        with self._barrier_lock:
            batch = self._barrier_open
            opened = batch is None
            if opened:
                batch = self._barrier_open = _Waiter()
        if opened:  # later joiners ride on this wake-up: the batch stays open until that tick
            self.wake()
        return batch

    def _flush_barrier_batch(self) -> None:
        if (
            self._barrier_open is None
        ):  # unlocked peek: joiners always wake the tick after setting it
            return
        with self._barrier_lock:
            batch, self._barrier_open = self._barrier_open, None
        if batch is None:
            return
        if not self._isLeader() or self._transfer is not None:
            batch.finish(error=NotLeaderError(self._owner.leader_address))
            return

        def done(result: Any, index: int | None, error: RaftError | None) -> None:
            batch.finish(index=index, error=error)

        self.submit_command(_encode_command(self._func_id, encode_barrier()), self.completion(done))

    # -- leadership ----------------------------------------------------------------

    def _announce_leadership(self) -> None:
        """on_leadership(True) once the leader has applied its own no-op, i.e.
        every entry committed before its term is in the FSM (as Nomad's
        establishLeadership waits for a barrier); False as soon as it is not
        leader any more."""
        noop = self._SyncObj__noopIDx
        ready = self._isLeader() and noop is not None and self.raftLastApplied >= noop
        if ready != self._announced_leader:
            self._announced_leader = ready
            self._owner._leadership_changed(ready, self.raftCurrentTerm)

    def start_transfer(self, transfer: _Transfer) -> None:
        if self._transfer is not None:
            transfer.waiter.finish(
                error=LeadershipTransferError("another leadership transfer is in progress")
            )
            return
        if not self._isLeader():
            transfer.waiter.finish(error=NotLeaderError(self._owner.leader_address))
            return
        self._transfer = transfer
        self._log.info("raft_transfer_started", target=transfer.target)
        self._drive_transfer()

    def _drive_transfer(self) -> None:
        tr = self._transfer
        assert tr is not None
        now = monotonic()
        leader = self._getLeader()
        if not self._isLeader():
            if leader is not None and leader.id == tr.target:
                self._end_transfer(None)
            elif leader is not None and leader != self.selfNode:
                self._end_transfer(
                    LeadershipTransferError(f"leadership went to {leader.id}, not {tr.target}")
                )
            elif now > tr.deadline:
                self._end_transfer(
                    LeadershipTransferError(f"{tr.target} did not take over in time")
                )
            return
        if now > tr.deadline:
            self._end_transfer(
                LeadershipTransferError(
                    f"{tr.target} did not catch up and win an election in time; still leader"
                )
            )
            return
        if now < tr.next_attempt:
            return
        node = TCPNode(tr.target)
        match = self._SyncObj__raftMatchIndex.get(node, 0)
        if match != self._SyncObj__raftLog[-1][1] or not self.isNodeConnected(node):
            return  # writes are fenced; the target catches up within a few ticks

        def sent(_res: Any, err: int) -> None:
            if err == FAIL_REASON.SUCCESS:
                tr.sent += 1

        # pysyncobj 0.3.17's Raft TimeoutNow: the target starts an election
        # at once and ignores our heartbeats until it ends. Resend if we are
        # still leader after an election timeout (message lost, target busy).
        self.transferLeadership(node, sent)
        tr.next_attempt = now + self._min_timeout

    def _end_transfer(self, error: RaftError | None) -> None:
        tr, self._transfer = self._transfer, None
        if tr is not None:
            self._log.info("raft_transfer_finished", target=tr.target, ok=error is None)
            tr.waiter.finish(error=error)

    @property
    def transfer_in_progress(self) -> bool:
        return self._transfer is not None


_BIND_HINTS = {
    errno.EADDRINUSE: "another process holds the port (a server still running from an earlier start?): "
    "stop it or choose another raft_addr",
    errno.EADDRNOTAVAIL: "the host is not an address of this machine: use one of its own addresses",
}


def _check_bindable(address: str, grace: float = 2.0) -> None:
    """Fail early, saying why, when the raft address cannot be listened on.

    pysyncobj retries a failed bind every second and never says why, so a port
    held by another process cost the whole bind timeout and a vague error.
    Binding the way pysyncobj will (SO_REUSEADDR) and closing at once tells
    the cause. "In use" is retried for ``grace`` seconds: right after a
    server is killed its accepted connections still hold the port for a few
    milliseconds (measured: up to 10 ms) while they close.
    """
    host, port = _split_host_port(address, "raft bind address")  # validated with the config: cannot fail here
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    deadline = monotonic() + grace
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or monotonic() > deadline:
                    hint = _BIND_HINTS.get(exc.errno or 0, "check the address")
                    raise RaftError(
                        f"cannot listen on raft address {address}: {exc.strerror or exc}; {hint}"
                    ) from None
        time.sleep(0.02)


class _Notifier:
    """Delivers leadership changes on their own thread, in order, so a slow
    callback (starting leader loops) never delays heartbeats."""

    def __init__(self, callback: LeadershipCallback | None, log: Any) -> None:
        self._callback = callback
        self._log = log
        self._queue: collections.deque[bool | None] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        if callback is not None:
            self._thread = threading.Thread(target=self._run, name="raft-leadership", daemon=True)
            self._thread.start()

    def post(self, value: bool) -> None:
        if self._callback is None:
            return
        with self._cv:
            self._queue.append(value)
            self._cv.notify()

    def stop(self) -> None:
        if self._thread is None:
            return
        with self._cv:
            self._queue.append(None)
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        assert self._callback is not None
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                value = self._queue.popleft()
            if value is None:
                return
            _safe_call(self._log, self._callback, value)


class RaftNode:
    """A Caravan server's raft node.

    Threading: ``submit``/``submit_sync``/``barrier``/``transfer_leadership``
    may be called from any thread except the tick thread (``submit`` with a
    callback is fine there too). Callbacks run on the tick thread and must
    return quickly; ``on_leadership`` runs on its own thread.
    """

    def __init__(
        self,
        config: RaftConfig,
        target: ApplyTarget,
        *,
        on_leadership: LeadershipCallback | None = None,
        on_fatal: FatalHandler | None = None,
        bind_timeout: float = 10.0,
    ) -> None:
        config.validate()
        os.makedirs(config.data_path, exist_ok=True)
        self._config = config
        self._log = structlog.get_logger("raft").bind(node_id=config.self_address)
        self._on_fatal = on_fatal
        self._stopped = False
        self._notifier = _Notifier(on_leadership, self._log)
        if not config.truncation_fix_enabled:
            self._log.warning(
                "raft_truncation_fix_disabled", note="TEST ONLY: acknowledged writes can be lost"
            )
        hooks: dict[str, Any] = {"onStateChanged": self._on_state_changed}
        if config.serializer is not None and config.deserializer is not None:
            hooks["serializer"] = self._wrap_snapshot_hook(config.serializer)
            hooks["deserializer"] = self._wrap_snapshot_hook(config.deserializer)
            if config.serialize_checker is not None:
                hooks["serializeChecker"] = self._wrap_serialize_checker(config.serialize_checker)
        conf = config.to_syncobj_conf(**hooks)
        _check_bindable(config.effective_bind_address)
        self._obj = _Replica(self, config, conf, target)
        transport = self._obj._SyncObj__transport
        if not transport._bindOverEvent.wait(bind_timeout) or not transport.ready:
            self._obj.destroy()
            raise RaftError(
                f"could not listen on {config.effective_bind_address} within {bind_timeout:.0f}s; "
                "is the address local and the port free?"
            )
        self._log.info(
            "raft_started",
            bind=config.effective_bind_address,
            peers=config.other_peers,
            profile=config.profile,
            fsync=config.fsync,
            max_entry_bytes=config.max_entry_bytes,
        )

    # -- properties ------------------------------------------------------------

    @property
    def config(self) -> RaftConfig:
        return self._config

    @property
    def self_address(self) -> str:
        return self._config.self_address

    @property
    def is_leader(self) -> bool:
        """Local belief only (a deposed leader may not know yet): use
        :meth:`barrier` before serving a linearizable read."""
        return self._obj._isLeader()

    @property
    def leader_address(self) -> str | None:
        """The leader this node is in contact with, or None.

        pysyncobj keeps a follower's last leader until the follower starts an
        election, and a follower that reaches no peer never starts one: with
        the leader and the other follower down it would name the dead leader
        forever, and forward every request there. Past its election deadline
        (no heartbeat for an election timeout) a follower knows no leader,
        as a hashicorp/raft follower does once its heartbeat times out.
        """
        obj = self._obj
        leader = obj._getLeader()
        if leader is None:
            return None
        if not obj._isLeader() and obj._SyncObj__raftElectionDeadline < monotonic():
            return None
        return leader.id

    @property
    def max_entry_bytes(self) -> int:
        return self._config.max_entry_bytes

    # -- writes ------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._stopped or self._obj._halted:
            raise NodeStoppedError("raft node is stopped")
        if self._obj.transfer_in_progress:
            raise NotLeaderError(None, "leadership transfer in progress; retry shortly")
        if not self._obj._isLeader():
            raise NotLeaderError(self.leader_address)

    def submit(self, entry: bytes, callback: SubmitCallback | None = None) -> None:
        """Append ``entry`` to the log (leader only); asynchronous.

        Raises :class:`NotLeaderError` or :class:`EntryTooLargeError` before
        anything is queued. Later outcomes go to ``callback(result, index,
        error)`` on the tick thread, after the tick's FSM commit.
        """
        if not isinstance(entry, bytes | bytearray):
            raise TypeError("raft entries are bytes")
        self._check_writable()
        command = _encode_command(self._obj._func_id, bytes(entry))
        size = len(command) + 1
        if size > self._config.max_entry_bytes:
            raise EntryTooLargeError(len(entry), size, self._config.max_entry_bytes)
        cb = self._obj.completion(callback) if callback is not None else None
        self._obj.submit_command(command, cb)

    def submit_sync(self, entry: bytes, timeout: float = 5.0) -> tuple[Any, int]:
        """Submit and wait: returns ``(result, index)``.

        A timeout raises :class:`UnknownOutcomeError` -- the entry may still
        commit; retry only with an idempotent request id.
        """
        if self._obj.in_tick_thread():
            raise RaftError("submit_sync must not run on the raft tick thread (it would deadlock)")
        waiter = _Waiter()
        box: list[Any] = []

        def done(result: Any, index: int | None, error: RaftError | None) -> None:
            box.append(result)
            waiter.finish(index=index, error=error)

        self.submit(entry, done)
        if not waiter.event.wait(timeout):
            raise UnknownOutcomeError(
                f"entry not committed within {timeout:g}s; it may still be applied"
            )
        if waiter.error is not None:
            raise waiter.error
        assert waiter.index is not None
        return box[0], waiter.index

    def barrier(self, timeout: float = 5.0) -> int:
        """Commit a no-op barrier through the log; return its index.

        Once it returns, this node was leader when the barrier committed and
        its FSM has applied (and committed) everything up to the returned
        index, so a read served now is linearizable. Concurrent callers share
        one barrier entry.
        """
        if self._obj.in_tick_thread():
            raise RaftError("barrier must not run on the raft tick thread (it would deadlock)")
        self._check_writable()
        batch = self._obj.join_barrier()
        if not batch.event.wait(timeout):
            raise UnknownOutcomeError(f"barrier not committed within {timeout:g}s")
        return _barrier_index(batch)

    async def barrier_async(self, timeout: float = 5.0) -> int:
        """:meth:`barrier` for a coroutine on an asyncio loop, without holding a thread.

        Every task of the loop that arrives before the batch is submitted
        shares its entry, so a few hundred concurrent linearizable reads cost
        one barrier (waiting in threads, they were as many entries as threads).
        """
        self._check_writable()
        batch = self._obj.join_barrier()
        # shield: a waiter cancelled (its client went away) must not cancel the batch's future.
        await asyncio.shield(batch.future(asyncio.get_running_loop(), timeout))
        if not batch.event.is_set():
            raise UnknownOutcomeError(f"barrier not committed within {timeout:g}s")
        return _barrier_index(batch)

    # -- leadership -------------------------------------------------------------

    def transfer_leadership(self, target: str, timeout: float = 5.0) -> None:
        """Hand leadership to ``target`` and wait until it has taken over.

        New writes are refused (:class:`NotLeaderError`) while the transfer
        runs, so the target can catch up; once it matches our log we send
        pysyncobj's TimeoutNow and the target wins the election it starts.
        On failure (timeout, another node won) raises
        :class:`LeadershipTransferError`; writes resume on this node if it is
        still leader.
        """
        if target == self.self_address:
            raise LeadershipTransferError("cannot transfer leadership to this node itself")
        if target not in self._config.other_peers:
            raise LeadershipTransferError(f"{target} is not a peer of this cluster")
        if self._obj.in_tick_thread():
            raise RaftError("transfer_leadership must not run on the raft tick thread")
        if not self._obj._isLeader():
            raise NotLeaderError(self.leader_address)
        transfer = _Transfer(target=target, deadline=monotonic() + timeout)
        self._obj._tasks.append(lambda: self._obj.start_transfer(transfer))
        self._obj.wake()
        if not transfer.waiter.event.wait(timeout + 1.0):
            raise LeadershipTransferError(f"leadership transfer to {target} did not finish in time")
        if transfer.waiter.error is not None:
            raise transfer.waiter.error

    def add_peer(self, address: str, timeout: float = 5.0) -> None:
        """Add a voting member (only with ``dynamic_membership``; one change at a time)."""
        self._membership_change("add", address, timeout)

    def remove_peer(self, address: str, timeout: float = 5.0) -> None:
        """Remove a voting member (only with ``dynamic_membership``; one change at a time)."""
        self._membership_change("remove", address, timeout)

    def _membership_change(self, op: str, address: str, timeout: float) -> None:
        if not self._config.dynamic_membership:
            raise MembershipChangeError(
                "dynamic membership is disabled; the peer list is static (set dynamic_membership to enable)"
            )
        self._check_writable()
        waiter = _Waiter()

        def done(_res: Any, err: int) -> None:
            waiter.finish(error=None if err == FAIL_REASON.SUCCESS else self._error_for(err))

        if op == "add":
            self._obj.addNodeToCluster(address, done)
        else:
            self._obj.removeNodeFromCluster(address, done)
        if not waiter.event.wait(timeout):
            raise UnknownOutcomeError(
                f"membership change ({op} {address}) not committed within {timeout:g}s"
            )
        if isinstance(waiter.error, RequestDeniedError):
            raise MembershipChangeError(
                f"membership change ({op} {address}) refused: another change is still uncommitted "
                "or the leader has not committed its first entry yet; retry"
            )
        if waiter.error is not None:
            raise waiter.error

    # -- status ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """A snapshot of this node's raft state (read without locks; fields
        may be from slightly different moments)."""
        obj = self._obj
        for _ in range(5):
            try:
                return self._status_once(obj)
            except (
                RuntimeError,
                IndexError,
            ):  # the tick thread changed a dict / rewrote the journal list
                time.sleep(0.001)
                continue
        return self._status_once(obj)

    def _status_once(self, obj: _Replica) -> dict[str, Any]:
        state = obj._SyncObj__raftState
        journal = obj._SyncObj__raftLog
        is_leader = state == _RAFT_STATE.LEADER
        match = dict(obj._SyncObj__raftMatchIndex)
        nxt = dict(obj._SyncObj__raftNextIndex)
        peers = []
        for node in sorted(obj.otherNodes, key=lambda n: n.id):
            peers.append(
                {
                    "address": node.id,
                    "connected": obj.isNodeConnected(node),
                    "match_index": match.get(node) if is_leader else None,
                    "next_index": nxt.get(node) if is_leader else None,
                }
            )
        return {
            "self": self.self_address,
            "role": _ROLES.get(state, str(state)),
            "term": obj.raftCurrentTerm,
            "leader": self.leader_address,
            "commit_index": obj.raftCommitIndex,
            "applied_index": obj.raftLastApplied,
            "last_log_index": journal[-1][1],
            "first_log_index": journal[0][1],
            "peers": peers,
            "leader_ready": obj._announced_leader,
            "transfer_in_progress": obj.transfer_in_progress,
            "profile": self._config.profile,
            "fsync": self._config.fsync,
            "fsync_stats": dict(obj._fstats),
            "fsm_commits": obj._commits,
            "truncation_fix": obj._fix_enabled,
            "truncation": obj._tstats.as_dict(),
            "catchup": dict(obj._cstats),
            "halted": obj._halted,
        }

    # -- lifecycle -------------------------------------------------------------

    def destroy(self, timeout: float = 5.0) -> None:
        """Stop the tick thread, close sockets and the journal. Idempotent.

        Entries still queued in pysyncobj are dropped (their waiters time out
        with UnknownOutcomeError); everything applied was committed by the
        last tick.
        """
        if self._stopped:
            return
        self._stopped = True
        obj = self._obj
        obj.destroy()
        thread = obj._SyncObj__thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        err = NodeStoppedError("raft node stopped")
        with obj._barrier_lock:
            batch, obj._barrier_open = obj._barrier_open, None
        if batch is not None:
            batch.finish(error=err)
        if obj._transfer is not None:
            obj._transfer.waiter.finish(error=err)
        self._notifier.stop()
        self._log.info("raft_stopped")

    # -- internals ---------------------------------------------------------------

    def _wrap_snapshot_hook(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """pysyncobj calls the snapshot serializer/deserializer on the tick
        thread, after this tick's entries were applied but before our
        end-of-tick commit: commit first, so the serializer reads (and the
        deserializer replaces) a store that holds every applied entry."""

        def hook(*args: Any) -> Any:
            obj = getattr(self, "_obj", None)
            if obj is not None:
                obj.commit_pending()
            return fn(*args)

        return hook

    def _wrap_serialize_checker(self, fn: Callable[[], int]) -> Callable[[], int]:
        """pysyncobj polls the checker every tick (no commit needed: it only
        reports on a dump already started). An exception there would abort
        the rest of the tick (apply, sends, our commit) on every tick, so it
        is logged and reported as a failed dump instead; pysyncobj then keeps
        the journal and tries again later."""

        def checker() -> int:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - must never break the tick
                self._log.error(
                    "raft_serialize_checker_failed", error=f"{type(exc).__name__}: {exc}"
                )
                return SERIALIZER_STATE.FAILED

        return checker

    def _on_state_changed(self, old: int, new: int) -> None:
        # May run before self._obj is assigned (pysyncobj ticks during its
        # constructor); it must never raise inside pysyncobj's state change.
        self._log.info("raft_role_changed", old=_ROLES.get(old), new=_ROLES.get(new))

    def _leadership_changed(self, is_leader: bool, term: int) -> None:
        self._log.info("raft_leadership", is_leader=is_leader, term=term)
        self._notifier.post(is_leader)

    def _error_for(self, reason: int) -> RaftError:
        if reason == FAIL_REASON.QUEUE_FULL:
            return OverloadedError("raft command queue is full; nothing was appended, retry later")
        if reason in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
            return NotLeaderError(self.leader_address)
        if reason == FAIL_REASON.DISCARDED:
            return NotLeaderError(
                self.leader_address, "the entry was replaced by a new leader and not applied"
            )
        if reason == FAIL_REASON.REQUEST_DENIED:
            return RequestDeniedError(
                "the leader refused the entry (too large or not a caravan entry)"
            )
        return UnknownOutcomeError(
            "leadership changed before the entry committed; it may still be applied"
        )

    def _fatal(self, what: str, index: int, exc: BaseException) -> None:
        """Defect 5: the target failed in a way that is not a deterministic
        error result. Retrying wedges pysyncobj and skipping diverges, so the
        only safe move is to stop; on restart the journal replays the entry."""
        self._log.critical(
            "raft_fatal_apply_error",
            stage=what,
            index=index,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        if self._on_fatal is not None:
            self._on_fatal(FatalApplyError(f"{what} failed at index {index}: {type(exc).__name__}"))
            obj = getattr(self, "_obj", None)
            if obj is not None:
                obj.destroy()
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(EXIT_FATAL)
