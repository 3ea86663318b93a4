"""The member table: who the voters are, by id, raft address and RPC address.

pysyncobj knows a member only by its raft address. A server also needs each
member's id (status, list-peers, remove-peer by id) and RPC address (where a
follower forwards writes to the leader). Both travel with the membership
change itself, so every server learns them from the log, deterministically
and without the FSM:

- in the log: our membership command is pysyncobj's own
  ``['add'|'rem', raft_addr, TCPNode]`` with a fourth element, the member's
  ``{"id", "rpc"}``; pysyncobj reads the first three and ignores the rest;
- in a raft dump: pysyncobj stores the cluster node set; the serializer
  hook swaps each node for a plain ``Node`` whose id encodes the member
  (:func:`encode_node_id`), and the deserializer hook swaps it back, so a
  server that catches up by snapshot install learns the same table;
- across restarts: ``members.json`` in the raft data directory, rewritten on
  every change. A restarted server starts from it (then pysyncobj replays
  the dump's set and the journal's changes on top, which ends in the same
  table: the changes are set operations, so replaying any suffix of the
  history onto its result leaves the result). The config's ``[[server]]``
  list is read once, at bootstrap, and never again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj.node import Node, TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE

from raft.config import RaftConfig
from raft.errors import ConfigError

MEMBERS_FILE = "members.json"
_NODE_PREFIX = "caravan-member/1 "
_FORMAT = 1


@dataclass(frozen=True)
class Member:
    """One voter. ``rpc_addr`` is "" when no one told us (a dump from before member tables)."""

    node_id: str
    raft_addr: str
    rpc_addr: str

    def to_wire(self) -> dict[str, str]:
        return {"id": self.node_id, "raft": self.raft_addr, "rpc": self.rpc_addr}

    @classmethod
    def from_wire(cls, data: Any) -> Member:
        try:
            return cls(node_id=str(data["id"]), raft_addr=str(data["raft"]), rpc_addr=str(data["rpc"]))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"malformed member record {data!r}: {exc}") from None


def membership_command(op: str, member: Member) -> bytes:
    """pysyncobj's membership command (without its type byte), carrying the member's id and RPC address."""
    return pickle.dumps([op, member.raft_addr, TCPNode(member.raft_addr), {"id": member.node_id, "rpc": member.rpc_addr}])


def member_of_request(request: Any) -> Member | None:
    """The member a decoded membership request names, or None if it is not one of ours."""
    if not isinstance(request, list | tuple) or len(request) < 2:
        return None
    raft_addr = str(request[1])
    meta = request[3] if len(request) >= 4 and isinstance(request[3], dict) else {}
    return Member(node_id=str(meta.get("id", raft_addr)), raft_addr=raft_addr, rpc_addr=str(meta.get("rpc", "")))


MEMBERSHIP_TYPE = _COMMAND_TYPE.MEMBERSHIP


def encode_node_id(member: Member) -> str:
    """A dump's node id that carries the whole member (see the module docstring)."""
    return _NODE_PREFIX + json.dumps(member.to_wire(), sort_keys=True)


def decode_node(node: Any, known: dict[str, Member]) -> Member:
    """The member a dump's node stands for: ours encode it; a bare raft address is looked up in ``known``."""
    node_id = str(getattr(node, "id", node))
    if node_id.startswith(_NODE_PREFIX):
        return Member.from_wire(json.loads(node_id[len(_NODE_PREFIX) :]))
    return known.get(node_id) or Member(node_id=node_id, raft_addr=node_id, rpc_addr="")


def encode_cluster(members: Iterable[Member]) -> set[Node]:
    """The dump's cluster set: one plain ``Node`` per member, its id encoding the member."""
    return {Node(encode_node_id(m)) for m in members}


def decode_cluster(nodes: Iterable[Any], known: dict[str, Member]) -> tuple[set[TCPNode], list[Member]]:
    """(pysyncobj's node set, the members) from a dump's cluster set."""
    members = [decode_node(n, known) for n in nodes]
    return {TCPNode(m.raft_addr) for m in members}, members


def join_proof(password: str, member: Member, purpose: str = "join") -> str:
    """Proof that a joining server knows the cluster's raft password (HMAC over its identity).

    The leader adds a voter only with it: a voter that cannot speak raft
    (wrong password) would still count towards the quorum and cost the
    cluster a failure it can tolerate. ``purpose="removed"`` signs the
    leader's notice to a removed server instead.
    """
    message = f"caravan-{purpose}\n{member.node_id}\n{member.raft_addr}\n{member.rpc_addr}".encode()
    return hmac.new(password.encode(), message, hashlib.sha256).hexdigest()


def proof_ok(password: str, member: Member, proof: str, purpose: str = "join") -> bool:
    return hmac.compare_digest(join_proof(password, member, purpose), str(proof))


@dataclass
class MemberState:
    """What ``members.json`` holds: the voters, the cluster's fixed id, and its bootstrap size."""

    members: list[Member]
    cluster_id: str = ""
    bootstrap_size: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "cluster_id": self.cluster_id,
                "bootstrap_size": self.bootstrap_size,
                "members": [m.to_wire() for m in sorted(self.members, key=lambda m: m.raft_addr)],
            },
            indent=1,
        )


def load_state(data_dir: str | Path) -> MemberState | None:
    """The membership a server holds in its raft data directory, or None before its first start."""
    path = Path(data_dir) / MEMBERS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}; restore it from a backup or wipe the data dir and join again") from None
    return MemberState(
        members=[Member.from_wire(m) for m in data.get("members", [])],
        cluster_id=str(data.get("cluster_id", "")),
        bootstrap_size=int(data.get("bootstrap_size", 0)),
    )


def save_state(data_dir: str | Path, state: MemberState, *, fsync: bool = True) -> None:
    """Write ``members.json`` atomically (tmp, fsync, rename): a crash leaves the old or the new file."""
    path = Path(data_dir) / MEMBERS_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(state.to_json())
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def starting_members(config: RaftConfig) -> MemberState:
    """The membership this node starts from: its own (``members.json``) once it has one.

    Only the first start reads the configuration (``bootstrap_members``, or
    ``peers`` by address); it is written down at once, so a restart never
    depends on the peers' configs again (DESIGN.md, "Membership and restarts").
    """
    if not config.dynamic_membership:  # a static peer list: the config is the truth, every start
        members = list(config.bootstrap_members) or [
            Member(node_id=a, raft_addr=a, rpc_addr="") for a in [config.self_address, *config.other_peers]
        ]
        return MemberState(members=members, cluster_id=config.cluster_id, bootstrap_size=len(members))
    state = load_state(config.data_path)
    if state is not None:
        return state
    members = list(config.bootstrap_members) or [
        Member(node_id=a, raft_addr=a, rpc_addr="") for a in [config.self_address, *config.other_peers]
    ]
    state = MemberState(
        members=members,
        cluster_id=config.cluster_id,
        bootstrap_size=config.bootstrap_size or len(members),
    )
    save_state(config.data_path, state, fsync=True)
    return state
