"""Live membership on the replica: the member table, and who may campaign.

pysyncobj applies a membership change to its node set when the entry enters
the log (leader: on append; follower: on receipt), undoes it when the entry
is truncated, and does it again when the entry is applied (a no-op unless
it is a restart's replay). One override of its private ``__doChangeCluster``
sees every one of those steps, so the member table (raft/members.py) follows
pysyncobj's node set exactly, plus what pysyncobj leaves out: itself.

Campaigning (pysyncobj has no pre-vote, so a stray candidate deposes a
healthy leader by raising the term):

- a server that is not in its own member table never campaigns: pysyncobj
  ignores its own removal, so a removed server would keep its old
  configuration and start elections against the cluster that dropped it;
- a server that has just joined waits until it has heard from a leader
  once: its log is empty and its peers may not have reached it yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

from raft.config import RaftConfig
from raft.members import (
    Member,
    MemberState,
    decode_cluster,
    encode_cluster,
    member_of_request,
    save_state,
)
from raft.replica_base import ReplicaBase


class Membership(ReplicaBase):
    """Mixin: the member table, persisted in ``members.json``, and the campaign gate."""

    def setup_membership(self, config: RaftConfig, state: MemberState) -> None:
        """Before ``SyncObj.__init__``: the table this server starts from (raft/node.py chose it)."""
        self._self_addr = config.self_address
        self._member_dir = config.data_path
        self._member_meta = state
        self._table: dict[str, Member] = {m.raft_addr: m for m in state.members}
        self._members_version = 0
        self._await_leader = config.await_leader
        self._dynamic = config.dynamic_membership  # static: the config's peers, whatever a dump says
        self._admitting_change = False  # set by raft/commands.py around the leader's admission
        self._ignored_votes = 0

    # -- views (any thread: the table is replaced, never changed in place) ----

    def member_list(self) -> list[Member]:
        return sorted(self._table.values(), key=lambda m: (m.node_id, m.raft_addr))

    @property
    def is_member(self) -> bool:
        return self._self_addr in self._table

    @property
    def members_version(self) -> int:
        return self._members_version

    @property
    def ignored_votes(self) -> int:
        """Vote requests dropped because their sender is not a member."""
        return self._ignored_votes

    @property
    def member_state(self) -> MemberState:
        return self._member_meta

    def known_leader(self) -> str | None:
        """A server outside the configuration follows no leader: it must not forward writes to one."""
        if not self.is_member:
            return None
        return super().known_leader()

    # -- following pysyncobj's node set ----------------------------------------

    def _SyncObj__doChangeCluster(self, request: Any, reverse: bool = False) -> bool:  # noqa: N802 - pysyncobj's private hook
        changed = SyncObj._SyncObj__doChangeCluster(self, request, reverse)
        if self._admitting_change and not changed:
            return changed  # the leader refused it: nothing enters the log
        member = member_of_request(request)
        if member is None or request[0] not in ("add", "rem"):
            return changed
        adding = (request[0] == "add") != reverse
        table = dict(self._table)
        if adding:
            old = table.get(member.raft_addr)
            if old is not None and not member.rpc_addr:
                member = old
            table[member.raft_addr] = member
        else:
            table.pop(member.raft_addr, None)
        self._set_table(table, "add" if adding else "remove", member)
        return changed

    def _set_table(self, table: dict[str, Member], op: str, member: Member | None) -> None:
        if table == self._table:
            return
        was_member = self.is_member
        self._table = table
        self._members_version += 1
        self._member_meta = MemberState(
            members=list(table.values()),
            cluster_id=self._member_meta.cluster_id,
            bootstrap_size=self._member_meta.bootstrap_size,
        )
        try:
            save_state(self._member_dir, self._member_meta)
        except OSError as exc:  # the log still holds the change; the next change or restart rewrites it
            self.log.error("raft_members_not_saved", error=str(exc))
        self.log.info(
            "raft_membership_changed",
            op=op,
            member=member.to_wire() if member else None,
            voters=len(table),
        )
        if was_member and not self.is_member:
            self.log.warning(
                "raft_removed_from_cluster",
                note="this server is no longer a voter: it will not campaign; stop it, wipe its data dir to join again",
            )

    def mark_removed(self) -> None:
        """Tick thread: the leader told us we were removed (the entry itself never reaches us:
        pysyncobj's leader drops a removed node from its sends as it appends the removal)."""
        if self.is_member:
            table = {a: m for a, m in self._table.items() if a != self._self_addr}
            self._set_table(table, "remove", self._table[self._self_addr])

    def caravan_on_message(self, node: Any, message: dict[str, Any], deliver: Callable[..., None]) -> None:
        """Ignore vote requests from servers outside our configuration: a removed server that
        has not noticed must not raise the term of the cluster that dropped it."""
        if self._dynamic and message.get("type") == "request_vote" and node.id not in self._table:
            self._ignored_votes += 1
            return
        super().caravan_on_message(node, message, deliver)

    # -- the dump's cluster set --------------------------------------------------

    def member_serializer(self, fn: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
        """The dump carries the member table in its cluster node set (raft/members.py)."""

        def serializer(file_name: str, raft_data: Any) -> Any:
            last, prev, _nodes = raft_data
            return fn(file_name, (last, prev, encode_cluster(self._table.values())))

        return serializer

    def member_deserializer(self, fn: Callable[[str], Any]) -> Callable[[str], Any]:
        """A dump's cluster set replaces the table (a snapshot install, or a restart before its replay).

        Except for this server itself: a dump never removes it. A server
        learns its removal from the removal entry or the leader's notice
        (``mark_removed``), never from a snapshot: a joining server's first
        snapshot is taken before the entry that adds it, and a dump read
        back at a restart after a removal lacks it anyway.
        """

        def deserializer(file_name: str) -> Any:
            last, prev, cluster = fn(file_name)
            nodes, members = decode_cluster(cluster, self._table)
            if self._dynamic:
                table = {m.raft_addr: m for m in members}
                me = self._table.get(self._self_addr)
                if me is not None:
                    table.setdefault(self._self_addr, me)
                self._set_table(table, "dump", None)
            return (last, prev, nodes)

        return deserializer

    # -- campaigning ----------------------------------------------------------------

    def gate_campaign(self) -> None:
        """Tick thread, before pysyncobj's tick: push the election deadline out while we may not campaign."""
        if self._await_leader and self._getLeader() is not None:
            self._await_leader = False
            self.log.info("raft_joined_heard_leader", leader=self._getLeader().id)
        if not (self._await_leader or not self.is_member):
            return
        if self._SyncObj__raftState != _RAFT_STATE.LEADER:
            self._SyncObj__raftElectionDeadline = monotonic() + self._SyncObj__generateRaftTimeout()
