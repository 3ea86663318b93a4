"""Field contract: every object the /v1 API serves carries every key of Nomad's own struct.

Code written against Nomad indexes the keys its ``api`` package always
carries; a missing one is a crash in someone's script. The lists of those
keys are test data (``tests/data/nomad_fields/<object>.json``, read from
Nomad's ``api/*.go``), and each test reads a real object from a real
server over HTTP and compares its keys with them: every key Nomad always
sends must be there, and any key Nomad does not have must be one of ours
named below (so a new one is a decision, not an accident). ``time.Time``
fields must be strings: a Go client refuses a number there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.http.support import HTTPCluster, job, start_cluster, stop_cluster, wait_until

pytestmark = pytest.mark.cluster

FIELDS_DIR = Path(__file__).resolve().parents[1] / "data" / "nomad_fields"
TIMEOUT = 30

# Keys we serve that Nomad's struct lacks: Caravan's own, kept on purpose.
CARAVAN_EXTRAS: dict[str, set[str]] = {
    "job": {"CreateTime", "ModifyTime", "Queue", "PriorityClass"},  # wall-clock times; queue and class by name
    "job_list_stub": {"NodePool", "Multiregion", "Queue", "PriorityClass"},  # Nomad's server sends the first two too
    "node": {"CreateTime", "ModifyTime"},
    "node_list_stub": set(),
    "allocation": {"JobVersion", "JobType"},  # ours; JobType is what the list stub shows
    "allocation_list_stub": {"DesiredTransition", "PreviousAllocation", "AllocModifyIndex"},
    "evaluation": set(),
    "deployment": set(),
    "deployment_state": {"AutoPromote"},  # Nomad's server sends it too
    "job_summary": set(),
    "acl_token": set(),
    "acl_token_list_stub": set(),
    "raft_configuration": set(),
    "raft_server": {"RaftAddress", "RPCAddress"},  # ours: two ports where Nomad has one
    "job_deregister_response": {"Index", "LastContact", "KnownLeader"},  # QueryMeta, as Nomad's
}


def nomad_fields(name: str) -> dict[str, dict[str, Any]]:
    """Nomad's fields of one object: name -> {"type": Go type, "omitempty": bool}."""
    return json.loads((FIELDS_DIR / f"{name}.json").read_text())["fields"]


def check_keys(name: str, obj: dict[str, Any]) -> None:
    """``obj`` has every key Nomad always sends, no stranger, and strings for Go times."""
    fields = nomad_fields(name)
    always = {k for k, f in fields.items() if not f["omitempty"]}
    missing = sorted(always - set(obj))
    assert not missing, f"{name} lacks Nomad's fields {missing}"
    strangers = sorted(set(obj) - set(fields) - CARAVAN_EXTRAS[name])
    assert not strangers, f"{name} has keys Nomad's struct does not: {strangers}"
    for key, field in fields.items():
        if key in obj and field["type"].lstrip("*") == "time.Time" and obj[key] is not None:
            assert isinstance(obj[key], str), f"{name}.{key} is a Go time: {obj[key]!r}"


@dataclass
class Served:
    """One single-server cluster with one of each object, read over HTTP."""

    base: str
    token: str
    ids: dict[str, str]

    def get(self, path: str) -> Any:
        resp = requests.get(self.base + path, headers={"X-Nomad-Token": self.token}, timeout=TIMEOUT)
        assert resp.status_code == 200, (path, resp.status_code, resp.text)
        return resp.json()


def _seed(c: HTTPCluster) -> dict[str, str]:
    """A client node, a job placed on it (alloc, eval, deployment)."""
    base = c.leader_url
    node_id = str(uuid.uuid4())
    node = {
        "ID": node_id, "Name": "contract-n1", "Datacenter": "dc1",
        "Attributes": {"driver.sim": "1", "kernel.name": "linux"},
        "Resources": {"CPU": 4000, "MemoryMB": 8192, "DiskMB": 0},
        "Status": "ready", "SchedulingEligibility": "eligible",
    }  # fmt: skip
    with c.rpc() as client:
        client.call("node.register", {"node": node})
    out = requests.post(f"{base}/v1/jobs", json={"Job": job("contract")}, timeout=TIMEOUT).json()
    allocs = wait_until(
        lambda: requests.get(f"{base}/v1/job/contract/allocations", timeout=TIMEOUT).json(), 30.0, "a placement"
    )
    deployment = wait_until(
        lambda: requests.get(f"{base}/v1/job/contract/deployment", timeout=TIMEOUT).json(), 30.0, "a deployment"
    )
    return {"node": node_id, "eval": out["EvalID"], "alloc": allocs[0]["ID"], "deployment": deployment["ID"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    c = start_cluster(tmp_path_factory.mktemp("fields"), 1)
    try:
        ids = _seed(c)
        boot = requests.post(f"{c.leader_url}/v1/acl/bootstrap", timeout=TIMEOUT)
        assert boot.status_code == 200, boot.text
        yield Served(c.leader_url, boot.json()["SecretID"], ids)
    finally:
        stop_cluster(c)


def _one(items: list[dict[str, Any]], key: str, value: str) -> dict[str, Any]:
    return next(i for i in items if i.get(key) == value)


READS: dict[str, Callable[[Served], dict[str, Any]]] = {
    "job": lambda s: s.get("/v1/job/contract"),
    "job_list_stub": lambda s: _one(s.get("/v1/jobs"), "ID", "contract"),
    "job_summary": lambda s: s.get("/v1/job/contract/summary"),
    "node": lambda s: s.get(f"/v1/node/{s.ids['node']}"),
    "node_list_stub": lambda s: _one(s.get("/v1/nodes"), "ID", s.ids["node"]),
    "allocation": lambda s: s.get(f"/v1/allocation/{s.ids['alloc']}"),
    "allocation_list_stub": lambda s: _one(s.get("/v1/allocations"), "ID", s.ids["alloc"]),
    "evaluation": lambda s: s.get(f"/v1/evaluation/{s.ids['eval']}"),
    "deployment": lambda s: s.get(f"/v1/deployment/{s.ids['deployment']}"),
    "acl_token": lambda s: s.get("/v1/acl/token/self"),
    "acl_token_list_stub": lambda s: s.get("/v1/acl/tokens")[0],
    "raft_configuration": lambda s: s.get("/v1/operator/raft/configuration"),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_served_object_has_nomads_fields(served: Served, name: str) -> None:
    check_keys(name, READS[name](served))


def test_lists_and_nested_objects_have_nomads_fields(served: Served) -> None:
    """The same objects where lists and parents carry them: every item, every nested struct."""
    for ev in served.get("/v1/evaluations"):
        check_keys("evaluation", ev)
    for dep in served.get("/v1/deployments"):
        check_keys("deployment", dep)
        for state in dep["TaskGroups"].values():
            check_keys("deployment_state", state)
    for alloc in served.get(f"/v1/node/{served.ids['node']}/allocations"):
        check_keys("allocation", alloc)  # Nomad's node allocations are whole allocations
    for version in served.get("/v1/job/contract/versions")["Versions"]:
        check_keys("job", version)
    for server in served.get("/v1/operator/raft/configuration")["Servers"]:
        check_keys("raft_server", server)
    alloc = served.get(f"/v1/allocation/{served.ids['alloc']}")
    check_keys("job", alloc["Job"])  # the job at the alloc's version, as Nomad embeds it


def test_filled_fields_carry_our_data(served: Served) -> None:
    """Where Caravan has the data the field is ours, not a zero."""
    stub = _one(served.get("/v1/allocations"), "ID", served.ids["alloc"])
    assert stub["NodeName"] == "contract-n1" and stub["JobType"] == "service"
    jobs = _one(served.get("/v1/jobs"), "ID", "contract")
    assert jobs["Periodic"] is False and "g" in jobs["JobSummary"]["Summary"]
    node = served.get(f"/v1/node/{served.ids['node']}")
    assert node["Drivers"]["sim"]["Healthy"] is True
    assert node["NodeResources"]["Cpu"]["CpuShares"] == 4000
    assert node["StatusUpdatedAt"] < 10**11  # Unix seconds, as Nomad's
    me = served.get("/v1/acl/token/self")
    assert me["SecretID"] == served.token and me["Type"] == "management"
    ev = served.get(f"/v1/evaluation/{served.ids['eval']}")
    assert ev["WaitUntil"] == "0001-01-01T00:00:00Z"


def test_deregistering_a_missing_job_is_nomads_empty_answer(served: Served) -> None:
    resp = requests.delete(
        f"{served.base}/v1/job/no-such-job", headers={"X-Nomad-Token": served.token}, timeout=TIMEOUT
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    check_keys("job_deregister_response", body)
    assert body["EvalID"] == "" and body["JobModifyIndex"] == 0


def test_leader_peers_and_raft_configuration_agree(http_cluster: HTTPCluster) -> None:
    """As in Nomad: the leader is one of the peers, and the peers are the raft servers' Addresses."""
    for node in http_cluster.nodes:
        base = http_cluster.url(node)
        leader = requests.get(f"{base}/v1/status/leader", timeout=TIMEOUT).json()
        peers = requests.get(f"{base}/v1/status/peers", timeout=TIMEOUT).json()
        conf = requests.get(f"{base}/v1/operator/raft/configuration", timeout=TIMEOUT).json()
        addresses = sorted(s["Address"] for s in conf["Servers"])
        assert sorted(peers) == addresses
        assert leader in peers
        assert [s["Address"] for s in conf["Servers"] if s["Leader"]] == [leader]
