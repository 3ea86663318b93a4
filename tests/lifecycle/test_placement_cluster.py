"""The leader's placement index on a real cluster: repeated shapes hit the trait cache, the
counters reach ``scheduler.stats``, and a placement failure is still explained per rule."""

from __future__ import annotations

from typing import Any

import pytest

from tests.lifecycle.conftest import Env, wait_until

pytestmark = pytest.mark.cluster


def batch(job_id: str, *, count: int = 1, cpu: int = 100, mem: int = 64, dc: str = "dc1") -> dict[str, Any]:
    return {
        "ID": job_id,
        "Type": "batch",
        "Datacenters": [dc],
        "TaskGroups": [{"Name": "g", "Count": count,
                        "Tasks": [{"Name": "t", "Driver": "sim", "Config": {"run_for": "10m"}, "Resources": {"CPU": cpu, "MemoryMB": mem}}]}],
    }


def evals_of(env: Env, job_id: str) -> list[dict[str, Any]]:
    return env.read("eval.list", {"job_id": job_id})


def test_repeated_shapes_hit_the_trait_cache_and_failures_are_explained(lifecycle_env: Env) -> None:
    env = lifecycle_env
    env.call("scheduler.stats", {"reset": True})
    ids = [f"shape-{i}" for i in range(5)]
    for job_id in ids:
        env.call("job.register", {"job": batch(job_id)})
    wait_until(lambda: all(any(e["Status"] == "complete" for e in evals_of(env, j)) for j in ids), 60, "the five evals complete")
    stats = env.call("scheduler.stats", {})
    placement = stats["Workers"]["Placement"]
    assert placement["Placements"] >= 5, placement
    assert placement["CacheHits"] >= 4, f"one shape: one ranking built, then found: {placement}"
    assert placement["RescoredPerHit"] < 3, f"a hit rescores only the nodes changed since: {placement}"
    index = stats["PlacementIndex"]
    assert index["Nodes"] >= 3 and index["Traits"] >= 1 and index["Rebuilds"] >= 1, index
    assert "ConflictRate" in stats["Workers"] and stats["Workers"]["TopK"] >= 1

    # Nowhere to go: `eval status` still says, per rule, why the nodes were filtered.
    env.call("job.register", {"job": batch("too-big", mem=10_000_000)})
    env.call("job.register", {"job": batch("elsewhere", dc="dc9")})
    for job_id, reasons in (("too-big", ["asks more memory (10000000 MB) than any node has", "resources exhausted (memory)"]),
                            ("elsewhere", ["missing datacenter"])):
        blocked = wait_until(lambda job_id=job_id: [e for e in evals_of(env, job_id) if e["Status"] == "blocked"], 60, "a blocked eval")
        shown = env.cli("eval", "status", blocked[0]["ID"])
        assert shown.returncode == 0, shown.stderr
        for reason in reasons:
            assert reason in shown.stdout, shown.stdout
    for job_id in [*ids, "too-big", "elsewhere"]:
        env.call("job.stop", {"job_id": job_id})
