"""Issue #35's acceptance, as a python-nomad user would drive it, with simulated clients running throughout.

Bootstrap ACLs on a live cluster, create a policy and a client token for it,
run jobs with the management token, read them with the client token, get a
403 where the policy does not allow the call, page through a list and
filter one, deregister and GC. The simulated nodes authenticate with their
node secrets, so none of it takes them or their allocs down.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import nomad
import nomad.api.exceptions as nx
import pytest

from node.devcluster import ClusterNode
from tests.http.support import job
from tests.lifecycle.conftest import Env, cluster_env, wait_until

pytestmark = pytest.mark.cluster

READ_ONLY = 'namespace "default" { policy = "read" }\nnode { policy = "read" }\n'
WATCH = 6.0  # seconds the clients are watched after the last call: three heartbeat TTLs and grace


@pytest.fixture
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from cluster_env(tmp_path_factory, "nomad-flow")


def client(node: ClusterNode, token: str | None = None) -> nomad.Nomad:
    host, port = node.http_address.rsplit(":", 1)
    return nomad.Nomad(host=host, port=int(port), token=token, timeout=30)


def every_page(n: nomad.Nomad, per_page: int) -> list[dict[str, Any]]:
    """All allocations, ``per_page`` at a time, following X-Nomad-NextToken as Nomad's own CLI does."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        params: dict[str, Any] = {"per_page": per_page, **({"next_token": token} if token else {})}
        resp = n.allocations.request(method="get", params=params)
        page = resp.json()
        assert len(page) <= per_page
        items += page
        token = resp.headers.get("X-Nomad-NextToken", "")
        if not token:
            return items


def test_python_nomad_drives_the_whole_flow_with_acls_on_and_clients_running(env: Env) -> None:
    sim = env.start_sim(3, "flow")
    server = next(n for n in env.cluster.nodes if n.http_address)
    boot = client(server).acl.generate_bootstrap()
    admin = client(server, boot["SecretID"])
    admin.acl.create_policy("readonly", {"Name": "readonly", "Description": "read jobs and nodes", "Rules": READ_ONLY})
    assert [p["Name"] for p in admin.acl.get_policies()] == ["readonly"]
    reader_token = admin.acl.create_token({"Name": "reader", "Type": "client", "Policies": ["readonly"]})
    reader = client(server, reader_token["SecretID"])

    admin.job.register_job("web", {"Job": job("web", count=3)})
    batch = job("etl", count=2, job_type="batch")
    batch["TaskGroups"][0]["Tasks"][0]["Config"] = {"run_for": "1s"}
    admin.job.register_job("etl", {"Job": batch})

    assert reader.job.get_job("web")["ID"] == "web"
    with pytest.raises(nx.URLNotAuthorizedNomadException):
        reader.job.register_job("nope", {"Job": job("nope")})
    with pytest.raises(nx.URLNotAuthorizedNomadException):
        reader.system.initiate_garbage_collection()

    def running() -> list[dict[str, Any]] | None:
        up = [a for a in admin.job.get_allocations("web") if a["ClientStatus"] == "running"]
        return up if len(up) == 3 else None

    web = wait_until(running, 60, "web's allocs running")
    wait_until(lambda: admin.job.get_job("etl")["Status"] == "dead", 60, "the batch job complete")

    everything = admin.allocations.get_allocations()
    paged = every_page(admin, 2)
    assert sorted(a["ID"] for a in paged) == sorted(a["ID"] for a in everything) and len(paged) == 5
    filtered = reader.allocations.get_allocations(filter_='JobID == "web" and ClientStatus == "running"')
    assert sorted(a["ID"] for a in filtered) == sorted(a["ID"] for a in web)

    stopped = admin.job.deregister_job("etl")["EvalID"]
    # A forced GC collects only a job whose evals are done: the deregistration's own eval first.
    wait_until(lambda: admin.evaluation.get_evaluation(stopped)["Status"] == "complete", 30, "the stop evaluated")
    admin.system.initiate_garbage_collection()
    wait_until(lambda: "etl" not in {j["ID"] for j in admin.jobs.get_jobs()}, 30, "the stopped batch job collected")

    deadline = time.monotonic() + WATCH
    while time.monotonic() < deadline:  # the clients stay up: every look, not only the last
        nodes = [n for n in admin.nodes.get_nodes() if n["ID"] in sim.nodes]
        assert len(nodes) == 3 and all(n["Status"] == "ready" for n in nodes), nodes
        assert running() is not None and sorted(a["ID"] for a in running() or []) == sorted(a["ID"] for a in web)
        time.sleep(0.5)
    assert not [a for a in admin.allocations.get_allocations() if a["ClientStatus"] in ("lost", "failed")]
    assert sim.proc.poll() is None
