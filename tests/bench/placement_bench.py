"""Placement benchmark (issue 36): packing density, latency and throughput at scale, and C1M at home.

    python -m tests.bench.placement_bench [--only density,latency,c1m] [--keep] [--fsync] [--workers N]
        density:  [--density-mode eval,incremental] [--vms 8000] [--incremental-vms 60000] [--days 4]
                  [--mean-life 2] [--fill 0.9] [--machines 0] [--warmup 0.25] [--then RULE,...]
                  [--buckets 1,3,5,unlimited] [--trace FILE] [--save-trace FILE]
        latency:  [--sizes 1000,10000,30000,100000] [--latency-requests 100] [--requests 2000] [--window 64]
                  [--phase-seconds 45] [--raw 2000]
        c1m:      [--c1m-nodes 5000] [--c1m-allocs 100000] [--c1m-jobs 100] [--c1m-seconds 300]

Three parts, each printed as a table with the published anchor beside our
figure and the target (see ``tests/bench/placement/``):

1. **density** (in process, the real Selector and rules): a synthetic trace in
   the AzurePackingTraceV1 schema, BestFit in 1, 3, 5 and unlimited buckets,
   beside Protean's 83.5 / 86.3 / 87.8 / 89.1%;
2. **latency** (a real local cluster per size): per-placement latency,
   sustained placements/s, cache figures and leader memory at 1,000, 10,000
   and 30,000 simulated nodes (and 100,000 when memory allows), beside
   Protean's 20 ms / 2,000 per s / 1 GiB per 10,000 servers;
3. **c1m** (a real local cluster): 100,000 allocations on 5,000 simulated
   nodes end to end, beside Nomad's C1M (~3,750/s) and C2M (~1,500/s).

The cluster parts print ratios against the raw write throughput of the same
run — the cluster's own small-write path (pipelined node re-registrations,
as lifecycle_bench measures it) — since absolute figures on a shared 2-core
machine vary between runs. The default run takes five to ten minutes on 2
cores (each phase is bounded by time); CI does not run it (a
small smoke test, tests/bench/test_placement_bench.py, does). Every cluster
part removes its directory unless ``--keep``, keeps it and says where it
failed on a failure, and stops every process it started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from tests.bench.placement import density as dens
from tests.bench.placement import trace as tr

PARTS = ("density", "latency", "c1m")


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "").replace(",", "")) for x in text.split(",") if x.strip()]


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parser() -> argparse.ArgumentParser:
    head, _, rest = (__doc__ or "").partition("\n")
    ap = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", type=_names, default=PARTS, help="parts to run, comma-separated: density,latency,c1m")
    ap.add_argument("--keep", action="store_true", help="keep each cluster's directory (data and logs)")
    ap.add_argument("--fsync", action="store_true", help="servers with fsync = true (the config default; off here as in lifecycle_bench)")
    ap.add_argument("--workers", type=int, default=None, help="scheduler workers on the leader (default: the config's)")
    ap.add_argument("--seed", type=int, default=1)
    d = ap.add_argument_group("density")
    d.add_argument("--density-mode", type=_names, default=("eval", "incremental"),
                   help="eval: a fresh Selector per arrival (as a one-request eval); incremental: one Selector for the trace")
    d.add_argument("--vms", type=int, default=8000, help="arrivals in the eval-mode trace (about: a Poisson count)")
    d.add_argument("--incremental-vms", type=int, default=60000, help="arrivals in the incremental-mode trace")
    d.add_argument("--days", type=float, default=4.0, help="trace length (days)")
    d.add_argument("--mean-life", type=float, default=2.0, help="mean VM lifetime (days; Lomax, heavy-tailed)")
    d.add_argument("--fill", type=float, default=0.9, help="machines: the trace's peak fills this share of their cores")
    d.add_argument("--machines", type=int, default=0, help="machines (0: from --fill)")
    d.add_argument("--warmup", type=float, default=0.25, help="share of the trace before density is averaged")
    d.add_argument("--then", type=_names, default=(), help="preference rules after BestFit, e.g. prefer-non-empty-machines")
    d.add_argument("--buckets", type=_names, default=tuple(label for label, _b in dens.BUCKETS),
                   help="BestFit bucket counts to run: 1,3,5,unlimited")
    d.add_argument("--trace", default="", help="replay this AzurePackingTraceV1 SQLite file instead of a synthetic trace")
    d.add_argument("--save-trace", default="", help="write the (eval-mode) synthetic trace to this SQLite file")
    lat = ap.add_argument_group("latency")
    lat.add_argument("--sizes", type=_ints, default=[1000, 10000, 30000, 100000],
                     help="simulated nodes, one cluster per size (100,000 only if memory allows, estimated from the sizes before)")
    lat.add_argument("--latency-requests", type=int, default=100, help="requests in the closed-loop latency phase")
    lat.add_argument("--requests", type=int, default=2000, help="requests in the throughput phase")
    lat.add_argument("--window", type=int, default=64, help="registrations in flight in the throughput phase")
    lat.add_argument("--phase-seconds", type=float, default=45.0, help="bound on each phase (latency, throughput)")
    lat.add_argument("--raw", type=int, default=2000, help="writes in each raw write throughput phase")
    c = ap.add_argument_group("c1m")
    c.add_argument("--c1m-nodes", type=int, default=5000)
    c.add_argument("--c1m-allocs", type=int, default=100_000)
    c.add_argument("--c1m-jobs", type=int, default=100)
    c.add_argument("--c1m-seconds", type=float, default=300.0, help="bound from the first register to all running")
    return ap


def density_part(a: argparse.Namespace) -> str:
    out = []
    labels = a.buckets
    known = [label for label, _b in dens.BUCKETS]
    if not labels or any(label not in known for label in labels):
        raise SystemExit(f"--buckets: choose from {','.join(known)}")
    for mode in a.density_mode:
        if mode not in ("eval", "incremental"):
            raise SystemExit(f"--density-mode: unknown mode {mode!r}; use eval and/or incremental")
        if a.trace:
            trace = tr.read(a.trace)
        else:
            trace = tr.generate(a.vms if mode == "eval" else a.incremental_vms, a.days, a.mean_life, a.seed)
            if a.save_trace and mode == "eval":
                tr.write(trace, a.save_trace)
        machines = a.machines or dens.machines_for(trace, a.fill)
        t0 = time.perf_counter()
        results = dens.run(trace, machines, mode, a.seed, a.warmup, a.then, labels)
        how = ("a fresh Selector over all machines per arrival, seeded per request (as a one-request eval)" if mode == "eval"
               else "one Selector for the whole trace (select/claim/release); its tie-break order is drawn once, "
                    "so ties go to machines in one fixed random order (first-fit-like)")
        rules = " > ".join(["best-fit(buckets)", *a.then, "random tie-break"])
        header = "\n".join([
            f"Packing density, {mode} mode: {how}",
            tr.describe(trace, a.mean_life),
            f"machines: {machines:,} x {tr.MACHINE_CORES} cores, 8 GiB/core ({'--machines' if a.machines else f'the peak fills {100 * a.fill:.0f}% of their cores'}); "
            f"rules: {rules}; density averaged over time after the first {100 * a.warmup:.0f}% of the trace; "
            f"{time.perf_counter() - t0:.0f}s",
        ])
        out.append(dens.report(results, trace, header))
    return "\n\n".join(out)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return run(a)
    # SIGTERM (timeout, a cancelled job) unwinds like Ctrl-C, so every cluster
    # part still stops the process groups it started and says where it was.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(a)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(a: argparse.Namespace) -> int:
    unknown = [p for p in a.only if p not in PARTS]
    if unknown:
        raise SystemExit(f"--only: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"placement benchmark: {os.cpu_count()} CPUs, load {load:.2f} at start; parts: {', '.join(a.only)}", flush=True)
    started = time.monotonic()
    failed = False
    for part in a.only:
        print(f"== {part}", flush=True)
        print(f"== {part} (progress on stderr)", file=sys.stderr, flush=True)
        t = time.monotonic()
        try:
            if part == "density":
                text = density_part(a)
            elif part == "latency":
                from tests.bench.placement import latency

                text, ok = latency.run(a)
                failed |= not ok
            else:
                from tests.bench.placement import c1m

                text = c1m.report(c1m.run(a), a)
        except Exception as exc:  # noqa: BLE001 - the other parts still run; the failure is printed
            failed = True
            text = f"{part}: FAILED after {time.monotonic() - t:.0f}s: {type(exc).__name__}: {exc}"
        print(f"{text}\n({part}: {time.monotonic() - t:.0f}s)\n", flush=True)
    print(f"({time.monotonic() - started:.0f}s in all{'; a part FAILED' if failed else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
