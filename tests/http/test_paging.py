"""Nomad's list paging and filtering over HTTP: per_page, next_token, filter, reverse, X-Nomad-NextToken."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.http.support import HTTPCluster, job

TIMEOUT = 30.0
JOBS = [f"pg-{i:02d}" for i in range(23)]


@pytest.fixture(scope="module")
def paged(http_cluster: HTTPCluster) -> HTTPCluster:
    """23 jobs (``pg-00``..``pg-22``), odd ones with ``Meta.parity = odd``; each register made an eval."""
    with http_cluster.rpc() as client:
        for i, job_id in enumerate(JOBS):
            client.call("job.register", {"job": job(job_id, meta={"parity": "odd" if i % 2 else "even"})})
    return http_cluster


def get(url: str, **params: Any) -> requests.Response:
    return requests.get(url, params=params, timeout=TIMEOUT)


def follow(url: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page, following X-Nomad-NextToken as a Nomad client does."""
    pages = []
    token = ""
    while True:
        resp = get(url, **params, **({"next_token": token} if token else {}))
        assert resp.status_code == 200, resp.text
        pages.append(resp.json())
        token = resp.headers.get("X-Nomad-NextToken", "")
        if not token:
            return pages
        assert token == _first_id_of_next(url, params, token)


def _first_id_of_next(url: str, params: dict[str, Any], token: str) -> str:
    """Nomad's token is the ID of the next page's first item."""
    return get(url, **{**params, "per_page": 1}, next_token=token).json()[0]["ID"]


def test_jobs_page_by_per_page(paged: HTTPCluster) -> None:
    pages = follow(f"{paged.follower_url}/v1/jobs", prefix="pg-", per_page=10)
    assert [len(p) for p in pages] == [10, 10, 3]
    assert [j["ID"] for p in pages for j in p] == JOBS


def test_without_per_page_everything_comes_streamed(paged: HTTPCluster) -> None:
    resp = get(f"{paged.leader_url}/v1/jobs", prefix="pg-")
    assert resp.status_code == 200
    assert "X-Nomad-NextToken" not in resp.headers
    assert int(resp.headers["X-Nomad-Index"]) > 0 and resp.headers["X-Nomad-KnownLeader"] == "true"
    assert [j["ID"] for j in resp.json()] == JOBS
    assert get(f"{paged.leader_url}/v1/jobs", prefix="pg-nothing").json() == []


def test_reverse(paged: HTTPCluster) -> None:
    pages = follow(f"{paged.follower_url}/v1/jobs", prefix="pg-", per_page=8, reverse="true")
    assert [j["ID"] for p in pages for j in p] == JOBS[::-1]


def test_filter_applies_before_paging(paged: HTTPCluster) -> None:
    url = f"{paged.follower_url}/v1/jobs"
    pages = follow(url, prefix="pg-", per_page=5, filter='Meta.parity == "odd"')
    assert [len(p) for p in pages] == [5, 5, 1]
    assert [j["ID"] for p in pages for j in p] == JOBS[1::2]
    everything = get(url, filter='ID matches "^pg-1[0-9]$" and Meta.parity != "odd"').json()
    assert [j["ID"] for j in everything] == ["pg-10", "pg-12", "pg-14", "pg-16", "pg-18"]


def test_evaluations_and_job_subresources_page(paged: HTTPCluster) -> None:
    base = paged.follower_url
    evals = [e for p in follow(f"{base}/v1/evaluations", per_page=4, filter='JobID matches "^pg-"') for e in p]
    assert sorted({e["JobID"] for e in evals}) == JOBS  # a register's eval, and maybe a blocked one
    assert len({e["ID"] for e in evals}) == len(evals)
    one = follow(f"{base}/v1/job/pg-03/evaluations", per_page=1)
    assert {e["JobID"] for p in one for e in p} == {"pg-03"} and all(len(p) == 1 for p in one)
    assert get(f"{base}/v1/job/pg-03/allocations", filter='ClientStatus == "running"').json() == []


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({"per_page": "-1"}, "per_page"),
        ({"per_page": "ten"}, "per_page"),
        ({"reverse": "sideways"}, "reverse"),
        ({"filter": 'Status = "running"'}, "column 8"),
        ({"filter": "Status =="}, "it ends early"),
        ({"filter": 'Priority == "high"'}, "Priority is a number"),
    ],
)
def test_bad_list_parameters_are_400(paged: HTTPCluster, params: dict[str, str], text: str) -> None:
    for path in ("/v1/jobs", "/v1/evaluations", "/v1/allocations", "/v1/nodes", "/v1/deployments"):
        resp = get(f"{paged.follower_url}{path}", **params)
        if "Priority" in params.get("filter", "") and path != "/v1/jobs":
            continue  # only jobs and evals have a Priority; elsewhere the filter just matches nothing
        assert resp.status_code == 400, (path, resp.text)
        assert text in resp.text, (path, resp.text)


def test_every_list_route_takes_the_parameters(paged: HTTPCluster) -> None:
    base = paged.follower_url
    for path in ("/v1/allocations", "/v1/nodes", "/v1/deployments", "/v1/job/pg-01/deployments"):
        resp = get(f"{base}{path}", per_page=2, filter='ID != ""')
        assert resp.status_code == 200, (path, resp.text)
        assert isinstance(resp.json(), list)


def test_small_frames_make_small_pages(cluster_factory: Any) -> None:
    """With a 64 KiB frame a page carries at most 16 KiB: a long list comes in many pages, none lost."""
    c: HTTPCluster = cluster_factory(1, 'rpc_max_frame = "64KiB"\nmax_entry_size = "32KiB"\n')
    ids = [f"small-{i:03d}" for i in range(60)]
    with c.rpc() as client:
        for job_id in ids:
            client.call("job.register", {"job": job(job_id, meta={"pad": "x" * 600})})
        first = client.call("job.list", {"prefix": "small-"})
    assert first["next_token"] and len(first["data"]) < len(ids)  # cut by the byte budget
    pages = follow(f"{c.leader_url}/v1/jobs", prefix="small-", per_page=1000)
    assert len(pages) > 1
    assert [j["ID"] for p in pages for j in p] == ids
    assert [j["ID"] for j in get(f"{c.leader_url}/v1/jobs", prefix="small-").json()] == ids
