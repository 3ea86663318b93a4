"""Failover figures: leader kill -9 to the first accepted write, and a restarted follower's first stale read.

Each starts from a settled cluster (``cluster.settle``) and leaves the killed
server started again (the next ``settle`` waits for it to catch up), so
every kill measures the same thing. Times run from the kill (the probe's
writes go to the other two servers, in tries of at most 1 s so the figure is
not rounded up to the wire client's backoff) and, for the follower, from the
moment its process is started, as ``../shared/tools/big_restore_probe.sh``
timed them.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient
from tests.bench.failover.cluster import Bench, settle
from tests.bench.failover.probes import tiny_job
from tests.bench.failover.state import job_id

SETTLE_S = 300.0
PROBE_TIMEOUT_S = 300.0


def first_write(addresses: list[str], name: str, since: float, timeout: float = PROBE_TIMEOUT_S) -> float:
    """Seconds from ``since`` (wall) until a write is accepted; each try is short, so the figure is not quantised."""
    deadline = time.monotonic() + timeout
    with RPCClient(addresses, timeout=1.0) as client:
        while time.monotonic() < deadline:
            try:
                client.call("job.register", {"job": tiny_job(name)}, timeout=1.0)
                return time.time() - since
            except (RPCError, OSError):
                continue  # the client already paused between its own retries
    raise TimeoutError(f"no write accepted within {timeout:g}s")


def leader_kills(bench: Bench, kills: int) -> dict[str, Any]:
    """Kill -9 the leader ``kills`` times; each time, seconds to the first accepted write (and the restart's catch-up)."""
    values = []
    for n in range(kills):
        leader = settle(bench, SETTLE_S)
        others = [a for a in bench.addresses if a != leader.rpc_addr]
        at = bench.kill(leader)
        values.append(first_write(others, f"probe-kill-{n}", at))
        bench.start(leader)
        print(f"  leader kill {n + 1}/{kills}: first write after {values[-1]:.2f} s", flush=True)
    return {"values_s": values, "median_s": statistics.median(values) if values else None}


def follower_restart(bench: Bench) -> dict[str, Any]:
    """Kill -9 a follower, start it again, and time (from the start) its first stale point read."""
    leader = settle(bench, SETTLE_S)
    follower = next(bench.server(a) for a in bench.addresses if a != leader.rpc_addr)
    bench.kill(follower)
    at = bench.start(follower)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while True:
        try:
            with RPCClient([follower.rpc_addr], timeout=1.0) as client:
                client.call("job.get", {"job_id": job_id(0), "stale": True}, timeout=1.0)
            break
        except (RPCError, OSError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{follower.id} served no stale read within {PROBE_TIMEOUT_S:g}s") from None
            time.sleep(0.02)  # the server is not up yet: poll again
    took = time.time() - at
    print(f"  follower {follower.id} restarted: first stale read after {took:.2f} s", flush=True)
    return {"server": follower.id, "seconds": took}
