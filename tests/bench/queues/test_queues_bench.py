"""Checks of ``make bench-queues``: the figures' arithmetic, and the harness end to end at scale 0.1.

The full run (15,000 workloads, minutes) stays out of ``make test``; the
cluster test runs the same code on 1,500 workloads (no baseline run), in
about half a minute.
"""

from __future__ import annotations

import pytest

from tests.bench.queues import __main__ as bench
from tests.bench.queues.metrics import Tracks, figures
from tests.bench.queues.plan import CLASSES, Plan, class_of, job_id, job_spec

S = 1_000_000_000


def wl(state: str, create: float, modify: float, admitted: float = 0.0, cpu: int = 1000) -> dict:
    return {"state": state, "create_time": int(create * S), "modify_time": int(modify * S),
            "admitted_time": int(admitted * S), "usage": {"cpu": cpu, "memory": 16}}  # fmt: skip


def test_plan_is_kueues_baseline() -> None:
    plan = Plan()
    assert plan.workloads == 15_000 and len(plan.queues()) == 30 and plan.nominal_units == 600
    assert plan.unit_seconds == 39_600 and round(plan.ideal_wall_s) == 66
    assert Plan(scale=0.1).workloads == 1_500
    small = CLASSES[0]
    spec = job_spec("cq-0-1-cohort-2", small, 7, queued=True)
    assert spec["ID"] == "cq-0-1-cohort-2-small-7" and class_of(spec["ID"]) == "small"
    assert (
        spec["Queue"] == "cq-0-1-cohort-2"
        and spec["TaskGroups"][0]["Tasks"][0]["Resources"]["CPU"] == 1000
    )
    assert "Queue" not in job_spec("q", small, 0, queued=False)


def test_figures_follow_kueues_definitions() -> None:
    """Usage integrates what is admitted (an eviction ends an interval); admission is the last one."""
    # one queue: 1 small, 1 medium, 1 large
    plan = Plan(scale=1 / 350, cohorts=1, queues_per_cohort=1)
    q = plan.queues()[0][0]
    small, large = job_id(q, CLASSES[0], 0), job_id(q, CLASSES[2], 0)
    t = Tracks()
    t.workload(small, wl("pending", 1, 1))
    t.workload(small, wl("admitted", 1, 2, admitted=2))
    t.workload(large, wl("pending", 1, 3, cpu=20_000))
    t.workload(small, wl("pending", 1, 3, admitted=2))  # evicted at 3
    t.workload(large, wl("admitted", 1, 3, admitted=3, cpu=20_000))
    t.workload(large, wl("finished", 1, 5, admitted=3, cpu=20_000))
    t.workload(small, wl("admitted", 1, 5, admitted=5))
    t.workload(small, wl("finished", 1, 6, admitted=5))
    f = figures(plan, t, 0.0, {small: 0.5}, queued=True)
    assert f.finished == 2 and f.evictions == 1 and f.wall_s == 6
    # (1 unit x (1 s + 1 s) + 20 units x 2 s) / (20 nominal x 6 s)
    assert f.usage_pct == pytest.approx(100 * 42 / 120)
    assert f.admission_s == {"small": 4.0, "large": 2.0}
    assert f.admission_from_send_s == {"small": 4.5}


@pytest.mark.cluster
@pytest.mark.slow  # a whole run (CI time): `make test-slow`
def test_bench_runs_end_to_end_at_a_tenth(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench.main(["--scale", "0.1", "--no-baseline", "--progress", "0", "--timeout", "240"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "finished 1500/1500" in out
    for label in ("wall time", "minimum queue usage", "time to admission, large",
                  "time to admission, medium", "time to admission, small", "ideal wall time"):  # fmt: skip
        assert label in out, out
