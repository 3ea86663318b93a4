"""What stands in for a server's raft node while the real one starts.

Starting raft costs a restarted server most of a second before the first
request (the link key's PBKDF2, pysyncobj loading its journal, the dump
check), none of which a stale read needs: it reads committed LMDB state and
reports the index it reflects. A server therefore listens first, with this
placeholder as its raft node, and swaps the real node in once it is built.
The placeholder is never the leader and knows none, so writes and
linearizable reads are refused as on a follower that has lost its leader
(clients retry them), and ``status`` says ``starting``.
"""

from __future__ import annotations

from typing import Any

from raft.config import RaftConfig
from raft.errors import NotLeaderError, RaftError

ROLE_STARTING = "starting"


class StartingRaft:
    """The part of ``RaftNode``'s surface a server uses before its raft node exists."""

    def __init__(self, config: RaftConfig) -> None:
        self.config = config

    @property
    def self_address(self) -> str:
        return self.config.self_address

    @property
    def is_leader(self) -> bool:
        return False

    @property
    def leader_address(self) -> str | None:
        return None

    @property
    def max_entry_bytes(self) -> int:
        return self.config.max_entry_bytes

    @property
    def quorum_contact_lost(self) -> bool:
        """Not cut off: starting (a request waits for a leader as it would during an election)."""
        return False

    def submit(self, entry: bytes, callback: Any = None) -> None:
        raise NotLeaderError("raft is starting; no leader known yet")

    def submit_sync(self, entry: bytes, timeout: float = 5.0) -> tuple[Any, int]:
        raise NotLeaderError("raft is starting; no leader known yet")

    def barrier(self, timeout: float = 5.0) -> int:
        raise NotLeaderError("raft is starting; no leader known yet")

    async def barrier_async(self, timeout: float = 5.0) -> int:
        raise NotLeaderError("raft is starting; no leader known yet")

    def transfer_leadership(self, target: str, timeout: float = 5.0) -> None:
        raise RaftError("raft is starting on this server; retry in a moment")

    def status(self) -> dict[str, Any]:
        return {
            "self": self.config.self_address,
            "role": ROLE_STARTING,
            "term": 0,
            "leader": None,
            "commit_index": 0,
            "applied_index": 0,
            "last_log_index": 0,
            "first_log_index": 0,
            "peers": [],
            "leader_ready": False,
            "transfer_in_progress": False,
            "profile": self.config.profile,
            "fsync": self.config.fsync,
            "halted": False,
        }

    def destroy(self, timeout: float = 5.0) -> None:
        """Nothing runs yet: nothing to stop."""
