"""Lifecycle benchmark: placing allocations through the scheduler on a real 3-server cluster.

    python -m tests.bench.lifecycle_bench [--allocs 1000] [--nodes 100] [--jobs 20] [--raw 2000] [--fsync]

Measured in one run, on the same machine:

* raw write throughput: small writes (a node re-registration) pipelined to the leader
  through the RPC write path, ``--window`` in flight — the baseline;
* one batch job of ``--allocs`` allocations on ``--nodes`` simulated nodes
  (one ``caravan client sim`` process): placements/s from the register call
  to the eval's plan committed (observed with a blocking query), and the
  time until the client reports them all running;
* a burst of ``--jobs`` jobs sharing ``--allocs`` allocations: placements/s,
  eval latency (broker enqueue to plan committed, on the leader) p50/p99,
  and plan conflicts (plans the applier only partly accepted);
* the placements/s ratio to the raw write throughput of the same run.

Absolute numbers on a shared 2-core machine vary between runs; the ratio is
what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from node import devcluster as cl
from node.wire.rpc_client import AsyncRPCClient, RPCClient

REPO = Path(__file__).resolve().parents[2]
TARGET = 1000.0  # placements/s


def batch_spec(job_id: str, count: int) -> dict[str, Any]:
    return {
        "ID": job_id,
        "Type": "batch",
        "TaskGroups": [
            {"Name": "g", "Count": count,
             "Tasks": [{"Name": "t", "Driver": "sim", "Config": {"run_for": "10m"}, "Resources": {"CPU": 100, "MemoryMB": 64}}]}
        ],
    }


async def raw_writes(addresses: list[str], n: int, window: int) -> float:
    """Pipelined small writes (the same dummy node re-registered): writes per second."""
    client = AsyncRPCClient(addresses, timeout=60)
    node = {"ID": "bench-raw", "Name": "bench-raw", "Datacenter": "bench-none", "Status": "ready",
            "SchedulingEligibility": "ineligible"}
    await client.call("node.register", {"node": node})
    sem = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with sem:
            await client.call("node.register", {"node": {**node, "Attributes": {"seq": str(i)}}})

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - t
    await client.close()
    return n / elapsed


class EvalWatch:
    """Completion times of evals, seen on one event stream (cheap to observe).

    Blocking queries per eval would wake on every commit and load the
    leader the benchmark measures; one journal subscription does not.
    """

    def __init__(self, address: str, index: int) -> None:
        self.done: dict[str, tuple[float, dict[str, Any]]] = {}
        self.cond = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._run, args=(address, index), daemon=True)
        self.thread.start()

    def _run(self, address: str, index: int) -> None:
        with RPCClient([address], timeout=60) as client:
            for item in client.stream("event.stream", {"index": index, "topics": ["Evaluation"], "heartbeat": 1},
                                      idle_timeout=30):
                if self.stop:
                    return
                now = time.perf_counter()
                for _topic, _type, key, obj in item.get("events") or []:
                    if obj is not None and obj["status"] not in ("pending",):
                        with self.cond:
                            self.done.setdefault(key, (now, obj))
                            self.cond.notify_all()

    def wait(self, eval_ids: list[str], timeout: float = 300.0) -> float:
        """The time the last of ``eval_ids`` left pending (perf_counter)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(e in self.done for e in eval_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"evaluations still pending after {timeout:g}s")
                self.cond.wait(left)
            return max(self.done[e][0] for e in eval_ids)


def wait_running(client: RPCClient, job_ids: list[str], want: int, timeout: float = 300.0) -> float:
    t, deadline = time.perf_counter(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = sum(client.call("job.summary", {"job_id": j, "stale": True})["data"]["Summary"]["g"]["Running"] for j in job_ids)
        if running >= want:
            return time.perf_counter() - t
        time.sleep(0.05)
    raise RuntimeError(f"only some of {want} allocations running after {timeout:g}s")


def start_sim(addresses: list[str], nodes: int, directory: str) -> subprocess.Popen:
    log = open(Path(directory) / "sim.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "client", "sim", "--nodes", str(nodes), "--name-prefix", "bench",
         "--servers", ",".join(addresses)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
    )
    log.close()
    return proc


def wait_nodes(client: RPCClient, nodes: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [n for n in client.list_all("node.list", {}) if n["Status"] == "ready" and n["Name"].startswith("bench-")]
        if len(ready) >= nodes:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{nodes} simulated nodes did not register within {timeout:g}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=20, help="jobs in the burst phase (sharing --allocs allocations)")
    ap.add_argument("--raw", type=int, default=2000, help="writes in the raw throughput phase")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--fsync", action="store_true", help="run the servers with fsync = true (the config default)")
    ap.add_argument("--workers", type=int, default=None, help="scheduler workers on the leader (default: the config's)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster directory (data and logs) instead of removing it")
    a = ap.parse_args()

    directory = tempfile.mkdtemp(prefix="caravan-lifecycle-bench-")
    extra = f"fsync = {'true' if a.fsync else 'false'}\n"
    if a.workers is not None:
        extra += f"[scheduler]\nworkers = {a.workers}\n"
    c = cl.up(directory, 3, extra_config=extra, timeout=60)
    sim = None
    try:
        addresses = c.rpc_addresses
        sim = start_sim(addresses, a.nodes, directory)
        with RPCClient(addresses, timeout=60) as client:
            wait_nodes(client, a.nodes)
            # The leader's own journal: an eval's record appears there when its plan committed.
            leader = cl.wait_for_leader(addresses)["Leader"]
            # Raw writes go to the leader: through whichever follower is listed first, the
            # figure measured forwarding and moved with the election's outcome, run to run.
            raw = asyncio.run(raw_writes([leader], a.raw, a.window))

            watch = EvalWatch(leader, client.call("node.list", {})["applied_index"])

            # Phase 1: one batch job of --allocs allocations.
            client.call("scheduler.stats", {"reset": True})
            t0 = time.perf_counter()
            out = client.call("job.register", {"job": batch_spec("bench-one", a.allocs)})
            one_s = watch.wait([out["EvalID"]]) - t0
            ev = watch.done[out["EvalID"]][1]
            placed = len(client.list_all("alloc.list", {"job_id": "bench-one"}))
            to_running = wait_running(client, ["bench-one"], a.allocs) + one_s
            stats_one = client.call("scheduler.stats", {"reset": True})

            # Phase 2: a burst of --jobs jobs sharing --allocs allocations.
            per = max(1, a.allocs // a.jobs)
            ids = [f"bench-burst-{i}" for i in range(a.jobs)]

            def register(job_id: str) -> str:
                with RPCClient(addresses, timeout=60) as cc:
                    return cc.call("job.register", {"job": batch_spec(job_id, per)})["EvalID"]

            t1 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                evals = list(pool.map(register, ids))
            burst_s = watch.wait(evals) - t1
            done = [watch.done[e][1] for e in evals]
            stats_burst = client.call("scheduler.stats", {})
            watch.stop = True
    finally:
        if sim is not None and sim.poll() is None:
            os.kill(sim.pid, signal.SIGTERM)
            try:
                sim.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(sim.pid, signal.SIGKILL)
                sim.wait(5)
        cl.down(c)
        if sys.exc_info()[0] is not None:
            print(f"the benchmark failed; the servers' logs are in {directory}", file=sys.stderr)
    if not a.keep:
        shutil.rmtree(directory, ignore_errors=True)

    one_rate = placed / one_s
    burst_placed = per * a.jobs
    burst_rate = burst_placed / burst_s
    w1, w2 = stats_one["Workers"], stats_burst["Workers"]
    print(f"fsync={a.fsync}  nodes={a.nodes}  allocs={a.allocs}  workers={a.workers or 'default'}  "
          f"(shared 2-core machine: compare ratios{'; logs in ' + directory if a.keep else ''})")
    print(f"{'measure':<52} {'value':>10} {'vs raw':>8}")
    print(f"{'raw writes, pipelined node re-registrations (/s)':<52} {raw:>10.0f} {1.0:>8.2f}")
    print(f"{'one job: placements/s (register -> plan committed)':<52} {one_rate:>10.0f} {one_rate / raw:>8.2f}")
    print(f"{'one job: eval status / placed allocs':<52} {ev['status'] + ' / ' + str(placed):>10}")
    print(f"{'one job: eval latency on the leader (ms)':<52} {w1['EvalLatencyMs']['P50']:>10.1f}")
    print(f"{'one job: plan entries (48 KiB raft entries)':<52} {stats_one['PlanApplier']['Entries']:>10}")
    print(f"{'one job: snapshot+schedule / check+commit (ms)':<52} {str(w1['PlanMsP50']) + ' / ' + str(w1['CommitMsP50']):>10}")
    print(f"{'one job: until all running on the clients (s)':<52} {to_running:>10.2f}")
    print(f"{'burst of ' + str(a.jobs) + ' jobs: placements/s':<52} {burst_rate:>10.0f} {burst_rate / raw:>8.2f}")
    print(f"{'burst: eval latency p50 (ms)':<52} {w2['EvalLatencyMs']['P50']:>10.1f}")
    print(f"{'burst: eval latency p99 (ms)':<52} {w2['EvalLatencyMs']['P99']:>10.1f}")
    print(f"{'burst: snapshot+schedule / check+commit p50 (ms)':<52} {str(w2['PlanMsP50']) + ' / ' + str(w2['CommitMsP50']):>10}")
    print(f"{'burst: evals processed / plan conflicts':<52} {str(w2['EvalsProcessed']) + ' / ' + str(w2['PlanConflicts']):>10}")
    print(f"{'burst: evals complete':<52} {sum(1 for e in done if e['status'] == 'complete'):>10}")
    verdict = "meets" if one_rate >= TARGET else "BELOW"
    print(f"target >= {TARGET:.0f} placements/s for the {a.allocs}-alloc job: {verdict} ({one_rate:.0f}/s)")


if __name__ == "__main__":
    main()
