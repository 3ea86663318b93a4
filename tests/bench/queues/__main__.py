"""Kueue's baseline scheduler benchmark on a 3-server Caravan cluster (``make bench-queues``).

    python -m tests.bench.queues [--scale 1] [--no-baseline] [--fsync] [--timeout 900] [--keep]
                                 [--breakdown] [--server-config TOML] [--stall 60] [--json FILE]

5 cohorts of 6 queues (nominal 20 units, borrowing limit 100); per queue 350
small (1 unit, 200 ms), 100 medium (5, 500 ms) and 50 large (20, 1 s)
workloads, generated at Kueue's pace: 15,000 batch jobs run by the sim
driver. Prints the wall time, the minimum queue usage and the average time
to admission per class beside Kueue's published means, and, from the same
run, the ideal wall time and a no-queue baseline (the same jobs, no queue,
on a fresh cluster) as ratios. About five minutes on 2 cores;
``--scale 0.1`` (1,500 workloads) takes well under a minute.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import asdict

from tests.bench.queues.plan import Plan
from tests.bench.queues.report import render
from tests.bench.queues.run import Options, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the workload counts (0.1: 1,500 workloads)",
    )
    ap.add_argument(
        "--no-baseline", action="store_true", help="skip the no-queue run of the same jobs"
    )
    ap.add_argument(
        "--fsync",
        action="store_true",
        help="run the servers with fsync = true (the config default)",
    )
    ap.add_argument(
        "--timeout", type=float, default=900.0, help="seconds a run may take before it fails"
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the clusters' directories (data and logs)"
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also follow allocations and evals: where a workload's time goes after admission",
    )
    ap.add_argument(
        "--server-config",
        default="",
        metavar="TOML",
        help="extra top-level server settings, e.g. 'max_entry_size = \"60KiB\"'",
    )
    ap.add_argument(
        "--stall",
        type=float,
        default=60.0,
        help="fail a run once no workload has finished for this many seconds",
    )
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument(
        "--progress", type=float, default=10.0, help="seconds between progress lines (0: none)"
    )
    a = ap.parse_args(argv)
    if a.scale <= 0:
        ap.error("--scale must be > 0")
    plan = Plan(scale=a.scale)
    opts = Options(
        scale=a.scale,
        fsync=a.fsync,
        timeout=a.timeout,
        keep=a.keep,
        progress=a.progress,
        breakdown=a.breakdown,
        extra_config=a.server_config + "\n" if a.server_config else "",
        stall=a.stall,
    )
    print(f"queued run: {plan.workloads} workloads ...", file=sys.stderr, flush=True)
    queued = run(plan, opts, queued=True)
    baseline = None
    if not a.no_baseline:
        print(f"no-queue run: {plan.workloads} jobs ...", file=sys.stderr, flush=True)
        baseline = run(plan, opts, queued=False)
    print(render(plan, queued, baseline, fsync=a.fsync))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"queued": asdict(queued), "baseline": asdict(baseline) if baseline else None},
                f,
                indent=1,
            )
    return 0 if queued.figures.finished == queued.figures.workloads else 1


if __name__ == "__main__":
    # SIGTERM (``timeout``, a cancelled job) unwinds like Ctrl-C: the runs' clean-up stops their servers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main())
