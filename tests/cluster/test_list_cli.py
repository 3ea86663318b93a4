"""The CLI's list commands: every page by default, --per-page / --page-token as Nomad's, --filter on the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import ClusterHandle, job_spec

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
NO_SCHEDULER = "[scheduler]\nenabled = false\n"
IDS = [f"cli-{i:02d}" for i in range(12)]


@pytest.fixture
def listed(cluster_factory) -> ClusterHandle:  # noqa: ANN001
    c: ClusterHandle = cluster_factory(nodes=1, extra_config=NO_SCHEDULER)
    with c.client() as client:
        for i, job_id in enumerate(IDS):
            client.call("job.register", {"job": job_spec(job_id, meta={"team": "blue" if i % 3 == 0 else "red"})})
    return c


def caravan(c: ClusterHandle, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(c.addresses)}
    env.pop("CARAVAN_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)


def test_list_commands_page_and_filter(listed: ClusterHandle) -> None:
    out = caravan(listed, "job", "list", "--json")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert [j["ID"] for j in jobs] == IDS
    assert out.stdout == json.dumps(jobs, indent=2, sort_keys=True) + "\n"  # streamed, yet the same text

    out = caravan(listed, "job", "list", "--filter", 'Meta.team == "blue"')
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == IDS[::3]

    out = caravan(listed, "job", "list", "--per-page", "5")
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == IDS[:5]
    assert "--page-token cli-05" in out.stderr
    out = caravan(listed, "job", "list", "--per-page", "5", "--page-token", "cli-10")
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == IDS[10:]
    assert "--page-token" not in out.stderr

    out = caravan(listed, "job", "list", "--filter", 'Meta.team == "green"')
    assert out.returncode == 0 and out.stdout.strip() == "No results"
    assert caravan(listed, "job", "list", "--json", "--filter", 'ID == "none"').stdout == "[]\n"
    evals = json.loads(caravan(listed, "eval", "list", "--json", "--filter", 'JobID == "cli-04"').stdout)
    assert {e["JobID"] for e in evals} == {"cli-04"}


def test_a_bad_filter_is_one_line_with_its_column(listed: ClusterHandle) -> None:
    for command in (["job", "list"], ["alloc", "list"], ["eval", "list"], ["node", "list"], ["deployment", "list"]):
        out = caravan(listed, *command, "--filter", 'Status = "running"')
        assert out.returncode == 1, (command, out.stdout)
        assert out.stderr.strip().splitlines() == ["Error: invalid filter expression at column 8: unexpected character '='"]
    out = caravan(listed, "job", "list", "--per-page", "0")
    assert out.returncode == 2 and "per-page" in out.stderr
