"""Check-quorum: a leader that cannot reach a majority steps down within an election timeout.

pysyncobj 0.3.17 deposes a leader that heard no ``next_node_idx`` from a
majority for ``leaderFallbackTimeout`` (2.5 s in our profiles, 30 s by
default), and it judges that at the start of a tick, before the tick reads
its sockets: a leader whose own tick thread stalled that long (a large
apply, a snapshot) steps down on the replies still waiting to be read.
Meanwhile an isolated leader keeps accepting writes it can never commit,
and its clients wait for them. hashicorp/raft's leader lease and etcd's
CheckQuorum do better, and so does this mixin:

* **Step down.** A leader that has not heard from a majority of the voters
  (itself included) within ``lease`` -- the minimum election timeout, by
  when the others may already elect a new leader -- becomes a follower. Its
  uncommitted writes and barriers are answered at once with
  ``LEADER_CHANGED`` (unknown outcome: the next leader may still commit an
  entry it had replicated), so their clients retry elsewhere with the same
  request id instead of waiting out their timeouts.
* **Stalls are not silence.** Contact is counted from the later of the last
  reply and the end of the leader's last stall (a tick gap over
  ``lease / 2``): a leader that did not run cannot have read the replies.
* **Quorum contact** (any role): whether this node has been connected to a
  majority of the voters within ``lease``. Forwarding uses it: a server cut
  off from a quorum will learn of no leader, so it tells its client at once
  instead of holding the request for an election it cannot see.
* **Rejoining.** A follower that reconnects after being cut off from every
  peer waits an election timeout before it may campaign, so it first hears
  the current leader's heartbeat. pysyncobj would campaign at once (its
  election deadline passed long ago) and, with a higher term, depose a
  healthy leader: the stall a partitioned follower caused when it healed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

from raft.config import RaftConfig
from raft.replica_base import ReplicaBase


def majority(voters: int) -> int:
    """Votes needed among ``voters`` (this node included)."""
    return voters // 2 + 1


@dataclass
class LeaderLease:
    """The leader's view of which voters it heard from recently (pure: time is passed in)."""

    lease: float
    #: contact is counted from no earlier than this: the term's start or the last stall's end
    since: float = 0.0
    last_tick: float | None = None
    contact: dict[str, float] = field(default_factory=dict)

    @property
    def stall(self) -> float:
        return self.lease / 2

    def start(self, now: float) -> None:
        """A new term as leader: every voter gets a full lease from now (as pysyncobj does)."""
        self.since = now
        self.last_tick = now
        self.contact.clear()

    def heard(self, peer: str, now: float) -> None:
        self.contact[peer] = now

    def track(self, peers: Iterable[str], now: float) -> None:
        """Follow the configuration: a voter just added gets a full lease (as in pysyncobj), a removed one is forgotten."""
        peers = set(peers)
        if peers != self.contact.keys():
            self.contact = {p: self.contact.get(p, now) for p in peers}

    def tick(self, now: float) -> None:
        """Once per tick: a gap longer than ``stall`` means this node did not run, so it restarts the count."""
        if self.last_tick is not None and now - self.last_tick > self.stall:
            self.since = now
        self.last_tick = now

    def in_contact(self, peers: Iterable[str], now: float) -> list[str]:
        return [
            p for p in peers if now - max(self.contact.get(p, self.since), self.since) <= self.lease
        ]

    def lost_quorum(self, peers: Iterable[str], now: float) -> bool:
        """Whether this leader and the ``peers`` (the other voters) it heard from are short of a majority."""
        peers = list(peers)
        return 1 + len(self.in_contact(peers, now)) < majority(len(peers) + 1)


class CheckQuorum(ReplicaBase):
    """Mixin: the leader's check-quorum step-down, quorum contact, and the rejoin gate (tick thread)."""

    def setup_check_quorum(self, config: RaftConfig) -> None:
        """Before ``SyncObj.__init__``."""
        self._lease = LeaderLease(lease=config.resolved_profile().raft_min_timeout)
        self._leading = False
        self._quorum_seen = monotonic()  # a starting node gets one lease to connect
        self._isolated = False
        self._qstats = {"check_quorum_step_downs": 0, "campaigns_deferred": 0}

    @property
    def quorum_stats(self) -> dict[str, int]:
        return dict(self._qstats)

    @property
    def quorum_contact_lost(self) -> bool:
        """Any thread: not connected to a majority of the voters for longer than a lease."""
        return monotonic() - self._quorum_seen > self._lease.lease

    def caravan_on_message(self, node: Any, message: dict[str, Any], deliver: Any) -> None:
        if message.get("type") == "next_node_idx":
            self._lease.heard(node.id, monotonic())
        super().caravan_on_message(node, message, deliver)  # type: ignore[misc]

    def check_quorum(self) -> None:
        """Tick thread, before pysyncobj's tick: step down without a quorum; gate a rejoin."""
        now = monotonic()
        voters = [n.id for n in self._SyncObj__otherNodes]
        connected = {n.id for n in self._SyncObj__connectedNodes}
        if 1 + sum(v in connected for v in voters) >= majority(len(voters) + 1):
            self._quorum_seen = now
        state = self._SyncObj__raftState
        if state == _RAFT_STATE.LEADER:
            if not self._leading:
                self._leading = True
                self._lease.start(now)
            self._lease.tick(now)
            self._lease.track(voters, now)
            if self._lease.lost_quorum(voters, now):
                self._step_down(now, voters)
            return
        self._leading = False
        self._gate_rejoin(now, bool(connected) or not voters)

    def _step_down(self, now: float, voters: list[str]) -> None:
        heard = {
            v: round(now - self._lease.contact[v], 3) for v in voters if v in self._lease.contact
        }
        self.log.warning(
            "raft_check_quorum_step_down",
            term=self.raftCurrentTerm,
            lease=self._lease.lease,
            seconds_since_heard=heard,
        )
        self._qstats["check_quorum_step_downs"] += 1
        self._leading = False
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        waiting = self._SyncObj__commandsWaitingCommit
        for idx in sorted(waiting):
            for _term, callback in waiting.pop(idx):
                callback(None, FAIL_REASON.LEADER_CHANGED)

    def _gate_rejoin(self, now: float, connected: bool) -> None:
        """A follower back from isolation hears the leader for an election timeout before it campaigns."""
        if not connected:
            self._isolated = True
            return
        if self._isolated:
            self._isolated = False
            deadline = now + self._SyncObj__generateRaftTimeout()
            if self._SyncObj__raftElectionDeadline < deadline:
                self._SyncObj__raftElectionDeadline = deadline
                self._qstats["campaigns_deferred"] += 1
