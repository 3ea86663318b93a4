"""Error types of the raft adapter.

Every error a caller of :mod:`raft` can see derives from :class:`RaftError`,
so the RPC layer can map the whole family in one place. Each error says in
one line what went wrong and what to do; none of them ever carries the raft
password or an entry's payload.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base class of every error raised by the raft adapter."""


class ConfigError(RaftError):
    """The raft configuration is invalid or incomplete (the node refuses to start)."""


class NotLeaderError(RaftError):
    """This node cannot accept the request because it is not the leader.

    The entry was *not* appended to the log, so the caller may safely retry
    against ``leader_address`` (``None`` while no leader is known).
    """

    def __init__(self, leader_address: str | None, detail: str = "") -> None:
        self.leader_address = leader_address
        where = f"the leader is {leader_address}" if leader_address else "no leader is known yet"
        msg = f"this node is not the raft leader; {where}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class UnknownOutcomeError(RaftError):
    """The request may or may not have been applied.

    Raised on a timeout, a leader change or pysyncobj's UNKNOWN_OUTCOME: the
    entry may still commit later. Retry only with an idempotent request id.
    """


class EntryTooLargeError(RaftError):
    """An entry is larger than the configured maximum.

    pysyncobj splits a log entry of 64 KiB or more into chunks and its chunk
    bookkeeping is broken (see shared/reference/pysyncobj.md, defect 2), so
    entries are capped well below that; callers must split their batches.
    """

    def __init__(self, size: int, encoded_size: int, limit: int) -> None:
        self.size = size
        self.encoded_size = encoded_size
        self.limit = limit
        super().__init__(
            f"raft entry too large: {size} bytes ({encoded_size} bytes as stored in the raft log) "
            f"exceeds the limit of {limit} bytes; split the request into smaller batches"
        )


class RequestDeniedError(RaftError):
    """The leader refused the entry (too large, or a command type we never replicate)."""


class OverloadedError(RaftError):
    """pysyncobj's command queue is full; nothing was appended, retry later."""


class LeadershipTransferError(RaftError):
    """A leadership transfer could not be completed."""


class MembershipChangeError(RaftError):
    """A membership change was refused (disabled, or another change is still in flight)."""


class NodeStoppedError(RaftError):
    """The raft node has been destroyed or halted after a fatal error."""


class FatalApplyError(RaftError):
    """The apply target raised: the node must stop rather than diverge."""


class JournalUnchangedError(RaftError):
    """A journal compaction could not write its new file; the journal is as it was."""


class JournalSwitchError(RaftError):
    """The compacted journal is on disk but could not be opened: the node must stop."""
