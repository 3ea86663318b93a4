"""The replica: one pysyncobj ``SyncObj`` composed of one mixin per mechanism.

The mixins (see raft/replica_base.py) each own one mechanism; this class
wires the points where several meet -- the tick (new commands, fsync, commit,
callbacks, queued tasks, barrier, transfer, announcement, in that order), the send hook
(log repair, then fsync's hold) and the barrier batch -- and runs pysyncobj's
constructor once every mixin's state is in place.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic
from typing import Any

from raft.apply import ApplyPath, ApplyTarget
from raft.auth import LinkAuthenticator
from raft.barrier import BarrierBatches
from raft.commands import CommandQueue
from raft.config import RaftConfig
from raft.durability import Durability
from raft.entries import encode_barrier, encode_command
from raft.errors import NotLeaderError, RaftError
from raft.leadership import Leadership
from raft.members import MemberState, starting_members
from raft.membership import Membership
from raft.quorum import CheckQuorum
from raft.repair import LogRepair
from raft.replica_base import ROLE_NAMES, ReplicaOwner
from raft.ticks import TickGaps, TickLoad
from raft.transport import CaravanTransport
from raft.waiters import Waiter


class Replica(
    Membership, CheckQuorum, ApplyPath, CommandQueue, Durability, LogRepair, Leadership
):
    """The SyncObj subclass. Everything here runs on pysyncobj's tick thread
    unless marked otherwise. All attributes are assigned *before*
    ``SyncObj.__init__`` because pysyncobj starts the tick thread (and may
    receive messages) inside its constructor."""

    def __init__(
        self,
        owner: ReplicaOwner,
        config: RaftConfig,
        conf: Any,
        target: ApplyTarget,
        members: MemberState | None = None,
    ) -> None:
        members = members or starting_members(config)
        self.setup_base(owner, config)
        self.setup_membership(config, members)
        self.setup_apply(target)
        self.setup_commands(config, conf)
        self.setup_durability(config)
        self.setup_repair(config)
        self.setup_leadership(config)
        self.setup_check_quorum(config)
        self._auth = LinkAuthenticator(config.password)
        # A tick later than half the shortest election timeout is a stall worth a line.
        self.tick_gaps = TickGaps(stall=config.resolved_profile().raft_min_timeout / 2)
        self.tick_load = TickLoad()
        self._barriers = BarrierBatches()
        self._func_id = -1
        if conf.deserializer is not None:
            # Wrapped here, not in RaftNode: pysyncobj may load the dump in its
            # first tick, before RaftNode has a reference to this object.
            conf.deserializer = self.aligning_deserializer(self.member_deserializer(conf.deserializer))
        if conf.serializer is not None:
            conf.serializer = self.member_serializer(conf.serializer)
        super().__init__(
            config.self_address,
            [m.raft_addr for m in members.members if m.raft_addr != config.self_address],
            conf,
            transportClass=CaravanTransport,
        )
        self._func_id = self._methodToID[self._getFuncName("caravan_apply")]

    @property
    def func_id(self) -> int:
        """pysyncobj's id of the replicated method, the first field of every command."""
        return self._func_id

    @property
    def encryptor(self) -> LinkAuthenticator:  # read by the transport for every connection
        return self._auth

    def _getEncryptor(self) -> LinkAuthenticator:  # noqa: N802 (pysyncobj name)
        return self._auth

    # -- the tick --------------------------------------------------------------

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802,N803 (pysyncobj names)
        if self.bind_tick_thread():
            self.addOnTickCallback(self._finish_tick)
        self._note_tick()
        # New commands leave before this tick's apply (raft/commands.py).
        self.take_commands_early()
        # Before pysyncobj counts the leader's own log towards a commit and
        # before held acks/votes leave: make the journal durable (fsync mode).
        self.sync_journal()
        self.gate_campaign()
        self.check_quorum()
        super()._onTick(timeToWait)
        # pysyncobj returns early (no tick callbacks) while the port is not
        # bound; make sure applied entries are committed on that path too.
        self._finish_tick()

    def _note_tick(self) -> None:
        now = monotonic()
        self.tick_load.started(now)
        gap = self.tick_gaps.note(now)
        if gap is not None:
            self.log.warning(
                "raft_tick_stalled",
                seconds=round(gap, 3),
                role=ROLE_NAMES.get(self._SyncObj__raftState),
                not_logged=self.tick_gaps.take_unlogged(),
                hint="no tick started for this long (a long apply, or the process starved of CPU or the GIL); "
                "a leader stalled this long may lose its followers to an election",
            )

    def _finish_tick(self) -> None:
        # The leader's entries appended this tick were already sent to
        # followers; syncing now, before poll, overlaps our fsync with theirs
        # (the tick-start sync then finds nothing to do).
        self.sync_journal()
        if not self.commit_pending():
            return
        self.fire_deferred()
        self.run_tasks()
        self._flush_barrier_batch()
        self.drive_transfer()
        self.announce_leadership()
        self.tick_load.finished(monotonic())  # what follows is pysyncobj's poll

    def caravan_on_send(
        self, node: Any, message: dict[str, Any], send: Callable[..., bool]
    ) -> bool:
        """CaravanTransport's send hook: repair the message, then hold it for fsync or send it."""
        message = self.rewrite_outgoing(node, message)
        if self.defer_until_synced(node, message):
            return True
        return send(node, message)

    # -- barrier ---------------------------------------------------------------

    def join_barrier(self) -> Waiter:
        """Any thread: join the barrier batch that the next tick will submit (raft/barrier.py)."""
        return self._barriers.join(self.wake)

    def _flush_barrier_batch(self) -> None:
        batch = self._barriers.take()
        if batch is None:
            return
        if not self._isLeader() or self.transfer_in_progress:
            batch.finish(error=NotLeaderError(self.known_leader()))
            return

        def done(result: Any, index: int | None, error: RaftError | None) -> None:
            batch.finish(index=index, error=error)

        self.submit_command(encode_command(self._func_id, encode_barrier()), self.completion(done))

    def cancel_waiters(self, error: RaftError) -> None:
        """Any thread, after the tick thread stopped: fail the open barrier batch and transfer."""
        self._barriers.cancel(error)
        self.cancel_transfer(error)
