"""The raft node: Caravan's public API over one pysyncobj ``SyncObj``.

Shape (see DESIGN.md, "The write path"): the leader submits opaque entries
(``type byte | msgpack``); pysyncobj replicates and commits them; on every
server the tick thread calls the single replicated method, which hands
``(index, entry)`` to ``target.apply`` and commits once per tick before any
caller hears of its entry (raft/apply.py). A crash can only lose the
uncommitted tick: those entries are already in the raft journal (pysyncobj
writes it before applying), pysyncobj re-applies the journal from its start
(or the dump) on restart, and the FSM skips entries ``<= applied_index`` --
so nothing acknowledged is lost and nothing applies twice
(``tests/raft/test_cluster.py::test_kill9_*`` checks both).

Where each mechanism lives (numbers from shared/reference/pysyncobj.md)
-----------------------------------------------------------------------
- this module: :class:`RaftNode`, the API callers use (writes, barriers,
  leadership transfer, membership, status, lifecycle);
- raft/replica.py: the ``SyncObj`` subclass, composed of one mixin per
  mechanism (raft/replica_base.py explains the layout);
- raft/apply.py: the replicated method, group commit, callbacks; defect 5
  (an exception in the replicated method wedges pysyncobj: we stop the
  process, exit code 70, via raft/events.py);
- raft/commands.py: defect 2 (entries of 64 KiB or more are corrupted:
  capped at submit and at the leader's queue), defect 4 (concurrent
  membership changes), and coalesced append_entries;
- raft/repair.py: defect 1 (follower truncation, :mod:`raft.truncation`),
  the catch-up livelock (:mod:`raft.catchup`), snapshot installs and writes
  lost in a truncated tail;
- raft/durability.py: defect 6 (no fsync) and defect 7 (compaction is not
  crash-safe, :mod:`raft.journal`);
- raft/leadership.py, raft/barrier.py: leadership announcements and
  transfer; batched barriers for linearizable reads;
- raft/quorum.py: check-quorum (a leader out of touch with a majority for
  an election timeout steps down and answers its pending writes), quorum
  contact for forwarding, and no campaign straight after a rejoin;
  raft/transport.py's keep-alives keep idle follower links from timing out
  (their loss cost every election a round);
- raft/members.py, raft/membership.py: live membership (dynamic mode): the
  member table (id, raft and RPC address) carried by the membership entries
  and the dump's node set, ``members.json`` for restarts, and who may
  campaign (not a removed server, not a newcomer before it heard a leader);
- raft/startup.py: the port check (pysyncobj retries a failed bind forever,
  silently) and pysyncobj's role-change and snapshot hooks. Defect 3
  (0.0.0.0 bind, unauthenticated pickle) is closed by raft/config.py (bind
  to the node's own host, mandatory password) and :mod:`raft.auth` (every
  frame authenticated).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import structlog
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic

from raft.apply import ApplyTarget, SubmitCallback
from raft.barrier import barrier_index
from raft.config import RaftConfig
from raft.entries import BARRIER_MESSAGE_TYPE, encode_barrier, encode_command, encoded_entry_size
from raft.errors import (
    EntryTooLargeError,
    LeadershipTransferError,
    MembershipChangeError,
    NodeStoppedError,
    NotLeaderError,
    RaftError,
    RequestDeniedError,
    UnknownOutcomeError,
)
from raft.events import EXIT_FATAL, FatalHandler, LeadershipCallback, NodeEvents
from raft.leadership import Transfer
from raft.members import (
    MEMBERSHIP_TYPE,
    Member,
    MemberState,
    membership_command,
    starting_members,
)
from raft.replica import Replica
from raft.startup import check_bindable, syncobj_hooks
from raft.status import replica_status
from raft.waiters import Waiter

__all__ = [
    "BARRIER_MESSAGE_TYPE",
    "EXIT_FATAL",
    "ApplyTarget",
    "FatalHandler",
    "LeadershipCallback",
    "RaftNode",
    "SubmitCallback",
    "encode_barrier",
    "encoded_entry_size",
]


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
        self._stopped = False
        self._events = NodeEvents(self._log, on_leadership, on_fatal, self._replica_or_none)
        if not config.truncation_fix_enabled:
            self._log.warning(
                "raft_truncation_fix_disabled", note="TEST ONLY: acknowledged writes can be lost"
            )
        conf = config.to_syncobj_conf(**syncobj_hooks(config, self._log, self._replica_or_none))
        check_bindable(config.effective_bind_address)
        members = starting_members(config)
        self._obj = Replica(self._events, config, conf, target, members)
        self._await_bind(bind_timeout)
        self._log.info(
            "raft_started",
            bind=config.effective_bind_address,
            peers=[m.raft_addr for m in members.members if m.raft_addr != config.self_address],
            member=config.self_address in {m.raft_addr for m in members.members},
            profile=config.profile,
            fsync=config.fsync,
            max_entry_bytes=config.max_entry_bytes,
        )

    def _replica_or_none(self) -> Replica | None:
        """The replica once its constructor returned; pysyncobj calls back during it."""
        return getattr(self, "_obj", None)

    def _await_bind(self, bind_timeout: float) -> None:
        transport = self._obj._SyncObj__transport
        if not transport._bindOverEvent.wait(bind_timeout) or not transport.ready:
            self._obj.destroy()
            raise RaftError(
                f"could not listen on {self._config.effective_bind_address} within {bind_timeout:.0f}s; "
                "is the address local and the port free?"
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
        """The leader this node is in contact with, or None (see ``Replica.known_leader``:
        a follower past its election deadline names no leader)."""
        return self._obj.known_leader()

    @property
    def quorum_contact_lost(self) -> bool:
        """Whether this node has been cut off from a majority of the voters for over an
        election timeout (raft/quorum.py): until that changes it hears of no leader, so
        a request waiting here for one waits in vain."""
        return self._obj.quorum_contact_lost

    @property
    def max_entry_bytes(self) -> int:
        return self._config.max_entry_bytes

    # -- writes ------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._stopped or self._obj.halted:
            raise NodeStoppedError("raft node is stopped")
        if self._obj.transfer_in_progress:
            raise NotLeaderError(None, "leadership transfer in progress; retry shortly")
        if not self._obj._isLeader():
            raise NotLeaderError(self.leader_address)

    def _refuse_on_tick_thread(self, message: str) -> None:
        """Waiting on the tick thread for the tick thread's work would never end."""
        if self._obj.in_tick_thread():
            raise RaftError(message)

    def submit(self, entry: bytes, callback: SubmitCallback | None = None) -> None:
        """Append ``entry`` to the log (leader only); asynchronous.

        Raises :class:`NotLeaderError` or :class:`EntryTooLargeError` before
        anything is queued. Later outcomes go to ``callback(result, index,
        error)`` on the tick thread, after the tick's FSM commit.
        """
        if not isinstance(entry, bytes | bytearray):
            raise TypeError("raft entries are bytes")
        self._check_writable()
        command = encode_command(self._obj.func_id, bytes(entry))
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
        self._refuse_on_tick_thread(
            "submit_sync must not run on the raft tick thread (it would deadlock)"
        )
        waiter = Waiter()
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
        self._refuse_on_tick_thread(
            "barrier must not run on the raft tick thread (it would deadlock)"
        )
        self._check_writable()
        batch = self._obj.join_barrier()
        if not batch.event.wait(timeout):
            raise UnknownOutcomeError(f"barrier not committed within {timeout:g}s")
        return barrier_index(batch)

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
        return barrier_index(batch)

    # -- leadership and membership ---------------------------------------------

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
        if target not in {m.raft_addr for m in self.members()}:
            raise LeadershipTransferError(f"{target} is not a peer of this cluster")
        self._refuse_on_tick_thread("transfer_leadership must not run on the raft tick thread")
        if not self._obj._isLeader():
            raise NotLeaderError(self.leader_address)
        transfer = Transfer(target=target, deadline=monotonic() + timeout)
        self._obj.run_on_tick(lambda: self._obj.start_transfer(transfer))
        if not transfer.waiter.event.wait(timeout + 1.0):
            raise LeadershipTransferError(f"leadership transfer to {target} did not finish in time")
        if transfer.waiter.error is not None:
            raise transfer.waiter.error

    def add_peer(self, address: str, timeout: float = 5.0) -> None:
        """Add a voting member known only by its raft address (see :meth:`add_member`)."""
        self.add_member(Member(node_id=address, raft_addr=address, rpc_addr=""), timeout)

    def remove_peer(self, address: str, timeout: float = 5.0) -> None:
        """Remove the voting member at raft ``address`` (see :meth:`remove_member`)."""
        member = next((m for m in self.members() if m.raft_addr == address), None)
        self.remove_member(member or Member(node_id=address, raft_addr=address, rpc_addr=""), timeout)

    def add_member(self, member: Member, timeout: float = 5.0) -> None:
        """Add a voter, with its id and RPC address, as one committed entry; wait for the commit.

        pysyncobj counts the new voter in the quorum as soon as the entry is
        appended, so the caller checks first that the server is reachable
        (node/endpoints). One change at a time (defect 4):
        :class:`MembershipChangeError` while another is uncommitted.
        """
        self._membership_change("add", member, timeout)

    def remove_member(self, member: Member, timeout: float = 5.0) -> None:
        """Remove a voter as one committed entry; the leader cannot remove itself (transfer first)."""
        if member.raft_addr == self.self_address:
            raise MembershipChangeError(
                "the leader cannot remove itself: transfer leadership first "
                "(caravan operator raft transfer-leadership), then remove it"
            )
        self._membership_change("rem", member, timeout)

    def mark_removed(self) -> None:
        """This server was removed from the configuration (the leader says so, see
        node/core/membership.py): stop campaigning and following, as if the entry had arrived."""
        self._obj.run_on_tick(self._obj.mark_removed)

    def members(self) -> list[Member]:
        """The voters as this server knows them: its latest configuration in the log."""
        return self._obj.member_list()

    @property
    def is_member(self) -> bool:
        """Whether this server is in its own configuration (False once removed: it then never campaigns)."""
        return self._obj.is_member

    @property
    def members_version(self) -> int:
        """Bumped on every change of :meth:`members`, so callers rebuild their views only then."""
        return self._obj.members_version

    @property
    def member_state(self) -> MemberState:
        """The members with the cluster id and bootstrap size (as in ``members.json``)."""
        return self._obj.member_state

    def _membership_change(self, op: str, member: Member, timeout: float) -> None:
        if not self._config.dynamic_membership:
            raise MembershipChangeError(
                "dynamic membership is disabled; the peer list is static (set dynamic_membership to enable)"
            )
        self._refuse_on_tick_thread("membership changes must not run on the raft tick thread")
        self._check_writable()
        waiter = Waiter()
        what = f"{'add' if op == 'add' else 'remove'} {member.node_id} ({member.raft_addr})"

        def done(_res: Any, err: int) -> None:
            waiter.finish(error=None if err == FAIL_REASON.SUCCESS else self._obj.error_for(err))

        self._obj._applyCommand(membership_command(op, member), done, MEMBERSHIP_TYPE)
        if not waiter.event.wait(timeout):
            raise UnknownOutcomeError(f"membership change ({what}) not committed within {timeout:g}s")
        if isinstance(waiter.error, RequestDeniedError):
            raise MembershipChangeError(
                f"membership change ({what}) refused: another change is still uncommitted, "
                "the leader has not committed its first entry yet, or nothing would change; retry"
            )
        if waiter.error is not None:
            raise waiter.error

    # -- status and lifecycle ------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """A snapshot of this node's raft state (read without locks; fields
        may be from slightly different moments)."""
        return replica_status(self._obj, self._config)

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
        obj.cancel_waiters(NodeStoppedError("raft node stopped"))
        self._events.stop()
        self._log.info("raft_stopped")

