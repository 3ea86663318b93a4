"""Part 3: Nomad's C1M at home — ``--c1m-allocs`` allocations on ``--c1m-nodes`` simulated nodes.

One 3-server cluster and one ``caravan client sim`` process; the cluster's
raw write throughput first (the baseline of the ratios), then
``--c1m-jobs`` batch jobs sharing the allocations (C1M ran 1,000 jobs x
1,000 tasks; the default here is 100 x 1,000) registered 16 at a time:

- **placed**: from the first register call to the last eval's plan
  committed (evals followed on the leader's event stream);
- **running** (end to end): until the job summaries count every allocation
  running, i.e. the simulated client saw it and reported it (summaries are
  polled, stale, every half second).

Bounded by ``--c1m-seconds``: past it the part reports how far it got.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from node.wire.errors import NOT_FOUND, RPCError
from node.wire.rpc_client import AsyncRPCClient, RPCClient
from tests.bench.lifecycle_bench import raw_writes
from tests.bench.placement import anchors
from tests.bench.placement import clusterkit as ck
from tests.bench.placement.table import ratio, render, verdict

CPU, MEMORY_MB = 100, 64  # 20 allocs per 4,000 MHz node at 100,000 on 5,000


def spec(job_id: str, count: int) -> dict[str, Any]:
    return {"ID": job_id, "Type": "batch", "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [{
        "Name": "t", "Driver": "sim", "Config": {"run_for": "1h"}, "Resources": {"CPU": CPU, "MemoryMB": MEMORY_MB}}]}]}


@dataclass
class C1MResult:
    nodes: int
    allocs: int
    jobs: int
    raw_wps: float = 0.0
    register_s: float = 0.0  # until every register call returned
    placed_s: float = float("nan")
    placed: int = 0
    running_s: float = float("nan")
    running: int = 0
    bounded: bool = False
    leader_rss: float = float("nan")
    sim_rss: float = float("nan")
    stats: dict[str, Any] | None = None
    topology: str = ""

    @property
    def placed_rate(self) -> float:
        return self.placed / self.placed_s if self.placed_s == self.placed_s and self.placed_s > 0 else float("nan")

    @property
    def running_rate(self) -> float:
        return self.running / self.running_s if self.running_s == self.running_s and self.running_s > 0 else float("nan")


async def _register(addresses: list[str], ids: list[str], per: list[int]) -> list[str]:
    client = AsyncRPCClient(addresses, timeout=300)
    sem = asyncio.Semaphore(16)

    async def one(job_id: str, count: int) -> str:
        async with sem:
            return (await client.call("job.register", {"job": spec(job_id, count)}))["EvalID"]

    try:
        return list(await asyncio.gather(*(one(j, n) for j, n in zip(ids, per, strict=True))))
    finally:
        await client.close()


async def _running(addresses: list[str], ids: list[str]) -> int:
    client = AsyncRPCClient(addresses, timeout=60)
    sem = asyncio.Semaphore(16)

    async def one(job_id: str) -> int:
        async with sem:
            try:
                out = await client.call("job.summary", {"job_id": job_id, "stale": True})
            except RPCError as exc:
                if exc.code == NOT_FOUND:  # a stale read on a follower that has not applied the register yet
                    return 0
                raise
            return int(out["data"]["Summary"]["g"]["Running"])

    try:
        return sum(await asyncio.gather(*(one(j) for j in ids)))
    finally:
        await client.close()


def run(a: Any) -> C1MResult:
    res = C1MResult(a.c1m_nodes, a.c1m_allocs, a.c1m_jobs, topology=ck.topology_note(a.c1m_nodes))
    with ck.LocalCluster("c1m", fsync=a.fsync, workers=a.workers, keep=a.keep) as lc:
        step = lc.step
        step(f"c1m: starting the simulated client ({a.c1m_nodes:,} nodes; {res.topology})")
        sim = lc.start_sim(a.c1m_nodes, "c1m")
        with RPCClient(lc.addresses, timeout=60) as client:
            step("c1m: waiting for the nodes to register")
            ck.wait_nodes(client, a.c1m_nodes, timeout=60 + a.c1m_nodes / 200, sim=sim)
            address, pid = lc.leader()
            step(f"c1m: raw write throughput ({a.raw:,} writes)")
            res.raw_wps = asyncio.run(raw_writes(lc.addresses, a.raw, 64))
            watch = ck.EvalWatch(address, ck.applied_index(address))
            try:
                ids = [f"c1m-{i}" for i in range(a.c1m_jobs)]
                base, extra = divmod(a.c1m_allocs, a.c1m_jobs)
                per = [base + (1 if i < extra else 0) for i in range(a.c1m_jobs)]
                client.call("scheduler.stats", {"reset": True})
                step(f"c1m: registering {a.c1m_jobs:,} jobs of {base:,} allocations (at most {a.c1m_seconds:g}s)")
                deadline = time.monotonic() + a.c1m_seconds
                t0 = time.perf_counter()
                evals = asyncio.run(_register(lc.addresses, ids, per))
                res.register_s = time.perf_counter() - t0
                step("c1m: waiting for the plans to commit and the client to report the allocations running")
                while time.monotonic() < deadline:
                    if sim.poll() is not None:
                        raise RuntimeError(f"the simulated client exited (code {sim.returncode}): {lc.sim_log_tail('c1m')}")
                    with watch.cond:
                        done = [watch.done[e][0] for e in evals if e in watch.done]
                    if len(done) == len(evals) and res.placed_s != res.placed_s:
                        res.placed_s = max(done) - t0
                        res.placed = int(client.call("scheduler.stats", {})["Workers"]["Placements"])
                    res.running = asyncio.run(_running(lc.addresses, ids))
                    if res.running >= a.c1m_allocs:
                        res.running_s = time.perf_counter() - t0
                        break
                    time.sleep(0.5)
                else:
                    res.bounded = True
                    res.running_s = time.perf_counter() - t0
                    if res.placed_s != res.placed_s:
                        res.placed_s = res.running_s
                        res.placed = int(client.call("scheduler.stats", {})["Workers"]["Placements"])
                res.stats = client.call("scheduler.stats", {})
            finally:
                watch.stop = True
            res.leader_rss = ck.rss_mib(pid)
            res.sim_rss = ck.rss_mib(sim.pid)
    return res


def report(r: C1MResult, a: Any) -> str:
    w = (r.stats or {}).get("Workers", {})
    pa = (r.stats or {}).get("PlanApplier", {})
    mark = "*" if r.bounded else ""
    rows = [
        ["raw writes, pipelined node re-registrations (/s)", f"{r.raw_wps:,.0f}", "1.00x", "", ""],
        ["placed: register -> last plan committed (/s)", f"{r.placed_rate:,.0f}{mark}", ratio(r.placed_rate, r.raw_wps),
         f"{anchors.NOMAD_C1M_RATE:,.0f} (C1M) / {anchors.NOMAD_C2M_RATE:,.0f} (C2M)", ""],
        ["end to end: register -> all reported running (/s)", f"{r.running_rate:,.0f}{mark}", ratio(r.running_rate, r.raw_wps),
         f"{anchors.NOMAD_C1M_RATE:,.0f} (C1M) / {anchors.NOMAD_C2M_RATE:,.0f} (C2M)",
         f">= {anchors.TARGET_C1M_RATE:,.0f}: {verdict(r.running_rate >= anchors.TARGET_C1M_RATE)}"],
    ]
    lines = [
        f"C1M at home — {r.allocs:,} allocations ({r.jobs:,} batch jobs) on {r.nodes:,} simulated nodes, 3 servers, "
        f"fsync={a.fsync}, one client sim process ({r.topology})",
        render(["measure", "ours", "vs raw", "Nomad", "target"], rows),
        f"  placed {r.placed:,} in {r.placed_s:.1f}s; running {r.running:,} of {r.allocs:,} after {r.running_s:.1f}s; "
        f"register calls took {r.register_s:.1f}s; evals {w.get('EvalsProcessed', 'n/a')}, plan conflicts "
        f"{w.get('PlanConflicts', 'n/a')}, plan entries {pa.get('Entries', 'n/a')}; leader RSS {r.leader_rss:,.0f} MiB, "
        f"client RSS {r.sim_rss:,.0f} MiB",
        "  Nomad's figures: C1M 1,000,000 containers on 5,000 hosts, 5 servers, ~3,750/s (2016); "
        "C2M 2,000,000 on 6,100 hosts, 3 servers, ~1,500/s (2020)",
    ]
    if r.bounded:
        lines.append(f"  * bounded: stopped after {a.c1m_seconds:g}s before every allocation ran; the rates are what was done by then")
    return "\n".join(lines)
