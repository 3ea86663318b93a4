"""Kueue's borrow-and-reclaim scenario, end to end on a real three-server cluster with simulated GPU nodes.

Queues team-a and team-b form cohort ``lab`` with 2 GPUs nominal each; two
simulated nodes advertise 4 GPUs each (more than the quota, so no placement ever waits on a fragmented node). team-a borrows team-b's idle GPU;
team-b's 2-GPU job reclaims it (exactly one team-a workload is evicted,
with Kueue's record, and waits again in its place); a higher-priority
team-b job then preempts within the queue; Hold keeps new work pending
while running work continues; HoldAndDrain evicts it. Then the leader is
killed in the middle of a reclaim: no quota is over-admitted, no workload
is lost, and every replica holds the same state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from fsm.quota import Ledger
from node import devcluster as cl
from tests.cluster.conftest import ClusterHandle, wait_until

ROOT = Path(__file__).resolve().parents[2]
GPU = "nvidia/gpu"
CONFIG = '[scheduler]\nmin_heartbeat_ttl = "2s"\nheartbeat_grace = "2s"\neval_nack_delay = "200ms"\n'


def gpu_job(job_id: str, queue: str, gpus: int, pclass: str = "low") -> dict[str, Any]:
    task = {"Name": "t", "Driver": "sim", "Config": {"run_for": "1h"},
            "Resources": {"CPU": 100, "MemoryMB": 64, "Devices": [{"Name": GPU, "Count": gpus}]}}
    return {"ID": job_id, "Type": "service", "Queue": queue, "PriorityClass": pclass,
            "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}]}  # fmt: skip


def queue_def(name: str) -> dict[str, Any]:
    return {"name": name, "cohort": "lab", "resources": [{"name": GPU, "nominal": 2}],
            "reclaim_within_cohort": "Any", "within_queue": "LowerPriority"}  # fmt: skip


@pytest.fixture
def lab(cluster_factory: Callable[..., ClusterHandle], tmp_path: Path) -> Iterator[ClusterHandle]:
    c = cluster_factory(3, CONFIG)
    log = open(tmp_path / "sim.log", "wb")  # noqa: SIM115 - handed to the child
    sim = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "client", "sim", "--nodes", "2", "--name-prefix", "gpu",
         "--device", f"{GPU}=4", "--servers", ",".join(c.addresses)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
    )  # fmt: skip
    log.close()
    try:
        with c.client() as rpc:
            wait_until(lambda: sum(n["Status"] == "ready" for n in rpc.call("node.list", {})["data"]) == 2, 60,
                       "two GPU nodes ready")  # fmt: skip
            for name in ("team-a", "team-b"):
                rpc.call("queue.upsert", {"queue": queue_def(name)})
            for name, value in (("low", 0), ("high", 100)):
                rpc.call("priority_class.upsert", {"priority_class": {"name": name, "value": value}})
        yield c
    finally:
        if sim.poll() is None:
            os.kill(sim.pid, signal.SIGTERM)
            try:
                sim.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(sim.pid, signal.SIGKILL)


def caravan(c: ClusterHandle, *args: str) -> str:
    env = {**os.environ, "CARAVAN_ADDRESS": ",".join(c.addresses)}
    env.pop("CARAVAN_TOKEN", None)
    out = subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def running(rpc: Any, job_id: str) -> int:
    allocs = rpc.call("alloc.list", {"job_id": job_id})["data"]
    return sum(a["ClientStatus"] == "running" and a["DesiredStatus"] == "run" for a in allocs)


def ledger(rpc: Any, queue: str) -> dict[str, int]:
    row = rpc.call("queue.get", {"name": queue})["data"]["ledger"][GPU]
    return {k: row[k] for k in ("used", "borrowed", "lent")}


def pending(rpc: Any, queue: str) -> list[tuple[int, str]]:
    return [(p["position"], p["job_id"]) for p in rpc.call("queue.pending", {"name": queue})["data"]]


@pytest.mark.cluster
def test_borrow_reclaim_preempt_hold_and_drain(lab: ClusterHandle) -> None:
    with lab.client() as rpc:
        for i in (1, 2, 3):
            rpc.call("job.register", {"job": gpu_job(f"a{i}", "team-a", 1)})
        wait_until(lambda: all(running(rpc, f"a{i}") for i in (1, 2, 3)), 60, "team-a's three jobs running")
        assert ledger(rpc, "team-a") == {"used": 3, "borrowed": 1, "lent": 0}
        assert ledger(rpc, "team-b") == {"used": 0, "borrowed": 0, "lent": 1}

        # Reclaim: team-b's 2-GPU job evicts exactly one team-a workload, which waits again.
        rpc.call("job.register", {"job": gpu_job("b1", "team-b", 2)})
        wait_until(lambda: running(rpc, "b1"), 60, "b1 running once it reclaimed its GPU")
        assert pending(rpc, "team-a") == [(1, "a3")]
        row = rpc.call("queue.pending", {"name": "team-a"})["data"][0]
        assert row["last_eviction"]["message"] == (
            "Preempted to accommodate a workload (UID: default/b1) due to reclamation within the cohort; "
            "preemptor path: /lab/team-b; preemptee path: /lab/team-a"
        )
        assert "insufficient unused quota" in row["reason"]
        # The record is on the job too: `caravan job status`, and HTTP.
        status = caravan(lab, "job", "status", "a3")
        assert "position 1 in queue team-a" in status and "due to reclamation within the cohort" in status
        line = caravan(lab, "queue", "pending", "team-a")
        assert "a3" in line and "insufficient unused quota" in line
        http = requests.get(f"http://{lab.cluster.nodes[0].http_address}/v1/job/a3/workload", timeout=10).json()
        assert http["State"] == "pending" and http["Evictions"][-1]["Reason"] == "InCohortReclamation"
        wait_until(lambda: running(rpc, "a3") == 0, 30, "a3's alloc stopped")
        assert [running(rpc, j) for j in ("a1", "a2")] == [1, 1]
        assert ledger(rpc, "team-a") == {"used": 2, "borrowed": 0, "lent": 0}
        assert ledger(rpc, "team-b") == {"used": 2, "borrowed": 0, "lent": 0}

        # Within the queue: a higher-priority job preempts the lower one (2 GPUs, so team-b lends nothing).
        rpc.call("job.register", {"job": gpu_job("b2", "team-b", 2, pclass="high")})
        wait_until(lambda: running(rpc, "b2"), 60, "b2 running")
        assert pending(rpc, "team-b") == [(1, "b1")]
        evicted = rpc.call("queue.pending", {"name": "team-b"})["data"][0]["last_eviction"]
        assert "due to prioritization in the queue" in evicted["message"]

        # Hold: new work waits, running work continues. HoldAndDrain: running work is evicted.
        rpc.call("queue.stop", {"name": "team-a", "policy": "Hold"})
        rpc.call("job.register", {"job": gpu_job("a4", "team-a", 1)})
        assert pending(rpc, "team-a") == [(1, "a3"), (2, "a4")]
        assert [running(rpc, j) for j in ("a1", "a2")] == [1, 1]
        rpc.call("queue.stop", {"name": "team-a", "policy": "HoldAndDrain"})
        wait_until(lambda: pending(rpc, "team-a") == [(1, "a1"), (2, "a2"), (3, "a3"), (4, "a4")], 30,
                   "drained work back in line, in its places")  # fmt: skip
        wait_until(lambda: running(rpc, "a1") + running(rpc, "a2") == 0, 30, "drained allocs stopped")
        # Its allocs stopped, the evicted job waits: pending, not dead (it has not ended).
        wait_until(lambda: rpc.call("job.get", {"job_id": "a1"})["data"]["Status"] == "pending", 30, "a1 pending")

        # Resumed, team-a admits again in line order (its own quota: a1 and a2) and they run again.
        rpc.call("queue.stop", {"name": "team-a", "policy": "None"})
        wait_until(lambda: running(rpc, "a1") and running(rpc, "a2"), 60, "a1 and a2 readmitted and running")
        assert pending(rpc, "team-a") == [(1, "a3"), (2, "a4")]


@pytest.mark.cluster
def test_a_leader_killed_mid_reclaim_over_admits_nothing_and_loses_nothing(lab: ClusterHandle) -> None:
    with lab.client() as rpc:
        for i in (1, 2, 3, 4):
            rpc.call("job.register", {"job": gpu_job(f"a{i}", "team-a", 1)})
        wait_until(lambda: rpc.call("queue.get", {"name": "team-a"})["data"]["admitted"] == 4, 60, "team-a borrowing all")
        rpc.call("job.register", {"job": gpu_job("b1", "team-b", 2)})
    lab.kill(lab.leader())
    with lab.client() as rpc:
        wait_until(lambda: running(rpc, "b1"), 90, "b1 admitted and running under the new leader")
        jobs = [f"a{i}" for i in (1, 2, 3, 4)] + ["b1"]
        states = {}
        for job_id in jobs:
            row = rpc.call("job.get", {"job_id": job_id})["data"]
            states[job_id] = row["Status"]
        assert set(states.values()) <= {"pending", "running"}, f"a workload was lost: {states}"
        queues = [rpc.call("queue.get", {"name": n})["data"] for n in ("team-a", "team-b")]
        assert sum(q["admitted"] for q in queues) + sum(q["pending"] for q in queues) == 5
    index = max(i for _, i in lab.digests().values())
    digests = lab.digests(expect_index=index)
    assert len({d for d, _ in digests.values()}) == 1, f"replicas diverged: {digests}"
    _check_quota_on_every_server(lab)


def _check_quota_on_every_server(lab: ClusterHandle) -> None:
    """Each live server's own ledger keeps the quota (reads served locally, not forwarded)."""
    from fsm.queues import Queue, QuotaLimit

    for node in lab.cluster.nodes:
        if not cl.alive(node.pid):
            continue
        with lab.client(node.rpc_addr) as rpc:
            rows = [rpc.call("queue.get", {"name": n, "stale": True})["data"] for n in ("team-a", "team-b")]
        queues = [Queue(name=r["name"], cohort="lab", resources=[QuotaLimit(GPU, 2)]) for r in rows]
        used = {r["name"]: {GPU: r["ledger"][GPU]["used"]} for r in rows}
        assert not Ledger.build(queues, used.items()).violations(), f"{node.id} over-admits: {used}"
