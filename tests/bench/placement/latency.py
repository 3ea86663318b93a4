"""Part 2: per-placement latency and sustained placements/s at 1,000 to 30,000 simulated nodes.

For each size, a fresh 3-server cluster and one ``caravan client sim --nodes N``
process (with ``--clusters``/``--racks`` when it has them), then, in order:

1. the cluster's raw write throughput (pipelined node re-registrations, as
   lifecycle_bench measures it) — the baseline of the ratios;
2. **latency**, closed loop: one request at a time (register, wait for its
   eval's plan to commit, next), so no request waits behind another; the
   leader's ``scheduler.stats`` is reset before and read after;
3. **throughput**: ``--requests`` requests registered ``--window`` at a time,
   counted until the last eval's plan commits (or ``--phase-seconds`` pass:
   the phase is bounded and says how much finished).

Requests follow Protean's mix: 94% ask for one alloc (else 2-8), and 80% repeat
the previous request's shape (cpu/memory), else take one of the other shapes.
Each request is a batch job whose task runs for an hour (sim driver).

Latency figures, and where each comes from:

- ``dequeue -> committed``: per placement, from the workers' stats if they
  report it; otherwise n/a, and the nearest figures are printed instead:
- ``enqueue -> committed``: the workers' EvalLatencyMs (broker enqueue to plan
  committed). In the closed loop an eval waits behind no other, so this is
  the time of one placement, plus the broker's hand-off;
- ``schedule p50/p99`` and ``commit p50``: the workers' PlanMsP50/PlanMsP99
  (snapshot and schedule) and CommitMsP50 (plan check and commit), per
  attempt (n/a where the workers do not report one);
- ``register -> placed (client side)``: from the ``job.register`` call to the
  eval's completion seen on the leader's event stream; it includes the
  register's own raft write.

Leader CPU per placement: the leader's user + system CPU time (/proc) over
the throughput phase, divided by the placements committed in it. On a shared
2-core machine it moves far less between runs than placements/s, and it says
what one core could sustain (1000 / it per second).

Cache hit rate and nodes re-scored per placement on a hit and on a miss are
read from ``scheduler.stats`` by name (the selector's section; the path each
came from is printed), n/a when it has none.

Memory: the leader's RSS from /proc before the client registers, after, and
at the end; per 10,000 nodes both as the registration's increase and as the
whole process (the latter is dominated by the empty server at 1,000 nodes).
100,000 nodes (in the default sizes) run only when an estimate scaled from
the largest size run before fits in 70% of free memory; otherwise the table
says why not.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from node.wire.rpc_client import AsyncRPCClient, RPCClient
from tests.bench.lifecycle_bench import raw_writes
from tests.bench.placement import anchors
from tests.bench.placement import clusterkit as ck
from tests.bench.placement.table import fmt, ms, pct, ratio, render, verdict

SHAPES = ((100, 64), (250, 256), (500, 512), (1000, 1024), (200, 2048))  # (MHz, MB)
RUN_FOR = "1h"
SIM_PREFIX = "sim"


@dataclass
class Request:
    job_id: str
    count: int
    cpu: int
    memory_mb: int

    def spec(self) -> dict[str, Any]:
        return {
            "ID": self.job_id,
            "Type": "batch",
            "TaskGroups": [{"Name": "g", "Count": self.count, "Tasks": [{
                "Name": "t", "Driver": "sim", "Config": {"run_for": RUN_FOR},
                "Resources": {"CPU": self.cpu, "MemoryMB": self.memory_mb}}]}],
        }


def request_mix(n: int, seed: int, prefix: str) -> list[Request]:
    """Protean's mix: 94% single-alloc, 80% repeat the previous shape."""
    rng = random.Random(seed)
    out: list[Request] = []
    shape = rng.choice(SHAPES)
    for i in range(n):
        if i and rng.random() >= anchors.PROTEAN_REPEAT_SHAPE:
            shape = rng.choice([s for s in SHAPES if s != shape])
        count = 1 if rng.random() < anchors.PROTEAN_SINGLE else rng.randint(2, 8)
        out.append(Request(f"{prefix}-{i}", count, *shape))
    return out


@dataclass
class SizeResult:
    nodes: int
    register_s: float = 0.0
    raw_wps: float = 0.0
    rss_empty: float = float("nan")
    rss_nodes: float = float("nan")
    rss_end: float = float("nan")
    sim_rss: float = float("nan")
    lat_done: int = 0
    lat_asked: int = 0
    lat_client: list[float] = field(default_factory=list)  # seconds, register -> placed
    lat_stats: dict[str, Any] = field(default_factory=dict)
    tp_requests: int = 0
    tp_done: int = 0
    tp_placements: int = 0
    tp_seconds: float = 0.0
    tp_bounded: bool = False
    tp_register_s: float = 0.0  # until the last register call of the throughput phase returned
    tp_leader_cpu: float = float("nan")  # the leader's CPU seconds over the throughput phase
    # ... and everyone else's on this machine: both followers, the client sim, this process
    tp_other_cpu: dict[str, float] = field(default_factory=dict)
    tp_stats: dict[str, Any] = field(default_factory=dict)
    topology: str = ""
    ready_end: int = 0
    error: str = ""

    @property
    def rate(self) -> float:
        return self.tp_placements / self.tp_seconds if self.tp_seconds > 0 else float("nan")

    @property
    def leader_ms_per_placement(self) -> float:
        return self.ms_per_placement(self.tp_leader_cpu)

    def ms_per_placement(self, seconds: float) -> float:
        """``seconds`` of CPU over the throughput phase, in ms per placement committed in it."""
        return 1000 * seconds / self.tp_placements if self.tp_placements else float("nan")

    @property
    def machine_ms_per_placement(self) -> float:
        """CPU per placement of every process of the run (servers, client sim, this benchmark)."""
        return self.leader_ms_per_placement + sum(map(self.ms_per_placement, self.tp_other_cpu.values()))

    @property
    def mib_per_10k(self) -> float:
        return (self.rss_nodes - self.rss_empty) * 10_000 / self.nodes

    @property
    def total_mib_per_10k(self) -> float:
        return self.rss_end * 10_000 / self.nodes


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def closed_loop(addresses: list[str], watch: ck.EvalWatch, reqs: list[Request], seconds: float) -> list[float]:
    """One request at a time: register-to-placed seconds of each that finished within ``seconds``."""
    out = []
    deadline = time.monotonic() + seconds
    with RPCClient(addresses, timeout=60) as client:
        for req in reqs:
            if time.monotonic() >= deadline:
                break
            t = time.perf_counter()
            eval_id = client.call("job.register", {"job": req.spec()})["EvalID"]
            done = watch.wait_one(eval_id, deadline)
            if done is None:
                break
            out.append(done - t)
    return out


async def register_all(addresses: list[str], reqs: list[Request], window: int) -> tuple[float, dict[str, Request]]:
    """Register every request, ``window`` in flight: (start time, eval id -> request)."""
    client = AsyncRPCClient(addresses, timeout=120)
    it = iter(reqs)
    evals: dict[str, Request] = {}

    async def worker() -> None:
        for req in it:
            out = await client.call("job.register", {"job": req.spec()})
            evals[out["EvalID"]] = req

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(window)))
    finally:
        await client.close()
    return t0, evals


def run_size(nodes: int, a: Any) -> SizeResult:
    res = SizeResult(nodes, topology=ck.topology_note(nodes))
    with ck.LocalCluster(f"latency-{nodes}", fsync=a.fsync, workers=a.workers, keep=a.keep) as lc:
        step = lc.step
        _leader, pid = lc.leader()
        res.rss_empty = ck.rss_mib(pid)
        step(f"{nodes:,} nodes: starting the simulated client ({res.topology})")
        sim = lc.start_sim(nodes, SIM_PREFIX)
        with RPCClient(lc.addresses, timeout=60) as client:
            step(f"{nodes:,} nodes: waiting for them to register")
            res.register_s = ck.wait_nodes(client, nodes, timeout=60 + nodes / 200, sim=sim)
            time.sleep(2)  # the first heartbeats
            address, pid = lc.leader()
            res.rss_nodes = ck.rss_mib(pid)
            res.sim_rss = ck.rss_mib(sim.pid)
            step(f"{nodes:,} nodes: raw write throughput ({a.raw:,} writes)")
            res.raw_wps = asyncio.run(raw_writes(lc.addresses, a.raw, 64))
            watch = ck.EvalWatch(address, ck.applied_index(address))
            try:
                reqs = request_mix(a.latency_requests + a.requests, a.seed, f"req{nodes}")
                lat_reqs, tp_reqs = reqs[: a.latency_requests], reqs[a.latency_requests:]

                step(f"{nodes:,} nodes: latency, closed loop ({len(lat_reqs):,} requests, at most {a.phase_seconds:g}s)")
                client.call("scheduler.stats", {"reset": True})
                res.lat_asked = len(lat_reqs)
                res.lat_client = closed_loop(lc.addresses, watch, lat_reqs, a.phase_seconds)
                res.lat_done = len(res.lat_client)
                res.lat_stats = client.call("scheduler.stats", {"reset": True})

                step(f"{nodes:,} nodes: throughput ({len(tp_reqs):,} requests, window {a.window}, at most {a.phase_seconds:g}s)")
                res.tp_requests = len(tp_reqs)
                deadline = time.monotonic() + a.phase_seconds
                cpu0 = ck.cpu_seconds(pid)
                others = {"followers": [n.pid for n in lc.cluster.nodes if n.pid != pid], "client sim": [sim.pid]}
                others0 = {k: sum(map(ck.cpu_seconds, pids)) for k, pids in others.items()}
                bench0 = time.process_time()
                t0, evals = asyncio.run(register_all(lc.addresses, tp_reqs, a.window))
                res.tp_register_s = time.perf_counter() - t0
                for eval_id in evals:
                    if watch.wait_one(eval_id, deadline) is None:
                        res.tp_bounded = True
                        break
                res.tp_leader_cpu = ck.cpu_seconds(pid) - cpu0
                res.tp_other_cpu = {k: sum(map(ck.cpu_seconds, pids)) - others0[k] for k, pids in others.items()}
                res.tp_other_cpu["this benchmark"] = time.process_time() - bench0
                res.tp_stats = client.call("scheduler.stats", {})
                finished = [e for e in evals if e in watch.done]
                res.tp_done = len(finished)
                # Placements the workers committed in this phase (the stats were reset before it).
                res.tp_placements = int(res.tp_stats["Workers"]["Placements"])
                if res.tp_bounded:
                    res.tp_seconds = time.perf_counter() - t0
                else:
                    res.tp_seconds = max(watch.done[e][0] for e in finished) - t0
            finally:
                watch.stop = True
            res.rss_end = ck.rss_mib(pid)
            res.ready_end = ck.ready_nodes(lc.http_address(address), SIM_PREFIX)
            res.sim_rss = max(res.sim_rss, ck.rss_mib(sim.pid))
    return res


def mem_100k(results: list[SizeResult], asked: bool) -> str:
    """Whether 100,000 nodes fit in memory here, from the slope measured at the largest size."""
    done = [r for r in results if not r.error and r.rss_nodes == r.rss_nodes]
    avail = ck.mem_available_mib()
    if not done:
        return "100,000 nodes: not attempted (no smaller size finished to estimate its memory from)"
    big = max(done, key=lambda r: r.nodes)
    per_node = max(0.0, (big.rss_end - big.rss_empty) / big.nodes)  # leader, MiB per node (with its allocs)
    sim_per_node = big.sim_rss / big.nodes if big.sim_rss == big.sim_rss else 0.0
    need = 3 * (big.rss_empty + per_node * 100_000) + sim_per_node * 100_000
    fits = need < 0.7 * avail
    head = f"100,000 nodes: memory estimate {need / 1024:.1f} GiB (3 servers + client, scaled from {big.nodes:,} nodes) vs {avail / 1024:.1f} GiB available"
    if not fits:
        return head + ": not attempted, it would not fit in 70% of what is free"
    if asked:
        return head + ": attempted above"
    return head + ": it would fit; not asked for (--sizes ...,100000)"


def report(results: list[SizeResult], a: Any) -> str:
    lines = [
        f"Latency and throughput at scale — 3 servers, fsync={a.fsync}, workers={a.workers or 'config default'}; "
        f"one client sim process per size; Protean's mix (94% one alloc, 80% repeat the previous shape), shapes "
        f"{', '.join(f'{c} MHz/{m} MB' for c, m in SHAPES)}",
    ]
    rows = []
    for r in results:
        if r.error:
            rows.append([f"{r.nodes:,}", f"FAILED: {r.error}"] + [""] * 10)
            continue
        lat = ck.placement_latency(r.lat_stats)
        w = r.lat_stats.get("Workers", {})
        ev = w.get("EvalLatencyMs", {})
        sched = f"{w.get('PlanMsP50', float('nan')):.1f} / {w.get('PlanMsP99', float('nan')):.1f}"
        rows.append([
            f"{r.nodes:,}",
            "n/a" if lat is None else f"{lat[1]:.1f} / {lat[2]:.1f}",
            f"{ev.get('P50', float('nan')):.1f} / {ev.get('P99', float('nan')):.1f}",
            sched,
            f"{w.get('CommitMsP50', float('nan')):.1f}",
            f"{1000 * percentile(r.lat_client, 0.5):.1f} / {1000 * percentile(r.lat_client, 0.99):.1f}",
            f"{r.lat_done}/{r.lat_asked}",
            f"{r.rate:,.0f}" + ("*" if r.tp_bounded else ""),
            f"{r.leader_ms_per_placement:.2f}",
            f"{r.tp_done:,}/{r.tp_requests:,}",
            f"{r.raw_wps:,.0f}",
            ratio(r.rate, r.raw_wps),
        ])
    lines.append(render(["nodes", "deq->commit p50/p99 ms", "enq->commit p50/p99 ms", "schedule p50/p99 ms", "commit p50 ms",
                         "register->placed p50/p99 ms (client)", "latency reqs done", "placements/s", "leader CPU ms/placement",
                         "throughput reqs done", "raw writes/s",
                         "vs raw"], rows))
    lines.append("  deq->commit: per placement, from scheduler.stats when the workers report it (n/a: they do not; "
                 "enq->commit is the workers' EvalLatencyMs, closed loop so no eval queues behind another)")
    lines.append("  leader CPU ms/placement: the leader's user + system CPU over the throughput phase (registrations, "
                 "planning, plan checks and commits, client updates, event streams) per placement committed; one core "
                 "at this cost sustains 1000/it placements/s")
    done = [r for r in results if not r.error]
    cores = os.cpu_count() or 1
    for r in done:
        parts = ", ".join(f"{k} {r.ms_per_placement(v):.2f}" for k, v in r.tp_other_cpu.items())
        total = r.machine_ms_per_placement
        lines.append(f"  CPU ms/placement at {r.nodes:,} nodes, every process of the run: leader "
                     f"{r.leader_ms_per_placement:.2f}, {parts}; {total:.2f} in all, so {cores} cores run at most "
                     f"{cores * 1000 / total:,.0f} placements/s here (all servers and the client share them)")
    if done:
        lines.append("  throughput phase, register calls / whole phase (s): "
                     + ", ".join(f"{r.nodes:,} nodes {r.tp_register_s:.1f} / {r.tp_seconds:.1f}" for r in done))
    if any(r.tp_bounded for r in results):
        lines.append(f"  * bounded: the throughput phase stopped after {a.phase_seconds:g}s with evals still queued; "
                     "the rate is placements committed by then over that time")

    rows = []
    for r in results:
        if r.error:
            continue
        c = ck.cache_figures([r.lat_stats, r.tp_stats])
        hr, hit, miss, miss_ms = c["hit_rate"], c["rescored_hit"], c["rescored_miss"], c["miss_ms"]
        rows.append([f"{r.nodes:,}", pct(hr[1]) if hr else "n/a", fmt(hit[1]) if hit else "n/a",
                     fmt(miss[1]) if miss else "n/a", ms(miss_ms[1]) if miss_ms else "n/a",
                     f"{r.rss_empty:,.0f} -> {r.rss_nodes:,.0f} -> {r.rss_end:,.0f}",
                     f"{r.mib_per_10k:,.0f}", f"{r.total_mib_per_10k:,.0f}", f"{r.sim_rss:,.0f}",
                     f"{r.register_s:.0f}", f"{r.ready_end:,}", r.topology])
    lines.append(render(["nodes", "cache hit rate", "re-scored/hit", "re-scored/miss", "on a miss p50",
                         "leader RSS MiB (empty -> nodes -> end)", "MiB/10k (nodes)", "MiB/10k (total)",
                         "client RSS MiB", "register s", "ready at end", "topology"], rows))
    for r in results:
        if r.error:
            continue
        found = {k: v[0] for k, v in ck.cache_figures([r.lat_stats, r.tp_stats]).items() if v is not None}
        if found:
            lines.append(f"  cache figures at {r.nodes:,} nodes read from scheduler.stats: "
                         + ", ".join(f"{k} <- {path}" for k, path in found.items()))
        extra = ck.extra_sections(r.tp_stats)
        if extra:
            lines.append(f"  scheduler.stats at {r.nodes:,} nodes, sections beyond the workers': {extra}")
    lines.append(mem_100k([r for r in results if r.nodes < 100_000] or results, any(r.nodes >= 100_000 for r in results)))

    at = next((r for r in results if r.nodes == 30_000 and not r.error), None)
    lines.append("Anchors (Protean, 30,000-server zone): ~20 ms average per allocation, 70-80 ms on a cache miss; "
                 "~50 servers re-scored on a hit, ~2,000 on a miss; 2,000 requests/s peak; ~1 GiB per 10,000 servers")
    if at is None:
        lines.append("Targets at 30,000 nodes (p50 <= 20 ms, >= 2,000 placements/s): n/a (30,000 nodes not run or failed)")
    else:
        lat = ck.placement_latency(at.lat_stats)
        p50 = lat[1] if lat else at.lat_stats.get("Workers", {}).get("EvalLatencyMs", {}).get("P50", float("nan"))
        which = "dequeue->commit" if lat else "enqueue->commit, closed loop (dequeue->commit not reported)"
        lines.append(f"Targets at 30,000 nodes: p50 <= {anchors.TARGET_P50_MS:g} ms: {verdict(p50 <= anchors.TARGET_P50_MS)} "
                     f"({p50:.1f} ms, {which}); >= {anchors.TARGET_RPS:,.0f} placements/s: "
                     f"{verdict(at.rate >= anchors.TARGET_RPS)} ({at.rate:,.0f}/s)")
    return "\n".join(lines)


def run(a: Any) -> tuple[str, bool]:
    """The part's tables, and whether every size ran."""
    results = []
    for nodes in a.sizes:
        if nodes >= 100_000 and results:
            note = mem_100k(results, True)
            if "not attempted" in note:
                print(f"  ... {note}", file=sys.stderr, flush=True)
                continue
        try:
            results.append(run_size(nodes, a))
        except Exception as exc:  # noqa: BLE001 - reported in the table; the other sizes still run
            results.append(SizeResult(nodes, error=f"{type(exc).__name__}: {exc}"[:160]))
    return report(results, a), all(not r.error for r in results)
