"""The placeholder a server answers with while its raft node starts (raft/starting.py).

A restarted server listens before raft is up, so stale reads are served at
once; until the real node is in, everything that needs raft must be refused
the way a follower without a leader refuses it (clients retry), never crash.
"""

from __future__ import annotations

import asyncio

import pytest

from raft.config import RaftConfig
from raft.errors import NotLeaderError, RaftError
from raft.starting import ROLE_STARTING, StartingRaft


def _starting() -> StartingRaft:
    return StartingRaft(RaftConfig(self_address="127.0.0.1:1", peers=["127.0.0.1:1"], data_dir="/nonexistent"))


def test_it_is_no_leader_and_knows_none() -> None:
    raft = _starting()
    assert raft.is_leader is False
    assert raft.leader_address is None
    assert raft.self_address == "127.0.0.1:1"
    assert raft.max_entry_bytes == raft.config.max_entry_bytes


def test_writes_barriers_and_transfers_are_refused_as_retryable() -> None:
    raft = _starting()
    with pytest.raises(NotLeaderError):
        raft.submit(b"x")
    with pytest.raises(NotLeaderError):
        raft.submit_sync(b"x")
    with pytest.raises(NotLeaderError):
        raft.barrier()
    with pytest.raises(NotLeaderError):
        asyncio.run(raft.barrier_async())
    with pytest.raises(RaftError):
        raft.transfer_leadership("127.0.0.1:2")
    raft.destroy()  # nothing to stop


def test_status_has_the_fields_the_server_reports() -> None:
    status = _starting().status()
    assert status["role"] == ROLE_STARTING
    assert status["leader"] is None
    for field in ("term", "commit_index", "first_log_index", "last_log_index", "peers"):
        assert field in status
