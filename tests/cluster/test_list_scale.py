"""100,000 allocations listed whole through the CLI and through HTTP (issue 35: lists must scale).

At 20,000 allocations one job's ``alloc.list`` answered 11.8 MB against the
4 MiB frame limit. Here five jobs hold 20,000 allocations each. The state is
built by applying entries to an FSM directly (the scheduler would take
minutes to place this many), saved as a snapshot and restored into a real
one-server cluster with ``caravan operator snapshot restore``; then every
list is read as a user reads it, and each allocation must come exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from fsm import messages as m
from fsm.machine import FSM
from fsm.structs import SECOND, Allocation, Evaluation, Job, Node, Resources, Task, TaskGroup
from snapshot import save
from tests.cluster.conftest import ClusterHandle

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
JOBS = 5
PER_JOB = 20_000
NODES = 50
PER_ENTRY = 1000  # allocations a PlanApply entry places
NO_SCHEDULER = "[scheduler]\nenabled = false\n"


def _uuid(kind: int, i: int) -> str:
    """Unique in its first 8 characters, so the CLI's short ids are unique too."""
    return f"{i:08x}-0000-4000-8000-{kind:012x}"


def _job(job_id: str) -> Job:
    task = Task(name="server", config={"image": "nginx:1.25"}, resources=Resources(cpu=100, memory_mb=64))
    return Job(id=job_id, name=job_id, task_groups=[TaskGroup(name="web", count=PER_JOB, tasks=[task])])


def build_state(path: str) -> None:
    """NODES nodes and JOBS jobs of PER_JOB allocations each, applied as committed entries would be."""
    fsm = FSM(path)
    index = 0
    now = 1_700_000_000 * SECOND

    def apply(*bodies: Any) -> None:
        nonlocal index, now
        batch = []
        for body in bodies:
            index += 1
            now += 1_000_000
            batch.append((index, m.encode_entry(body, time=now, rid=f"scale-{index}")))
        fsm.apply_batch(batch)

    apply(*(m.NodeRegister(node=Node(id=_uuid(1, n), name=f"client-{n}", status="ready")) for n in range(NODES)))
    for j in range(JOBS):
        job_id, eval_id = f"scale-{j}", _uuid(2, j)
        apply(m.JobRegister(job=_job(job_id), eval=Evaluation(id=eval_id, job_id=job_id)))
        for start in range(0, PER_JOB, PER_ENTRY):
            allocs = [
                Allocation(
                    id=_uuid(3, j * PER_JOB + a), eval_id=eval_id, job_id=job_id, node_id=_uuid(1, a % NODES),
                    task_group="web", name=f"{job_id}.web[{a}]", resources=Resources(cpu=100, memory_mb=64),
                )
                for a in range(start, start + PER_ENTRY)
            ]
            apply(m.PlanApply(eval_id=eval_id, job_id=job_id, allocs_to_place=allocs))
    fsm.commit()
    fsm.close()


def caravan(*args: str, address: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "CARAVAN_ADDRESS": address}
    env.pop("CARAVAN_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def test_100k_allocations_list_whole_through_cli_and_http(cluster_factory, tmp_path: Path) -> None:  # noqa: ANN001
    source = FSM(str(tmp_path / "built"))  # the FSM's own layout, then a snapshot of it
    source.close()
    build_state(str(tmp_path / "built"))
    snap = tmp_path / "scale.snap"
    built = FSM(str(tmp_path / "built"))
    try:
        save(built, str(snap))
    finally:
        built.close()

    c: ClusterHandle = cluster_factory(nodes=1, extra_config=NO_SCHEDULER)
    out = caravan("operator", "snapshot", "restore", str(snap), "--dir", c.cluster.dir)
    assert out.returncode == 0, out.stderr
    c.reload()
    address = ",".join(c.addresses)
    total = JOBS * PER_JOB

    # The CLI: everything, page after page, as one table (a header, then a row each).
    out = caravan("alloc", "list", "--stale", address=address)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["ID", "Node"]
    short_ids = [line.split()[0] for line in lines[1:]]
    assert len(short_ids) == total and len(set(short_ids)) == total

    # One job's 20,000 (the list that failed with frame_too_large), as JSON.
    out = caravan("alloc", "list", "--job", "scale-3", "--json", address=address)
    assert out.returncode == 0, out.stderr[-2000:]
    ids = [a["ID"] for a in json.loads(out.stdout)]
    assert len(ids) == PER_JOB and len(set(ids)) == PER_JOB
    assert {a["JobID"] for a in json.loads(out.stdout)} == {"scale-3"}

    # HTTP: all at once (streamed a page at a time), and page by page with X-Nomad-NextToken.
    http = f"http://{c.cluster.nodes[0].http_address}"
    whole = requests.get(f"{http}/v1/allocations", params={"stale": ""}, timeout=120)
    assert whole.status_code == 200, whole.text[:500]
    ids = [a["ID"] for a in whole.json()]
    assert len(ids) == total and len(set(ids)) == total
    paged: list[str] = []
    token = ""
    while True:
        params = {"per_page": "10000", **({"next_token": token} if token else {})}
        resp = requests.get(f"{http}/v1/job/scale-1/allocations", params=params, timeout=60)
        assert resp.status_code == 200, resp.text[:500]
        paged += [a["ID"] for a in resp.json()]
        token = resp.headers.get("X-Nomad-NextToken", "")
        if not token:
            break
    assert len(paged) == PER_JOB and len(set(paged)) == PER_JOB
