"""What every part of the replica shares: its owner, log, journal view, leader.

The replica is one pysyncobj ``SyncObj`` whose behaviour is spread over one
mixin per mechanism (raft/apply.py, raft/commands.py, raft/durability.py,
raft/repair.py, raft/leadership.py), composed in raft/replica.py -- the way
hashicorp/raft spreads one ``Raft`` struct over raft.go, replication.go and
friends. pysyncobj calls its overrides on ``self``, so they must all live on
one class. Each mixin derives from :class:`ReplicaBase`, sets its own state in
a ``setup_*`` method (called before ``SyncObj.__init__``, which starts the tick
thread) and reads only its own state plus what this base makes public.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog
from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

from raft.config import RaftConfig

#: pysyncobj's raft states by name, for logs and status.
ROLE_NAMES = {
    _RAFT_STATE.FOLLOWER: "follower",
    _RAFT_STATE.CANDIDATE: "candidate",
    _RAFT_STATE.LEADER: "leader",
}


class ReplicaOwner(Protocol):
    """What the replica reports up to the node that owns it (raft/events.py)."""

    def fatal(self, what: str, index: int, exc: BaseException) -> None: ...

    def leadership_changed(self, is_leader: bool, term: int) -> None: ...


class JournalView:
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


class ReplicaBase(SyncObj):
    """The state every mechanism of the replica reads.

    Everything runs on pysyncobj's tick thread unless marked otherwise.
    """

    def setup_base(self, owner: ReplicaOwner, config: RaftConfig) -> None:
        """Before ``SyncObj.__init__``: the owner, the log and the journal view."""
        self.owner = owner
        self.log = structlog.get_logger("raft").bind(node_id=config.self_address)
        self.view = JournalView(self)

    def known_leader(self) -> str | None:
        """Any thread: the leader this node is in contact with, or None.

        pysyncobj keeps a follower's last leader until the follower starts an
        election, and a follower that reaches no peer never starts one: with
        the leader and the other follower down it would name the dead leader
        forever, and forward every request there. Past its election deadline
        (no heartbeat for an election timeout) a follower knows no leader,
        as a hashicorp/raft follower does once its heartbeat times out.
        """
        leader = self._getLeader()
        if leader is None:
            return None
        if not self._isLeader() and self._SyncObj__raftElectionDeadline < monotonic():
            return None
        return leader.id
