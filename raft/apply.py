"""The apply path: the one replicated method, group commit, and outcomes.

On every server the tick thread calls the single replicated method, which
hands ``(index, entry)`` to ``target.apply``. The index is
``raftLastApplied + 1`` (pysyncobj increments it right after the method
returns), identical on all servers and across restarts.

``target.apply`` writes into a pending LMDB transaction; we call
``target.commit()`` once per tick, right after pysyncobj's apply loop for
that tick returns (we wrap it), and again at the end of the tick if anything
else applied. Client callbacks for successful entries are *deferred* until
right after that commit, so a caller that sees ``(result, index)`` can read
the state at ``index`` from LMDB immediately (a barrier read depends on this).

A tick applies everything committed, which can take seconds (a backlog
after a restart, a run of large entries). pysyncobj sends nothing while it
applies, and checks a follower's election deadline at the start of the next
tick, before it reads the leader's messages that came meanwhile: a busy
cluster held elections under its own load (16 in 25 s during a mass
node-down). So the apply goes in slices of ``APPLY_SLICE`` entries, and
once it has run ``KEEPALIVE_AFTER`` seconds it shows it is alive between
slices: a leader sends its append_entries (heartbeats) to the followers, a
follower pushes its election deadline out by a fresh timeout, as if it had
just heard from the leader (it had: it is applying what the leader sent),
and tells the leader it is alive with a reply that changes nothing else, so
a leader waiting on followers busy applying keeps its check-quorum lease.
Neither touches safety; a leader that died meanwhile is noticed one
election timeout later.

Defect 5 (shared/reference/pysyncobj.md): an exception in the replicated
method wedges pysyncobj, so anything the target raises stops the node
(raft/events.py) -- a failure that is not a deterministic error result must
not be skipped (that would diverge) nor retried forever (that wedges it).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pysyncobj import SyncObj, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.syncobj import _COMMAND_TYPE

from raft.errors import (
    NodeStoppedError,
    NotLeaderError,
    OverloadedError,
    RaftError,
    RequestDeniedError,
    UnknownOutcomeError,
)
from raft.replica_base import ReplicaBase
from raft.waiters import safe_call


class ApplyTarget(Protocol):
    """What the FSM presents to the raft node (fsm.machine implements it)."""

    def apply(self, index: int, entry: bytes) -> object: ...

    def commit(self) -> None: ...

    @property
    def applied_index(self) -> int: ...


APPLY_SLICE = 4  # entries applied between checks of how long the tick has been applying
KEEPALIVE_AFTER = 0.1  # seconds of applying after which the tick shows it is alive, and again each time
#: A follower's reply that changes nothing on the leader (not a success, not a reset: pysyncobj
#: only notes the response time) and that check-quorum counts as contact (raft/quorum.py).
ALIVE_WHILE_APPLYING = {"type": "next_node_idx", "next_node_idx": 0, "reset": False, "success": False}

#: ``callback(result, index, error)``: exactly one of (result/index) or error is set.
SubmitCallback = Callable[[Any, "int | None", "RaftError | None"], None]


class ApplyPath(ReplicaBase):
    """Mixin: apply entries to the target, commit once per tick, release callbacks."""

    def setup_apply(self, target: ApplyTarget) -> None:
        """Before ``SyncObj.__init__``: the target and the tick's bookkeeping."""
        self._target = target
        self._halted = False
        self._pending_commit = False
        self._deferred: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._commits = 0
        self._tick_ident: int | None = None
        self._wake_pipe: PipeNotifier | None = None
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()

    @property
    def halted(self) -> bool:
        """Whether a fatal apply or commit failure stopped this replica."""
        return self._halted

    @property
    def commits(self) -> int:
        """FSM commits (group commits) so far."""
        return self._commits

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
            self.owner.fatal("apply", index, exc)
            raise NodeStoppedError("raft node halted after a fatal apply error") from exc
        self._pending_commit = True
        return result, index

    def commit_pending(self) -> bool:
        """Tick thread: commit the target's pending write txn, if any."""
        if self._pending_commit and not self._halted:
            self._pending_commit = False
            try:
                self._target.commit()
            except BaseException as exc:  # noqa: BLE001
                self._halted = True
                self.owner.fatal("commit", self.raftLastApplied, exc)
                return False
            self._commits += 1
        return not self._halted

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 - wraps pysyncobj's private apply loop
        """Group commit right where pysyncobj applied this tick's entries,
        then release their callbacks -- before the tick goes on to send
        append_entries, take new commands and compact, so callers see results
        as early as with raw pysyncobj."""
        need_send = False
        commit = self._SyncObj__raftCommitIndex
        alive_at = time.monotonic()
        while self.raftLastApplied < commit:
            before = self.raftLastApplied
            # pysyncobj applies up to its commit index: show it a slice at a time.
            self._SyncObj__raftCommitIndex = min(commit, before + APPLY_SLICE)
            try:
                need_send = SyncObj._SyncObj__applyLogEntries(self) or need_send
            finally:
                self._SyncObj__raftCommitIndex = commit
            if self.raftLastApplied == before:
                break  # entries not in the log (compacted away): nothing more to apply here
            if time.monotonic() - alive_at >= KEEPALIVE_AFTER:
                self.keep_alive()
                alive_at = time.monotonic()
        if self.commit_pending():
            self.fire_deferred()
        return need_send

    def keep_alive(self) -> None:
        """Tick thread, deep in a long apply: a leader heartbeats its followers; a follower waits
        longer, and tells its leader it is alive (the leader's check-quorum lease counts it)."""
        if self._isLeader():
            self._SyncObj__sendAppendEntries()
            return
        leader = self._getLeader()
        if leader is not None:
            deadline = time.monotonic() + self._SyncObj__generateRaftTimeout()
            self._SyncObj__raftElectionDeadline = max(self._SyncObj__raftElectionDeadline, deadline)
            self._SyncObj__transport.send(leader, dict(ALIVE_WHILE_APPLYING))

    def fire_deferred(self) -> None:
        """Tick thread, after a commit: run the callbacks of the committed entries."""
        if not self._deferred:
            return
        batch, self._deferred = self._deferred, []
        for fn, args in batch:
            safe_call(self.log, fn, *args)

    def run_tasks(self) -> None:
        """Tick thread: run what other threads queued with :meth:`run_on_tick`."""
        while self._tasks:
            safe_call(self.log, self._tasks.popleft())

    def run_on_tick(self, task: Callable[[], None]) -> None:
        """Any thread: run ``task`` on the tick thread at the end of its next tick."""
        self._tasks.append(task)
        self.wake()

    def bind_tick_thread(self) -> bool:
        """Tick thread: remember it and open the wake-up pipe; True on the first tick only."""
        if self._tick_ident is not None:
            return False
        self._tick_ident = threading.get_ident()
        self._wake_pipe = PipeNotifier(self._poller)
        return True

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

    def submit_command(self, command: bytes, callback: Callable[[Any, int], None] | None) -> None:
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
                    safe_call(self.log, user_cb, result, index, None)
            else:
                safe_call(self.log, user_cb, None, None, self.error_for(err))

        return on_result

    def error_for(self, reason: int) -> RaftError:
        """The caller's error for a pysyncobj ``FAIL_REASON``."""
        if reason == FAIL_REASON.QUEUE_FULL:
            return OverloadedError("raft command queue is full; nothing was appended, retry later")
        if reason in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
            return NotLeaderError(self.known_leader())
        if reason == FAIL_REASON.DISCARDED:
            return NotLeaderError(
                self.known_leader(), "the entry was replaced by a new leader and not applied"
            )
        if reason == FAIL_REASON.REQUEST_DENIED:
            return RequestDeniedError(
                "the leader refused the entry (too large or not a caravan entry)"
            )
        return UnknownOutcomeError(
            "leadership changed before the entry committed; it may still be applied"
        )
