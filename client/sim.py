"""``caravan client sim``: one process simulating N client nodes (Nomad's nodesim).

It talks to the cluster only as a client (RPC), like a fleet of Nomad
clients would:

- registers its nodes and heartbeats them in chunks spread over the TTL the
  leader grants (``client.fleet``: tens of thousands of nodes per process,
  with ``--clusters`` / ``--racks`` topology), re-registering any node the
  servers no longer know;
- follows the change journal (``event.stream``, Allocation records) from the
  index of its registration, resuming on another server after a break and
  reloading its nodes' allocations (``alloc.list``) if told to reset; each
  record costs O(1) whatever the number of nodes (dict lookups by node and
  alloc id);
- runs each allocation placed on its nodes as a simulated task with the
  ``sim`` driver (``client.driver``), fetching the job version's task
  config; reports ``running``, then ``complete``/``failed``; stops a task
  when the server stops its alloc; for each service alloc it reports
  health once the task has run for the group's ``min_healthy_time``
  (unhealthy if it fails first, or once ``healthy_deadline`` passes when its
  task's checks never pass), as Nomad's client does: with the ``update``
  block's times in a deployment, else the ``migrate`` block's (a node
  drain moves the next allocs once these replacements are healthy);
- batches status changes into ``alloc.update`` calls (every
  ``report_interval``, at most ``REPORT_BATCH`` allocs per call);
- keeps each alloc's directory under the node's data dir, and its terminal
  allocs until its GC (``client.collector``, Nomad's client GC) evicts
  them: on ``gc_interval``, when an alloc ends, before a placement that
  would exceed ``gc_max_allocs``, when the servers' GC deletes one, and when
  ``caravan client gc`` asks (a ``ClientGC`` record on the stream); each node
  re-registers now and then with ``client.gc.*`` attributes that say what it
  holds (``caravan node status`` shows them).

Killing the process is a client crash: its nodes miss their heartbeats, the
leader marks them down and their allocs lost, and replaces them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from client.collector import Collector, NodeDisk
from client.driver import DriverError, Outcome, plan_run, task_spec
from client.fleet import (
    Fleet,
    SimConfig,
    SimError,
    SimNode,
    for_each,
    load_nodes,
    place,
    save_nodes,
)
from client.silence import POLL_INTERVAL, Silence
from fsm.topics import TOPIC_ALLOC, TOPIC_CLIENT_GC
from node.wire.errors import NOT_FOUND, RESET_REQUIRED, UNAVAILABLE, RPCError
from node.wire.rpc_client import AsyncRPCClient

REPORT_BATCH = 200
LIST_CONCURRENCY = 16  # alloc.list calls in flight while reloading after a reset
# Nomad's update defaults (seconds), for service groups without an update block.
UPDATE_DEFAULTS = {"MinHealthyTime": 10.0, "HealthyDeadline": 300.0}
RPC_TIMEOUT = 15.0
STREAM_HEARTBEAT = 5.0
TERMINAL = ("complete", "failed", "lost")
SERVER_TERMINAL = ("stop", "evict")


@dataclass
class Run:
    alloc_id: str
    node_id: str
    job_id: str
    job_version: int
    deployment_id: str
    task_group: str
    task: asyncio.Task[Any] | None = None
    started: float = 0.0
    healthy_reported: str | None = None  # deployment id ("" for none) whose health was reported
    joined: float = 0.0  # when an in-place update moved it into its deployment (monotonic)
    moved: asyncio.Event = field(default_factory=asyncio.Event)  # set on such a move
    finished: bool = False
    quiet_stop: bool = False  # stopped without a report: marked lost, or resumed by the next run
    status: str = ""  # the terminal client status it reported
    shutdown: bool = False  # stopped because this client is shutting down


@dataclass
class SimStats:
    started: int = 0
    completed: int = 0
    failed: int = 0
    stopped: int = 0
    reports: int = 0
    report_calls: int = 0
    resets: int = 0
    stream_breaks: int = 0
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=100))  # the latest


class SimClient:
    def __init__(self, cfg: SimConfig) -> None:
        if cfg.nodes < 1:
            raise SimError("--nodes must be at least 1")
        if not cfg.servers:
            raise SimError("--servers needs at least one server RPC address")
        self.cfg = cfg
        if cfg.racks and not cfg.clusters:
            cfg.clusters = 1  # racks are numbered inside a cluster
        self.restored = load_nodes(cfg.state_file)[: cfg.nodes] if cfg.state_file else []
        prefix = cfg.name_prefix or f"sim-{uuid.uuid4().hex[:6]}"
        # One node secret for this client's nodes (see SimNode); restored nodes keep theirs.
        self.secret = next((n.secret for n in self.restored if n.secret), "") or str(uuid.uuid4())
        fresh = (SimNode(str(uuid.uuid4()), f"{prefix}-{i}") for i in range(len(self.restored), cfg.nodes))
        nodes = [*self.restored, *fresh]
        for node in nodes:
            node.secret = node.secret or self.secret
        place(nodes, cfg.clusters, cfg.racks)
        self.nodes = {n.id: n for n in nodes}
        if cfg.state_file:
            save_nodes(cfg.state_file, nodes)
        # Nodes the fault harness cut off (client.silence); read before registering, so a
        # restart during the cut does not bring them back.
        self.silence = Silence.from_env()
        self.silence.poll()
        self.silence.acknowledge()
        self.fleet = Fleet(cfg, AsyncRPCClient(cfg.servers, token=self.secret, timeout=RPC_TIMEOUT), self.nodes,
                           error=self._error, say=self.say, silence=self.silence)
        self._beating: asyncio.Task[None] | None = None
        self.rng = random.Random(cfg.seed)
        self.runs: dict[str, Run] = {}
        self.done: set[str] = set()  # allocs this client ran to an end (late records are ignored)
        self.pending: dict[str, dict[str, Any]] = {}  # alloc id -> update to report
        self.pending_node: dict[str, str] = {}  # alloc id -> its node, for each pending update
        self.jobs: dict[tuple[str, int], dict[str, Any]] = {}
        self.stats = SimStats()
        self.index = 0
        self.stop_event = asyncio.Event()
        self.temp_dir = "" if cfg.data_dir else tempfile.mkdtemp(prefix="caravan-client-")
        self.data_dir = cfg.data_dir or self.temp_dir
        os.makedirs(self.data_dir, exist_ok=True)
        self.collector = Collector(self.data_dir, cfg.gc, NodeDisk(cfg.disk_mb << 20, cfg.inodes),
                                   log=self._log, warn=self._warn)

    @property
    def rpc(self) -> AsyncRPCClient:
        """The one connection pool of this client (its fleet's: registration and heartbeats use it too)."""
        return self.fleet.rpc

    @rpc.setter
    def rpc(self, rpc: AsyncRPCClient) -> None:
        self.fleet.rpc = rpc

    # -- lifecycle ----------------------------------------------------------------
    def _heartbeats(self) -> asyncio.Task[None]:
        """The heartbeat loop, started once: before registration ends, since chunks beat as they are registered."""
        if self._beating is None:
            self._beating = asyncio.create_task(self.fleet.heartbeats(), name="heartbeats")
        return self._beating

    async def register(self) -> None:
        """Register every node, heartbeating each chunk as soon as it is in (see ``client.fleet``)."""
        self._heartbeats()
        await self.fleet.register_all()
        self.index = max(self.index, self.fleet.index)

    async def run(self) -> None:
        if not self.fleet.stats.registered:
            await self.register()
        tasks = [
            self._heartbeats(),
            asyncio.create_task(self._follow(), name="following allocations"),
            asyncio.create_task(self._reporter(), name="status reports"),
            asyncio.create_task(self.collector.ticker(), name="alloc gc"),
        ]
        if self.cfg.gc_report_interval > 0:
            tasks.append(asyncio.create_task(self._gc_reports(), name="gc reports"))
        if self.cfg.status_interval > 0:
            tasks.append(asyncio.create_task(self._status_lines(), name="status lines"))
        if self.silence.path:
            tasks.append(asyncio.create_task(self._watch_silence(), name="silence control"))
        stop = asyncio.create_task(self.stop_event.wait())
        crashed: asyncio.Task[Any] | None = None
        try:
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            # The loops retry RPC errors forever; one that ended had a bug. Stop
            # loudly rather than keep heartbeating nodes whose allocs nobody runs.
            crashed = next((t for t in tasks if t in done), None)
        finally:
            stop.cancel()
            for t in tasks:
                t.cancel()
            for run in list(self.runs.values()):
                # With a state file the nodes come back: their allocs keep
                # running, as a Nomad client's tasks outlive a client restart.
                # Without one the nodes are gone, so their allocs end now.
                run.quiet_stop = bool(self.cfg.state_file)
                run.shutdown = True
                if run.task is not None:
                    run.task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._flush(), 2.0)
            await self.rpc.close()
            self.remove_temp_dir()
        if crashed is not None:
            exc = None if crashed.cancelled() else crashed.exception()
            if exc is not None:  # a bug: its traceback belongs in the client's log
                traceback.print_exception(exc, file=sys.stderr)
            raise SimError(f"the client's {crashed.get_name()} loop stopped: {exc!r}")

    def remove_temp_dir(self) -> None:
        """A data dir of our own making goes with us (as ``nomad agent -dev``'s); a given one stays."""
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def say(self, message: str) -> None:
        if self.cfg.verbose:
            print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)

    def _log(self, message: str) -> None:
        """A line always printed: every GC eviction and request is worth a line in the client's log."""
        print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)

    def _warn(self, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)

    async def _status_lines(self) -> None:
        """A line now and then: at 10,000 nodes, per-node lines say nothing, one summary does."""
        while True:
            await asyncio.sleep(self.cfg.status_interval)
            print(f"{time.strftime('%H:%M:%S')} status: {self.fleet.status()} allocs_running={len(self.runs)}", flush=True)

    def _error(self, what: str, message: str) -> None:
        """Remember an error the client will retry past, and print it when it is new.

        A client that retried in silence would hide a broken cluster from
        whoever reads its log.
        """
        line = f"{what}: {message}"
        if not self.stats.errors or self.stats.errors[-1] != line:
            print(f"{time.strftime('%H:%M:%S')} {line}; retrying", file=sys.stderr, flush=True)
        self.stats.errors.append(line)

    async def _watch_silence(self) -> None:
        """Apply the harness's changes to the silenced nodes (``client.silence``), and acknowledge each.

        Heartbeats, reports and the journal's records follow the set at once;
        nodes brought back then reload their allocs, since the records about
        them while they were cut off were ignored.
        """
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            change = self.silence.poll()
            if change is None:
                continue
            silenced, restored = change
            self.silence.acknowledge()
            print(f"{time.strftime('%H:%M:%S')} silence: {len(silenced)} node(s) cut off, {len(restored)} back, "
                  f"{len(self.silence.ids)} silenced (generation {self.silence.generation})", flush=True)
            backoff = 0.05
            while restored:
                try:
                    await self._load_allocs(restored)
                    break
                except RPCError as exc:
                    self._error("reloading the allocations of nodes brought back", exc.message)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)

    # -- following allocations -----------------------------------------------------
    async def _follow(self) -> None:
        backoff = 0.05
        # A restarted client first picks up the allocs the servers still place
        # on its nodes (Nomad's client restores them from its state).
        reload = bool(self.restored)
        while True:
            if reload:
                try:
                    await self._load_allocs()
                    reload = False
                except RPCError as exc:
                    self._error("reading this client's allocations", exc.message)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
            args = {"index": self.index, "topics": [TOPIC_ALLOC, TOPIC_CLIENT_GC], "heartbeat": STREAM_HEARTBEAT}
            try:
                async for item in self.rpc.stream("event.stream", args, idle_timeout=3 * STREAM_HEARTBEAT + 10):
                    backoff = 0.05
                    if "index" in item:
                        self.index = max(self.index, item["index"])
                        for record in item.get("events") or []:
                            self.on_record(record)
                    elif "progress" in item:
                        self.index = max(self.index, item["progress"])
            except RPCError as exc:
                if exc.code == RESET_REQUIRED:
                    # The journal moved past us: reload our nodes' allocs. A
                    # failed reload is retried (it once ended this loop).
                    self.stats.resets += 1
                    reload = True
                    continue
                self.stats.stream_breaks += 1
                if exc.code != UNAVAILABLE:
                    self._error("event stream", exc.message)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def _load_allocs(self, only: Iterable[str] | None = None) -> None:
        """Run what the servers place on our nodes (or ``only`` these), stop what they no longer do.

        One ``alloc.list`` per node, a bounded number in flight; the answers
        are applied in node order once all are in, so a failure changes nothing.
        Silenced nodes are left out: they hear nothing until they are back.
        """
        answers: dict[str, dict[str, Any]] = {}
        nodes = {n for n in (self.nodes if only is None else only) if n in self.nodes and n not in self.silence}

        async def one(node_id: str) -> None:
            # Every page (a list answers a bounded page and a next_token), kept as one answer.
            args: dict[str, Any] = {"node_id": node_id}
            out = await self.rpc.call("alloc.list", args)
            data = list(out.get("data") or [])
            while out.get("next_token"):
                out = await self.rpc.call("alloc.list", {**args, "next_token": out["next_token"]})
                data += out.get("data") or []
            answers[node_id] = {**out, "data": data}

        await for_each(sorted(nodes), LIST_CONCURRENCY, one)
        seen: set[str] = set()
        for node_id in sorted(answers):
            out = answers[node_id]
            for alloc in out.get("data") or []:
                seen.add(alloc["ID"])
                self.on_alloc(_snake_alloc(alloc))
        for run in [r for r in self.runs.values() if r.node_id in nodes and r.alloc_id not in seen]:
            self.collector.server_deleted(run.alloc_id)
            self._stop(run, quiet=True)
        for node_id in nodes:  # kept allocs the servers no longer have were deleted by their GC
            for alloc_id in [a for a in self.collector.node(node_id).held if a not in seen]:
                self.collector.server_deleted(alloc_id)
        if answers:
            # Follow on from the OLDEST state a list was read at: the lists may come from
            # servers at different indexes, and an alloc placed between the two would be in
            # neither a lagging server's list nor a stream begun past it (it would stay
            # pending for good). Records already seen are replayed harmlessly.
            self.index = min(_read_at(out) for out in answers.values())

    def on_record(self, record: list[Any]) -> None:
        topic, _type, key, obj = record
        if topic == TOPIC_CLIENT_GC:
            self.on_gc_request(obj or {})
            return
        if topic != TOPIC_ALLOC:
            return
        if obj is None:  # garbage-collected by the servers: so goes its directory (Nomad's removeAlloc)
            self.done.discard(key)
            if self.collector.where.get(key) in self.silence:  # cut off: it hears of it when back
                return
            self.collector.server_deleted(key)
            run = self.runs.get(key)
            if run is not None:
                self._stop(run, quiet=True)
            return
        self.on_alloc(obj)

    def on_gc_request(self, request: dict[str, Any]) -> None:
        """A forced client GC (``caravan client gc``): for one of our nodes, or for every node ("")."""
        node_id, alloc_id = request.get("node_id", ""), request.get("alloc_id", "")
        if node_id:
            targets = [node_id] if node_id in self.nodes and node_id not in self.silence else []
        else:
            targets = [n for n, st in self.collector.nodes.items() if st.held and n not in self.silence]
        for target in targets:
            what = f"alloc {alloc_id}" if alloc_id else "every terminal alloc"
            self._log(f"gc: node {target}: forced collection of {what} requested (index {request.get('index', 0)})")
            self.collector.spawn(self.collector.force(target, alloc_id))

    def on_alloc(self, alloc: dict[str, Any]) -> None:
        """React to an allocation (wire shape) placed on, or changed on, one of our nodes."""
        if alloc.get("node_id") not in self.nodes or alloc.get("node_id") in self.silence:
            return  # not ours, or cut off: a silenced node hears of it when it is back
        alloc_id = alloc["id"]
        run = self.runs.get(alloc_id)
        server_terminal = alloc.get("desired_status") in SERVER_TERMINAL
        client_status = alloc.get("client_status")
        if run is None:
            if client_status in TERMINAL or alloc_id in self.done:
                return
            if server_terminal:
                # Stopped before it ran here, or while this client was down:
                # acknowledge the stop so the servers do not wait on it.
                self.done.add(alloc_id)
                self._merge(alloc_id, {"ClientStatus": "complete", "ClientDescription": "alloc stopped by the server"},
                            alloc["node_id"])
                return
            run = Run(
                alloc_id,
                alloc["node_id"],
                alloc["job_id"],
                int(alloc.get("job_version", 0)),
                alloc.get("deployment_id") or "",
                alloc.get("task_group") or "",
            )
            self.runs[alloc_id] = run
            self.collector.started(run.node_id, alloc_id)
            run.task = asyncio.create_task(self._run(run), name=f"alloc-{alloc_id[:8]}")
            self.stats.started += 1
            return
        if client_status == "lost" or (server_terminal and client_status in TERMINAL):
            self._stop(run, quiet=True)
        elif server_terminal:
            self._stop(run, quiet=False)
        else:
            run.job_version = int(alloc.get("job_version", run.job_version))
            deployment_id = alloc.get("deployment_id") or ""
            if deployment_id != run.deployment_id:
                # Updated in place into a new rollout: its health is judged
                # anew, from now (Nomad's client restarts its health watcher).
                run.deployment_id = deployment_id
                run.joined = time.monotonic()
                run.moved.set()

    def _stop(self, run: Run, *, quiet: bool) -> None:
        if run.finished:
            return
        run.quiet_stop = quiet
        if run.task is not None:
            run.task.cancel()

    # -- running an allocation -------------------------------------------------------
    async def job_spec(self, job_id: str, version: int) -> dict[str, Any]:
        found = self.jobs.get((job_id, version))
        if found is not None:
            return found
        for stale in (True, False):
            try:
                job = (await self.rpc.call("job.get", {"job_id": job_id, "stale": stale}))["data"]
            except RPCError as exc:
                if exc.code == NOT_FOUND and stale:
                    continue  # a lagging server: ask the leader
                raise
            self.jobs[(job_id, int(job.get("Version", 0)))] = job
            if int(job.get("Version", 0)) == version:
                return job
            if int(job.get("Version", 0)) > version:
                break
        versions = (await self.rpc.call("job.versions", {"job_id": job_id}))["data"]["Versions"]
        for job in versions:
            self.jobs[(job_id, int(job.get("Version", 0)))] = job
        found = self.jobs.get((job_id, version))
        if found is None:
            raise DriverError(f"job {job_id} version {version} is no longer known to the servers")
        return found

    async def _run(self, run: Run) -> None:
        now_ns = time.time_ns()
        run.started = time.monotonic()
        outcome: Outcome | None = None
        names: list[str] = []
        try:
            await self.collector.make_room(run.node_id)  # before it starts: within gc_max_allocs
            try:
                job = await self.job_spec(run.job_id, run.job_version)
                group = next((g for g in job.get("TaskGroups") or [] if g.get("Name") == run.task_group), None)
                if group is None:
                    raise DriverError(f"job {run.job_id} has no task group {run.task_group!r}")
                tasks = [task_spec(t) for t in group.get("Tasks") or []]
                outcome = plan_run(tasks, self.rng)
                await self._build(run, tasks)
            except (DriverError, RPCError) as exc:
                self._report(run, "failed", str(exc), {}, failed=True)
                self.stats.failed += 1
                run.finished = True
                return
            names = [t.name for t in tasks]
            self._report(run, "running", "", {n: {"State": "running", "StartedAt": now_ns} for n in names})
            self.say(f"alloc {run.alloc_id[:8]} running on {self.nodes[run.node_id].name}")
            health = asyncio.create_task(self._health(run, job, group, outcome.healthy))
            try:
                if outcome.after is None:
                    await asyncio.Event().wait()  # until stopped
                await asyncio.sleep(outcome.after)
            finally:
                health.cancel()
            end_ns = time.time_ns()
            states = {n: {"State": "dead", "Failed": outcome.failed, "StartedAt": now_ns, "FinishedAt": end_ns} for n in names}
            status = "failed" if outcome.failed else "complete"
            self._report(run, status, outcome.description, states, failed=outcome.failed)
            if outcome.failed:
                self.stats.failed += 1
            else:
                self.stats.completed += 1
            run.finished = True
            self.say(f"alloc {run.alloc_id[:8]} {status}")
        except asyncio.CancelledError:
            if not run.finished and not run.quiet_stop:
                end_ns = time.time_ns()
                states = {n: {"State": "dead", "StartedAt": now_ns, "FinishedAt": end_ns} for n in names} if outcome else {}
                why = "client shut down" if run.shutdown else "alloc stopped by the server"
                self._report(run, "complete", why, states)
                self.stats.stopped += 1
            run.finished = True
        finally:
            self.done.add(run.alloc_id)
            self.runs.pop(run.alloc_id, None)
            if run.shutdown:
                self.collector.forget(run.node_id, run.alloc_id)
            else:  # terminal: kept for inspection until the GC evicts it
                status = run.status if run.status in TERMINAL else "lost" if run.quiet_stop else "complete"
                self.collector.finished(run.node_id, run.alloc_id, status)

    async def _build(self, run: Run, tasks: list[Any]) -> None:
        """The alloc's directory, with what its tasks write; a disk error fails the alloc, as a driver's would."""
        try:
            await self.collector.build(run.node_id, run.alloc_id, tasks)
        except OSError as exc:
            raise DriverError(f"alloc directory: {exc.strerror or exc}") from None

    async def _health(self, run: Run, job: dict[str, Any], group: dict[str, Any], healthy: bool) -> None:
        """Report a service alloc's health: for its deployment, or (outside one) for a drain's steps.

        Healthy once it ran ``min_healthy_time``; unhealthy when its checks
        never pass and ``healthy_deadline`` has gone by, as Nomad's client
        judges it, with the update block's times in a deployment and the
        migrate block's outside one. Again after an in-place update moves it into a new
        deployment, with that version's times.
        """
        while True:
            if job.get("Type") != "service":
                return
            block = "Update" if run.deployment_id else "Migrate"
            wait = _health_time(group, block, "MinHealthyTime" if healthy else "HealthyDeadline")
            while (left := wait - (time.monotonic() - max(run.started, run.joined))) > 0:
                await asyncio.sleep(left)
            if run.healthy_reported != run.deployment_id:
                run.healthy_reported = run.deployment_id
                self._merge(run.alloc_id, {"DeploymentStatus": {"Healthy": healthy, "Timestamp": time.time_ns()}}, run.node_id)
            run.moved.clear()
            await run.moved.wait()
            try:
                job = await self.job_spec(run.job_id, run.job_version)
            except (DriverError, RPCError):
                return  # the version is gone: the server is stopping this alloc anyway
            group = next((g for g in job.get("TaskGroups") or [] if g.get("Name") == run.task_group), {})

    # -- reporting ------------------------------------------------------------------------
    def _report(self, run: Run, status: str, description: str, states: dict[str, Any], *, failed: bool = False) -> None:
        run.status = status
        update: dict[str, Any] = {"ClientStatus": status, "ClientDescription": description}
        if states:
            update["TaskStates"] = states
        if failed and run.deployment_id and run.healthy_reported != run.deployment_id:
            run.healthy_reported = run.deployment_id
            update["DeploymentStatus"] = {"Healthy": False, "Timestamp": time.time_ns()}
        self._merge(run.alloc_id, update, run.node_id)

    def _merge(self, alloc_id: str, update: dict[str, Any], node_id: str) -> None:
        self.pending_node[alloc_id] = node_id
        old = self.pending.get(alloc_id)
        self.pending[alloc_id] = {**(old or {}), **update, "ID": alloc_id}
        if "ClientStatus" not in self.pending[alloc_id]:
            self.pending[alloc_id]["ClientStatus"] = "running"

    async def _gc_reports(self) -> None:
        """Re-register the nodes whose kept allocs changed, with ``client.gc.*`` attributes saying what they hold.

        At most one registration per node per ``gc_report_interval``: the
        servers store it (a raft write), so ``node status`` shows it from any
        server. Silenced nodes wait until they are back.
        """
        while True:
            await asyncio.sleep(self.cfg.gc_report_interval)
            due = [n for n in self.collector.dirty if n in self.nodes and n not in self.silence]
            if not due:
                continue
            self.collector.dirty.difference_update(due)
            for node_id in due:
                self.nodes[node_id].extra = self.collector.attributes(node_id)
            try:
                await self.fleet.register([self.nodes[n] for n in due])
            except RPCError as exc:
                self.collector.dirty.update(due)
                self._error("reporting what the nodes hold", exc.message)

    async def _reporter(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.report_interval)
            await self._flush()

    async def _flush(self) -> None:
        """Report pending status changes, in batches; those of silenced nodes wait until they are back."""
        while self.pending:
            if self.silence.ids:
                ids = [i for i in self.pending if self.pending_node.get(i) not in self.silence][:REPORT_BATCH]
            else:
                ids = list(self.pending)[:REPORT_BATCH]
            if not ids:
                return
            batch = [self.pending.pop(i) for i in ids]
            nodes = {i: self.pending_node.pop(i, "") for i in ids}
            try:
                await self.rpc.call("alloc.update", {"allocs": batch})
                self.stats.reports += len(batch)
                self.stats.report_calls += 1
            except RPCError as exc:
                self._error("alloc.update", exc.message)
                for item in batch:  # put back unless something newer came meanwhile
                    self.pending.setdefault(item["ID"], item)
                    self.pending_node.setdefault(item["ID"], nodes[item["ID"]])
                return


def _read_at(answer: dict[str, Any]) -> int:
    """The index of the state a list answer was read at (its server's applied index)."""
    return int(answer.get("applied_index") or answer.get("index") or 0)


def _health_time(group: dict[str, Any], block: str, key: str) -> float:
    """The group's ``block`` (Update or Migrate) duration ``key`` in seconds (Nomad's default without one)."""
    value = (group.get(block) or {}).get(key)
    return UPDATE_DEFAULTS[key] if value is None else float(value) / 1e9


def _snake_alloc(alloc: dict[str, Any]) -> dict[str, Any]:
    """The few fields of a Nomad-JSON alloc that ``on_alloc`` reads, in wire names."""
    return {
        "id": alloc["ID"],
        "node_id": alloc["NodeID"],
        "job_id": alloc["JobID"],
        "job_version": alloc.get("JobVersion", 0),
        "deployment_id": alloc.get("DeploymentID", ""),
        "desired_status": alloc.get("DesiredStatus"),
        "client_status": alloc.get("ClientStatus"),
        "task_group": alloc.get("TaskGroup", ""),
    }


async def _main(cfg: SimConfig) -> int:
    try:
        sim = SimClient(cfg)
    except OSError as exc:
        raise SimError(f"cannot write the client state file {cfg.state_file}: {exc}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sim.stop_event.set)
    try:
        await sim.register()
    except RPCError as exc:
        print(f"Error: could not register nodes: {exc.message}", file=sys.stderr, flush=True)
        await sim.rpc.close()
        sim.remove_temp_dir()
        return 1
    took = sim.fleet.stats.register_seconds
    topology = f", {cfg.clusters} cluster(s) x {cfg.racks} rack(s)" if cfg.clusters else ""
    if cfg.devices:
        topology += ", devices " + ", ".join(f"{name}={count}" for name, count in sorted(cfg.devices.items()))
    print(
        f"Simulating {len(sim.nodes)} node(s) in {cfg.datacenter} ({cfg.cpu} MHz, {cfg.memory_mb} MB each{topology}) "
        f"against {','.join(cfg.servers)}; registered in {took:.1f}s ({len(sim.nodes) / max(took, 1e-9):.0f}/s)",
        flush=True,
    )
    for node in sim.nodes.values():
        print(f"  node {node.id} {node.name}", flush=True)
    await sim.run()
    return 0


def run_sim(cfg: SimConfig) -> int:
    """Entry point of ``caravan client sim``: run until SIGTERM/SIGINT."""
    try:
        return asyncio.run(_main(cfg))
    except SimError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 1
