"""Progress of long CLI operations on a real cluster: plain periodic lines on stderr, clean stdout.

Run through a pipe (as here, or in CI and logs) the commands print no bar,
just lines that say the counts, the rate and the elapsed time; --json
stdout stays one JSON document.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.cluster.conftest import ClusterHandle, job_spec

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
NO_SCHEDULER = "[scheduler]\nenabled = false\n"


def caravan(*args: str, address: str) -> subprocess.CompletedProcess:
    """The CLI through pipes (not a terminal), with fast plain progress lines."""
    env = {**os.environ, "CARAVAN_ADDRESS": address, "CARAVAN_PROGRESS_INTERVAL": "0.05"}
    env.pop("CARAVAN_TOKEN", None)
    env.pop("CARAVAN_PROGRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=180
    )


def progress_lines(stderr: str, label: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{label}: ")]


def populate(c: ClusterHandle, jobs: int) -> None:
    with c.client() as client:
        for i in range(jobs):
            client.call("job.register", {"job": job_spec(f"progress-{i}", count=2)})


def test_snapshot_save_and_restore_report_bytes_on_stderr(cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    c = cluster_factory(nodes=1, extra_config=NO_SCHEDULER)
    populate(c, 200)
    snap = tmp_path / "state.snap"
    out = caravan("operator", "snapshot", "save", "--json", str(snap), address=",".join(c.addresses))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["Path"] == str(snap)  # stdout: the answer and nothing else
    lines = progress_lines(out.stderr, "snapshot save")
    assert lines, out.stderr
    assert re.search(r"snapshot save: done, [\d.]+ (B|KiB|MiB), [\d.]+ (B|KiB|MiB)/s, [\d.]+s elapsed", lines[-1])
    assert any("verifying" in line for line in lines)

    out = caravan("operator", "snapshot", "restore", str(snap), "--dir", c.cluster.dir, address="")
    c.reload()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Restored ")
    lines = progress_lines(out.stderr, "snapshot restore")
    assert lines and lines[-1].startswith("snapshot restore: done, "), out.stderr
    assert " of " in lines[-1]  # the total is known up front: the file's size times its passes


def test_forced_gc_reports_counts_and_json_stays_clean(cluster_factory) -> None:  # noqa: ANN001
    c = cluster_factory(nodes=1)
    populate(c, 30)
    with c.client() as client:
        for i in range(30):
            client.call("job.stop", {"job_id": f"progress-{i}"})
    out = caravan("system", "gc", "--json", address=",".join(c.addresses))
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert "Collected" in answer
    lines = progress_lines(out.stderr, "system gc")
    assert lines, out.stderr
    assert re.search(r"system gc: done, [\d,]+( of [\d,]+)? objects", lines[-1]), lines[-1]
    collected = sum(answer["Collected"].values())
    assert f"{collected:,}" in lines[-1]


def test_job_run_monitor_counts_placements_on_stderr(cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    c = cluster_factory(nodes=1)
    node = {
        "ID": str(uuid.uuid4()), "Name": "progress-n1", "Datacenter": "dc1",
        "Attributes": {"driver.sim": "1", "kernel.name": "linux"},
        "Resources": {"CPU": 4000, "MemoryMB": 8192, "DiskMB": 0},
        "Status": "ready", "SchedulingEligibility": "eligible",
    }  # fmt: skip
    with c.client() as client:
        client.call("node.register", {"node": node})
    spec = tmp_path / "web.json"
    spec.write_text(json.dumps(job_spec("progress-web", count=3)))
    out = caravan("job", "run", str(spec), address=",".join(c.addresses))
    assert out.returncode == 0, out.stderr
    assert "Monitoring evaluation" in out.stdout
    lines = progress_lines(out.stderr, "job run")
    assert lines and lines[-1].startswith("job run: done, 3 of 3 allocations (100%)"), out.stderr
    assert "job run:" not in out.stdout
