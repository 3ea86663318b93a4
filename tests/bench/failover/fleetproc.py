"""One simulated fleet process: registers and heartbeats nodes ``first .. first + count - 1`` of the state.

    python -m tests.bench.failover.fleetproc --servers A,B,C --first 0 --count 3000 --events FILE

It drives ``client.fleet.Fleet`` (chunked registration, heartbeats spread
over the granted TTL) for the node ids the state was built with, and runs no
allocations: the restored state holds ~1M allocs already marked running, and
``caravan client sim`` would reload and report every one of them on start
(its state file makes a restarted client pick up its allocs), which is a
different benchmark. The bench kills this process with SIGKILL to make its
nodes silent at once.

Every answered heartbeat call is appended to ``--events`` as a JSON line
(chunk, wall time answered, TTL granted): after the kill, the latest line per
chunk says when each node's TTL runs out, which is what bounds "TTL plus
grace, and no later".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from client.fleet import Fleet, SimConfig, SimNode
from node.wire.messages import MAX_HEARTBEAT_IDS
from node.wire.rpc_client import AsyncRPCClient
from tests.bench.failover.state import node_id, node_name


class _Recorder:
    """The fleet's RPC client, noting each answered ``node.heartbeat`` (the Fleet keeps its chunks to itself)."""

    def __init__(self, rpc: AsyncRPCClient, out: Any, chunk_of: dict[str, int]) -> None:
        self.rpc = rpc
        self.out = out
        self.chunk_of = chunk_of

    async def call(self, method: str, args: dict[str, Any], **kw: Any) -> Any:
        answer = await self.rpc.call(method, args, **kw)
        if method == "node.heartbeat":
            ids = args["node_ids"]
            line = {"event": "beat", "chunk": self.chunk_of.get(ids[0], -1), "nodes": len(ids),
                    "answered": time.time(), "ttl": float(answer.get("HeartbeatTTL") or 0)}
            self.out.write(json.dumps(line) + "\n")
            self.out.flush()
        return answer

    async def close(self) -> None:
        await self.rpc.close()


async def run(args: argparse.Namespace) -> None:
    cfg = SimConfig(servers=args.servers.split(","), nodes=args.count, cpu=args.cpu, memory_mb=args.memory,
                    node_class="sim", heartbeat_batch=args.heartbeat_batch, status_interval=0)
    nodes = {node_id(i): SimNode(node_id(i), node_name(i)) for i in range(args.first, args.first + args.count)}
    size = max(1, min(args.heartbeat_batch, MAX_HEARTBEAT_IDS))  # as Fleet chunks them
    ids = list(nodes)
    chunk_of = {chunk_ids[0]: n for n, chunk_ids in enumerate(ids[i: i + size] for i in range(0, len(ids), size))}
    with open(args.events, "a") as out:
        rpc = _Recorder(AsyncRPCClient(cfg.servers, timeout=15.0), out, chunk_of)
        fleet = Fleet(cfg, rpc, nodes, error=lambda what, msg: print(f"{what}: {msg}", file=sys.stderr, flush=True),  # type: ignore[arg-type]
                      say=lambda msg: print(msg, flush=True))
        beating = asyncio.create_task(fleet.heartbeats())
        await fleet.register_all()
        out.write(json.dumps({"event": "registered", "nodes": fleet.stats.registered, "at": time.time(),
                              "seconds": fleet.stats.register_seconds}) + "\n")
        out.flush()
        await beating


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", required=True)
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--cpu", type=int, default=4000)
    p.add_argument("--memory", type=int, default=8192)
    p.add_argument("--heartbeat-batch", type=int, default=500)
    p.add_argument("--events", required=True)
    try:
        asyncio.run(run(p.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
