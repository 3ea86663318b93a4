"""A node's raft status, read from the replica without locks.

The tick thread keeps running while this reads, so a dict may change size or
the journal list be rewritten under it; the read is retried a few times
rather than taking a lock the tick thread would have to honour.
"""

from __future__ import annotations

import time
from typing import Any

from pysyncobj.monotonic import monotonic
from pysyncobj.syncobj import _RAFT_STATE

from raft.config import RaftConfig
from raft.replica import Replica
from raft.replica_base import ROLE_NAMES


def replica_status(obj: Replica, config: RaftConfig) -> dict[str, Any]:
    """A snapshot of the replica's raft state (fields may be from slightly different moments)."""
    for _ in range(5):
        try:
            return _status_once(obj, config)
        except (
            RuntimeError,
            IndexError,
        ):  # the tick thread changed a dict / rewrote the journal list
            time.sleep(0.001)
            continue
    return _status_once(obj, config)


def _peers(obj: Replica, is_leader: bool) -> list[dict[str, Any]]:
    match = dict(obj._SyncObj__raftMatchIndex)
    nxt = dict(obj._SyncObj__raftNextIndex)
    # The leader's last answer from each peer: what autopilot's dead-server cleanup measures.
    heard = dict(obj._SyncObj__lastResponseTime) if is_leader else {}
    now = monotonic()
    peers = []
    for node in sorted(obj.otherNodes, key=lambda n: n.id):
        peers.append(
            {
                "address": node.id,
                "connected": obj.isNodeConnected(node),
                "match_index": match.get(node) if is_leader else None,
                "next_index": nxt.get(node) if is_leader else None,
                "last_contact": round(now - heard[node], 3) if node in heard else None,
            }
        )
    return peers


def _status_once(obj: Replica, config: RaftConfig) -> dict[str, Any]:
    state = obj._SyncObj__raftState
    journal = obj._SyncObj__raftLog
    peers = _peers(obj, state == _RAFT_STATE.LEADER)
    return {
        "self": config.self_address,
        "role": ROLE_NAMES.get(state, str(state)),
        "term": obj.raftCurrentTerm,
        "leader": obj.known_leader(),
        "commit_index": obj.raftCommitIndex,
        "applied_index": obj.raftLastApplied,
        "last_log_index": journal[-1][1],
        "first_log_index": journal[0][1],
        "peers": peers,
        "leader_ready": obj.leader_ready,
        "transfer_in_progress": obj.transfer_in_progress,
        "profile": config.profile,
        "fsync": config.fsync,
        "fsync_stats": obj.fsync_stats,
        "fsm_commits": obj.commits,
        **obj.repair_stats(),
        "halted": obj.halted,
        "member": obj.is_member,
        "ignored_votes": obj.ignored_votes,
        "check_quorum": obj.quorum_stats,
        "members": [m.to_wire() for m in obj.member_list()],
        # The tick thread: its share of the last second spent working, and its stalls (raft/ticks.py).
        "tick_busy": round(obj.tick_load.load, 3),
        "tick_stalls": obj.tick_gaps.stalls,
    }
