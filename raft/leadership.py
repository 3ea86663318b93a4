"""Leadership: announcing it once the leader is ready, and handing it over.

A leader is announced (``on_leadership(True)``) only once it has applied its
own no-op, i.e. every entry committed before its term is in the FSM -- as
Nomad's establishLeadership waits for a barrier. A transfer fences writes,
waits for the target to match the leader's log and then sends pysyncobj
0.3.17's TimeoutNow, resending after an election timeout while still leader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic
from pysyncobj.node import TCPNode

from raft.config import RaftConfig
from raft.errors import LeadershipTransferError, NotLeaderError, RaftError
from raft.replica_base import ReplicaBase
from raft.waiters import Waiter


@dataclass
class Transfer:
    """One leadership transfer in progress: its target, deadline and waiter."""

    target: str
    deadline: float
    waiter: Waiter = field(default_factory=Waiter)
    next_attempt: float = 0.0
    sent: int = 0


class Leadership(ReplicaBase):
    """Mixin: leadership announcements and the transfer driver (tick thread)."""

    def setup_leadership(self, config: RaftConfig) -> None:
        """Before ``SyncObj.__init__``: nothing announced, no transfer."""
        self._announced_leader = False
        self._transfer: Transfer | None = None
        self._min_timeout = config.resolved_profile().raft_min_timeout

    @property
    def leader_ready(self) -> bool:
        """Whether this node has announced itself leader (its no-op is applied)."""
        return self._announced_leader

    @property
    def transfer_in_progress(self) -> bool:
        return self._transfer is not None

    def announce_leadership(self) -> None:
        """on_leadership(True) once the leader has applied its own no-op, i.e.
        every entry committed before its term is in the FSM (as Nomad's
        establishLeadership waits for a barrier); False as soon as it is not
        leader any more."""
        noop = self._SyncObj__noopIDx
        ready = self._isLeader() and noop is not None and self.raftLastApplied >= noop
        if ready != self._announced_leader:
            self._announced_leader = ready
            self.owner.leadership_changed(ready, self.raftCurrentTerm)

    def start_transfer(self, transfer: Transfer) -> None:
        """Tick thread: begin ``transfer``, or fail it at once."""
        if self._transfer is not None:
            transfer.waiter.finish(
                error=LeadershipTransferError("another leadership transfer is in progress")
            )
            return
        if not self._isLeader():
            transfer.waiter.finish(error=NotLeaderError(self.known_leader()))
            return
        self._transfer = transfer
        self.log.info("raft_transfer_started", target=transfer.target)
        self.drive_transfer()

    def drive_transfer(self) -> None:
        """Tick thread: move the transfer in progress (if any) one step on."""
        tr = self._transfer
        if tr is None:
            return
        now = monotonic()
        if not self._isLeader():
            self._settle_as_follower(tr, now)
            return
        if now > tr.deadline:
            self._end_transfer(
                LeadershipTransferError(
                    f"{tr.target} did not catch up and win an election in time; still leader"
                )
            )
            return
        if now >= tr.next_attempt:
            self._try_timeout_now(tr, now)

    def cancel_transfer(self, error: RaftError) -> None:
        """Any thread: fail the transfer's waiter (the node is stopping)."""
        tr = self._transfer
        if tr is not None:
            tr.waiter.finish(error=error)

    def _settle_as_follower(self, tr: Transfer, now: float) -> None:
        """No longer leader: done if the target won, failed if another did or time ran out."""
        leader = self._getLeader()
        if leader is not None and leader.id == tr.target:
            self._end_transfer(None)
        elif leader is not None and leader != self.selfNode:
            self._end_transfer(
                LeadershipTransferError(f"leadership went to {leader.id}, not {tr.target}")
            )
        elif now > tr.deadline:
            self._end_transfer(LeadershipTransferError(f"{tr.target} did not take over in time"))

    def _try_timeout_now(self, tr: Transfer, now: float) -> None:
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
            self.log.info("raft_transfer_finished", target=tr.target, ok=error is None)
            tr.waiter.finish(error=error)
