"""HTTP contract of the /v1 API on a real three-server cluster: paths, shapes, headers, status codes.

Most requests go to a follower on purpose: it must answer them itself
(forwarding internally), never with a redirect.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import requests

from tests.http.support import HTTPCluster, job, wait_until

pytestmark = pytest.mark.cluster

TIMEOUT = 30


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def get(url: str, **kw: Any) -> requests.Response:
    return requests.get(url, timeout=TIMEOUT, allow_redirects=False, **kw)


def register(base: str, spec: dict[str, Any], **extra: Any) -> requests.Response:
    return requests.post(
        f"{base}/v1/jobs", json={"Job": spec, **extra}, timeout=TIMEOUT, allow_redirects=False
    )


def assert_read_headers(resp: requests.Response) -> int:
    assert resp.headers["Content-Type"].startswith("application/json")
    assert int(resp.headers["X-Nomad-Index"]) >= 1
    assert resp.headers["X-Nomad-KnownLeader"] == "true"
    assert int(resp.headers["X-Nomad-LastContact"]) >= 0
    return int(resp.headers["X-Nomad-Index"])


def assert_error(resp: requests.Response, status: int, text: str = "") -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert text.lower() in resp.text.lower(), resp.text
    assert "Traceback" not in resp.text


# -- status and operator --------------------------------------------------------------------------
def test_status_leader_and_peers_agree_on_every_server(http_cluster: HTTPCluster) -> None:
    leader = http_cluster.leader()
    for node in http_cluster.nodes:
        resp = get(f"{http_cluster.url(node)}/v1/status/leader")
        assert resp.status_code == 200
        assert resp.json() == leader.rpc_addr  # a JSON string
        peers = get(f"{http_cluster.url(node)}/v1/status/peers").json()
        assert sorted(peers) == sorted(n.rpc_addr for n in http_cluster.nodes)
    assert get(f"{http_cluster.follower_url}/v1/regions").json() == ["global"]


def test_operator_raft_configuration(http_cluster: HTTPCluster) -> None:
    resp = get(f"{http_cluster.follower_url}/v1/operator/raft/configuration")
    assert resp.status_code == 200
    conf = resp.json()
    assert conf["Index"] > 0
    assert len(conf["Servers"]) == 3
    assert [s["Leader"] for s in conf["Servers"]].count(True) == 1
    assert {"ID", "Node", "Address", "Leader", "Voter", "RaftProtocol"} <= set(conf["Servers"][0])


# -- jobs -------------------------------------------------------------------------------------------
def test_register_read_list_through_a_follower(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("web")
    resp = register(base, job(job_id, count=2))
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert {"EvalID", "EvalCreateIndex", "JobModifyIndex", "Index", "Warnings"} <= set(out)
    assert out["EvalID"] and out["JobModifyIndex"] == out["Index"] == out["EvalCreateIndex"]
    assert out["Warnings"] == ""
    assert int(resp.headers["X-Nomad-Index"]) == out["Index"]

    got = get(f"{base}/v1/job/{job_id}")
    assert got.status_code == 200
    assert assert_read_headers(got) >= out["Index"]
    body = got.json()
    assert body["ID"] == job_id and body["TaskGroups"][0]["Count"] == 2
    assert (
        body["Periodic"] is None and body["ParameterizedJob"] is None
    )  # objects or null, as Nomad
    assert isinstance(body["TaskGroups"][0]["ReschedulePolicy"]["Delay"], int)  # nanoseconds

    listed = get(f"{base}/v1/jobs")
    assert_read_headers(listed)
    stub = next(j for j in listed.json() if j["ID"] == job_id)
    assert {"ID", "Name", "Type", "Status", "Priority", "JobModifyIndex"} <= set(stub)
    assert "TaskGroups" not in stub  # a list stub, as Nomad's


def test_register_path_must_match_body(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("match")
    resp = requests.post(f"{base}/v1/job/{job_id}", json={"Job": job("other")}, timeout=TIMEOUT)
    assert_error(resp, 400, "Job ID does not match")
    resp = requests.put(f"{base}/v1/job/{job_id}", json={"Job": job(job_id)}, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text  # PUT and POST alike, as Nomad
    assert get(f"{base}/v1/job/{job_id}").json()["ID"] == job_id


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ("not json", "json"),
        ("{}", "Job must be specified"),
        ('{"Job": 3}', "Job must be specified"),
        ('{"Job": {"Type": "service"}}', "ID"),
        (
            '{"Job": {"ID": "x", "TaskGroups": [{"Name": "g", "Count": -1, "Tasks": [{"Name": "t"}]}]}}',
            "count",
        ),
        ('{"Job": {"ID": "x", "Priority": "high"}}', "priority"),
    ],
)
def test_register_bad_input_is_400(http_cluster: HTTPCluster, body: str, text: str) -> None:
    resp = requests.post(f"{http_cluster.follower_url}/v1/jobs", data=body, timeout=TIMEOUT)
    assert_error(resp, 400, text)


def test_enforce_index_conflict_is_409(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("cas")
    first = register(base, job(job_id), EnforceIndex=True, JobModifyIndex=0).json()
    stale = register(base, job(job_id, count=3), EnforceIndex=True, JobModifyIndex=0)
    assert_error(stale, 409, "enforce index")
    ok = register(
        base, job(job_id, count=3), EnforceIndex=True, JobModifyIndex=first["JobModifyIndex"]
    )
    assert ok.status_code == 200, ok.text
    versions = get(f"{base}/v1/job/{job_id}/versions")
    assert_read_headers(versions)
    body = versions.json()
    assert [v["Version"] for v in body["Versions"]] == [1, 0]  # newest first
    assert body["Versions"][0]["TaskGroups"][0]["Count"] == 3


def test_missing_objects_are_404(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    for path in (
        "/v1/job/missing",
        "/v1/job/missing/summary",
        "/v1/job/missing/versions",
        "/v1/evaluation/00000000-0000-0000-0000-000000000000",
        "/v1/allocation/00000000-0000-0000-0000-000000000000",
        "/v1/deployment/00000000-0000-0000-0000-000000000000",
        "/v1/node/00000000-0000-0000-0000-000000000000",
    ):
        assert_error(get(base + path), 404, "not found")
    resp = requests.delete(f"{base}/v1/job/missing", timeout=TIMEOUT)
    assert resp.status_code == 200 and resp.json()["EvalID"] == ""  # Nomad: a no-op, not a 404
    assert_error(get(f"{base}/v1/no/such/path"), 404)
    assert requests.patch(f"{base}/v1/jobs", timeout=TIMEOUT).status_code == 405


def test_job_subresources(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("sub")
    out = register(base, job(job_id)).json()
    for sub in ("allocations", "evaluations", "deployments"):
        resp = get(f"{base}/v1/job/{job_id}/{sub}")
        assert resp.status_code == 200 and isinstance(resp.json(), list)
        assert_read_headers(resp)
    evals = get(f"{base}/v1/job/{job_id}/evaluations").json()
    assert out["EvalID"] in {e["ID"] for e in evals}
    latest = get(f"{base}/v1/job/{job_id}/deployment")
    assert latest.status_code == 200
    assert latest.json() is None or latest.json()["JobID"] == job_id
    summary = get(f"{base}/v1/job/{job_id}/summary").json()
    assert summary["JobID"] == job_id and "g" in summary["Summary"]
    assert set(summary["Summary"]["g"]) >= {
        "Queued",
        "Complete",
        "Failed",
        "Running",
        "Starting",
        "Lost",
    }


def test_deregister_and_purge(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("stop")
    register(base, job(job_id))
    resp = requests.delete(f"{base}/v1/job/{job_id}", timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert {"EvalID", "EvalCreateIndex", "JobModifyIndex", "Index"} <= set(out)
    assert get(f"{base}/v1/job/{job_id}").json()["Stop"] is True
    resp = requests.delete(f"{base}/v1/job/{job_id}", params={"purge": "True"}, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    assert get(f"{base}/v1/job/{job_id}").status_code == 404


# -- query parameters ----------------------------------------------------------------------------------
def test_prefix_namespace_region_and_go_booleans(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    tag = uuid.uuid4().hex[:6]
    ids = [f"pre{tag}-a", f"pre{tag}-b", f"zzz{tag}"]
    for job_id in ids:
        register(base, job(job_id, meta={"team": "x"}))
    listed = {j["ID"] for j in get(f"{base}/v1/jobs", params={"prefix": f"pre{tag}"}).json()}
    assert listed == set(ids[:2])
    everything = {j["ID"] for j in get(f"{base}/v1/jobs?prefix=").json()}  # empty prefix: no filter
    assert set(ids) <= everything
    odd = get(
        f"{base}/v1/jobs", params={"namespace": "nope", "region": "mars", "prefix": f"zzz{tag}"}
    )
    assert odd.status_code == 200 and [j["ID"] for j in odd.json()] == [ids[2]]
    with_meta = get(f"{base}/v1/jobs", params={"prefix": f"zzz{tag}", "meta": "true"}).json()
    assert with_meta[0]["Meta"] == {"team": "x"}
    for value in ("True", "true", "1", "t", ""):
        resp = get(
            f"{base}/v1/job/{ids[0]}?stale={value}" if value else f"{base}/v1/job/{ids[0]}?stale"
        )
        assert resp.status_code in (200, 404), resp.text  # stale: may lag, never an error
    resp = wait_until(
        lambda: get(f"{base}/v1/job/{ids[0]}?stale=1").status_code == 200,
        15.0,
        "a stale read on the follower",
    )
    assert resp
    assert_error(get(f"{base}/v1/job/{ids[0]}?stale=maybe"), 400, "stale")
    assert_error(get(f"{base}/v1/jobs?index=-1"), 400, "index")
    assert_error(get(f"{base}/v1/jobs?index=1&wait=forever"), 400, "wait")
    resp = requests.delete(f"{base}/v1/job/{ids[2]}?purge=yes", timeout=TIMEOUT)
    assert_error(resp, 400, "purge")


def test_blocking_query_returns_on_change_and_after_wait(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("block")
    out = register(base, job(job_id)).json()
    index = assert_read_headers(get(f"{base}/v1/job/{job_id}"))
    result: dict[str, Any] = {}

    def blocked_read() -> None:
        resp = get(f"{base}/v1/job/{job_id}", params={"index": index, "wait": "60s"})
        result["status"], result["index"], result["count"] = (
            resp.status_code,
            int(resp.headers["X-Nomad-Index"]),
            resp.json()["TaskGroups"][0]["Count"],
        )

    reader = threading.Thread(target=blocked_read)
    reader.start()
    wait_until(lambda: reader.is_alive(), 5.0, "the blocking read to start")
    update = register(base, job(job_id, count=4)).json()
    reader.join(TIMEOUT + 30)
    assert not reader.is_alive()
    assert result["status"] == 200 and result["index"] > index and result["count"] == 4
    assert update["JobModifyIndex"] > out["JobModifyIndex"]
    # Nothing changes: the read returns at its wait with the same index.
    resp = get(f"{base}/v1/job/{job_id}", params={"index": result["index"], "wait": "300ms"})
    assert resp.status_code == 200 and int(resp.headers["X-Nomad-Index"]) == result["index"]
    # Blocking and stale together: served by the follower itself.
    resp = get(f"{base}/v1/jobs", params={"index": result["index"], "wait": "200ms", "stale": ""})
    assert resp.status_code == 200


# -- evaluations, allocations, deployments, nodes -----------------------------------------------
def test_evaluation_allocation_deployment_node_routes(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    node_id = str(uuid.uuid4())
    node = {
        "ID": node_id,
        "Name": "n1",
        "Datacenter": "dc1",
        "Attributes": {"driver.sim": "1", "kernel.name": "linux"},
        "Resources": {"CPU": 4000, "MemoryMB": 8192, "DiskMB": 0},
        "Status": "ready",
        "SchedulingEligibility": "eligible",
    }
    with http_cluster.rpc() as client:
        client.call("node.register", {"node": node})
    job_id = uid("objs")
    out = register(base, job(job_id)).json()
    evals = get(f"{base}/v1/evaluations")
    assert_read_headers(evals)
    assert out["EvalID"] in {e["ID"] for e in evals.json()}
    prefixed = get(f"{base}/v1/evaluations", params={"prefix": out["EvalID"][:8]}).json()
    assert [e["ID"] for e in prefixed] == [out["EvalID"]]
    ev = get(f"{base}/v1/evaluation/{out['EvalID']}")
    assert ev.status_code == 200 and ev.json()["JobID"] == job_id
    assert isinstance(get(f"{base}/v1/evaluation/{out['EvalID']}/allocations").json(), list)
    assert isinstance(get(f"{base}/v1/allocations").json(), list)
    assert isinstance(get(f"{base}/v1/deployments").json(), list)

    nodes = get(f"{base}/v1/nodes")
    assert_read_headers(nodes)
    stub = next(n for n in nodes.json() if n["ID"] == node_id)
    assert stub["Name"] == "n1" and stub["Status"] == "ready" and "Attributes" not in stub
    assert [n["ID"] for n in get(f"{base}/v1/nodes", params={"prefix": node_id[:12]}).json()] == [
        node_id
    ]
    assert get(f"{base}/v1/node/{node_id}").json()["Datacenter"] == "dc1"
    assert isinstance(get(f"{base}/v1/node/{node_id}/allocations").json(), list)

    def placed() -> list[dict[str, Any]]:
        return get(f"{base}/v1/job/{job_id}/allocations").json()

    allocs = wait_until(placed, 30.0, "the scheduler to place the job on the new node")
    alloc = get(f"{base}/v1/allocation/{allocs[0]['ID']}")
    assert alloc.status_code == 200 and alloc.json()["JobID"] == job_id
    assert allocs[0]["ID"] in {a["ID"] for a in get(f"{base}/v1/allocations").json()}
    assert allocs[0]["ID"] in {a["ID"] for a in get(f"{base}/v1/node/{node_id}/allocations").json()}
    deployment = get(f"{base}/v1/job/{job_id}/deployment").json()
    if deployment is not None:
        assert get(f"{base}/v1/deployment/{deployment['ID']}").json()["JobID"] == job_id
        assert isinstance(get(f"{base}/v1/deployment/allocations/{deployment['ID']}").json(), list)


# -- system -----------------------------------------------------------------------------------------
def test_system_gc_collects_a_stopped_job(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = uid("gc")
    register(base, job(job_id))
    requests.delete(f"{base}/v1/job/{job_id}", timeout=TIMEOUT).raise_for_status()

    def collected() -> bool:
        resp = requests.put(f"{base}/v1/system/gc", timeout=TIMEOUT)
        assert resp.status_code == 200, resp.text
        assert {"Index", "Collected"} <= set(resp.json())
        return get(f"{base}/v1/job/{job_id}").status_code == 404

    # The stop's evaluation must finish (scheduler) before the job is collectable.
    wait_until(collected, 60.0, "forced GC to collect the stopped job")


def test_reconcile_summaries_and_snapshot_answer_or_say_not_implemented(
    http_cluster: HTTPCluster,
) -> None:
    base = http_cluster.follower_url
    resp = requests.put(f"{base}/v1/system/reconcile/summaries", timeout=TIMEOUT)
    assert resp.status_code in (200, 501), resp.text
    if resp.status_code == 501:
        assert "not available" in resp.text
    snap = get(f"{base}/v1/operator/snapshot")
    assert snap.status_code in (200, 501), snap.text
    if snap.status_code == 501:
        assert "not available" in snap.text
    else:
        assert snap.content


# -- parse --------------------------------------------------------------------------------------------
SEED = """
job "docs" {
  group "example" {
    reschedule {
      attempts       = 15
      interval       = "1h"
      delay          = "30s"
      delay_function = "exponential"
      max_delay      = "120s"
      unlimited      = false
    }
  }
}
"""


def test_jobs_parse(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    resp = requests.post(
        f"{base}/v1/jobs/parse", json={"JobHCL": SEED, "Canonicalize": False}, timeout=TIMEOUT
    )
    assert resp.status_code == 200, resp.text
    parsed = resp.json()
    assert parsed["ID"] == "docs"
    assert parsed["TaskGroups"][0]["ReschedulePolicy"] == {
        "Attempts": 15,
        "Interval": 3_600_000_000_000,
        "Delay": 30_000_000_000,
        "DelayFunction": "exponential",
        "MaxDelay": 120_000_000_000,
        "Unlimited": False,
    }
    bad = requests.post(
        f"{base}/v1/jobs/parse",
        json={"JobHCL": 'job "x" {\n  group "g" {\n    count = \n  }\n}\n'},
        timeout=TIMEOUT,
    )
    assert_error(bad, 400, "line 3, column")
    assert_error(
        requests.post(f"{base}/v1/jobs/parse", json={"Nope": 1}, timeout=TIMEOUT), 400, "JobHCL"
    )
    spec = 'job "canon" {\n  type = "batch"\n  group "g" {\n    task "t" {\n      driver = "sim"\n    }\n  }\n}\n'
    canon = requests.post(
        f"{base}/v1/jobs/parse", json={"JobHCL": spec, "Canonicalize": True}, timeout=TIMEOUT
    ).json()
    assert (
        canon["Priority"] == 50 and canon["TaskGroups"][0]["ReschedulePolicy"]["Attempts"] == 1
    )  # batch defaults
    # The parsed JSON registers as is.
    assert register(base, canon).status_code == 200


# -- errors and redirects ---------------------------------------------------------------------------
def test_followers_never_redirect(http_cluster: HTTPCluster) -> None:
    for node in http_cluster.followers():
        base = http_cluster.url(node)
        resp = register(base, job(uid("noredir")))
        assert resp.status_code == 200 and "Location" not in resp.headers
        assert get(f"{base}/v1/jobs").status_code == 200
