"""Raft configuration: addresses, secrets, storage paths and tuned profiles.

pysyncobj's defaults are tuned for nothing in particular: with them a serial
writer gets ~10 writes/s (latency = 2 x max(appendEntriesPeriod,
autoTickPeriod)), the server binds 0.0.0.0 and talks unauthenticated pickle.
:class:`RaftConfig` closes those holes (bind to the node's own host, a
mandatory password) and picks the pysyncobj knobs from a named, measured
profile (see ``tests/bench/raft_bench.py`` for the numbers).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raft.errors import ConfigError

#: pysyncobj chunks any single log entry of ``appendEntriesBatchSizeBytes``
#: (64 KiB) or more, and that path corrupts entries (defect 2). Our cap sits
#: well below it, measured on the entry *as stored in the log* (pickled).
CHUNK_THRESHOLD_BYTES = 64 * 1024
DEFAULT_MAX_ENTRY_BYTES = 48 * 1024
#: Largest cap we accept: leaves headroom under the chunk threshold.
MAX_ALLOWED_ENTRY_BYTES = 60 * 1024

#: Environment switch that turns the follower-truncation fix off. TEST ONLY:
#: jepsen_like uses it to show the anomaly the fix prevents.
UNSAFE_DISABLE_TRUNCATION_FIX_ENV = "CARAVAN_UNSAFE_DISABLE_TRUNCATION_FIX"


@dataclass(frozen=True)
class RaftProfile:
    """A named set of pysyncobj timing/batching knobs.

    Field names follow :class:`pysyncobj.SyncObjConf` (snake_case). Values
    were measured on the project's 2-core machine with three nodes on one
    host; change them only together with a benchmark run.
    """

    name: str
    append_entries_use_batch: bool
    append_entries_period: float
    auto_tick_period: float
    raft_min_timeout: float
    raft_max_timeout: float
    leader_fallback_timeout: float
    connection_timeout: float
    connection_retry_time: float
    commands_wait_leader: bool
    log_compaction_min_entries: int
    log_compaction_min_time: float
    send_buffer_size: int
    recv_buffer_size: int
    commands_queue_size: int
    #: Unbatched mode only: the leader ships the entries its command loop
    #: appended every this many entries (and at the loop's end) instead of
    #: after every single command as pysyncobj does (raft/commands.py).
    coalesce_entries: int = 64


#: The default profile, and the base the others are built from: each of
#: them states only what it changes. Every submit wakes the tick thread (pipe
#: notifier) and sends append_entries immediately instead of waiting for a
#: batch period, so a serial writer sees sub-millisecond commits on loopback;
#: pipelined writers still get batched append_entries because the leader
#: ships everything past each follower's nextIndex in one message.
_LOW_LATENCY = RaftProfile(
    name="low-latency",
    append_entries_use_batch=False,
    append_entries_period=0.05,
    auto_tick_period=0.02,
    # etcd's and Nomad's 1 s: at 1M objects one full pass of the cyclic collector stops every
    # thread, the tick thread included, for 0.3-0.8 s, and a 0.5 s minimum let such a pause
    # cost a busy leader its leadership (bench-failover, issue #34).
    raft_min_timeout=1.0,
    raft_max_timeout=1.5,
    leader_fallback_timeout=2.5,
    connection_timeout=3.0,
    connection_retry_time=0.25,
    commands_wait_leader=False,
    log_compaction_min_entries=50_000,
    log_compaction_min_time=300.0,
    send_buffer_size=2**20,
    recv_buffer_size=2**20,
    commands_queue_size=200_000,
)

PROFILES: dict[str, RaftProfile] = {
    "low-latency": _LOW_LATENCY,
    # Bulk loads (restores, benchmarks). Same unbatched pipeline, but the
    # leader coalesces up to 256 entries per append_entries (about the 64 KiB
    # message cap for small entries), with bigger socket buffers and queue.
    # pysyncobj's own batch mode (appendEntriesUseBatch=True) was measured
    # and lost on both latency and throughput: it only ships on a timer.
    "throughput": replace(
        _LOW_LATENCY,
        name="throughput",
        log_compaction_min_entries=100_000,
        send_buffer_size=2**22,
        recv_buffer_size=2**22,
        commands_queue_size=400_000,
        coalesce_entries=256,
    ),
    # pysyncobj's batch mode with a short period, kept for comparison runs.
    "batched": replace(
        _LOW_LATENCY,
        name="batched",
        append_entries_use_batch=True,
        append_entries_period=0.005,
        auto_tick_period=0.002,
        log_compaction_min_entries=100_000,
        send_buffer_size=2**21,
        recv_buffer_size=2**21,
        commands_queue_size=400_000,
    ),
}
DEFAULT_PROFILE = "low-latency"

Serializer = Callable[[str, Any], None]
Deserializer = Callable[[str], Any]
#: pysyncobj's ``serializeChecker``: returns a ``pysyncobj.SERIALIZER_STATE``
#: (0 not serializing, 1 serializing, 2 success, 3 failed).
SerializeChecker = Callable[[], int]


def split_host_port(address: str, what: str) -> tuple[str, int]:
    """``host:port`` split and checked; ``what`` names the address in the error.

    Public because the node checks its bind address with the same rule
    before pysyncobj tries to bind (raft/startup.py).
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what} {address!r} is not host:port")
    try:
        port_no = int(port)
    except ValueError:
        raise ConfigError(f"{what} {address!r} has a non-numeric port") from None
    if not 0 < port_no < 65536:
        raise ConfigError(f"{what} {address!r} has a port outside 1-65535")
    return host, port_no


@dataclass
class RaftConfig:
    """Everything a raft node needs to start.

    ``password`` is mandatory: pysyncobj unpickles whatever arrives on its
    port, so an unauthenticated raft port is remote code execution. It is
    excluded from ``repr`` so it never reaches a log line.
    """

    self_address: str
    peers: list[str]
    data_dir: str | Path
    password: str = field(default="", repr=False)
    #: ``host:port`` to listen on. Default: the host and port of
    #: ``self_address`` (pysyncobj's own default is 0.0.0.0, defect 3).
    bind_address: str | None = None
    profile: str = DEFAULT_PROFILE
    #: Cap on one entry as stored in the raft log (after pysyncobj pickles it).
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    #: fsync the raft journal (and vote metadata) before acknowledging.
    fsync: bool = False
    #: Overrides of the profile's timings (seconds); None keeps the profile's.
    election_timeout_min: float | None = None
    election_timeout_max: float | None = None
    heartbeat_period: float | None = None
    leader_fallback_timeout: float | None = None
    #: Override of the profile's compaction trigger (log entries since the last dump).
    compaction_entries: int | None = None
    #: pysyncobj's dynamic membership; off by default (static peer list).
    dynamic_membership: bool = False
    #: The voters with their ids and RPC addresses, used only when the data
    #: dir holds no membership yet (first start); afterwards ``members.json``
    #: and the log are the truth (raft/members.py). Empty: ``peers`` by address.
    bootstrap_members: tuple[Any, ...] = ()
    #: The cluster's id and bootstrap size, stored beside the membership at first start.
    cluster_id: str = ""
    bootstrap_size: int = 0
    #: A server that has just joined: no campaign until it has heard from a leader.
    await_leader: bool = False
    serializer: Serializer | None = field(default=None, repr=False)
    deserializer: Deserializer | None = field(default=None, repr=False)
    #: pysyncobj's ``serializeChecker``, for a serializer that writes the dump
    #: off the tick thread (snapshot.raft_hooks.BackgroundSnapshotter): pysyncobj
    #: polls it every tick and drops compacted log entries only after it
    #: reports success. Requires ``serializer``.
    serialize_checker: SerializeChecker | None = field(default=None, repr=False)
    #: TEST ONLY: disable the follower-truncation fix (defect 1).
    unsafe_disable_truncation_fix: bool = False

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def journal_file(self) -> str:
        return str(self.data_path / "raft.journal")

    @property
    def dump_file(self) -> str:
        return str(self.data_path / "raft.dump")

    @property
    def other_peers(self) -> list[str]:
        """Peers without this node's own address (order kept, duplicates dropped)."""
        seen: list[str] = []
        for p in self.peers:
            if p != self.self_address and p not in seen:
                seen.append(p)
        return seen

    @property
    def effective_bind_address(self) -> str:
        if self.bind_address:
            return self.bind_address
        host, port = split_host_port(self.self_address, "self address")
        return f"{host}:{port}"

    @property
    def truncation_fix_enabled(self) -> bool:
        if self.unsafe_disable_truncation_fix:
            return False
        return os.environ.get(UNSAFE_DISABLE_TRUNCATION_FIX_ENV, "") not in ("1", "true", "yes")

    def resolved_profile(self) -> RaftProfile:
        """The named profile with this config's timing overrides applied."""
        try:
            prof = PROFILES[self.profile]
        except KeyError:
            names = ", ".join(sorted(PROFILES))
            raise ConfigError(
                f"unknown raft profile {self.profile!r}; choose one of: {names}"
            ) from None
        overrides: dict[str, Any] = {}
        if self.election_timeout_min is not None:
            overrides["raft_min_timeout"] = self.election_timeout_min
        if self.election_timeout_max is not None:
            overrides["raft_max_timeout"] = self.election_timeout_max
        if self.heartbeat_period is not None:
            overrides["append_entries_period"] = self.heartbeat_period
        if self.leader_fallback_timeout is not None:
            overrides["leader_fallback_timeout"] = self.leader_fallback_timeout
        if self.compaction_entries is not None:
            overrides["log_compaction_min_entries"] = self.compaction_entries
        return replace(prof, **overrides) if overrides else prof

    def validate(self) -> None:
        """Raise :class:`ConfigError` with a one-line reason if unusable."""
        if not self.password:
            raise ConfigError(
                "raft password is required: set one shared secret for all servers "
                "(the raft port must never accept unauthenticated peers)"
            )
        split_host_port(self.self_address, "self address")
        for p in self.other_peers:
            split_host_port(p, "peer address")
        host, _ = split_host_port(self.effective_bind_address, "bind address")
        if host in ("", "*"):
            raise ConfigError(
                "bind address must name a host; use 0.0.0.0 explicitly to listen everywhere"
            )
        if not 1024 <= self.max_entry_bytes <= MAX_ALLOWED_ENTRY_BYTES:
            raise ConfigError(
                f"max entry size {self.max_entry_bytes} must be between 1024 and "
                f"{MAX_ALLOWED_ENTRY_BYTES} bytes (pysyncobj corrupts entries of 64 KiB or more)"
            )
        if (self.serializer is None) != (self.deserializer is None):
            raise ConfigError("snapshot serializer and deserializer must be given together")
        if self.serialize_checker is not None and self.serializer is None:
            raise ConfigError("a snapshot serialize checker needs a snapshot serializer")
        prof = self.resolved_profile()
        if prof.raft_min_timeout <= 3 * prof.append_entries_period:
            raise ConfigError("election timeout must exceed three heartbeat periods")
        if prof.raft_max_timeout <= prof.raft_min_timeout:
            raise ConfigError("election timeout max must exceed its min")
        if prof.leader_fallback_timeout <= prof.append_entries_period:
            raise ConfigError("leader fallback timeout must exceed the heartbeat period")
        if not str(self.data_dir):
            raise ConfigError("raft data dir is required")

    def to_syncobj_conf(self, **overrides: Any) -> Any:
        """Build the :class:`pysyncobj.SyncObjConf` for this config.

        ``password`` is deliberately *not* passed: pysyncobj's own encryption
        needs the optional ``cryptography`` package; the adapter installs its
        own frame authenticator (keyed BLAKE2b MAC) on the transport instead (raft/auth.py).
        """
        from pysyncobj import SyncObjConf

        prof = self.resolved_profile()
        compaction_entries = prof.log_compaction_min_entries
        compaction_time = prof.log_compaction_min_time
        if self.serializer is None:
            # pysyncobj's default serializer pickles the SyncObj's __dict__,
            # which is meaningless for an LMDB-backed FSM: without a real
            # snapshot format, never compact (the journal keeps everything).
            compaction_entries = 2**62
            compaction_time = 10.0**12
        kwargs: dict[str, Any] = {
            "autoTick": True,
            "autoTickPeriod": prof.auto_tick_period,
            "appendEntriesUseBatch": prof.append_entries_use_batch,
            "appendEntriesPeriod": prof.append_entries_period,
            "appendEntriesBatchSizeBytes": CHUNK_THRESHOLD_BYTES,
            "raftMinTimeout": prof.raft_min_timeout,
            "raftMaxTimeout": prof.raft_max_timeout,
            "leaderFallbackTimeout": prof.leader_fallback_timeout,
            "connectionTimeout": max(prof.connection_timeout, prof.raft_max_timeout),
            "connectionRetryTime": prof.connection_retry_time,
            "commandsWaitLeader": prof.commands_wait_leader,
            "commandsQueueSize": prof.commands_queue_size,
            "sendBufferSize": prof.send_buffer_size,
            "recvBufferSize": prof.recv_buffer_size,
            "bindAddress": self.effective_bind_address,
            "journalFile": self.journal_file,
            "fullDumpFile": self.dump_file,
            "logCompactionMinEntries": compaction_entries,
            "logCompactionMinTime": compaction_time,
            "logCompactionBatchSize": CHUNK_THRESHOLD_BYTES,
            "dynamicMembershipChange": self.dynamic_membership,
            "serializer": self.serializer,
            "deserializer": self.deserializer,
            "useFork": False,
        }
        if self.serialize_checker is not None:
            # Only when set: pysyncobj treats any non-None checker as the
            # authority on whether a dump is in progress.
            kwargs["serializeChecker"] = self.serialize_checker
        kwargs.update(overrides)
        conf = SyncObjConf(**kwargs)
        return conf
