"""A new server joining a live cluster (Nomad's ``server join``).

A server whose config has ``join`` and whose data dir holds no raft state
does not start raft with a guessed peer list: pysyncobj accepts raft
connections only from nodes it knows, and a server that campaigns against a
cluster it is not part of raises the term and deposes its leader. So it
listens for RPCs and waits (``Joiner.wait`` in the raft start-up thread),
asking the cluster at each ``join`` address -- or the one a ``caravan server
join ADDR`` names -- to add it. The leader answers once the add entry is
committed, with the member table and the cluster's id; raft then starts with
those members, and the leader's log (or its snapshot) catches it up.

The request carries an HMAC over the server's identity keyed by the raft
password (``raft.members.join_proof``): the leader adds only a server that
knows it, since a voter that cannot speak raft still counts in the quorum.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import structlog

from node.core.config import ServerConfig
from node.wire.async_client import AsyncRPCClient
from node.wire.sync_client import RPCClient
from raft.members import Member, join_proof

ADD_PEER = "operator.raft.add_peer"
RETRY_EVERY = 2.0  # seconds between rounds over the ``join`` addresses

log = structlog.get_logger("caravan.join")


class JoinError(Exception):
    """A join that cannot succeed as asked; ``str()`` is the one line to show."""


@dataclass(frozen=True)
class JoinAnswer:
    """What the leader answers a joining server: who the voters are now, and the cluster's identity."""

    members: tuple[Member, ...]
    cluster_id: str
    bootstrap_size: int

    @classmethod
    def from_wire(cls, data: Any) -> JoinAnswer:
        try:
            return cls(
                members=tuple(Member.from_wire(m) for m in data["Members"]),
                cluster_id=str(data["ClusterID"]),
                bootstrap_size=int(data["BootstrapSize"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise JoinError(f"the cluster answered the join with a malformed member table ({exc}); is it a Caravan cluster?") from None


class Joiner:
    """The join of one server: requested by its config or by ``agent.join``, awaited by its raft start."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.identity = Member(node_id=config.node_id, raft_addr=config.raft_addr, rpc_addr=config.rpc_addr)
        self._done = threading.Event()
        self._answer: JoinAnswer | None = None

    @property
    def joined(self) -> bool:
        return self._done.is_set()

    def request(self) -> dict[str, Any]:
        """The ``operator.raft.add_peer`` arguments that ask for this server."""
        me = self.identity
        proof = join_proof(self.config.raft_password, me)
        return {"id": me.node_id, "raft_addr": me.raft_addr, "rpc_addr": me.rpc_addr, "proof": proof}

    def deliver(self, answer: JoinAnswer) -> None:
        if not any(m.raft_addr == self.identity.raft_addr for m in answer.members):
            raise JoinError("the cluster answered the join without this server among its members; retry the join")
        if self._answer is None:
            self._answer = answer
        self._done.set()

    async def join_async(self, address: str, token: str | None) -> JoinAnswer:
        """``agent.join``: ask the cluster at ``address`` (its leader, via redirects) to add this server."""
        if self._answer is not None:
            return self._answer
        client = AsyncRPCClient([address], token=token, timeout=30.0)
        try:
            answer = JoinAnswer.from_wire(await client.call(ADD_PEER, self.request()))
        finally:
            await client.close()
        self.deliver(answer)
        return answer

    def wait(self, stopping: threading.Event) -> JoinAnswer:
        """Raft start-up thread: block until joined, asking the ``join`` addresses every few seconds."""
        addresses = list(self.config.join or ())
        log.info("waiting to join a cluster", node_id=self.config.node_id, join=addresses)
        while not self._done.is_set():
            if stopping.is_set():
                raise JoinError("stopped before joining a cluster")
            for address in addresses:
                if self._try(address):
                    break
            self._done.wait(RETRY_EVERY)
        assert self._answer is not None
        return self._answer

    def _try(self, address: str) -> bool:
        try:
            with RPCClient([address], timeout=30.0) as client:
                self.deliver(JoinAnswer.from_wire(client.call(ADD_PEER, self.request())))
            log.info("joined the cluster", via=address, node_id=self.config.node_id)
            return True
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the next round tries again
            log.warning("join attempt failed; retrying", via=address, error=f"{type(exc).__name__}: {exc}")
            return False


def raft_overrides(answer: JoinAnswer) -> dict[str, Any]:
    """The ``RaftConfig`` fields a joined server starts raft with: the leader's members and cluster id."""
    return {
        "cluster_id": answer.cluster_id,
        "bootstrap_members": answer.members,
        "bootstrap_size": answer.bootstrap_size,
        "await_leader": True,
    }


_JOINERS: weakref.WeakKeyDictionary[Any, Joiner] = weakref.WeakKeyDictionary()


def joiner_of(server: Any) -> Joiner | None:
    """The server's pending join, if it started without raft state and with ``join`` set."""
    return _JOINERS.get(server)


def register(server: Any, joiner: Joiner) -> None:
    _JOINERS[server] = joiner
