"""Cluster benchmark: the full write and read paths through a real 3-server Caravan cluster.

    python -m tests.bench.cluster_bench [--serial 500] [--pipelined 20000] [--window 256] [--failovers 5]
                                        [--rounds 3] [--fsync]

Measured in one run, on the same machine:

* raw pysyncobj (a replicated no-op, 3 processes, the same raft profile) — the baseline;
* Caravan serial write latency (job registrations, one at a time, to the leader): p50/p99;
* Caravan pipelined throughput (job registrations, ``--window`` in flight): writes/s;
* pipelined reads of one job (stale, and linearizable: leader + barrier), beside
  a ``status`` call, which answers from memory (the RPC layer's own ceiling);
* alloc client updates pipelined, when the cluster exposes ``plan.submit`` to create allocs;
* leader failover: kill -9 the leader, time until the first successful write (median).

Ratios are against a baseline of the same run (raw pysyncobj for writes,
``status`` for reads), since absolute numbers on a shared 2-core machine
vary between runs. The machine's load also moves within a run (raw
pysyncobj alone gave 4,760 to 6,600/s in runs minutes apart), so one raw
phase and one Caravan phase can see different machines. So the registration
ratio is measured in ``--rounds`` pairs, each a raw run and then a fresh
cluster's registrations right after it, and the median pair is reported
(every pair is printed). Reads, alloc updates and failover run once, on the
last round's cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from node import devcluster as cl
from node.wire.errors import RPCError
from node.wire.rpc_client import AsyncRPCClient, RPCClient
from tests.bench import raft_bench


def job_spec(job_id: str) -> dict[str, Any]:
    return {"ID": job_id, "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "sim"}]}]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux /proc; 0 where unavailable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each server and of this (client) process."""
    now = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t = os.times()
    now["client"] = t.user + t.system
    return now


def cpu_per_write(before: dict[str, float], after: dict[str, float], writes: int) -> str:
    """Microseconds of CPU per write in each process: where the cost of a write goes."""
    return ", ".join(f"{name} {1e6 * (after[name] - before[name]) / writes:.0f}" for name in before)


def raw_cpu_per_write(raw: dict[str, Any], writes: int) -> str:
    """The raw baseline's CPU split, as ``cpu_per_write`` gives Caravan's (its caller runs in the leader)."""
    cpu = raw.get("cpu_s") or {}
    leader = raw.get("leader")
    if leader not in cpu:
        return "n/a"
    parts = [f"leader {1e6 * cpu[leader] / writes:.0f}"]
    parts += [f"follower {1e6 * cpu[name] / writes:.0f}" for name in sorted(cpu) if name != leader]
    return ", ".join(parts)


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def serial_writes(leader: str, n: int) -> list[float]:
    lat = []
    with RPCClient([leader]) as client:
        for i in range(n):
            t = time.perf_counter()
            client.call("job.register", {"job": job_spec(f"serial-{i}")})
            lat.append(time.perf_counter() - t)
    return lat


async def pipelined(leader: str, n: int, window: int, make: Any) -> float:
    """``n`` calls with ``window`` in flight: writes/s.

    ``window`` workers take the next call number from one shared iterator. A
    Semaphore over ``n`` coroutines cost the client ~15 us per call on
    Python 3.11 (each release scans waiters already woken), CPU the
    servers on the same 2 cores then lacked.
    """
    client = AsyncRPCClient([leader], timeout=60)
    numbers = iter(range(n))

    async def worker() -> None:
        for i in numbers:
            method, args = make(i)
            await client.call(method, args)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    elapsed = time.perf_counter() - t
    await client.close()
    return n / elapsed


def prepare_allocs(leader: str, count: int) -> list[str] | None:
    """Place ``count`` allocs with plan.submit if the cluster has it; None otherwise."""
    with RPCClient([leader]) as client:
        try:
            client.call("node.register", {"node": {"ID": "bench-node", "Status": "ready"}})
            client.call("job.register", {"job": job_spec("alloc-bench")})
            ids = []
            for start in range(0, count, 20):
                batch = [
                    {"ID": str(uuid.uuid4()), "EvalID": "bench-eval", "JobID": "alloc-bench", "NodeID": "bench-node", "TaskGroup": "g"}
                    for _ in range(min(20, count - start))
                ]
                client.call("plan.submit", {"plan": {"AllocsToPlace": batch, "Evals": [{"ID": "bench-eval", "JobID": "alloc-bench", "Status": "complete"}]}})
                ids += [a["ID"] for a in batch]
            return ids
        except RPCError as exc:
            if exc.code == "unknown_method":
                return None
            raise


def failover(c: cl.Cluster, rounds: int) -> list[float]:
    times = []
    for r in range(rounds):
        leader = cl.wait_for_leader(c.rpc_addresses, 30)
        node = next(n for n in c.nodes if n.rpc_addr == leader["Leader"])
        others = [n.rpc_addr for n in c.nodes if n is not node]
        cl.kill(c, node.id)
        t = time.perf_counter()
        with RPCClient(others, timeout=30) as client:
            client.call("job.register", {"job": job_spec(f"failover-{r}")})
        times.append(time.perf_counter() - t)
        cl.restart(c, node.id)
        cl.wait_for_leader(c.rpc_addresses, 30)
    return times


@dataclass
class Round:
    """One raw pysyncobj run and, right after it, one of Caravan's registration runs."""

    raw: dict[str, Any]
    registrations: float
    cpu: str

    @property
    def raw_wps(self) -> float:
        return self.raw.get("pipelined_wps", float("nan"))

    @property
    def ratio(self) -> float:
        return self.registrations / self.raw_wps


def start_cluster(fsync: bool) -> tuple[cl.Cluster, str, dict[str, int]]:
    """A fresh 3-server cluster: (cluster, leader's address, server pids by role)."""
    directory = tempfile.mkdtemp(prefix="caravan-bench-")
    # The scheduler is off so the write path alone is measured (job registrations
    # would otherwise also create evals, plans and blocked evals).
    extra = f"fsync = {'true' if fsync else 'false'}\n[scheduler]\nenabled = false\n"
    c = cl.plan(directory, 3, extra_config=extra)
    for node in c.nodes:
        cl.start_node(node)
    c.save()
    try:
        leader = cl.wait_for_leader(c.rpc_addresses, 30)["Leader"]
    except BaseException:
        cl.down(c)
        raise
    pids = {("leader" if n.rpc_addr == leader else f"follower {n.id}"): n.pid for n in c.nodes}
    return c, leader, pids


def registrations(leader: str, pids: dict[str, int], n: int, window: int) -> tuple[float, str]:
    """Pipelined job registrations after a warm-up: (writes/s, CPU per write of each process)."""
    register = lambda i: ("job.register", {"job": job_spec(f"p-{i}")})  # noqa: E731
    asyncio.run(pipelined(leader, min(n, 2000), window, lambda i: register(n + i)))  # warm-up
    before = cpu_now(pids)
    rate = asyncio.run(pipelined(leader, n, window, register))
    return rate, cpu_per_write(before, cpu_now(pids), n)


def reads_and_updates(leader: str, pids: dict[str, int], n: int, window: int) -> tuple[dict[str, tuple[float, str]], float | None, str]:
    """Pipelined reads of the registered jobs, then alloc client updates: rates and CPU per call."""
    # Reads, beside the RPC layer's own ceiling (the baseline of their ratios): "status" answers from memory.
    reads = {}
    calls = {
        "status RPC": lambda i: ("status", {}),
        "job.get, stale": lambda i: ("job.get", {"job_id": f"p-{i % n}", "stale": True}),
        "job.get, linearizable": lambda i: ("job.get", {"job_id": f"p-{i % n}"}),
    }
    for label, call in calls.items():
        before = cpu_now(pids)
        rate = asyncio.run(pipelined(leader, n, window, call))
        reads[label] = (rate, cpu_per_write(before, cpu_now(pids), n))
    allocs = prepare_allocs(leader, 2000)
    if not allocs:
        return reads, None, ""
    # Each alloc flips between running and complete; every update changes state.
    statuses = ["running", "complete"]

    def update(i: int) -> tuple[str, dict[str, Any]]:
        return ("alloc.update", {"allocs": [{"ID": allocs[i % len(allocs)], "ClientStatus": statuses[(i // len(allocs)) % 2]}]})

    asyncio.run(pipelined(leader, len(allocs), window, update))  # warm-up
    before = cpu_now(pids)
    upd = asyncio.run(pipelined(leader, n, window, lambda i: update(len(allocs) + i)))
    return reads, upd, cpu_per_write(before, cpu_now(pids), n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serial", type=int, default=500)
    ap.add_argument("--pipelined", type=int, default=20000, help="writes per pipelined phase (after a warm-up)")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="raw/registration pairs; the ratio reported is their median")
    ap.add_argument("--fsync", action="store_true", help="run the servers with fsync = true (the config default)")
    ap.add_argument("--keep", action="store_true", help="keep each round's cluster directory (data and logs) instead of removing it")
    a = ap.parse_args()
    n = a.pipelined

    rounds: list[Round] = []
    # Each round: raw pysyncobj, then a fresh Caravan cluster's registrations,
    # back to back, so that both sides of a ratio see the same machine.
    for r in range(a.rounds):
        raw = raft_bench.run_case("raw", "low-latency", False, a.serial, n, a.window, 256)
        c, leader, pids = start_cluster(a.fsync)
        try:
            if r == 0:
                lat = serial_writes(leader, a.serial)
            reg, reg_cpu = registrations(leader, pids, n, a.window)
            rounds.append(Round(raw, reg, reg_cpu))
            if r == a.rounds - 1:
                reads, upd, upd_cpu = reads_and_updates(leader, pids, n, a.window)
                fo = failover(c, a.failovers)
        except BaseException:
            cl.down(c)
            print(f"round {r + 1} failed; its servers' logs are in {c.dir}", file=sys.stderr)
            raise
        cl.down(c)
        if a.keep:
            print(f"round {r + 1}: cluster directory kept in {c.dir}", file=sys.stderr)
        else:
            shutil.rmtree(c.dir, ignore_errors=True)  # a round leaves ~1-2 GB of LMDB and raft logs

    first = rounds[0].raw
    raw_p50 = first.get("p50_ms", float("nan"))
    print(f"fsync={a.fsync}  (raw pysyncobj, first round: serial p50 {raw_p50:.2f} ms)")
    for i, rnd in enumerate(rounds, 1):
        print(f"round {i}: raw pysyncobj {rnd.raw_wps:.0f}/s (CPU us/write: {raw_cpu_per_write(rnd.raw, n)}),"
              f" job registers {rnd.registrations:.0f}/s = {rnd.ratio:.2f}x (CPU us/write: {rnd.cpu})")
    mid = sorted(rounds, key=lambda rnd: rnd.ratio)[len(rounds) // 2]
    print(f"{'measure':<38} {'value':>12} {'vs raw':>8}")
    print(f"{'serial job register p50 (ms)':<38} {percentile(lat, 0.5) * 1000:>12.2f} {percentile(lat, 0.5) * 1000 / raw_p50:>8.2f}")
    print(f"{'serial job register p99 (ms)':<38} {percentile(lat, 0.99) * 1000:>12.2f}")
    print(f"{'pipelined job registers (/s)':<38} {mid.registrations:>12.0f} {mid.ratio:>8.2f}   (the round of the median ratio)")
    base = reads["status RPC"][0]
    for label, (rate, cpu) in reads.items():
        print(f"{f'pipelined {label} (/s)':<38} {rate:>12.0f} {rate / base:>8.2f}   (CPU us/call: {cpu})")
    raw_tp = rounds[-1].raw_wps  # the alloc updates ran in the last round
    if upd is not None:
        print(f"{'pipelined alloc client updates (/s)':<38} {upd:>12.0f} {upd / raw_tp:>8.2f}   (CPU us/write: {upd_cpu})")
    else:
        print(f"{'pipelined alloc client updates (/s)':<38} {'n/a (no plan.submit RPC)':>12}")
    print(f"{'failover, kill -9 to first write (s)':<38} {statistics.median(fo):>12.2f}   (runs: {', '.join(f'{x:.2f}' for x in fo)})")


if __name__ == "__main__":
    main()
