"""The simulated client's nodes at scale: who they are, where they sit, registering and heartbeating them.

One ``caravan client sim`` process stands in for tens of thousands of hosts
(Nomad's nodesim serves hundreds per process), so no work here is per node
on a timer:

- **Registration** runs with at most ``register_concurrency`` calls in
  flight (the leader coalesces them into few raft entries), one heartbeat
  chunk after another. A chunk starts heartbeating as soon as its own nodes
  are registered: with 10,000 nodes the first ones' TTLs would run out
  before the last ones were registered.
- **Heartbeats** go in chunks of at most ``heartbeat_batch`` node ids (never
  more than the server's ``MAX_HEARTBEAT_IDS``), one ``node.heartbeat``
  call per chunk. The leader grants a TTL that grows with the cluster
  (``max(min_heartbeat_ttl, nodes / max_heartbeats_per_second)`` plus up to
  as much again at random), and each chunk beats again after
  ``BEAT_FRACTION`` of its own TTL: over that jitter the mean of 1/TTL is
  ln 2 / base, so the fleet sends about 0.99 x ``max_heartbeats_per_second``
  node beats a second, spread over the TTL rather than in step, and each
  beat has 30% of its TTL plus the server's grace to arrive.
- **Topology** (``--clusters N --racks M``): node ``i`` sits in cluster
  ``c<i mod N>`` and rack ``c<c>-r<(i div N) mod M>``, set as the
  ``meta.cluster`` / ``meta.rack`` attributes the scheduler's cluster rules
  and constraints read. It depends only on the node's position, which the
  state file keeps with its id, so the same flags put a node in the same place.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from client.gc import GCConfig
from client.silence import Silence
from fsm.structs import CLUSTER_ATTRIBUTE, RACK_ATTRIBUTE
from node.wire.errors import RPCError
from node.wire.messages import MAX_HEARTBEAT_IDS
from node.wire.rpc_client import AsyncRPCClient

BEAT_FRACTION = 0.7  # of the granted TTL, before a chunk beats again
BEAT_MARGIN = 1.0  # seconds: and at least this long before its TTL runs out
DEFAULT_TTL = 10.0  # until a server grants one (Nomad's min_heartbeat_ttl)
RETRY_FIRST = 0.25  # seconds before a failed heartbeat is sent again, doubling up to RETRY_MAX
RETRY_MAX = 4.0
SILENT_RECHECK = 0.25  # seconds: how soon a chunk whose nodes are all silenced looks again
RPC_TIMEOUT = 15.0
T = TypeVar("T")


class SimError(Exception):
    """The simulation cannot start (no server answers, bad arguments)."""


@dataclass
class SimConfig:
    servers: list[str]
    nodes: int = 1
    cpu: int = 4000
    memory_mb: int = 8192
    disk_mb: int = 10240  # each node's disk: registered as its DiskMB, and what GC usage is a percentage of
    inodes: int = 655360  # each node's inode count (ext4's default for that disk: one per 16 KiB)
    datacenter: str = "dc1"
    node_class: str = "sim"
    name_prefix: str = ""
    token: str | None = None  # not sent: a client authenticates with its node secret, never an ACL token
    report_interval: float = 0.1
    seed: int | None = None
    verbose: bool = False
    state_file: str = ""  # keeps node ids across restarts, as a Nomad client's data dir does
    clusters: int = 0  # 0: no topology attributes
    racks: int = 0  # racks per cluster; 0: none
    heartbeat_batch: int = 500  # node ids per node.heartbeat call
    register_concurrency: int = 64  # node.register calls in flight
    status_interval: float = 60.0  # seconds between status lines; 0: none
    # Devices every node advertises, by Nomad's name, ``vendor/type`` or ``vendor/type/model``
    # (``{"nvidia/gpu": 4}``); tasks ask for them with ``device "nvidia/gpu" { count = 1 }``.
    devices: dict[str, int] = field(default_factory=dict)
    data_dir: str = ""  # alloc directories live under <data_dir>/<node id>/alloc; "": a temporary one
    gc: GCConfig = field(default_factory=GCConfig)  # the client's alloc GC (Nomad's gc_* settings)
    gc_report_interval: float = 10.0  # seconds between node re-registrations showing what a node holds; 0: never


@dataclass
class SimNode:
    """One simulated node; ``secret`` is its node secret (Nomad's SecretID), chosen by this client.

    The servers keep only its hash and refuse this node's calls without it.
    The nodes of one client process share one secret: the process is their
    one client, and one secret lets a heartbeat call carry hundreds of nodes.
    """

    id: str
    name: str
    cluster: str = ""
    rack: str = ""
    secret: str = ""
    extra: dict[str, str] = field(default_factory=dict)  # attributes the client adds (what its GC holds)

    def register_args(self, cfg: SimConfig) -> dict[str, Any]:
        attributes = {"driver.sim": "1", "kernel.name": "linux", "cpu.arch": "amd64", "unique.hostname": self.name,
                      **self.extra}
        if self.cluster:
            attributes[CLUSTER_ATTRIBUTE] = self.cluster
        if self.rack:
            attributes[RACK_ATTRIBUTE] = self.rack
        return {
            "node": {
                "ID": self.id,
                "Name": self.name,
                "Datacenter": cfg.datacenter,
                "NodeClass": cfg.node_class,
                "Attributes": attributes,
                "Resources": {"CPU": cfg.cpu, "MemoryMB": cfg.memory_mb, "DiskMB": cfg.disk_mb, "Devices": dict(cfg.devices)},
                "Status": "ready",
                "SchedulingEligibility": "eligible",
                **({"SecretID": self.secret} if self.secret else {}),
            }
        }


async def for_each(items: Iterable[T], concurrency: int, fn: Callable[[T], Awaitable[None]]) -> None:
    """Await ``fn(item)`` for every item, at most ``concurrency`` at once.

    The first error cancels the rest and is raised as it is (not in an
    ExceptionGroup), so callers catch ``RPCError`` as from a single call.
    """
    todo = iter(items)

    async def worker() -> None:
        for item in todo:
            await fn(item)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()


def topology(position: int, clusters: int, racks: int) -> tuple[str, str]:
    """(cluster, rack) of the node at ``position``: round-robin over clusters, then over racks inside one."""
    if clusters <= 0 and racks <= 0:
        return "", ""
    clusters = max(clusters, 1)
    cluster = position % clusters
    rack = f"c{cluster}-r{(position // clusters) % racks}" if racks > 0 else ""
    return f"c{cluster}", rack


def place(nodes: Sequence[SimNode], clusters: int, racks: int) -> None:
    """Set each node's cluster and rack from its position."""
    for position, node in enumerate(nodes):
        node.cluster, node.rack = topology(position, clusters, racks)


def next_beat(ttl: float) -> float:
    """Seconds until a chunk granted ``ttl`` beats again: BEAT_FRACTION of it, and BEAT_MARGIN before it ends."""
    return max(0.05, 0.25 * ttl, min(BEAT_FRACTION * ttl, ttl - BEAT_MARGIN))


def beat_timeout(ttl: float) -> float:
    """How long one heartbeat call may retry inside the RPC client (leader failover included)."""
    return max(2.0, min(RPC_TIMEOUT, 0.3 * ttl))


@dataclass
class Chunk:
    """Nodes heartbeated together in one call, with the TTL last granted to them."""

    ids: list[str]
    ttl: float = DEFAULT_TTL
    due: float = 0.0  # loop time of its next beat


@dataclass
class FleetStats:
    registered: int = 0
    register_seconds: float = 0.0
    heartbeats: int = 0  # node.heartbeat calls answered
    beats: int = 0  # node heartbeats they carried
    heartbeat_errors: int = 0


class Fleet:
    """Registers the client's nodes and keeps them heartbeating, chunk by chunk."""

    def __init__(
        self,
        cfg: SimConfig,
        rpc: AsyncRPCClient,
        nodes: dict[str, SimNode],
        *,
        error: Callable[[str, str], None],
        say: Callable[[str], None],
        silence: Silence | None = None,
    ) -> None:
        self.cfg = cfg
        self.silence = silence or Silence()  # nodes cut off from the servers: not heartbeated
        self.rpc = rpc
        self.nodes = nodes
        self.error = error
        self.say = say
        size = max(1, min(cfg.heartbeat_batch, MAX_HEARTBEAT_IDS))
        ids = list(nodes)
        self.chunks = [Chunk(ids[i : i + size]) for i in range(0, len(ids), size)]
        self.stats = FleetStats()
        self.index = 0  # the newest registration's raft index
        self._ready: asyncio.Queue[Chunk] = asyncio.Queue()

    async def register(self, nodes: Sequence[SimNode]) -> list[float]:
        """Register ``nodes`` with at most ``register_concurrency`` calls in flight; the TTLs granted.

        Raises the first RPCError (the rest of the workers stop with it).
        """
        ttls: list[float] = []

        async def one(node: SimNode) -> None:
            out = await self.rpc.call("node.register", node.register_args(self.cfg))
            self.index = max(self.index, int(out.get("Index", 0)))
            ttls.append(float(out.get("HeartbeatTTL") or DEFAULT_TTL))

        await for_each(nodes, self.cfg.register_concurrency, one)
        return ttls

    async def register_all(self) -> None:
        """Register every node, handing each chunk to the heartbeat loop once its nodes are in."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        for n, chunk in enumerate(self.chunks, 1):
            at = loop.time()
            # A silenced node stays away (a restart during the cut); it registers again when back, if unknown.
            ttls = await self.register([self.nodes[i] for i in chunk.ids if i not in self.silence])
            chunk.ttl = min(ttls, default=DEFAULT_TTL)  # every node of it was granted at least this
            chunk.due = at + next_beat(chunk.ttl)
            self.stats.registered += len(chunk.ids)
            self._ready.put_nowait(chunk)
            if len(self.chunks) > 1 and (n % 10 == 0 or n == len(self.chunks)):
                print(f"{time.strftime('%H:%M:%S')} registered {self.stats.registered}/{len(self.nodes)} nodes", flush=True)
        self.stats.register_seconds = time.monotonic() - started

    async def heartbeats(self) -> None:
        """Beat every registered chunk when it is due, for as long as the client runs."""
        async with asyncio.TaskGroup() as tg:
            while True:
                tg.create_task(self._beat(await self._ready.get()), name="heartbeat chunk")

    async def _beat(self, chunk: Chunk) -> None:
        loop = asyncio.get_running_loop()
        retry = RETRY_FIRST
        while True:
            await asyncio.sleep(max(0.0, chunk.due - loop.time()))
            ids = [i for i in chunk.ids if i not in self.silence] if self.silence.ids else chunk.ids
            if not ids:  # every node of the chunk is cut off: look again soon, so they come back promptly
                chunk.due = loop.time() + SILENT_RECHECK
                continue
            sent = loop.time()
            try:
                out = await self.rpc.call("node.heartbeat", {"node_ids": ids}, timeout=beat_timeout(chunk.ttl))
            except RPCError as exc:
                self.stats.heartbeat_errors += 1
                self.error("heartbeat", exc.message)
                chunk.due = loop.time() + retry
                retry = min(retry * 2, RETRY_MAX)
                continue
            retry = RETRY_FIRST
            self.stats.heartbeats += 1
            self.stats.beats += len(ids)
            chunk.ttl = float(out.get("HeartbeatTTL") or chunk.ttl)
            chunk.due = sent + next_beat(chunk.ttl)  # the server's deadline runs from before the answer
            unknown = [self.nodes[i] for i in out.get("Unknown") or [] if i in self.nodes]
            if unknown:
                self.say(f"re-registering {len(unknown)} node(s) the servers do not know")
                try:
                    await self.register(unknown)
                except RPCError as exc:
                    self.error("re-registering nodes", exc.message)

    def status(self) -> str:
        """One line on how the fleet is doing (for logs at scale, where per-node lines are noise)."""
        ttls = [c.ttl for c in self.chunks]
        return (
            f"nodes={len(self.nodes)} registered={self.stats.registered} heartbeat_calls={self.stats.heartbeats} "
            f"node_beats={self.stats.beats} heartbeat_errors={self.stats.heartbeat_errors} "
            f"ttl_s={min(ttls):.1f}..{max(ttls):.1f}"
        )


def load_nodes(path: str) -> list[SimNode]:
    """The nodes a state file recorded; none if it does not exist yet."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise SimError(f"cannot read the client state file {path}: {exc}; delete it to start with new nodes") from None
    try:
        return [SimNode(str(n["id"]), str(n["name"]), secret=str(n.get("secret", ""))) for n in data["nodes"]]
    except (KeyError, TypeError) as exc:
        raise SimError(f"client state file {path} is not one this client wrote ({exc!r}); "
                       "delete it to start with new nodes") from None


def save_nodes(path: str, nodes: list[SimNode]) -> None:
    """Write the state file atomically: a crash leaves the old file or the new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        # The node secret too, as a Nomad client's data dir keeps it: a restarted
        # client must present the same one to register its nodes again.
        json.dump({"nodes": [{"id": n.id, "name": n.name, "secret": n.secret} for n in nodes]}, f, indent=1)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
