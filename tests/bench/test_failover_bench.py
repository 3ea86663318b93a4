"""Quick checks of ``make bench-failover``'s parts that need no cluster (the run itself takes minutes).

The state builder and its layout (which jobs a lost node range hurts), the
"all down" bound read from a fleet's heartbeat log, the eval counting and
the table are checked here; the cluster parts run only in the benchmark.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import cast

from fsm.machine import FSM
from tests.bench.failover.cluster import Fleet, Heartbeat
from tests.bench.failover.probes import EvalSeen, Watcher
from tests.bench.failover.report import render_all
from tests.bench.failover.state import Layout, build, job_id, node_id
from tests.bench.failover.storm import storm_evals, ttl_bound


def test_built_state_has_the_layouts_nodes_and_allocs(tmp_path: Path) -> None:
    layout = Layout.plan(2_000, 10)
    fsm = FSM(str(tmp_path / "s"))
    try:
        build(fsm, layout)
        with fsm.read() as r:
            assert r.node(node_id(9)) is not None and r.node(node_id(10)) is None
            allocs = list(r.allocs_by_node(node_id(3), terminal=False))
    finally:
        fsm.close()
    assert len(allocs) == layout.allocs_per_node
    assert all(a.client_status == "running" for a in allocs)
    assert layout.node_cpu == layout.allocs_per_node * 250


def test_affected_jobs_are_those_with_an_alloc_on_a_lost_node() -> None:
    layout = Layout(objects=0, nodes=1000, jobs=20, allocs_per_job=100)  # job j on nodes 100j .. 100j+99 (mod 1000)
    assert layout.affected_jobs(range(950, 1000)) == {job_id(9), job_id(19)}


def test_ttl_bound_is_the_latest_chunk_deadline_plus_grace(tmp_path: Path) -> None:
    events = tmp_path / "f.jsonl"
    lines = [{"event": "beat", "chunk": 0, "answered": 100.0, "ttl": 12.0},
             {"event": "beat", "chunk": 1, "answered": 104.0, "ttl": 15.0},
             {"event": "beat", "chunk": 0, "answered": 108.0, "ttl": 10.0},
             {"event": "beat", "chunk": 1, "answered": 130.0, "ttl": 15.0}]  # after the kill: not counted
    events.write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut by the ki")
    fleet = Fleet("lost", 0, 2, cast(subprocess.Popen, None), events)
    assert ttl_bound(fleet, killed_at=110.0, grace=5.0) == 104.0 + 15.0 + 5.0 - 110.0


def test_storm_evals_counts_per_job_per_entry_and_keeps_follow_ups_apart() -> None:
    watcher = Watcher.__new__(Watcher)  # no stream: only the bookkeeping
    watcher.evals = {
        "a": EvalSeen("job-1", "node-update", 11, "complete"),
        "b": EvalSeen("job-1", "node-update", 12, "complete"),
        "c": EvalSeen("job-2", "node-update", 12, "canceled"),
        "d": EvalSeen("job-2", "node-update", 13, "blocked", previous_eval="c"),
        "e": EvalSeen("fw-1", "job-register", 12, "complete"),
    }
    watcher.lock = threading.Lock()
    out = storm_evals(watcher, 10, {"job-1", "job-2", "job-3"}, {11, 12})
    assert out["evals"] == 3 and out["followups"] == 1
    assert out["max_evals_per_job_per_batch"] == 1
    assert out["affected_jobs_without_eval"] == 1
    assert out["other_triggers"] == {"job-register": 1}


def test_table_prints_targets_and_anchors() -> None:
    results = {"leader_kills": {"values_s": [0.7, 0.9, 1.1], "median_s": 0.9},
               "follower_restart": {"server": "server2", "seconds": 1.5}}
    out = render_all(results)
    assert "0.90 s" in out and "etcd 1.56-2.04 s" in out and "etcd 9.3 s at 1.2 GB" in out
    assert 'min_heartbeat_ttl = "10s"' in Heartbeat().toml()


def _storm_result(before_p99: float, during_p99: float, quiet: bool) -> dict:
    window = {"calls": 600, "failed": 0, "p50_ms": 5.0, "max_ms": 1.5 * max(before_p99, during_p99)}
    return {
        "leader_kill": None, "leader_changes": 0, "down": 10, "all_down_s": 16.0, "first_down_s": 12.0,
        "bound_s": 17.0, "monitor_pass_s": 1.0, "live_marked_down": 0, "down_batches": 1, "eval_batches": 1,
        "storm_entries": 1, "baseline_entries_per_s": 10.0, "entries_to_settled": 100, "entries_over_baseline": 5.0,
        "evals": 3, "affected_jobs": 3, "followups": 0, "other_triggers": {}, "max_evals_per_job_per_batch": 1,
        "affected_jobs_without_eval": 0, "evals_settled_s": 30.0, "elections": 0, "term_delta": 0,
        "before": {**window, "p99_ms": before_p99}, "during": {**window, "p99_ms": during_p99}, "quiet": quiet,
    }


def test_a_busy_baseline_gives_way_to_the_first_storms_quiet_one() -> None:
    # The storm+kill's own baseline ran while the broker was still busy (p99 500 ms): the
    # ratio is taken against the first storm's quiet baseline (50 ms), and the table says so.
    results = {"config": {"expire": 10}, "storm": _storm_result(50.0, 90.0, quiet=True),
               "storm_kill": _storm_result(500.0, 200.0, quiet=False)}
    out = render_all(results)
    assert "storm: write p99 during / before (50 ms)" in out and "1.80x" in out
    assert "storm+kill: write p99 during / the first storm's quiet baseline (the broker had not drained) (50 ms)" in out
    assert "4.00x" in out and "0.40x" not in out


def test_a_quiet_baseline_is_the_storms_own() -> None:
    results = {"config": {"expire": 10}, "storm": _storm_result(50.0, 90.0, quiet=True),
               "storm_kill": _storm_result(40.0, 60.0, quiet=True)}
    out = render_all(results)
    assert "storm+kill: write p99 during / before (40 ms)" in out and "1.50x" in out
