"""Server configuration, loaded from one TOML file per server.

Every server of a cluster lists the whole membership, itself included, in
``[[server]]`` tables; ``node_id`` says which entry is this server. One list
that is identical on every server is easy to generate and to diff, and it
gives each server both the raft addresses of its peers and the RPC
addresses it forwards writes to and names in ``not_leader`` answers.

Example (``/etc/caravan/s1.toml``)::

    node_id   = "s1"
    data_dir  = "/var/lib/caravan/s1"     # relative paths: relative to this file
    log_level = "info"                    # debug | info | warning | error
    log_file  = "/var/log/caravan/s1.log" # default: <data_dir>/server.log
    raft_password_file = "/etc/caravan/raft.key"  # or raft_password = "..."
    raft_profile   = "low-latency"        # default: the raft adapter's default
    raft_compaction_entries = 50000       # compact the raft log (write a snapshot) after this many entries; default: the profile's
    max_entry_size = "48KiB"              # one raft entry; default: the raft adapter's
    rpc_max_frame  = "4MiB"               # largest RPC request or response
    fsync = true
    rpc_bind  = "0.0.0.0:4647"            # default: this server's rpc_addr
    raft_bind = "10.0.0.1:4648"           # default: this server's raft_addr
    http_addr = "0.0.0.0:4646"            # Nomad-compatible HTTP API; "off" disables it
    http_event_heartbeat = "30s"          # {} lines on idle /v1/event/stream responses

    [[server]]
    id        = "s1"
    rpc_addr  = "10.0.0.1:4647"           # what clients and other servers dial
    raft_addr = "10.0.0.1:4648"
    [[server]]
    id        = "s2"
    rpc_addr  = "10.0.0.2:4647"
    raft_addr = "10.0.0.2:4648"
    [[server]]
    id        = "s3"
    rpc_addr  = "10.0.0.3:4647"
    raft_addr = "10.0.0.3:4648"

    [gc]                                  # Nomad's defaults; durations as Go writes them
    eval_interval = "5m"
    eval_threshold = "1h"
    batch_eval_threshold = "24h"
    job_interval = "5m"
    job_threshold = "4h"
    deployment_interval = "5m"
    deployment_threshold = "1h"
    node_interval = "5m"
    node_threshold = "24h"
    token_interval = "5m"
    token_threshold = "1h"
    reap_batch = 7281                     # ids in one reap entry (also capped by max_entry_size)
    job_batch = 2048
    token_batch = 4096

    [scheduler]                           # the leader's lifecycle loops (Nomad's defaults)
    enabled = true                        # false: no broker, workers, heartbeat TTLs or deployment
                                          # watcher (tests that drive evals and allocs by hand)
    workers = 2                           # scheduler workers on the leader (0: evals wait, as Nomad's num_schedulers = 0)
    min_heartbeat_ttl = "10s"             # the TTL granted is max(this, nodes / max_heartbeats_per_second)
    max_heartbeats_per_second = 50        #   plus up to as much again at random (Nomad's), told to clients
    heartbeat_grace = "10s"               # a node is marked down after its granted TTL + grace
    failover_heartbeat_ttl = "5m"         # a new leader waits this (+ grace) for a node's first heartbeat
    eval_delivery_limit = 3               # deliveries before an eval is failed
    eval_nack_timeout = "60s"             # an unacked eval is redelivered after this
    eval_nack_delay = "1s"                # first redelivery delay (later ones: eval_nack_delay_later)
    eval_nack_delay_later = "20s"
    failed_eval_followup = "1m"           # a failed eval's follow-up eval waits this long

    [journal]                             # must be the same on every server
    max_batches = 100000
    max_bytes = "256MiB"

Top-level ``rpc_addr`` / ``raft_addr`` may repeat this server's entry (they
must then be equal to it). The ``[[server]]`` list seeds the first start
only: afterwards the raft log and ``<data_dir>/raft/members.json`` say who
the members are (raft/members.py). ``join`` and ``[autopilot]``: see
``node/core/membership_settings.py``.

Unknown keys are errors (a misspelt key silently ignored is a setting that
does not apply). Every error is one line, ``config error: ...``, naming the
key and what to do; the raft password never appears in one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsm.journal import Retention
from node.core.membership_settings import AutopilotConfig, parse_autopilot, parse_join
from node.spec.units import parse_duration, parse_size
from node.wire.framing import DEFAULT_MAX_FRAME, format_address, parse_address

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_HTTP_PORT = 4646  # Nomad's HTTP port, so Nomad clients find the API without settings
MIN_PASSWORD_LENGTH = 16
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ConfigError(ValueError):
    """An unusable configuration; ``str()`` is the one line to show the operator."""

    def __str__(self) -> str:
        return f"config error: {self.args[0]}"


# ---- records -------------------------------------------------------------------


@dataclass(frozen=True)
class ServerEntry:
    """One cluster member, as every server's config lists it."""

    id: str
    rpc_addr: str
    raft_addr: str


@dataclass(frozen=True)
class GCConfig:
    """Leader GC timing and batch sizes (seconds, counts); Nomad's defaults.

    Thresholds are ages: an object is collected once it has been eligible
    for that long. A threshold may be 0; an interval must be positive.
    """

    eval_interval: float = 300.0
    eval_threshold: float = 3600.0
    batch_eval_threshold: float = 86400.0
    job_interval: float = 300.0
    job_threshold: float = 4 * 3600.0
    deployment_interval: float = 300.0
    deployment_threshold: float = 3600.0
    node_interval: float = 300.0
    node_threshold: float = 86400.0
    token_interval: float = 300.0
    token_threshold: float = 3600.0
    reap_batch: int = 7281
    job_batch: int = 2048
    token_batch: int = 4096


@dataclass(frozen=True)
class SchedulerConfig:
    """The leader's scheduling loops (seconds, counts); Nomad's defaults.

    Heartbeats: a node's TTL grows with the cluster so the leader hears at
    most ``max_heartbeats_per_second`` beats (``node.core.heartbeats``); a
    new leader gives every node ``failover_heartbeat_ttl`` to find it.
    """

    enabled: bool = True
    workers: int = 2
    min_heartbeat_ttl: float = 10.0
    max_heartbeats_per_second: float = 50.0
    heartbeat_grace: float = 10.0
    failover_heartbeat_ttl: float = 300.0
    eval_delivery_limit: int = 3
    eval_nack_timeout: float = 60.0
    eval_nack_delay: float = 1.0
    eval_nack_delay_later: float = 20.0
    failed_eval_followup: float = 60.0


@dataclass(frozen=True)
class ServerConfig:
    """A validated server config; build it with ``load`` / ``loads`` / ``from_dict``.

    ``rpc_addr`` and ``raft_addr`` are this server's advertised addresses
    (from its ``[[server]]`` entry); ``rpc_bind`` and ``raft_bind`` are where
    it listens, which differ behind NAT or when binding 0.0.0.0.
    """

    node_id: str
    data_dir: Path
    servers: tuple[ServerEntry, ...]
    raft_password: str = field(repr=False)
    rpc_bind: str
    raft_bind: str
    log_file: Path
    log_level: str = "info"
    raft_profile: str | None = None
    raft_compaction_entries: int | None = None
    max_entry_size: int | None = None
    rpc_max_frame: int = DEFAULT_MAX_FRAME
    fsync: bool = True
    gc: GCConfig = field(default_factory=GCConfig)
    journal: Retention = field(default_factory=Retention)
    # None: not configured (<rpc_bind host>:4646 if that port is free); "": HTTP API off.
    http_addr: str | None = None
    http_event_heartbeat: float = 30.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # None: bootstrap from [[server]]; else join the cluster at these RPC addresses (membership_settings.py).
    join: tuple[str, ...] | None = None
    autopilot: AutopilotConfig = field(default_factory=AutopilotConfig)

    @property
    def http_bind(self) -> str | None:
        """Where the HTTP API listens, or None when it is turned off."""
        if self.http_addr is None:
            host, _ = parse_address(self.rpc_bind)
            return format_address(host, DEFAULT_HTTP_PORT)
        return self.http_addr or None

    @property
    def self_entry(self) -> ServerEntry:
        return next(s for s in self.servers if s.id == self.node_id)

    @property
    def rpc_addr(self) -> str:
        return self.self_entry.rpc_addr

    @property
    def raft_addr(self) -> str:
        return self.self_entry.raft_addr

    @property
    def peers(self) -> tuple[ServerEntry, ...]:
        """The other members."""
        return tuple(s for s in self.servers if s.id != self.node_id)

    def rpc_addr_of_raft(self, raft_addr: str) -> str | None:
        """The RPC address of the member at ``raft_addr`` (raft names leaders by raft address)."""
        return next((s.rpc_addr for s in self.servers if s.raft_addr == raft_addr), None)

    def raft_config(self, **overrides: Any) -> Any:
        """The ``raft.config.RaftConfig`` of this server; ``overrides`` are RaftConfig fields.

        The raft adapter validates it (profile names, entry size bounds)
        when the node starts, with its own one-line errors.
        """
        from raft.config import RaftConfig  # the raft adapter pulls in pysyncobj

        settings: dict[str, Any] = {
            "self_address": self.raft_addr,
            "peers": [s.raft_addr for s in self.servers],
            "data_dir": self.data_dir,
            "password": self.raft_password,
            "bind_address": self.raft_bind,
            "fsync": self.fsync,
            "dynamic_membership": True,  # the [[server]] list seeds the first start only (raft/members.py)
        }
        if self.raft_profile is not None:
            settings["profile"] = self.raft_profile
        if self.max_entry_size is not None:
            settings["max_entry_bytes"] = self.max_entry_size
        if self.raft_compaction_entries is not None:
            settings["compaction_entries"] = self.raft_compaction_entries
        from raft.members import Member

        settings["bootstrap_members"] = tuple(Member(s.id, s.raft_addr, s.rpc_addr) for s in self.servers)
        return RaftConfig(**(settings | overrides))

    @classmethod
    def load(cls, path: str | Path) -> ServerConfig:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot read {path}: {exc.strerror or exc}; pass the path of the server's TOML config"
            ) from None
        try:
            return cls.loads(text, base_dir=path.parent)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc.args[0]}") from None

    @classmethod
    def loads(cls, text: str, *, base_dir: str | Path = ".") -> ServerConfig:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"invalid TOML: {exc}") from None
        return cls.from_dict(data, base_dir=base_dir)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, base_dir: str | Path = ".") -> ServerConfig:
        """Validate parsed TOML. Relative paths are taken relative to ``base_dir``."""
        return _Parser(Path(base_dir)).server_config(data)


# ---- parsing and validation ------------------------------------------------------

_TOP_KEYS = (
    "node_id",
    "data_dir",
    "log_level",
    "log_file",
    "raft_password",
    "raft_password_file",
    "raft_profile",
    "raft_compaction_entries",
    "max_entry_size",
    "rpc_max_frame",
    "fsync",
    "rpc_addr",
    "raft_addr",
    "rpc_bind",
    "raft_bind",
    "server",
    "gc",
    "journal",
    "http_addr",
    "http_event_heartbeat",
    "scheduler",
    "join",
    "autopilot",
)
_SERVER_KEYS = ("id", "rpc_addr", "raft_addr")
# What Nomad, Consul and etcd call their peer lists: said to mean [[server]].
_PEER_KEYS = ("peers", "servers", "retry_join", "start_join", "initial_cluster")


def _check_keys(table: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            if key in _PEER_KEYS and "server" in known:
                hint = 'list every server (this one too) as a [[server]] table with id, rpc_addr and raft_addr'
            elif close:
                hint = f"did you mean {close[0]!r}?"
            else:
                hint = f"known keys: {', '.join(known)}"
            raise ConfigError(f"unknown key {key!r}{where}; {hint}")


class _Parser:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir

    def path(self, value: Any, name: str) -> Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be a non-empty path string")
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def address(self, value: Any, name: str) -> str:
        try:
            _, port = parse_address(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        if port == 0:
            raise ConfigError(
                f"{name}: port 0 is not a fixed address; give the port other servers dial"
            )
        return value

    def size(self, value: Any, name: str) -> int:
        try:
            size = parse_size(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        if size <= 0:
            raise ConfigError(f"{name} must be positive")
        return size

    def positive_int(self, value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, not {value!r}")
        return value

    def duration(self, value: Any, name: str, *, allow_zero: bool) -> float:
        if not isinstance(value, str):
            raise ConfigError(f'{name} must be a duration string like "5m", not {value!r}')
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        if seconds < 0 or (seconds == 0 and not allow_zero) or not math.isfinite(seconds):
            need = "zero or positive" if allow_zero else "positive"
            raise ConfigError(f"{name} must be {need}, not {value!r}")
        return seconds

    def servers(self, value: Any) -> tuple[ServerEntry, ...]:
        if not isinstance(value, list) or not value:
            raise ConfigError(
                "no [[server]] entries; list every cluster member (this one included) as a [[server]] table"
            )
        entries: list[ServerEntry] = []
        for n, table in enumerate(value, 1):
            where = f"[[server]] #{n}"
            if not isinstance(table, dict):
                raise ConfigError(f"{where} must be a table with id, rpc_addr and raft_addr")
            _check_keys(table, _SERVER_KEYS, f" in {where}")
            for key in _SERVER_KEYS:
                if key not in table:
                    raise ConfigError(
                        f"{where} has no {key}; every [[server]] needs id, rpc_addr and raft_addr"
                    )
            server_id = table["id"]
            if not isinstance(server_id, str) or not _NODE_ID.match(server_id):
                raise ConfigError(
                    f"{where}: id {server_id!r} must be 1-64 letters, digits, '.', '_' or '-'"
                )
            entries.append(
                ServerEntry(
                    id=server_id,
                    rpc_addr=self.address(table["rpc_addr"], f"{where} rpc_addr"),
                    raft_addr=self.address(table["raft_addr"], f"{where} raft_addr"),
                )
            )
        for key in _SERVER_KEYS:
            seen: set[str] = set()
            for entry in entries:
                value = getattr(entry, key)
                if value in seen:
                    raise ConfigError(
                        f"two [[server]] entries share {key} {value!r}; each member needs its own"
                    )
                seen.add(value)
        return tuple(entries)

    def password(self, data: dict[str, Any]) -> str:
        inline, file = data.get("raft_password"), data.get("raft_password_file")
        if inline is not None and file is not None:
            raise ConfigError("set only one of raft_password and raft_password_file")
        if inline is None and file is None:
            raise ConfigError("raft_password is required (set raft_password or raft_password_file)")
        if file is not None:
            path = self.path(file, "raft_password_file")
            try:
                secret = path.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                reason = (
                    exc.strerror
                    if isinstance(exc, OSError) and exc.strerror
                    else type(exc).__name__
                )
                raise ConfigError(f"cannot read raft_password_file {path}: {reason}") from None
            source = f"raft_password_file {path}"
        else:
            if not isinstance(inline, str):
                raise ConfigError("raft_password must be a string")
            secret = inline
            source = "raft_password"
        if len(secret) < MIN_PASSWORD_LENGTH:
            raise ConfigError(
                f"{source} is shorter than {MIN_PASSWORD_LENGTH} characters; "
                f"use a random secret, e.g. the output of `openssl rand -hex 16`"
            )
        return secret

    def gc(self, table: Any) -> GCConfig:
        if not isinstance(table, dict):
            raise ConfigError("[gc] must be a table")
        fields = {f.name: f for f in dataclasses.fields(GCConfig)}
        _check_keys(table, tuple(fields), " in [gc]")
        values: dict[str, Any] = {}
        for key, value in table.items():
            name = f"gc.{key}"
            if type(fields[key].default) is int:
                values[key] = self.positive_int(value, name)
            else:
                values[key] = self.duration(value, name, allow_zero=key.endswith("_threshold"))
        return GCConfig(**values)

    def scheduler(self, table: Any) -> SchedulerConfig:
        if not isinstance(table, dict):
            raise ConfigError("[scheduler] must be a table")
        if "heartbeat_ttl" in table:
            raise ConfigError("scheduler.heartbeat_ttl is now min_heartbeat_ttl (the TTL grows with the cluster); rename it")
        fields = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
        _check_keys(table, tuple(fields), " in [scheduler]")
        values: dict[str, Any] = {}
        for key, value in table.items():
            name = f"scheduler.{key}"
            if type(fields[key].default) is bool:
                if not isinstance(value, bool):
                    raise ConfigError(f"{name} must be true or false, not {value!r}")
                values[key] = value
            elif key == "workers":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"{name} must be a non-negative integer, not {value!r}")
                values[key] = value
            elif type(fields[key].default) is int:
                values[key] = self.positive_int(value, name)
            elif key == "max_heartbeats_per_second":
                if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                    raise ConfigError(f"{name} must be a positive number of heartbeats a second, not {value!r}")
                values[key] = float(value)
            else:
                values[key] = self.duration(value, name, allow_zero=False)
        return SchedulerConfig(**values)

    def journal(self, table: Any) -> Retention:
        if not isinstance(table, dict):
            raise ConfigError("[journal] must be a table")
        _check_keys(table, ("max_batches", "max_bytes"), " in [journal]")
        values: dict[str, Any] = {}
        if "max_batches" in table:
            values["max_batches"] = self.positive_int(table["max_batches"], "journal.max_batches")
        if "max_bytes" in table:
            values["max_bytes"] = self.size(table["max_bytes"], "journal.max_bytes")
        return Retention(**values)

    def identity(self, data: dict[str, Any]) -> tuple[str, Path, tuple[ServerEntry, ...], ServerEntry]:
        """(node_id, data_dir, the [[server]] list, this server's entry in it), each checked."""
        node_id = data.get("node_id")
        if node_id is None:
            raise ConfigError(
                "node_id is required; set it to this server's id in the [[server]] list"
            )
        if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
            raise ConfigError(f"node_id {node_id!r} must be 1-64 letters, digits, '.', '_' or '-'")
        if "data_dir" not in data:
            raise ConfigError("data_dir is required; set it to a directory this server alone uses")
        data_dir = self.path(data["data_dir"], "data_dir")
        servers = self.servers(data.get("server"))
        me = next((s for s in servers if s.id == node_id), None)
        if me is None:
            ids = ", ".join(s.id for s in servers)
            raise ConfigError(
                f"node_id {node_id!r} is not among the [[server]] ids ({ids}); add an entry for it or fix node_id"
            )
        for key in ("rpc_addr", "raft_addr"):
            if key in data and data[key] != getattr(me, key):
                raise ConfigError(
                    f"{key} {data[key]!r} differs from the [[server]] entry of {node_id!r} ({getattr(me, key)!r}); "
                    f"remove {key} (the [[server]] list is enough) or make them equal"
                )
        return node_id, data_dir, servers, me

    def frame_limits(self, data: dict[str, Any]) -> tuple[int, int | None]:
        """(rpc_max_frame, max_entry_size): an entry must fit a frame, or a follower could not forward it."""
        rpc_max_frame = self.size(data.get("rpc_max_frame", DEFAULT_MAX_FRAME), "rpc_max_frame")
        max_entry_size = None
        if "max_entry_size" in data:
            max_entry_size = self.size(data["max_entry_size"], "max_entry_size")
            if max_entry_size >= rpc_max_frame:
                raise ConfigError(
                    f"max_entry_size ({max_entry_size} bytes) must be below rpc_max_frame ({rpc_max_frame} bytes), "
                    f"or a write that fits one entry could not be forwarded to the leader"
                )
        return rpc_max_frame, max_entry_size

    def server_config(self, data: dict[str, Any]) -> ServerConfig:
        _check_keys(data, _TOP_KEYS, "")
        node_id, data_dir, servers, me = self.identity(data)
        log_level = data.get("log_level", "info")
        if not isinstance(log_level, str) or log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"log_level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        raft_profile = data.get("raft_profile")
        if raft_profile is not None and (not isinstance(raft_profile, str) or not raft_profile):
            raise ConfigError("raft_profile must be a profile name string")
        fsync = data.get("fsync", True)
        if not isinstance(fsync, bool):
            raise ConfigError(f"fsync must be true or false, not {fsync!r}")
        rpc_max_frame, max_entry_size = self.frame_limits(data)
        return ServerConfig(
            node_id=node_id,
            data_dir=data_dir,
            servers=servers,
            raft_password=self.password(data),
            rpc_bind=self.address(data.get("rpc_bind", me.rpc_addr), "rpc_bind"),
            raft_bind=self.address(data.get("raft_bind", me.raft_addr), "raft_bind"),
            log_file=self.path(data["log_file"], "log_file")
            if "log_file" in data
            else data_dir / "server.log",
            log_level=log_level.lower(),
            raft_profile=raft_profile,
            raft_compaction_entries=self.positive_int(data["raft_compaction_entries"], "raft_compaction_entries")
            if "raft_compaction_entries" in data
            else None,
            max_entry_size=max_entry_size,
            rpc_max_frame=rpc_max_frame,
            fsync=fsync,
            gc=self.gc(data.get("gc", {})),
            journal=self.journal(data.get("journal", {})),
            http_addr=self.http_addr(data.get("http_addr")),
            http_event_heartbeat=self.duration(
                data.get("http_event_heartbeat", "30s"), "http_event_heartbeat", allow_zero=False
            ),
            scheduler=self.scheduler(data.get("scheduler", {})),
            join=parse_join(data.get("join"), self.address, ConfigError),
            autopilot=parse_autopilot(
                data.get("autopilot", {}), lambda v, n: self.duration(v, n, allow_zero=False), ConfigError
            ),
        )

    def http_addr(self, value: Any) -> str | None:
        if value is None:
            return None
        if value in ("", "off"):
            return ""
        return self.address(value, "http_addr")


def load_config(path: str | Path) -> ServerConfig:
    """``ServerConfig.load``, for callers that want a function (the CLI)."""
    return ServerConfig.load(path)
