"""Devices end to end: ``caravan client sim --device nvidia/gpu=2`` nodes, GPU jobs placed on them.

One single-server cluster (a placement test: replication is not what it is
about) with one simulated client of two nodes advertising two GPUs each:

- an HCL job of three 1-GPU allocs is placed on the GPU nodes, and
  ``caravan node status`` and ``alloc status`` show the devices;
- a JSON job asking for three GPUs (more than any node has) stays unplaced,
  and ``/v1/evaluation/:id`` says which device;
- the HTTP API serves Nomad's shapes: the task's RequestedDevice list and the
  node's NodeDeviceResource list.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from node import devcluster as cl
from tests.lifecycle.conftest import LIFECYCLE_CONFIG, Env, wait_until

pytestmark = pytest.mark.cluster

JOB_HCL = """
job "train" {
  group "g" {
    count = 3
    task "t" {
      driver = "sim"
      config {
        run_for = "1h"
      }
      resources {
        cpu    = 100
        memory = 64
        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
"""

TOO_BIG = {
    "Job": {
        "ID": "huge",
        "TaskGroups": [{
            "Name": "g",
            "Tasks": [{"Name": "t", "Driver": "sim", "Config": {"run_for": "1h"},
                       "Resources": {"CPU": 100, "MemoryMB": 64, "Devices": [{"Name": "nvidia/gpu", "Count": 3}]}}],
        }],
    }
}  # fmt: skip


@pytest.fixture(scope="module")
def gpu_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("devices")
    cluster = cl.up(str(tmp / "cluster"), 1, extra_config=LIFECYCLE_CONFIG, timeout=60)
    env = Env(cluster, tmp)
    try:
        env.start_sim(2, "gpu", "--device", "nvidia/gpu=2")
        yield env
    finally:
        env.stop_sims()
        cl.down(cl.Cluster.load(cluster.dir))


def _http(env: Env, path: str) -> Any:
    resp = requests.get(f"http://{env.cluster.http_addresses[0]}{path}", timeout=15)
    assert resp.status_code == 200, (path, resp.status_code, resp.text)
    return resp.json()


def test_gpu_jobs_are_placed_on_gpu_nodes_and_a_too_big_one_says_why(
    gpu_env: Env, tmp_path: Path
) -> None:
    env = gpu_env
    spec = tmp_path / "train.nomad.hcl"
    spec.write_text(JOB_HCL)
    run = env.cli("job", "run", "--detach", str(spec))
    assert run.returncode == 0, run.stderr

    def running() -> list[dict[str, Any]] | None:
        allocs = [
            a for a in env.read("alloc.list", {"job_id": "train"}) if a["ClientStatus"] == "running"
        ]
        return allocs if len(allocs) == 3 else None

    allocs = wait_until(running, 60, "three GPU allocs running")
    assert {a["NodeID"] for a in allocs} <= set(env.sims[0].nodes)
    for a in allocs:
        full = env.read("alloc.get", {"alloc_id": a["ID"]})
        assert full["Resources"]["Devices"] == {"nvidia/gpu": 1}

    node_id = allocs[0]["NodeID"]
    status = env.cli("node", "status", node_id)
    assert status.returncode == 0, status.stderr
    assert "nvidia/gpu=2" in status.stdout, status.stdout
    alloc_status = env.cli("alloc", "status", allocs[0]["ID"])
    assert alloc_status.returncode == 0, alloc_status.stderr
    assert "nvidia/gpu=1" in alloc_status.stdout, alloc_status.stdout

    out = requests.post(f"http://{env.cluster.http_addresses[0]}/v1/jobs", json=TOO_BIG, timeout=15)
    assert out.status_code == 200, out.text
    eval_id = out.json()["EvalID"]

    def failed() -> dict[str, Any] | None:
        ev = _http(env, f"/v1/evaluation/{eval_id}")
        return ev if ev.get("FailedTGAllocs") else None

    ev = wait_until(failed, 60, "the too-big job's eval to record its failure")
    reason = ev["FailedTGAllocs"]["g"]["Reason"]
    assert "asks more device nvidia/gpu (3) than any node has" in reason, reason
    assert "resources exhausted (device nvidia/gpu): 2 nodes" in reason, reason
    shown = env.cli("eval", "status", eval_id)
    assert "asks more device nvidia/gpu (3) than any node has" in shown.stdout, shown.stdout

    node = _http(env, f"/v1/node/{node_id}")
    (group,) = node["NodeResources"]["Devices"]
    assert (group["Vendor"], group["Type"], len(group["Instances"])) == ("nvidia", "gpu", 2)
    job = _http(env, "/v1/job/train")
    assert job["Queue"] == "" and job["PriorityClass"] == ""  # Caravan's fields, present when unset
    devices = job["TaskGroups"][0]["Tasks"][0]["Resources"]["Devices"]
    assert devices == [{"Name": "nvidia/gpu", "Count": 1, "Constraints": None, "Affinities": None}]
