"""Failover and node loss at scale (issue 34), measured in one run.

    python -m tests.bench.failover_bench [--objects 1000000] [--nodes 5000] [--expire 2000] [--kills 3]
                                         [--json FILE] [--keep]

A 3-server cluster seeded (snapshot restore) with about ``--objects``
objects, whose ``--nodes`` nodes are all heartbeated by two live fleet
processes (``--nodes - --expire`` and ``--expire`` nodes). Then, each from a
settled cluster with the fleets and a steady writer running:

1. a follower killed -9 and restarted: seconds to its first stale read;
2. the leader killed -9, ``--kills`` times: seconds to the first accepted
   write (median and each value);
3. mass expiry: the ``--expire`` fleet killed -9 at once; the time until
   all its nodes are down (against their last TTL plus grace), raft entries
   and evals written (against one eval per affected job per entry),
   elections, and write p99 during the storm against before it (``--before``
   seconds of writes, 60 by default: 600 calls, so that the p99 is not the
   worst call);
4. the same storm with the leader killed -9 once half the nodes are down;
   if the broker is still busy with the first storm's work when its
   baseline starts, its p99 is compared with the first storm's quiet one.

The fleets are ``tests.bench.failover.fleetproc`` processes driving
``client.fleet.Fleet`` for the state's own node ids (registration and
chunked heartbeats, no alloc runner: ``caravan client sim`` would reload and
report the ~1M restored allocs first). Heartbeat settings are short so
expiry takes seconds (printed with the figures). A quick run: ``--objects 50000 --nodes 500 --expire 200 --kills 3``.
Everything started is stopped, and the scratch directory removed, on any
exit (Ctrl-C included); ``--keep`` keeps the directory and its logs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from node.devcluster import ClusterError
from node.wire.errors import RPCError
from tests.bench.failover import phases
from tests.bench.failover.cluster import Bench, Fleet, Heartbeat, applied_index, wait_for
from tests.bench.failover.probes import Watcher, Writer
from tests.bench.failover.report import render_all
from tests.bench.failover.state import Layout, build_snapshot
from tests.bench.failover.storm import revive, storm

REGISTER_TIMEOUT_S = 900.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=1_000_000, help="objects in the seeded state")
    p.add_argument("--nodes", type=int, default=5000, help="simulated nodes, all with live clients")
    p.add_argument("--expire", type=int, default=2000, help="nodes whose client process is killed at once")
    p.add_argument("--kills", type=int, default=3, help="leader kills for the median")
    p.add_argument("--write-rate", type=float, default=10.0, help="steady writes a second (the p99 probe)")
    p.add_argument("--before", type=float, default=60.0,
                   help="seconds of writes before each storm (the baseline: 600 calls at 10/s, so that its p99 is not its worst call)")
    p.add_argument("--min-ttl", type=float, default=10.0, help="[scheduler] min_heartbeat_ttl, seconds")
    p.add_argument("--grace", type=float, default=5.0, help="[scheduler] heartbeat_grace, seconds")
    p.add_argument("--failover-ttl", type=float, default=30.0, help="[scheduler] failover_heartbeat_ttl, seconds")
    p.add_argument("--max-heartbeats", type=float, default=1000.0, help="[scheduler] max_heartbeats_per_second")
    p.add_argument("--no-kill-storm", action="store_true", help="skip the storm with a leader kill")
    p.add_argument("--json", default="", help="also write the figures to this file")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, data)")
    args = p.parse_args(argv)
    if not 0 < args.expire < args.nodes:
        p.error("--expire must be between 1 and --nodes - 1 (the rest stay live)")
    return args


def _say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def _start(bench: Bench, args: argparse.Namespace, layout: Layout, hb: Heartbeat, results: dict[str, Any]) -> None:
    _say(f"building {args.objects:,} objects on {layout.nodes:,} nodes ({layout.jobs:,} jobs)")
    snap, objects, seconds = build_snapshot(str(bench.dir), layout)
    results["state"] = {**layout.to_json(), "objects_built": objects, "build_s": seconds}
    _say(f"built {objects:,} objects in {seconds:.1f} s; restoring into 3 servers")
    t0 = time.monotonic()
    info = bench.up(hb, snap, timeout=600)
    os.remove(snap)  # each server holds its own copy now
    results["state"]["restore_s"] = time.monotonic() - t0
    results["state"]["snapshot_index"] = info["index"]
    _say(f"restored at index {info['index']:,} in {results['state']['restore_s']:.1f} s; starting the fleets")
    live = args.nodes - args.expire
    fleets = [bench.start_fleet("live", 0, live, layout.node_cpu, layout.node_memory_mb),
              bench.start_fleet("lost", live, args.expire, layout.node_cpu, layout.node_memory_mb)]
    for fleet in fleets:
        def ready(f: Any = fleet) -> bool:
            if f.proc.poll() is not None:
                raise RuntimeError(f"fleet {f.name} exited (code {f.proc.returncode}); see {bench.dir}/fleet-{f.name}.log")
            return f.registered()
        took = wait_for(f"fleet {fleet.name} registered", ready, REGISTER_TIMEOUT_S, 0.5)
        _say(f"fleet {fleet.name}: {fleet.count:,} nodes registered and heartbeating ({took:.1f} s)")


def run(bench: Bench, args: argparse.Namespace, results: dict[str, Any]) -> None:
    hb = Heartbeat(args.min_ttl, args.max_heartbeats, args.grace, args.failover_ttl)
    layout = Layout.plan(args.objects, args.nodes)
    results["config"] = {**vars(args), "heartbeat": asdict(hb)}
    _say(f"heartbeats: {hb.toml().splitlines()[1:]}")
    _start(bench, args, layout, hb, results)
    watcher = Watcher(bench.addresses, applied_index(bench))
    writer = Writer(bench.addresses, args.write_rate)
    try:
        _phases(bench, args, layout, hb, watcher, writer, results)
    finally:
        writer.stop()
        watcher.stop()


def _phase(results: dict[str, Any], key: str, fn: Callable[[], dict[str, Any]]) -> bool:
    """Run one measurement; a failure is recorded under ``key`` (and printed) and the run goes on."""
    try:
        results[key] = fn()
        return True
    except (TimeoutError, ClusterError, RPCError, RuntimeError) as exc:
        results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        _say(f"{key} failed: {results[key]['error']}")
        return False


def _phases(bench: Bench, args: argparse.Namespace, layout: Layout, hb: Heartbeat, watcher: Watcher, writer: Writer,
            results: dict[str, Any]) -> None:
    _say("follower restart -> first stale read")
    _phase(results, "follower_restart", lambda: phases.follower_restart(bench))
    _say(f"leader kill -> first write, {args.kills} times")
    _phase(results, "leader_kills", lambda: phases.leader_kills(bench, args.kills))
    live, lost = bench.fleets
    _say(f"storm: a quiet baseline, then the {lost.count:,}-node fleet killed")
    _phase(results, "storm", lambda: storm(bench, lost, live, watcher, writer, layout, hb, leader_kill=False,
                                           before_s=args.before, first=True))
    _say(f"storm: {_down_line(results['storm'])}")
    if args.no_kill_storm:
        return
    _say("reviving the lost fleet's nodes")
    revived: list[Fleet] = []

    def bring_back() -> dict[str, Any]:
        t0 = time.monotonic()
        revived.append(revive(bench, watcher, lost, "lost-2", layout, REGISTER_TIMEOUT_S))
        return {"fleet": revived[0].name, "seconds": time.monotonic() - t0}

    if not _phase(results, "revive", bring_back):
        return
    _say("storm with a leader kill: a quiet baseline, then the fleet killed again")
    _phase(results, "storm_kill", lambda: storm(bench, revived[0], live, watcher, writer, layout, hb, leader_kill=True,
                                                before_s=args.before, first=False))
    _say(f"storm+kill: {_down_line(results['storm_kill'])}")


def _down_line(storm_result: dict[str, Any]) -> str:
    if "error" in storm_result:
        return "failed"
    if storm_result["all_down_s"] is None:
        return f"only {storm_result['down']:,} down"
    return f"all down after {storm_result['all_down_s']:.2f} s"


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    results: dict[str, Any] = {}
    bench = Bench(keep=args.keep)
    failed, code = True, 1
    try:
        run(bench, args, results)
        failed = False
        code = 1 if any(isinstance(v, dict) and "error" in v for v in results.values()) else 0
    except KeyboardInterrupt:
        print("interrupted; stopping everything", file=sys.stderr)
        failed = False  # nothing to look into: clean up as after a run
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.close(failed)
        _print(results, args)
    return code


def _print(results: dict[str, Any], args: argparse.Namespace) -> None:
    state = results.get("state")
    if state:
        print(f"\nstate: {state['objects_built']:,} objects, {state['nodes']:,} nodes ({args.nodes - args.expire:,} + "
              f"{args.expire:,} in two fleet processes), {state['jobs']:,} jobs x {state['allocs_per_job']} allocs; "
              f"built in {state['build_s']:.1f} s, restored in {state.get('restore_s', float('nan')):.1f} s")
        print(f"heartbeats: min_heartbeat_ttl {args.min_ttl:g} s, heartbeat_grace {args.grace:g} s, "
              f"failover_heartbeat_ttl {args.failover_ttl:g} s, max_heartbeats_per_second {args.max_heartbeats:g}; "
              f"steady writer {args.write_rate:g}/s\n")
    print(render_all(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
