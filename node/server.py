"""One Caravan server process: FSM + raft + RPC, and the leader's loops.

Threads: pysyncobj's tick thread applies entries (and commits one LMDB
transaction per tick); an asyncio loop serves RPCs; blocking work (reads,
digests) runs in a thread pool. Writes are forwarded to the leader, which
stamps them with its wall clock and the client's request id and puts them
on the log; reads are linearizable (leader + barrier) unless ``stale``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from fsm.ids import new_uuid
from fsm.machine import FSM
from fsm.messages import encode_entry
from fsm.store import StateReader
from node import gauges
from node.core import acl, autopilot, joining, membership
from node.core.acl import Need
from node.core.api import Forward
from node.core.config import ServerConfig
from node.core.context import RequestContext
from node.core.forward import blocking_wait, forward_request
from node.core.heartbeats import Heartbeats
from node.core.process import GCPauses, tune_gc
from node.core.reads import read_committed
from node.core.rpc_server import RPCServer
from node.core.testhooks import (
    UNSAFE_SKIP_SNAPSHOT_RESTORE_ENV,
    install_unsafe_wall_clock,
    raft_data_only,
)
from node.core.wakeup import CoalescedWake, wait_event
from node.core.writes import CLIENT, LEADER, WRITE_TIMEOUT, WriteQueue
from node.endpoints.registry import METHODS, STREAMS
from node.leader import gc as leader_gc
from node.leader import lifecycle
from node.wire.errors import (
    BAD_REQUEST,
    TIMEOUT,
    UNAVAILABLE,
    RPCError,
)
from node.wire.rpc_client import AsyncRPCClient
from raft import errors as raft_errors
from raft.members import load_state
from raft.node import RaftNode
from raft.starting import StartingRaft
from raft.startup import check_bindable

#: Seconds a cancelled leader loop may take to end before it is reported.
LEADER_LOOP_STOP_WARN = 10.0


# Coroutines that run only while this server leads: started when it wins,
# cancelled when it loses leadership (a crash is logged and the loop restarted).
LeaderLoop = Callable[["Server"], Awaitable[Any]]
LEADER_LOOPS: tuple[LeaderLoop, ...] = (*leader_gc.LEADER_LOOPS, *lifecycle.LEADER_LOOPS)
# Services run on every server once its RPC listener is up; each start returns its stop.
ServiceStop = Callable[[], Awaitable[None]]
Service = Callable[["Server"], Awaitable[ServiceStop]]


def services() -> tuple[Service, ...]:
    """The services (the HTTP API), imported only once the RPC listener is up: aiohttp and the
    routes are a sixth of the server's import time, and a restarted server's stale reads need
    neither."""
    from node.http import service as http_service

    return tuple(http_service.SERVICES)


@dataclass
class Member:
    node_id: str
    raft_addr: str
    rpc_addr: str


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.log = structlog.get_logger("caravan.server").bind(node_id=config.node_id)
        self.members = [Member(s.id, s.raft_addr, s.rpc_addr) for s in config.servers]
        self.rpc_of_raft = {m.raft_addr: m.rpc_addr for m in self.members}
        # Names the cluster in snapshots: the same on every member, from the shared membership list.
        self.cluster_id = hashlib.sha256(",".join(sorted(m.node_id for m in self.members)).encode()).hexdigest()[:16]
        # After bootstrap the raft state, not this config, says who the members are and keeps the
        # cluster id fixed (raft/members.py); a server with ``join`` and no raft state waits to be added.
        stored = load_state(Path(config.data_dir) / "raft")
        if stored is not None and stored.cluster_id:
            self.cluster_id = stored.cluster_id
        if stored is None and config.join is not None:
            joining.register(self, joining.Joiner(config))
        self._members_seen = -1  # the raft members_version the views were built from
        data = Path(config.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.fsm = FSM(str(data / "state"), retention=config.journal)
        self.rpc = RPCServer(config.rpc_bind, max_frame=config.rpc_max_frame, log=self.log)
        self.leader_loops = list(LEADER_LOOPS)
        self.leader_loops.append(autopilot.run)
        gauges.register(self)
        for name, fn in METHODS.items():
            self.rpc.register(name, self._handler(name, fn))
        for name, stream in STREAMS.items():
            self.rpc.register(name, functools.partial(stream, self), streaming=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        # A placeholder until ``serve`` has built the real node (see raft/starting.py).
        self.raft: RaftNode | StartingRaft = StartingRaft(config.raft_config())
        self.forwarder = AsyncRPCClient(timeout=WRITE_TIMEOUT)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="caravan-read")
        self._applied_event: asyncio.Event | None = None
        self._commit_wanted = False  # someone took the commit event since the last commit woke it
        self.heartbeats = Heartbeats()
        self._leader_tasks: list[asyncio.Task[Any]] = []
        # Cancelled leader loops until they end: asyncio holds tasks only
        # weakly, and a loop that never finished would be collected unseen.
        self._retiring: set[asyncio.Task[Any]] = set()
        self._service_stops: list[ServiceStop] = []
        self._stopping = threading.Event()
        self._settled: collections.deque[tuple[asyncio.Future[Any], Any]] = collections.deque()
        self._tick_events: CoalescedWake | None = None  # commits and settled writes -> the loop
        self._commits = 0  # store commits so far (tick thread)
        self._acls_on = False  # ACLs bootstrapped (never undone: the log only moves forward)
        self._acls_off_at = -1  # value of _commits at which the store had no bootstrap
        self.snapshot_installs = 0  # raft dumps restored into the store (see _counting_installs)
        self.last_snapshot_install = 0

    # -- wiring -------------------------------------------------------------------
    def _handler(self, name: str, fn: Callable[..., Any]) -> Callable[[RequestContext, dict[str, Any]], Any]:
        """Wrap an endpoint so that a ``Forward`` re-sends the request to the leader.

        The follower passes the client's request id and token through, so the
        leader's answer (and its idempotency) is exactly what the client would
        have got from the leader directly. A request that arrives already
        forwarded and still finds no leader here gets ``not_leader``.
        """

        async def handler(ctx: RequestContext, args: dict[str, Any]) -> Any:
            try:
                return await fn(self, ctx, args)
            except Forward as fwd:
                return await self._forward(name, fn, ctx, args, fwd.leader)

        return handler

    async def _forward(
        self, name: str, fn: Callable[..., Any], ctx: RequestContext, args: dict[str, Any], leader: str | None
    ) -> Any:
        return await forward_request(self, name, fn, ctx, args, leader)

    def _start_raft(self) -> RaftNode:
        """Start raft with snapshot hooks: compaction writes the snapshot format off the tick."""
        from snapshot.raft_hooks import BackgroundSnapshotter

        raft_dir = Path(self.config.data_dir) / "raft"
        raft_dir.mkdir(parents=True, exist_ok=True)
        member_overrides = self._membership_overrides()
        self.snapshotter = BackgroundSnapshotter(self.fsm, str(raft_dir / "raft.dump"), cluster_id=self.cluster_id)
        config = self.config.raft_config(
            data_dir=str(raft_dir),
            serializer=self.snapshotter.serializer,
            deserializer=self._counting_installs(self.snapshotter.deserializer),
            serialize_checker=self.snapshotter.serialize_checker,
            **member_overrides,
        )
        return RaftNode(config, self.fsm, on_leadership=self._on_leadership)

    def _membership_overrides(self) -> dict[str, Any]:
        """Raft start-up thread: a joining server blocks here until added (node/core/joining.py)."""
        joiner = joining.joiner_of(self)
        if joiner is None:
            return {"cluster_id": self.cluster_id}
        overrides = joining.raft_overrides(joiner.wait(self._stopping))
        self.cluster_id = overrides["cluster_id"]
        return overrides

    def _refresh_members(self) -> None:
        """``members`` and ``rpc_of_raft`` follow the raft configuration (node/core/membership.py)."""
        self._members_seen = membership.refresh_views(self.raft, self._members_seen, self.members, self.rpc_of_raft)

    def _counting_installs(self, load: Callable[[str], tuple]) -> Callable[[str], tuple]:
        """Count raft dumps that replaced the store (a follower's snapshot install, or a restart onto a
        newer dump): ``status`` reports them, so operators and the fault harness can tell a catch-up by
        snapshot from one by log entries."""

        if os.environ.get(UNSAFE_SKIP_SNAPSHOT_RESTORE_ENV) == "1":
            self.log.warning("snapshot restore disabled", note="TEST ONLY: this replica will diverge")
            load = raft_data_only

        def deserializer(file_name: str) -> tuple:
            before = self.fsm.applied_index
            data = load(file_name)
            if self.fsm.applied_index > before:
                self.snapshot_installs += 1
                self.last_snapshot_install = self.fsm.applied_index
            return data

        return deserializer

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT."""
        self.loop = asyncio.get_running_loop()
        self.loop.set_default_executor(self.executor)
        self._applied_event = asyncio.Event()
        self._tick_events = CoalescedWake(self.loop, self._take_tick_events)
        self.fsm.on_commit(self._on_commit)
        # Listen first: stale reads need only the committed store, and starting
        # raft (link key derivation, journal load, dump check) took most of a
        # restarted server's time to its first answer. Until the real node is
        # in, the placeholder refuses writes and linearizable reads as a
        # follower without a leader would.
        # The raft port is bound only once raft starts, after the listener: check it first, so a
        # server whose raft port is taken fails at once saying why, not after answering reads.
        check_bindable(self.config.raft_bind)
        address = await self.rpc.start()
        raft = await self.loop.run_in_executor(None, self._start_raft)
        self.writes = WriteQueue(raft, self._settle_from_tick, self.rpc_of_raft)
        self.raft = raft
        if raft.is_leader:  # won while starting: _leadership_changed ignored it until now
            self._leadership_changed(True)
        for start in services():
            self._service_stops.append(await start(self))
        self.log.info("server started", rpc=address, raft=self.config.raft_addr)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        self.log.info("server stopping")
        self._stopping.set()
        for task in self._leader_tasks:
            task.cancel()
        for stop_service in reversed(self._service_stops):
            try:
                await stop_service()
            except Exception as exc:  # noqa: BLE001 - stopping the rest matters more
                self.log.warning("service did not stop cleanly", error=repr(exc))
        await self.rpc.close()
        await self.forwarder.close()
        self.raft.destroy()
        self.fsm.close()

    # -- events from the tick thread ----------------------------------------------
    def _on_commit(self, applied_index: int) -> None:
        self._commits += 1  # read by _acls_enabled (an int bump is atomic under the GIL)
        # Only a waiter needs the loop woken: on a follower serving no
        # blocking query, a wake-up per commit was ~7% of its samples (the
        # tick thread's pipe write and the GIL hand-off to the loop).
        if self._commit_wanted and self._tick_events is not None:
            self._tick_events.notify()

    def _take_tick_events(self) -> None:
        """On the loop: settle the writes the tick thread finished, and wake blocking queries.

        One wake-up of the loop per burst of ticks for both: a
        ``call_soon_threadsafe`` per commit (and another per batch of
        results) was ~6% of a follower's CPU under pipelined writes.
        """
        self._drain_settled()
        self._committed()

    def _committed(self) -> None:
        """Wake every blocking query that waits for a commit.

        Each commit sets the current event and installs a fresh one, instead
        of waiters clearing a shared event: a waiter that cleared it after its
        read would lose a commit that landed during the read.
        """
        self._commit_wanted = False
        event, self._applied_event = self._applied_event, asyncio.Event()
        if event is not None:
            event.set()

    def commit_event(self) -> asyncio.Event | None:
        """The event the next commit sets (None before the server runs).

        Take it *before* reading state, then wait on it: a commit that lands
        after the read still sets it, and one that landed before is in the
        read. Taking it is what asks the tick thread to wake the loop.
        """
        self._commit_wanted = True
        return self._applied_event

    def _on_leadership(self, is_leader: bool) -> None:
        self.log.info("leadership changed", leader=is_leader)
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._leadership_changed, is_leader)
            except RuntimeError:
                pass

    def _leadership_changed(self, is_leader: bool) -> None:
        if isinstance(self.raft, StartingRaft):
            return  # serve() looks again once the real node is in
        for task in self._leader_tasks:
            self._retire(task)
        self._leader_tasks = []
        if is_leader and not self._stopping.is_set():
            self.heartbeats.clear()
            self._leader_tasks = [asyncio.ensure_future(self._run_leader_loop(loop)) for loop in self.leader_loops]

    def _retire(self, task: asyncio.Task[Any]) -> None:
        """Cancel a leader loop, and say so if it has not ended LEADER_LOOP_STOP_WARN later."""
        task.cancel()
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

        def check() -> None:
            if not task.done():
                self.log.error(
                    "leader loop did not stop after leadership was lost; it is a bug, please report it",
                    task=repr(task)[:300],
                    waited_s=LEADER_LOOP_STOP_WARN,
                )

        asyncio.get_running_loop().call_later(LEADER_LOOP_STOP_WARN, check)

    async def _run_leader_loop(self, loop: LeaderLoop) -> None:
        """Run one leader loop; a crash is logged and the loop restarted, never silently lost."""
        name = getattr(loop, "__qualname__", repr(loop))
        while self.raft.is_leader and not self._stopping.is_set():
            try:
                await loop(self)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep leader duties alive
                self.log.error("leader loop failed; restarting it", loop=name, error=repr(exc))
                await asyncio.sleep(1.0)

    def _settle_from_tick(self, future: asyncio.Future[Any], value: Any) -> None:
        """Hand a result from the tick thread to the loop, waking the loop once per batch.

        One ``call_soon_threadsafe`` per write costs a pipe write and a GIL
        hand-off each; a tick that commits hundreds of entries needs one.
        """
        self._settled.append((future, value))
        if self._tick_events is not None:
            self._tick_events.notify()

    def _drain_settled(self) -> None:
        while self._settled:
            future, value = self._settled.popleft()
            if not future.done():
                future.set_result(value)

    # -- status ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        self._refresh_members()
        raft = self.raft.status()
        waiting = (joiner := joining.joiner_of(self)) is not None and isinstance(self.raft, StartingRaft) and not joiner.joined
        leader_raft = raft.get("leader")
        servers = []
        for member in self.members:
            servers.append(
                {
                    "ID": member.node_id,
                    "RaftAddress": member.raft_addr,
                    "RPCAddress": member.rpc_addr,
                    "Leader": member.raft_addr == leader_raft,
                    "Voter": True,
                }
            )
        return {
            "NodeID": self.config.node_id,
            "Role": "joining" if waiting else raft.get("role"),  # waiting to be added: raft not started
            "Term": raft.get("term"),
            "Leader": self.rpc_of_raft.get(leader_raft or "", ""),
            "LeaderRaft": leader_raft or "",
            "CommitIndex": raft.get("commit_index", 0),
            "AppliedIndex": self.fsm.applied_index,
            # Log compaction: the raft log holds FirstLogIndex..LastLogIndex; a peer that needs an
            # entry below FirstLogIndex is sent a snapshot. SnapshotInstalls counts dumps restored here.
            "FirstLogIndex": raft.get("first_log_index", 0),
            "LastLogIndex": raft.get("last_log_index", 0),
            "SnapshotInstalls": self.snapshot_installs,
            # False once this server was removed from the raft configuration (it then never campaigns).
            "Member": raft.get("member", joining.joiner_of(self) is None),
            "ClusterID": self.cluster_id,
            "LastSnapshotInstallIndex": self.last_snapshot_install,
            # The raft tick thread: share of the last second spent working (near 1: every write waits
            # whole ticks), and ticks that started late enough to risk an election (raft/ticks.py).
            "RaftTickBusy": raft.get("tick_busy", 0.0),
            "RaftTickStalls": raft.get("tick_stalls", 0),
            "servers": servers,
        }

    def leader_rpc(self) -> str | None:
        self._refresh_members()
        leader = self.raft.leader_address
        return self.rpc_of_raft.get(leader) if leader else None

    def state_now(self) -> int:
        """Now, in the time the state's records use (ns): the wall clock, but never before the
        newest time the log recorded. A leader whose clock ran ahead pins the state's times
        forward; delays set in that time must not wait for the skew as well."""
        return max(time.time_ns(), self.fsm.last_time)

    # -- auth ---------------------------------------------------------------------------
    async def local(self, fn: Callable[[StateReader], Any]) -> Any:
        """Run ``fn`` on this server's committed state, off the loop."""

        return await asyncio.get_running_loop().run_in_executor(self.executor, read_committed, self.fsm, fn)

    async def authorize(self, ctx: RequestContext, need: Need) -> None:
        """Check the caller's token. Inline on the loop: two point reads in LMDB cost microseconds."""
        if need is Need.NONE or not self._acls_enabled():
            return
        read_committed(self.fsm, lambda reader: acl.authorize(reader, ctx.token, need, time.time_ns()))

    def _acls_enabled(self) -> bool:
        """Whether ACLs are bootstrapped, reading the store at most once per commit until they are.

        Before bootstrap every request would otherwise open an LMDB read
        transaction just to learn that; the answer can only change when a
        commit lands. The commit count is taken before the read, so a
        bootstrap committed during the read is seen by the next request.
        """
        if self._acls_on:
            return True
        commits = self._commits
        if self._acls_off_at == commits:
            return False
        on = bool(read_committed(self.fsm, lambda reader: reader.acl_bootstrap_index()))
        if on:
            self._acls_on = True
        else:
            self._acls_off_at = commits
        return on

    # -- writes -------------------------------------------------------------------------
    async def propose(self, body: Any, rid: str | None = None, *, lane: str = LEADER) -> dict[str, Any]:
        """Leader-internal write (GC reaps, plans): {index, value}; raises RPCError.

        Raises ``not_leader`` when this server lost leadership: callers are
        leader loops, which are cancelled then anyway. ``lane`` is
        ``CLIENT`` for a write a caller waits on (node/core/writes.py).
        """
        if not self.raft.is_leader:
            raise RPCError.not_leader(self.leader_rpc())
        entry = encode_entry(body, time=time.time_ns(), rid=rid or new_uuid())
        result, index = await self.writes.submit(entry, lane)
        if not result.ok:
            raise RPCError(result.code or BAD_REQUEST, result.error)
        return {"index": result.index or index, "value": result.value, "duplicate": result.duplicate}


    async def write(self, ctx: RequestContext, need: Need, body: Any) -> dict[str, Any]:
        """Put ``body`` on the log through the leader; returns {index, value, duplicate}.

        A follower forwards the whole request (same request id and token), so
        the leader validates and stamps it, and a retry of a request that
        already committed returns the first result (the FSM remembers ids).
        """
        # A follower forwards before checking the token: a token (or object)
        # the client just created may not have reached this server yet.
        self.ensure_leader()
        await self.authorize(ctx, need)
        return await self.propose(body, ctx.request_id, lane=CLIENT)

    def ensure_leader(self) -> None:
        """Send the request on to the leader unless this server is it."""
        if not self.raft.is_leader:
            raise Forward(self.leader_rpc())

    # -- reads ----------------------------------------------------------------------------
    async def linearize(self, ctx: RequestContext) -> None:
        """Make a following local read linearizable: be the leader and pass a barrier."""
        self.ensure_leader()
        try:
            await self.raft.barrier_async(WRITE_TIMEOUT)
        except raft_errors.NotLeaderError:
            raise Forward(self.leader_rpc()) from None
        except raft_errors.RaftError as exc:
            raise RPCError(TIMEOUT, f"could not confirm leadership for a consistent read ({exc}); retry or use stale") from None

    async def read(
        self,
        ctx: RequestContext,
        args: dict[str, Any],
        tables: tuple[str, ...],
        fn: Callable[[StateReader], Any],
        *,
        need: Need = Need.READ,
        point: bool = False,
    ) -> dict[str, Any]:
        """{"index": N, "data": fn(state)} — linearizable, stale, and/or blocking.

        The token is checked where the read is served: on the leader after the
        barrier for a linearizable read (so a token just created is known), on
        this server's own state for a stale one.

        ``point``: ``fn`` reads a bounded amount (an object by id, a prefix
        lookup capped at a few objects), so it runs on the loop, as token
        checks do. Handing it to the executor cost more than the read itself:
        about 125 us of CPU per ``job.get`` under load, 212 against 85 us in all.
        Reads of unbounded size (lists) stay off the loop.
        """
        if not args.get("stale"):
            await self.linearize(ctx)
        await self.authorize(ctx, need)
        wait = blocking_wait(args)
        if wait > 0:
            await self._wait_tables(tables, int(args["min_index"]), wait)

        def run(reader: StateReader) -> dict[str, Any]:
            index = max([reader.table_index(t) for t in tables] + [1])
            return {"index": index, "applied_index": reader.applied_index, "data": fn(reader)}

        if point:
            return read_committed(self.fsm, run)
        return await self.local(run)

    async def _wait_tables(self, tables: tuple[str, ...], min_index: int, wait: float) -> None:
        """Blocking query: return once any of ``tables`` moves past ``min_index``, or at the deadline."""
        deadline = time.monotonic() + wait
        while True:
            event = self.commit_event()  # taken before the read: a commit after it sets this one
            assert event is not None
            index = read_committed(self.fsm, lambda r: max(r.table_index(t) for t in tables))
            remaining = deadline - time.monotonic()
            if index > min_index or remaining <= 0:
                return
            if not await wait_event(event, remaining):
                return

    def fsm_digest(self) -> tuple[str, int]:
        """The stored, incrementally kept digest (a full scan only once after a restore; see fsm/digest.py)."""
        return read_committed(self.fsm, lambda _reader: self.fsm.committed_digest())

    async def transfer_leadership(self, ctx: RequestContext, target: str | None) -> dict[str, Any]:
        self.ensure_leader()
        self._refresh_members()
        raft_target = None
        if target:
            for member in self.members:
                if target in (member.node_id, member.rpc_addr, member.raft_addr):
                    raft_target = member.raft_addr
            if raft_target is None:
                raise RPCError(BAD_REQUEST, f"unknown server {target!r}; see 'caravan operator raft list-peers'")
        if raft_target is None:
            others = [m.raft_addr for m in self.members if m.raft_addr != self.config.raft_addr]
            status = self.raft.status()
            match = {p["address"]: p.get("match_index") or 0 for p in status["peers"]}
            raft_target = max(others, key=lambda a: match.get(a, 0))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self.raft.transfer_leadership, raft_target, WRITE_TIMEOUT)
        except raft_errors.RaftError as exc:
            raise RPCError(UNAVAILABLE, f"leadership transfer failed: {exc}") from None
        return {"Leader": self.rpc_of_raft.get(raft_target, raft_target)}


def run_server(config: ServerConfig) -> int:
    """Entry point of ``caravan agent``: run until a signal; return the exit code."""
    # The RPC loop and pysyncobj's tick thread hand work to each other on every
    # write; with the default 5 ms GIL switch interval each hand-off can stall
    # that long (measured: 850 -> 1250 pipelined writes/s at 0.5 ms).
    sys.setswitchinterval(0.0005)
    install_unsafe_wall_clock(config)  # before Server() imports the modules that read the clock
    server = Server(config)
    tune_gc()
    GCPauses(server.log).install()
    try:
        asyncio.run(server.serve())
    except (OSError, raft_errors.RaftError) as exc:
        print(f"caravan agent: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
