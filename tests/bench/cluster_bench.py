"""Cluster benchmark: the full write and read paths through a real 3-server Caravan cluster.

    python -m tests.bench.cluster_bench [--serial 500] [--pipelined 20000] [--window 256] [--failovers 5] [--fsync]

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
vary between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

from node import cluster as cl
from node.errors import RPCError
from node.rpc_client import AsyncRPCClient, RPCClient
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serial", type=int, default=500)
    ap.add_argument("--pipelined", type=int, default=20000, help="writes per pipelined phase (after a warm-up)")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--fsync", action="store_true", help="run the servers with fsync = true (the config default)")
    a = ap.parse_args()

    raw = raft_bench.run_case("raw", "low-latency", False, a.serial, a.pipelined, a.window, 256)
    directory = tempfile.mkdtemp(prefix="caravan-bench-")
    # The scheduler is off so the write path alone is measured (job registrations
    # would otherwise also create evals, plans and blocked evals).
    extra = f"fsync = {'true' if a.fsync else 'false'}\n[scheduler]\nenabled = false\n"
    c = cl.plan(directory, 3, extra_config=extra)
    for node in c.nodes:
        cl.start_node(node)
    c.save()
    try:
        leader = cl.wait_for_leader(c.rpc_addresses, 30)["Leader"]
        pids = {("leader" if n.rpc_addr == leader else f"follower {n.id}"): n.pid for n in c.nodes}
        lat = serial_writes(leader, a.serial)
        n = a.pipelined
        register = lambda i: ("job.register", {"job": job_spec(f"p-{i}")})  # noqa: E731
        asyncio.run(pipelined(leader, min(n, 2000), a.window, lambda i: register(n + i)))  # warm-up
        before = cpu_now(pids)
        reg = asyncio.run(pipelined(leader, n, a.window, register))
        reg_cpu = cpu_per_write(before, cpu_now(pids), n)
        # Reads, beside the RPC layer's own ceiling (the baseline of their ratios): "status" answers from memory.
        reads = {}
        calls = {
            "status RPC": lambda i: ("status", {}),
            "job.get, stale": lambda i: ("job.get", {"job_id": f"p-{i % n}", "stale": True}),
            "job.get, linearizable": lambda i: ("job.get", {"job_id": f"p-{i % n}"}),
        }
        for label, call in calls.items():
            before = cpu_now(pids)
            rate = asyncio.run(pipelined(leader, n, a.window, call))
            reads[label] = (rate, cpu_per_write(before, cpu_now(pids), n))
        allocs = prepare_allocs(leader, 2000)
        upd = None
        if allocs:
            # Each alloc flips between running and complete; every update changes state.
            statuses = ["running", "complete"]

            def update(i: int) -> tuple[str, dict[str, Any]]:
                return ("alloc.update", {"allocs": [{"ID": allocs[i % len(allocs)], "ClientStatus": statuses[(i // len(allocs)) % 2]}]})

            asyncio.run(pipelined(leader, len(allocs), a.window, update))  # warm-up
            before = cpu_now(pids)
            upd = asyncio.run(pipelined(leader, n, a.window, lambda i: update(len(allocs) + i)))
            upd_cpu = cpu_per_write(before, cpu_now(pids), n)
        fo = failover(c, a.failovers)
    finally:
        cl.down(c)

    raw_p50 = raw.get("p50_ms", float("nan"))
    raw_tp = raw.get("pipelined_wps", float("nan"))
    print(f"fsync={a.fsync}  (raw pysyncobj: serial p50 {raw_p50:.2f} ms, pipelined {raw_tp:.0f}/s;"
          f" CPU us/write: {raw_cpu_per_write(raw, a.pipelined)})")
    print(f"{'measure':<38} {'value':>12} {'vs raw':>8}")
    print(f"{'serial job register p50 (ms)':<38} {percentile(lat, 0.5) * 1000:>12.2f} {percentile(lat, 0.5) * 1000 / raw_p50:>8.2f}")
    print(f"{'serial job register p99 (ms)':<38} {percentile(lat, 0.99) * 1000:>12.2f}")
    print(f"{'pipelined job registers (/s)':<38} {reg:>12.0f} {reg / raw_tp:>8.2f}   (CPU us/write: {reg_cpu})")
    base = reads["status RPC"][0]
    for label, (rate, cpu) in reads.items():
        print(f"{f'pipelined {label} (/s)':<38} {rate:>12.0f} {rate / base:>8.2f}   (CPU us/call: {cpu})")
    if upd is not None:
        print(f"{'pipelined alloc client updates (/s)':<38} {upd:>12.0f} {upd / raw_tp:>8.2f}   (CPU us/write: {upd_cpu})")
    else:
        print(f"{'pipelined alloc client updates (/s)':<38} {'n/a (no plan.submit RPC)':>12}")
    print(f"{'failover, kill -9 to first write (s)':<38} {statistics.median(fo):>12.2f}   (runs: {', '.join(f'{x:.2f}' for x in fo)})")


if __name__ == "__main__":
    main()
