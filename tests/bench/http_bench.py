"""HTTP API benchmark: job registrations through the Nomad-compatible API vs the RPC path.

    python -m tests.bench.http_bench [--requests 2000] [--concurrency 32] [--serial 300] [--fsync]

One real 3-server cluster; in the same run, for each path:

* HTTP ``POST /v1/jobs`` to the leader, and to a follower (which forwards
  the write to the leader over RPC internally);
* the RPC ``job.register`` to the leader, and to a follower (the same
  forwarding), with the msgpack client;

measured twice: ``--serial`` registrations one at a time (latency p50/p99),
and ``--requests`` registrations with ``--concurrency`` in flight
(throughput, and p50/p99 under that load). The client runs in this process
on the same 2-core machine as the three servers, so absolute numbers vary
between runs; compare the paths within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from node import devcluster as cl
from node.wire.rpc_client import AsyncRPCClient


def job_spec(job_id: str) -> dict[str, Any]:
    return {
        "ID": job_id,
        "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "sim"}]}],
    }


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


@dataclass
class Result:
    name: str
    mode: str
    n: int
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def rate(self) -> float:
        return self.n / self.seconds if self.seconds else float("nan")

    def row(self) -> str:
        p50, p99 = percentile(self.latencies, 0.5) * 1000, percentile(self.latencies, 0.99) * 1000
        return f"{self.name:<24} {self.mode:<12} {self.rate:>10.0f} {p50:>10.2f} {p99:>10.2f} {self.errors:>7}"


Call = Callable[[str], Awaitable[None]]


async def run(name: str, mode: str, call: Call, n: int, concurrency: int, tag: str) -> Result:
    latencies: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        nonlocal errors
        async with sem:
            started = time.perf_counter()
            try:
                await call(f"{tag}-{i}")
            except Exception:  # noqa: BLE001 - counted, the run goes on
                errors += 1
                return
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return Result(name, mode, n, time.perf_counter() - started, latencies, errors)


def http_call(session: aiohttp.ClientSession, address: str) -> Call:
    url = f"http://{address}/v1/jobs"

    async def call(job_id: str) -> None:
        async with session.post(url, json={"Job": job_spec(job_id)}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
            await resp.read()

    return call


def rpc_call(client: AsyncRPCClient) -> Call:
    async def call(job_id: str) -> None:
        await client.call("job.register", {"job": job_spec(job_id)})

    return call


async def bench(
    c: cl.Cluster, leader: cl.ClusterNode, follower: cl.ClusterNode, a: argparse.Namespace
) -> list[Result]:
    connector = aiohttp.TCPConnector(limit=max(a.concurrency, 1) * 2)
    timeout = aiohttp.ClientTimeout(total=60)
    results: list[Result] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        rpc_leader = AsyncRPCClient([leader.rpc_addr], timeout=60)
        rpc_follower = AsyncRPCClient([follower.rpc_addr], timeout=60)
        paths: list[tuple[str, Call]] = [
            ("HTTP via leader", http_call(session, leader.http_address)),
            ("HTTP via follower", http_call(session, follower.http_address)),
            ("RPC via leader", rpc_call(rpc_leader)),
            ("RPC via follower", rpc_call(rpc_follower)),
        ]
        try:
            for name, call in paths:  # warm connections and code paths
                await run(name, "warmup", call, 50, 8, f"w-{name[:4]}-{name[-6:]}".replace(" ", ""))
            for mode, n, conc in (
                ("serial", a.serial, 1),
                (f"conc={a.concurrency}", a.requests, a.concurrency),
            ):
                for name, call in paths:
                    tag = f"{mode}-{name}".replace(" ", "").replace("=", "")
                    results.append(await run(name, mode, call, n, conc, tag))
        finally:
            await rpc_leader.close()
            await rpc_follower.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--requests", type=int, default=2000, help="registrations per path in the concurrent run"
    )
    ap.add_argument(
        "--concurrency", type=int, default=32, help="requests in flight in the concurrent run"
    )
    ap.add_argument("--serial", type=int, default=300, help="registrations per path, one at a time")
    ap.add_argument(
        "--fsync",
        action="store_true",
        help="run the servers with fsync = true (the config default)",
    )
    a = ap.parse_args()

    directory = tempfile.mkdtemp(prefix="caravan-http-bench-")
    c = cl.plan(directory, 3, extra_config=f"fsync = {'true' if a.fsync else 'false'}")
    for node in c.nodes:
        cl.start_node(node)
    c.save()
    try:
        leader_rpc = cl.wait_for_leader(c.rpc_addresses, 30)["Leader"]
        leader = next(n for n in c.nodes if n.rpc_addr == leader_rpc)
        follower = next(n for n in c.nodes if n.id != leader.id)
        results = asyncio.run(bench(c, leader, follower, a))
        still_leader = cl.status_of(leader.rpc_addr)
    finally:
        cl.down(c)

    print(
        f"fsync={a.fsync}  job registrations: serial {a.serial} per path, concurrent {a.requests} per path"
    )
    if not still_leader or still_leader.get("Role") != "leader":
        print("warning: leadership moved during the run; the leader/follower split is approximate")
    print(f"{'path':<24} {'mode':<12} {'req/s':>10} {'p50 ms':>10} {'p99 ms':>10} {'errors':>7}")
    for r in results:
        print(r.row())
    by = {(r.name, r.mode): r for r in results}
    conc = f"conc={a.concurrency}"
    for mode in ("serial", conc):
        rpc = by[("RPC via leader", mode)]
        for name in ("HTTP via leader", "HTTP via follower", "RPC via follower"):
            r = by[(name, mode)]
            print(
                f"{mode:<12} {name:<18} vs RPC via leader: throughput x{r.rate / rpc.rate:.2f}, "
                f"p99 x{percentile(r.latencies, 0.99) / percentile(rpc.latencies, 0.99):.2f}"
            )


if __name__ == "__main__":
    main()
