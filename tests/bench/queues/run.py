"""One run: a fresh 3-server cluster and simulated clients, the workloads generated, observed to the end.

Servers start through ``node.devcluster.up``, the simulated client through
``devcluster.launch`` (recorded as the cluster's client, so ``down`` stops
it), each in a session of its own; the run's clean-up (``down``) stops them by pid. The nodes
have far more cpu and memory than the queues' 600 units, so node capacity
never binds and the figures measure admission, as Kueue's do (its runner
marks workloads finished without any kube-scheduler or nodes).

The workloads' records are followed on ``event.stream`` (topic Workload;
Job for the no-queue baseline) from a follower, so the observer costs the
leader nothing but the stream; every time used comes from the records (the
entries' times), not from when the observer saw them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node import devcluster as cl
from node.wire.events import follow
from node.wire.rpc_client import AsyncRPCClient, RPCClient
from tests.bench.queues import plan as pl
from tests.bench.queues.metrics import Figures, Tracks, figures

SIM_NODES = 10
SIM_CPU = 200_000  # MHz a node: 2,000 units over the nodes, against 600 of quota
SIM_MEMORY = 200_000  # MB a node


@dataclass
class Options:
    scale: float = 1.0
    fsync: bool = False
    timeout: float = 900.0  # seconds after generation starts (Kueue's runner: 10 min of recording)
    keep: bool = False
    progress: float = 10.0  # seconds between progress lines on stderr; 0: none
    breakdown: bool = False  # also follow the allocations (where the time after admission goes)
    extra_config: str = ""  # more server settings (TOML, top level)
    stall: float = 60.0  # fail once nothing has finished for this long (seconds)


@dataclass
class RunResult:
    queued: bool
    figures: Figures
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> cpu seconds during the run
    stats: dict[str, Any] = field(default_factory=dict)  # scheduler.stats at the end
    directory: str = ""


class Observer:
    """Follows the workloads' records on a follower's event stream, in a thread."""

    def __init__(self, addresses: list[str], index: int, queued: bool, total: int,
                 allocs: bool = False) -> None:  # fmt: skip
        self.tracks = Tracks()
        self.total = total
        self.queued = queued
        self.allocs = allocs
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.stop = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(addresses, index), daemon=True)
        self.thread.start()

    def _run(self, addresses: list[str], index: int) -> None:
        topic = "Workload" if self.queued else "Job"
        topics = [topic, "Allocation", "Evaluation"] if self.allocs else [topic]
        try:
            for item in follow(addresses, index=index, topics=topics, heartbeat=1.0):
                if self.stop:
                    return
                events = item.get("events") or []
                with self.lock:
                    for rec_topic, _type, key, obj in events:
                        if rec_topic == "Allocation":
                            self.tracks.alloc(obj)
                        elif rec_topic == "Evaluation":
                            self.tracks.eval(obj)
                        elif rec_topic != topic:
                            continue
                        elif self.queued:
                            self.tracks.workload(key, obj)
                        else:
                            self.tracks.job(key, obj)
                    if self.tracks.finished >= self.total:
                        self.done.set()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self.error = exc
            self.done.set()

    def counts(self) -> tuple[int, int, int]:
        with self.lock:
            t = self.tracks
            return len(t.jobs), t.admitted_now, t.finished


def cpu_seconds(pid: int) -> float:
    """User + system cpu time of a process so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _wait_nodes(client: RPCClient, nodes: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [n for n in client.list_all("node.list", {}) if n["Status"] == "ready"]
        if len(ready) >= nodes:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{nodes} simulated nodes did not register within {timeout:g}s")


def run(plan: pl.Plan, opts: Options, *, queued: bool) -> RunResult:
    """One run on a fresh cluster; its figures."""
    directory = tempfile.mkdtemp(prefix=f"caravan-queues-{'queued' if queued else 'noqueue'}-")
    extra = f"fsync = {'true' if opts.fsync else 'false'}\n" + opts.extra_config
    cluster: cl.Cluster | None = None
    failed = True
    try:
        try:
            cluster = cl.up(directory, 3, extra_config=extra, timeout=60)
        except BaseException:
            with contextlib.suppress(cl.ClusterError, OSError, ValueError):
                cluster = cl.Cluster.load(directory)  # what it started, for the clean-up to stop
            raise
        addresses = cluster.rpc_addresses
        sim = cl.launch(["client", "sim", "--nodes", str(SIM_NODES), "--cpu", str(SIM_CPU),
                         "--memory", str(SIM_MEMORY), "--name-prefix", "kq", "--servers", ",".join(addresses)],
                        Path(directory) / "sim.log")  # fmt: skip
        cluster.client_pid = sim.pid
        cluster.save()
        with RPCClient(addresses, timeout=60) as client:
            _wait_nodes(client, SIM_NODES)
            leader = cl.wait_for_leader(addresses)["Leader"]
            followers = [a for a in addresses if a != leader]
            index = client.call("node.list", {})["applied_index"]
            observer = Observer(followers + [leader], index, queued, plan.workloads, opts.breakdown)
            pids = {n.id: n.pid for n in cluster.nodes} | {"sim": sim.pid, "bench": os.getpid()}
            names = {n.rpc_addr: n.id for n in cluster.nodes}
            cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
            submitted: dict[str, float] = {}
            t0 = time.time()
            if queued:
                for cls in plan.classes():
                    client.call("priority_class.upsert", {"priority_class": pl.priority_class(cls)})
                for name, cohort in plan.queues():
                    client.call("queue.upsert", {"queue": pl.queue_def(name, cohort)})
            errors: list[BaseException] = []
            gen = threading.Thread(target=_generate, args=(plan, [leader, *followers], queued, submitted, errors),
                                   daemon=True)  # fmt: skip
            gen.start()
            try:
                _wait_done(observer, errors, t0 + opts.timeout, opts.progress, t0, opts.stall)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}{_admission_warnings(cluster)}") from exc
            gen.join(timeout=5)
            observer.stop = True
            cpu = {(k if k in ("sim", "bench") else f"{k}{' (leader)' if names.get(leader) == k else ''}"):
                   cpu_seconds(p) - cpu0[k] for k, p in pids.items()}  # fmt: skip
            stats = client.call("scheduler.stats", {})
        with observer.lock:
            figs = figures(plan, observer.tracks, t0, submitted, queued=queued)
        failed = False
        return RunResult(queued, figs, cpu, stats, directory)
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cl.down(cluster)
        if failed:
            print(f"the run failed; the servers' logs are in {directory}", file=sys.stderr)
        elif not opts.keep:
            shutil.rmtree(directory, ignore_errors=True)


def _generate(plan: pl.Plan, addresses: list[str], queued: bool, submitted: dict[str, float],
              errors: list[BaseException]) -> None:  # fmt: skip
    async def main() -> None:
        client = AsyncRPCClient(addresses, timeout=120)
        try:
            await pl.generate(plan, lambda spec: client.call("job.register", {"job": spec}),
                              queued=queued, submitted=submitted)  # fmt: skip
        finally:
            await client.close()

    try:
        asyncio.run(main())
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
        errors.append(exc)


def _admission_warnings(cluster: cl.Cluster) -> str:
    """The servers' last word on failed admission passes, if any (why a run stalled)."""
    for node in cluster.nodes:
        try:
            lines = Path(node.log_file).read_text(errors="replace").splitlines()
        except OSError:
            continue
        failed = [line for line in lines if "queue admission failed" in line]
        if failed:
            return (
                f"; {node.id} logged {len(failed)} failed admission passes, the last: {failed[-1]}"
            )
    return ""


def _wait_done(observer: Observer, errors: list[BaseException], deadline: float, every: float,
               t0: float, stall: float) -> None:  # fmt: skip
    next_line = time.time() + every
    last_finished, moved_at = -1, time.time()
    while not observer.done.wait(0.5):
        if errors:
            raise RuntimeError(f"registering the workloads failed: {errors[0]}") from errors[0]
        now = time.time()
        finished = observer.counts()[2]
        if finished != last_finished:
            last_finished, moved_at = finished, now
        elif stall and now - moved_at > stall:
            raise RuntimeError(f"stalled: no workload finished for {stall:g}s "
                               f"({finished}/{observer.total} finished)")  # fmt: skip
        if now > deadline:
            seen, admitted, finished = observer.counts()
            raise RuntimeError(f"not finished by the deadline: {finished}/{observer.total} finished "
                               f"({seen} seen, {admitted} admitted)")  # fmt: skip
        if every and now >= next_line:
            seen, admitted, finished = observer.counts()
            print(f"  {now - t0:6.1f}s  registered {seen:>6}  admitted now {admitted:>4}  "
                  f"finished {finished:>6}/{observer.total}", file=sys.stderr, flush=True)  # fmt: skip
            next_line = now + every
    if observer.error is not None:
        raise RuntimeError(f"the event stream failed: {observer.error}") from observer.error
