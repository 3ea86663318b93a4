"""ACL over HTTP: bootstrap, tokens in X-Nomad-Token, 403 without the right one, token CRUD."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.http.support import ChunkedStream, HTTPCluster, job

pytestmark = pytest.mark.cluster

TIMEOUT = 30
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def hdr(token: str | None) -> dict[str, str]:
    return {"X-Nomad-Token": token} if token else {}


@pytest.fixture(scope="module")
def mgmt(acl_cluster: HTTPCluster) -> Iterator[dict[str, Any]]:
    """The bootstrap token, created through a follower's HTTP API."""
    resp = requests.post(f"{acl_cluster.follower_url}/v1/acl/bootstrap", timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    yield resp.json()


def test_bootstrap_answer_and_second_bootstrap(
    acl_cluster: HTTPCluster, mgmt: dict[str, Any]
) -> None:
    assert mgmt["Type"] == "management" and mgmt["SecretID"] and mgmt["AccessorID"]
    assert RFC3339.match(mgmt["CreateTime"]) and mgmt["ExpirationTime"] is None
    assert "SecretHash" not in mgmt
    again = requests.post(f"{acl_cluster.leader_url}/v1/acl/bootstrap", timeout=TIMEOUT)
    assert again.status_code == 400 and "already done" in again.text


def test_tokens_gate_reads_and_writes(acl_cluster: HTTPCluster, mgmt: dict[str, Any]) -> None:
    base = acl_cluster.follower_url
    secret = mgmt["SecretID"]
    # Each denial says where an HTTP client puts a token, not the CLI's flag
    # (the write is forwarded to the leader: the hint survives the hop).
    read = requests.get(f"{base}/v1/jobs", timeout=TIMEOUT)
    assert read.status_code == 403 and read.text == "ACLs are enabled: pass a token (X-Nomad-Token header)"
    wrong = requests.get(f"{base}/v1/jobs", headers=hdr("not-a-token"), timeout=TIMEOUT)
    assert wrong.status_code == 403 and "(X-Nomad-Token header)" in wrong.text and "CARAVAN_TOKEN" not in wrong.text
    denied = requests.post(f"{base}/v1/jobs", json={"Job": job("acl-x")}, timeout=TIMEOUT)
    assert denied.status_code == 403 and denied.text == read.text
    ok = requests.post(
        f"{base}/v1/jobs", json={"Job": job("acl-x")}, headers=hdr(secret), timeout=TIMEOUT
    )
    assert ok.status_code == 200, ok.text
    bearer = requests.get(
        f"{base}/v1/job/acl-x", headers={"Authorization": f"Bearer {secret}"}, timeout=TIMEOUT
    )
    assert bearer.status_code == 200
    # Open with ACLs on, as in Nomad: status and metrics.
    assert requests.get(f"{base}/v1/status/leader", timeout=TIMEOUT).status_code == 200
    assert requests.get(f"{base}/v1/metrics", timeout=TIMEOUT).status_code == 200
    assert requests.put(f"{base}/v1/system/gc", timeout=TIMEOUT).status_code == 403


def test_client_token_lifecycle(acl_cluster: HTTPCluster, mgmt: dict[str, Any]) -> None:
    base = acl_cluster.follower_url
    secret = mgmt["SecretID"]
    spec = {"Name": "reader", "Type": "client", "Policies": ["read"], "ExpirationTTL": "1h"}
    assert requests.post(f"{base}/v1/acl/token", json=spec, timeout=TIMEOUT).status_code == 403
    created = requests.post(f"{base}/v1/acl/token", json=spec, headers=hdr(secret), timeout=TIMEOUT)
    assert created.status_code == 200, created.text
    reader = created.json()
    assert reader["Name"] == "reader" and reader["Policies"] == ["read"] and reader["SecretID"]
    assert RFC3339.match(reader["ExpirationTime"])

    rs = reader["SecretID"]
    assert requests.get(f"{base}/v1/jobs", headers=hdr(rs), timeout=TIMEOUT).status_code == 200
    write = requests.post(
        f"{base}/v1/jobs", json={"Job": job("acl-r")}, headers=hdr(rs), timeout=TIMEOUT
    )
    assert write.status_code == 403 and "write" in write.text
    assert (
        requests.get(f"{base}/v1/acl/tokens", headers=hdr(rs), timeout=TIMEOUT).status_code == 403
    )

    me = requests.get(f"{base}/v1/acl/token/self", headers=hdr(rs), timeout=TIMEOUT)
    assert me.status_code == 200 and me.json()["AccessorID"] == reader["AccessorID"]
    assert me.json()["SecretID"] == rs  # Nomad's self answers the whole token, secret included
    assert requests.get(f"{base}/v1/acl/token/self", timeout=TIMEOUT).status_code == 400
    assert (
        requests.get(f"{base}/v1/acl/token/self", headers=hdr("nope"), timeout=TIMEOUT).status_code
        == 404
    )

    listed = requests.get(f"{base}/v1/acl/tokens", headers=hdr(secret), timeout=TIMEOUT)
    assert listed.status_code == 200 and reader["AccessorID"] in {
        t["AccessorID"] for t in listed.json()
    }
    assert all("SecretID" not in t for t in listed.json())
    got = requests.get(
        f"{base}/v1/acl/token/{reader['AccessorID']}", headers=hdr(secret), timeout=TIMEOUT
    )
    assert got.status_code == 200 and got.json()["Name"] == "reader"
    missing = requests.get(
        f"{base}/v1/acl/token/00000000-0000-0000-0000-000000000000",
        headers=hdr(secret),
        timeout=TIMEOUT,
    )
    assert missing.status_code == 404

    update = requests.post(
        f"{base}/v1/acl/token/{reader['AccessorID']}",
        json={"Name": "x"},
        headers=hdr(secret),
        timeout=TIMEOUT,
    )
    assert update.status_code in (200, 501)
    bad = requests.post(
        f"{base}/v1/acl/token",
        json={"Type": "client", "Policies": ["root"]},
        headers=hdr(secret),
        timeout=TIMEOUT,
    )
    assert bad.status_code == 400
    bad_ttl = requests.post(
        f"{base}/v1/acl/token",
        json={**spec, "ExpirationTTL": "soon"},
        headers=hdr(secret),
        timeout=TIMEOUT,
    )
    assert bad_ttl.status_code == 400 and "ExpirationTTL" in bad_ttl.text

    deleted = requests.delete(
        f"{base}/v1/acl/token/{reader['AccessorID']}", headers=hdr(secret), timeout=TIMEOUT
    )
    assert deleted.status_code == 200, deleted.text
    assert requests.get(f"{base}/v1/jobs", headers=hdr(rs), timeout=TIMEOUT).status_code == 403


def test_event_stream_checks_the_token_before_streaming(
    acl_cluster: HTTPCluster, mgmt: dict[str, Any]
) -> None:
    node = acl_cluster.followers()[0]
    denied = ChunkedStream(node.http_address, "/v1/event/stream")
    try:
        assert denied.status == 403
        assert b"token" in denied.body().lower()
    finally:
        denied.close()
    allowed = ChunkedStream(node.http_address, "/v1/event/stream?topic=Job", token=mgmt["SecretID"])
    try:
        assert allowed.status == 200
        assert allowed.lines(1) == [b"{}\n"]
    finally:
        allowed.close()
