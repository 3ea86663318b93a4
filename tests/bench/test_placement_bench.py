"""Smoke test of ``make bench-placement``: the density part on a tiny trace, in a few seconds.

The full benchmark (and its cluster parts) stays out of CI; this checks that
the trace, the replay through the real Selector and the table still work.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.bench import placement_bench
from tests.bench.placement import clusterkit as ck
from tests.bench.placement import density as dens
from tests.bench.placement import latency
from tests.bench.placement import trace as tr


def test_density_part_prints_a_row_per_bucket_count(capsys: pytest.CaptureFixture[str]) -> None:
    code = placement_bench.main(["--only", "density", "--vms", "300", "--incremental-vms", "400", "--days", "1",
                                 "--mean-life", "0.5"])
    out = capsys.readouterr().out
    assert code == 0, out
    for mode in ("eval", "incremental"):
        assert f"Packing density, {mode} mode" in out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("1", "3", "5", "unlimited")]
    assert [r[0] for r in rows] == ["1", "3", "5", "unlimited"] * 2
    for row in rows:
        density = float(row[1].rstrip("%")) / 100
        assert 0 < density <= 1
        assert row[2] in ("83.5%", "86.3%", "87.8%", "89.1%")  # Protean's figure beside ours
    assert "ordering:" in out and "target" in out


def test_replay_frees_departures_and_keeps_density_in_range() -> None:
    trace = tr.generate(200, 1.0, 0.2, seed=3)
    machines = dens.machines_for(trace, 0.9)
    r = dens.replay(trace, machines, "3", 3, mode="eval", warmup=0.2)
    assert r.placed + sum(r.failed.values()) == len(trace.vms)
    assert 0 < r.density <= 1 and 0 < r.utilization <= r.density + 1e-9
    assert 0 < r.peak_fill <= 1


def test_trace_round_trips_through_the_azure_schema(tmp_path) -> None:
    trace = tr.generate(100, 1.0, 0.5, seed=5)
    path = str(tmp_path / "trace.sqlite")
    tr.write(trace, path)
    with sqlite3.connect(path) as db:
        cols = [c[1] for c in db.execute("PRAGMA table_info(vm)")]
    assert cols == ["vmId", "tenantId", "vmTypeId", "priority", "starttime", "endtime"]
    back = tr.read(path)
    assert [(v.vm_id, v.vm_type_id, v.priority) for v in back.vms] == [(v.vm_id, v.vm_type_id, v.priority) for v in trace.vms]
    assert set(back.types) == set(trace.types)


def test_request_mix_is_protean_like() -> None:
    reqs = latency.request_mix(5000, seed=1, prefix="r")
    single = sum(1 for r in reqs if r.count == 1) / len(reqs)
    repeat = sum(1 for a, b in zip(reqs, reqs[1:], strict=False) if (a.cpu, a.memory_mb) == (b.cpu, b.memory_mb)) / (len(reqs) - 1)
    assert 0.92 < single < 0.96
    assert 0.77 < repeat < 0.83


@pytest.mark.slow
@pytest.mark.cluster
def test_cluster_parts_print_their_tables_and_leave_nothing_behind(capsys: pytest.CaptureFixture[str]) -> None:
    """Both cluster parts at toy sizes (tens of seconds; not in `make test`)."""
    code = placement_bench.main(["--only", "latency,c1m", "--sizes", "200", "--latency-requests", "10", "--requests", "50",
                                 "--phase-seconds", "20", "--raw", "200", "--c1m-nodes", "100", "--c1m-allocs", "1000",
                                 "--c1m-jobs", "4", "--c1m-seconds", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert any(line.split()[:1] == ["200"] for line in out.splitlines() if line.strip())
    assert "end to end: register -> all reported running" in out
    assert "CPU ms/placement at 200 nodes, every process of the run: leader" in out
    assert "Nomad" in out and "Protean" in out


def test_cache_figures_are_read_by_name_and_summed_over_phases() -> None:
    warm = {"Workers": {"Placement": {"CacheHits": 45, "CacheMisses": 5, "RescoredOnHit": 135, "RescoredOnMiss": 150005,
                                      "RescoredPerMiss": 30001.0, "PlanMsOnMissP50": 340.0}}}
    hot = {"Workers": {"Placement": {"CacheHits": 1000, "CacheMisses": 0, "RescoredOnHit": 3000, "RescoredOnMiss": 0,
                                     "RescoredPerMiss": 0.0, "PlanMsOnMissP50": 0.0}}}
    both = ck.cache_figures([warm, hot])
    assert both["hit_rate"][1] == pytest.approx(1045 / 1050)
    assert both["rescored_hit"][1] == pytest.approx(3135 / 1045)
    assert both["rescored_miss"][1] == pytest.approx(30001)
    assert both["miss_ms"][1] == 340.0  # from the phase that had misses
    assert ck.cache_figures([hot])["rescored_miss"] is None  # no miss at all: n/a, not 0
    assert ck.cache_figures([{"Workers": {"Placements": 3}}]) == {
        "hit_rate": None, "rescored_hit": None, "rescored_miss": None, "miss_ms": None}


def test_cpu_seconds_reads_a_process_and_is_nan_for_none() -> None:
    import os

    own = ck.cpu_seconds(os.getpid())
    assert own == own and own >= 0  # a number, not NaN
    assert ck.cpu_seconds(2**22 + 12345) != ck.cpu_seconds(2**22 + 12345)  # no such process: NaN
