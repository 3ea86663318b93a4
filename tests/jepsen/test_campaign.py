"""Short fault-injection runs on real clusters (CI's campaign), and the must-fail run.

Fixed seeds, 15 s of faults each, so the whole file stays near two minutes
on a 2-core machine; ``make jepsen`` runs the long version. The must-fail
test turns on the FSM's test-only exactly-once bug
(``CARAVAN_UNSAFE_SKIP_APPLIED_INDEX_CHECK``) and shows the same campaign that
passes without it reports the anomaly: a checker that never fails proves
nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jepsen_like.runner import EXIT_ANOMALY, EXIT_OK, RESULTS_FILE, RunOptions, run

pytestmark = pytest.mark.cluster

UNSAFE_REAPPLY = "CARAVAN_UNSAFE_SKIP_APPLIED_INDEX_CHECK"


def short_run(out: Path, seed: int, nemeses: list[str], **overrides: object) -> tuple[int, list[dict]]:
    settings: dict[str, object] = {
        "quiet": (1.0, 2.0),
        "hold": (1.5, 3.0),
        "workloads": ["register", "set", "journal"],
        "time": 15.0,
    } | overrides
    options = RunOptions(
        out=str(out),
        seed=seed,
        nemeses=nemeses,
        checker_timeout=60.0,
        convergence_wait=60.0,
        keep_cluster_data=False,
        **settings,  # type: ignore[arg-type]
    )
    code = run(options, log=lambda *_: None)
    results = json.loads((out / RESULTS_FILE).read_text())
    return code, results


def explain(results: list[dict], out: Path) -> str:
    return f"report in {out}: " + "; ".join(f"{r['checker']} {r['status']}: {r['summary']}" for r in results)


def by_checker(results: list[dict], checker: str) -> dict:
    return next(r for r in results if r["checker"] == checker)


@pytest.mark.parametrize(
    ("seed", "nemeses", "quiet", "min_ops"),
    [
        (11, ["kill", "pause"], (1.0, 2.0), 100),
        (12, ["partition"], (1.0, 2.0), 100),
        # A whole-cluster restart replays the log and elects a leader (seconds on
        # a busy 2-core machine): leave the cluster some time to serve between them.
        (13, ["kill-all"], (3.0, 4.0), 20),
    ],
    ids=["kill+pause", "partition", "kill-all"],
)
def test_short_campaign_finds_no_anomaly(
    tmp_path: Path, seed: int, nemeses: list[str], quiet: tuple[float, float], min_ops: int
) -> None:
    out = tmp_path / "run"
    code, results = short_run(out, seed, nemeses, quiet=quiet)
    assert code == EXIT_OK, explain(results, out)
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    assert faults and all(f["kind"] in nemeses and f["end"] is not None for f in faults)
    assert by_checker(results, "linearizability")["operations"] > min_ops
    assert by_checker(results, "set")["details"]["acknowledged"] > min_ops // 5
    assert by_checker(results, "journal")["status"] == "ok", explain(results, out)
    for name in ("summary.txt", "timeline.html", "history-register.jsonl", "history-set.jsonl", "journal.jsonl"):
        assert (out / name).stat().st_size > 0, name


def test_lifecycle_under_faults_collects_safely(tmp_path: Path) -> None:
    """Jobs run on simulated clients, finish, and are collected by periodic and forced GC."""
    out = tmp_path / "lifecycle"
    code, results = short_run(out, 14, ["kill", "partition"], workloads=["lifecycle", "journal"])
    assert code == EXIT_OK, explain(results, out)
    gc = by_checker(results, "gc-safety")
    assert gc["status"] == "ok" and gc["details"]["collected_jobs"] > 5, explain(results, out)


def test_campaign_reports_broken_exactly_once(tmp_path: Path) -> None:
    """The deliberate bug makes a restarted replica re-apply its log; the run must say so."""
    out = tmp_path / "buggy"
    code, results = short_run(out, 21, ["kill"], time=12.0, server_env={UNSAFE_REAPPLY: "1"})
    assert code == EXIT_ANOMALY, explain(results, out)
    convergence = by_checker(results, "convergence")
    assert convergence["status"] == "anomaly" and "DIVERGED" in convergence["summary"], explain(results, out)
    assert "verdict: ANOMALY" in (out / "summary.txt").read_text()

    control = tmp_path / "control"  # the same campaign without the bug is clean
    code, results = short_run(control, 21, ["kill"], time=12.0)
    assert code == EXIT_OK, explain(results, control)
