"""Short fault-injection runs on real clusters (CI's campaign), and the must-fail run.

Fixed seeds, 15 s of faults each, so the whole file stays near two minutes
on a 2-core machine; ``make jepsen`` runs the long version. The must-fail
test turns on the FSM's test-only exactly-once bug
(``CARAVAN_UNSAFE_SKIP_APPLIED_INDEX_CHECK``) and shows the same campaign that
passes without it reports the anomaly: a checker that never fails proves
nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen_like.runner import EXIT_ANOMALY, EXIT_OK
from node.devcluster import Cluster, alive
from tests.conditions import wait_until
from tests.jepsen.support import short_run

pytestmark = pytest.mark.cluster

UNSAFE_REAPPLY = "CARAVAN_UNSAFE_SKIP_APPLIED_INDEX_CHECK"
ROOT = Path(__file__).resolve().parents[2]


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
    r = short_run(out, seed, nemeses, quiet=quiet)
    assert r.code == EXIT_OK, r.explain()
    assert r.faults and all(f["kind"] in nemeses and f["end"] is not None for f in r.faults)
    assert r.checker("linearizability")["operations"] > min_ops
    assert r.checker("set")["details"]["acknowledged"] > min_ops // 5
    assert r.checker("journal")["status"] == "ok", r.explain()
    for name in ("summary.txt", "timeline.html", "history-register.jsonl", "history-set.jsonl", "journal.jsonl"):
        assert (out / name).stat().st_size > 0, name


def test_lifecycle_under_faults_collects_safely(tmp_path: Path) -> None:
    """Jobs run on simulated clients, finish, and are collected by periodic and forced GC."""
    out = tmp_path / "lifecycle"
    r = short_run(out, 14, ["kill", "partition"], workloads=["lifecycle", "journal"])
    assert r.code == EXIT_OK, r.explain()
    gc = r.checker("gc-safety")
    assert gc["status"] == "ok" and gc["details"]["collected_jobs"] > 5, r.explain()


def test_a_killed_simulated_client_loses_its_allocs_and_comes_back(tmp_path: Path) -> None:
    """The client-kill nemesis: the servers mark the dead client's nodes down (its allocs lost and
    replaced once it is back on the same node ids), and the run stays clean."""
    out = tmp_path / "client-kill"
    r = short_run(out, 15, ["client-kill"], workloads=["lifecycle", "journal"], time=25.0, quiet=(1.0, 2.0))
    assert r.code == EXIT_OK, r.explain()
    kills = [f for f in r.faults if f["kind"] == "client-kill"]
    assert kills and all(f["end"] is not None for f in kills), r.faults
    assert "restarted the simulated client" in kills[0]["detail"] and "not all down" not in kills[0]["detail"], kills[0]
    assert r.checker("gc-safety")["status"] == "ok", r.explain()


def test_campaign_reports_broken_exactly_once(tmp_path: Path) -> None:
    """The deliberate bug makes a restarted replica re-apply its log; the run must say so."""
    out = tmp_path / "buggy"
    r = short_run(out, 21, ["kill"], time=12.0, server_env={UNSAFE_REAPPLY: "1"})
    assert r.code == EXIT_ANOMALY, r.explain()
    convergence = r.checker("convergence")
    assert convergence["status"] == "anomaly" and "DIVERGED" in convergence["summary"], r.explain()
    assert "verdict: ANOMALY" in (out / "summary.txt").read_text()

    control = tmp_path / "control"  # the same campaign without the bug is clean
    r = short_run(control, 21, ["kill"], time=12.0)
    assert r.code == EXIT_OK, r.explain()


def test_sigterm_stops_a_run_and_every_server_it_started(tmp_path: Path) -> None:
    """A CI timeout or ``kill`` used to end the harness and leave its three servers running."""
    out = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-m", "jepsen_like", "run", "--out", str(out), "--time", "60", "--nemesis", "kill"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        state = out / "cluster" / "cluster.json"
        wait_until(lambda: state.exists() and all(alive(n.pid) for n in Cluster.load(str(state.parent)).nodes),
                   60, "the run's cluster to be up")
        pids = [n.pid for n in Cluster.load(str(state.parent)).nodes]
        harness.send_signal(signal.SIGTERM)
        _, err = harness.communicate(timeout=60)
    finally:
        if harness.poll() is None:
            harness.kill()
    assert harness.returncode != 0, err
    assert "Traceback" not in err
    try:
        wait_until(lambda: not any(alive(pid) for pid in pids), 10, "the run's servers to stop")
    finally:
        for pid in pids:  # on failure, do not leave them to the rest of the suite
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_drained_node_is_emptied_and_opened_again_under_the_lifecycle_workload(tmp_path: Path) -> None:
    """The drain nemesis: a node of the simulated client is drained while jobs run, completes
    (or is ended after its wait), and is opened again; the run stays clean."""
    out = tmp_path / "drain"
    r = short_run(out, 17, ["drain"], workloads=["lifecycle", "journal"], time=25.0, quiet=(1.0, 2.0))
    assert r.code == EXIT_OK, r.explain()
    drains = [f for f in r.faults if f["kind"] == "drain"]
    assert drains and all(f["end"] is not None for f in drains), r.faults
    assert any("drain complete (seen" in f["detail"] for f in drains), drains
    assert r.checker("gc-safety")["status"] == "ok", r.explain()
