"""End to end with the real ``python-nomad`` client (pinned in the test extra), as its users would call it."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable

import nomad
import nomad.api.exceptions as nx
import pytest

from tests.http.support import HTTPCluster, job, wait_until

pytestmark = pytest.mark.cluster


def client_for(c: HTTPCluster, token: str | None = None, *, follower: bool = True) -> nomad.Nomad:
    node = c.followers()[0] if follower and len(c.nodes) > 1 else c.leader()
    host, port = node.http_address.rsplit(":", 1)
    return nomad.Nomad(host=host, port=int(port), token=token, timeout=30)


def test_register_read_list_deregister_gc(http_cluster: HTTPCluster) -> None:
    n = client_for(http_cluster)
    job_id = f"pn-{uuid.uuid4().hex[:8]}"
    out = n.job.register_job(job_id, {"Job": job(job_id, count=2, job_type="batch")})
    assert out["EvalID"] and out["JobModifyIndex"] > 0 and out["Warnings"] == ""

    assert job_id in n.job
    got = n.job.get_job(job_id)
    assert got["ID"] == job_id and got["Type"] == "batch" and got["TaskGroups"][0]["Count"] == 2
    assert n.job[job_id]["Name"] == job_id
    assert job_id in n.jobs and n.jobs[job_id]["ID"] == job_id
    assert [j["ID"] for j in n.jobs.get_jobs(prefix=job_id)] == [job_id]
    assert n.job.get_versions(job_id)["Versions"][0]["Version"] == 0
    assert job_id in {e["JobID"] for e in n.job.get_evaluations(job_id)}
    assert isinstance(n.job.get_allocations(job_id), list)
    assert n.job.get_summary(job_id)["JobID"] == job_id
    assert n.evaluation.get_evaluation(out["EvalID"])["JobID"] == job_id

    again = n.jobs.register_job({"Job": job(job_id, count=3, job_type="batch")})
    assert again["JobModifyIndex"] > out["JobModifyIndex"]
    assert [v["Version"] for v in n.job.get_versions(job_id)["Versions"]] == [1, 0]

    with pytest.raises(nx.URLNotFoundNomadException):
        n.job.get_job("no-such-job")
    assert "no-such-job" not in n.job
    with pytest.raises(nx.BadRequestNomadException):
        n.job.register_job("other-id", {"Job": job(job_id)})

    stopped = n.job.deregister_job(job_id)
    assert stopped["EvalID"]
    assert n.job.get_job(job_id)["Stop"] is True

    def collected() -> bool:
        assert n.system.initiate_garbage_collection() is True
        return job_id not in n.job

    wait_until(collected, 60.0, "GC to collect the stopped job")

    purged = f"pn-purge-{uuid.uuid4().hex[:6]}"
    n.job.register_job(purged, {"Job": job(purged)})
    n.job.deregister_job(purged, purge=True)
    assert purged not in n.job


def test_status_operator_parse_metrics(http_cluster: HTTPCluster) -> None:
    n = client_for(http_cluster)
    assert n.status.leader.get_leader() == http_cluster.leader().rpc_addr
    assert len(n.status.peers.get_peers()) == 3
    assert len(n.operator.get_configuration()["Servers"]) == 3
    parsed = n.jobs.parse('job "docs" {\n  group "example" {\n    count = 2\n  }\n}\n')
    assert parsed["ID"] == "docs" and parsed["TaskGroups"][0]["Count"] == 2
    with pytest.raises(nx.BadRequestNomadException):
        n.jobs.parse('job "docs" {')
    metrics = n.metrics.get_metrics()
    assert {"Gauges", "Counters", "Samples"} <= set(metrics)
    assert any(g["Name"] == "caravan_raft_term" for g in metrics["Gauges"])
    assert isinstance(n.nodes.get_nodes(), list)
    assert isinstance(n.allocations.get_allocations(), list)
    assert isinstance(n.deployments.get_deployments(), list)
    assert isinstance(n.evaluations.get_evaluations(), list)


def test_event_stream(http_cluster: HTTPCluster) -> None:
    n = client_for(http_cluster)
    job_id = f"pn-ev-{uuid.uuid4().hex[:8]}"
    start = int(n.jobs.request(method="get").headers["X-Nomad-Index"])
    stream, stop, events = n.event.stream.get_stream(
        index=start, topic={"Job": [job_id]}, timeout=30
    )
    stream.daemon = True
    stream.start()
    try:
        n.job.register_job(job_id, {"Job": job(job_id)})
        seen = None
        while seen is None:
            batch = events.get(timeout=30)  # heartbeats ({}) are not queued by the library
            assert {"Index", "Events"} <= set(batch)
            seen = next(
                (e for e in batch["Events"] if e["Topic"] == "Job" and e["Key"] == job_id), None
            )
        assert seen["Payload"]["Job"]["ID"] == job_id
        assert seen["Type"] == "JobRegistered"
    except queue.Empty:
        pytest.fail("no event for the registered job within 30 s")
    finally:
        stop.set()
        stream.join(10)  # a heartbeat line wakes the reader within the configured 300 ms
    assert not stream.is_alive()


def test_acl(cluster_factory: Callable[..., HTTPCluster]) -> None:
    c = cluster_factory(1)
    anon = client_for(c)
    boot = anon.acl.generate_bootstrap()
    assert boot["Type"] == "management" and boot["SecretID"]
    with pytest.raises(nx.URLNotAuthorizedNomadException):
        anon.jobs.get_jobs()
    with pytest.raises(nx.BadRequestNomadException):
        anon.acl.generate_bootstrap()

    admin = client_for(c, token=boot["SecretID"])
    assert admin.jobs.get_jobs() == []
    assert admin.acl.get_self_token()["AccessorID"] == boot["AccessorID"]
    created = admin.acl.create_token(
        {"Name": "ci", "Type": "client", "Policies": ["read", "write"]}
    )
    assert created["Name"] == "ci" and created["SecretID"]
    assert created["AccessorID"] in {t["AccessorID"] for t in admin.acl.get_tokens()}
    assert admin.acl.get_token(created["AccessorID"])["Policies"] == ["read", "write"]

    ci = client_for(c, token=created["SecretID"])
    ci.job.register_job("ci-job", {"Job": job("ci-job")})
    assert "ci-job" in ci.job
    with pytest.raises(nx.URLNotAuthorizedNomadException):
        ci.acl.get_tokens()
    with pytest.raises(nx.URLNotAuthorizedNomadException):
        ci.system.initiate_garbage_collection()

    assert admin.acl.delete_token(created["AccessorID"]) is True
    with pytest.raises(nx.URLNotAuthorizedNomadException):
        ci.jobs.get_jobs()
