"""The table: our figures beside Kueue's published means, and same-run baselines as ratios."""

from __future__ import annotations

from tests.bench.queues.plan import Plan
from tests.bench.queues.run import RunResult

# kubernetes-sigs/kueue test/performance/scheduler/configs/baseline/rangespec.yaml:
# the means of 5 runs, and the thresholds its checker enforces.
KUEUE = {
    "wall": (351.116, 425.0),
    "usage": (58.7, 55.0),
    "large": (6.666, 11.0),
    "medium": (76.768, 90.0),
    "small": (215.468, 260.0),
}


def render(plan: Plan, queued: RunResult, baseline: RunResult | None, *, fsync: bool) -> str:
    f = queued.figures
    out = [
        f"Kueue's baseline scheduler benchmark on Caravan: {len(plan.queues())} queues in {plan.cohorts} cohorts, "
        f"{f.workloads} workloads (scale {plan.scale:g}), 3 servers (fsync={fsync}), simulated clients",
        f"finished {f.finished}/{f.workloads}; evictions (preemptions) {f.evictions}",
        "",
        f"{'figure':<34} {'Caravan':>9} {'Kueue mean':>11} {'threshold':>10} {'vs mean':>8}  better?",
    ]

    def row(label: str, ours: float, key: str, unit: str, higher_better: bool = False) -> None:
        mean, limit = KUEUE[key]
        better = ours > mean if higher_better else ours < mean
        ratio = ours / mean if mean else 0.0
        out.append(f"{label:<34} {ours:>8.1f}{unit} {mean:>10.1f}{unit} {limit:>9.0f}{unit} "
                   f"{ratio:>7.2f}x  {'yes' if better else 'NO'}")  # fmt: skip

    row("wall time", f.wall_s, "wall", "s")
    row("minimum queue usage (class cq)", f.usage_pct, "usage", "%", higher_better=True)
    for cls in ("large", "medium", "small"):
        if cls in f.admission_s:
            row(f"avg time to admission, {cls}", f.admission_s[cls], cls, "s")
    wins = sum(
        [f.wall_s < KUEUE["wall"][0], f.usage_pct > KUEUE["usage"][0]]
        + [f.admission_s.get(c, 1e9) < KUEUE[c][0] for c in ("large", "medium", "small")]
    )
    out.append(f"better than Kueue's mean on {wins} of 5 figures"
               + (" (Kueue's means are for the full scale)" if plan.scale != 1 else ""))  # fmt: skip
    out += ["", "same run, for scale (ratios travel between machines better than seconds):"]
    ideal = plan.ideal_wall_s
    kueue = f", Kueue {KUEUE['wall'][0] / ideal:.2f}x" if plan.scale == 1 else ""
    out.append(f"  ideal wall time (work {plan.unit_seconds:,.0f} unit-s / {plan.nominal_units} units): "
               f"{ideal:.1f}s; Caravan {f.wall_s / ideal:.2f}x ideal{kueue}")  # fmt: skip
    out.append(
        f"  generation alone (slowest workload set, Kueue's pacing): {plan.generation_s:.0f}s"
    )
    if baseline is not None:
        b = baseline.figures
        out.append(f"  no-queue baseline, same {b.workloads} jobs and pacing, fresh cluster: wall {b.wall_s:.1f}s; "
                   f"queued/no-queue {f.wall_s / b.wall_s:.2f}x")  # fmt: skip
        turn = ", ".join(
            f"{c} {b.turnaround_s[c]:.2f}s"
            for c in ("large", "medium", "small")
            if c in b.turnaround_s
        )
        out.append(f"  no-queue register -> finished, mean: {turn}")
    out.append(f"  usage: least of the {len(plan.queues())} queues' own averages {f.min_queue_usage_pct:.1f}%; "
               f"work done (request x runtime) over nominal x window {f.useful_usage_pct:.1f}%")  # fmt: skip
    send = ", ".join(f"{c} {f.admission_from_send_s[c]:.2f}s" for c in ("large", "medium", "small")
                     if c in f.admission_from_send_s)  # fmt: skip
    out.append(f"  time to admission from the register call instead of the entry: {send}")
    turn = ", ".join(
        f"{c} {f.turnaround_s[c]:.2f}s" for c in ("large", "medium", "small") if c in f.turnaround_s
    )
    out.append(f"  queued register -> finished, mean: {turn}")
    for res in (queued, baseline):
        if res is not None and res.figures.breakdown:
            steps = "; ".join(f"{k} {v:.3f}s" for k, v in res.figures.breakdown.items())
            out.append(
                f"  after admission ({'queued' if res.queued else 'no-queue'}), mean: {steps}"
            )
    for res in (queued, baseline):
        if res is None:
            continue
        w = res.stats.get("Workers") or {}
        lat = w.get("EvalLatencyMs") or {}
        out.append(
            f"  leader's scheduler, {'queued' if res.queued else 'no-queue'} run: "
            f"{w.get('EvalsProcessed', '?')} evals, latency p50 {lat.get('P50', '?')} ms "
            f"p99 {lat.get('P99', '?')} ms, plan conflicts {w.get('PlanConflicts', '?')}"
        )
        cpu = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(res.cpu_s.items()))
        out.append(f"  cpu seconds during the {'queued' if res.queued else 'no-queue'} run: {cpu}")
    return "\n".join(out)
