"""Caravan's raft adapter over pysyncobj 0.3.17.

One replicated method hands ``(index, entry)`` to the FSM; the package adds
leadership (callbacks, transfer), a batched barrier for linearizable reads,
tuned config profiles, and fixes/guards for pysyncobj's defects (see
``raft/node.py`` and shared/reference/pysyncobj.md).
"""

from raft.config import DEFAULT_MAX_ENTRY_BYTES, PROFILES, RaftConfig, RaftProfile
from raft.errors import (
    ConfigError,
    EntryTooLargeError,
    FatalApplyError,
    LeadershipTransferError,
    MembershipChangeError,
    NodeStoppedError,
    NotLeaderError,
    OverloadedError,
    RaftError,
    RequestDeniedError,
    UnknownOutcomeError,
)
from raft.node import (
    BARRIER_MESSAGE_TYPE,
    EXIT_FATAL,
    ApplyTarget,
    RaftNode,
    SubmitCallback,
    encode_barrier,
    encoded_entry_size,
)

__all__ = [
    "BARRIER_MESSAGE_TYPE",
    "DEFAULT_MAX_ENTRY_BYTES",
    "EXIT_FATAL",
    "PROFILES",
    "ApplyTarget",
    "ConfigError",
    "EntryTooLargeError",
    "FatalApplyError",
    "LeadershipTransferError",
    "MembershipChangeError",
    "NodeStoppedError",
    "NotLeaderError",
    "OverloadedError",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftProfile",
    "RequestDeniedError",
    "SubmitCallback",
    "UnknownOutcomeError",
    "encode_barrier",
    "encoded_entry_size",
]
