"""GET /v1/event/stream: HTTP/1.1 chunked NDJSON, one line per batch, {} heartbeats, never ends.

Read with a raw socket so the framing itself is checked: every chunk is
exactly one JSON line, no line is blank, heartbeats are exactly ``{}``, and
no terminating chunk arrives while the server runs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import requests

from tests.http.support import ChunkedStream, HTTPCluster, job, wait_until

pytestmark = pytest.mark.cluster

TIMEOUT = 30


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def register(base: str, spec: dict[str, Any]) -> dict[str, Any]:
    resp = requests.post(f"{base}/v1/jobs", json={"Job": spec}, timeout=TIMEOUT)
    resp.raise_for_status()
    return resp.json()


def has_job(job_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda batch: any(e["Topic"] == "Job" and e["Key"] == job_id for e in batch["Events"])


def test_framing_heartbeats_and_no_end(http_cluster: HTTPCluster) -> None:
    node = http_cluster.followers()[0]
    stream = ChunkedStream(node.http_address, "/v1/event/stream?topic=Job")
    try:
        assert stream.status == 200
        assert stream.headers["transfer-encoding"] == "chunked"
        assert stream.headers["content-type"].startswith("application/json")
        first = stream.lines(1)[0]
        assert first == b"{}\n"  # a heartbeat at once
        job_id = uid("frame")
        out = register(http_cluster.url(node), job(job_id))
        batches = stream.events(has_job(job_id))
        last = batches[-1]
        assert set(last) == {"Index", "Events"}
        event = next(e for e in last["Events"] if e["Key"] == job_id)
        assert {"Topic", "Type", "Key", "Namespace", "Index", "Payload"} <= set(event)
        assert event["Index"] == last["Index"] == out["JobModifyIndex"]
        assert event["Namespace"] == "default"
        assert event["Payload"]["Job"]["ID"] == job_id  # keyed by topic, as Nomad
        assert all(e["Topic"] == "Job" for b in batches for e in b["Events"])
        # Idle: only heartbeats, each exactly {}, and the response does not end.
        idle_started = time.monotonic()
        heartbeats = 0
        while heartbeats < 3:
            (line,) = stream.lines(1)
            if line == b"{}\n":
                heartbeats += 1
        assert time.monotonic() - idle_started < 20
        assert not stream.ended
    finally:
        stream.close()


def test_topic_key_filter_and_resume_from_index(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    wanted, other = uid("want"), uid("other")
    first = register(base, job(wanted))
    register(base, job(other))
    second = register(base, job(wanted, count=2))
    address = http_cluster.followers()[0].http_address
    stream = ChunkedStream(address, f"/v1/event/stream?topic=Job:{wanted}&index={first['Index']}")
    try:
        assert stream.status == 200
        batches = stream.events(lambda b: b["Index"] >= second["Index"])
        indexes = [b["Index"] for b in batches]
        assert (
            indexes == sorted(set(indexes)) and indexes[0] == first["Index"]
        )  # from the index, inclusive
        assert {e["Key"] for b in batches for e in b["Events"]} == {wanted}
    finally:
        stream.close()
    # Resuming after the last index seen gives the next batches only.
    stream = ChunkedStream(
        address, f"/v1/event/stream?topic=Job:{wanted}&index={second['Index'] + 1}"
    )
    try:
        third = register(base, job(wanted, count=3))
        batches = stream.events(lambda b: b["Index"] >= third["Index"])
        assert [b["Index"] for b in batches] == [third["Index"]]
    finally:
        stream.close()


def test_errors_answered_before_streaming(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    resp = requests.get(f"{base}/v1/event/stream", params={"topic": "Bogus"}, timeout=TIMEOUT)
    assert resp.status_code == 400 and "unknown topic" in resp.text
    resp = requests.get(f"{base}/v1/event/stream", params={"index": "x"}, timeout=TIMEOUT)
    assert resp.status_code == 400


def test_reset_required_is_410(cluster_factory: Callable[..., HTTPCluster]) -> None:
    c = cluster_factory(1, "[journal]\nmax_batches = 3\n")
    base = c.url(c.nodes[0])
    for n in range(8):
        register(base, job(f"trim-{n}"))

    # index=2: "from batch 2 on" (index 0 or 1 would mean "from the oldest kept").
    # Polled: a write is answered once applied; its tick's trim commits just after.
    def trimmed() -> bool:
        probe = ChunkedStream(c.nodes[0].http_address, "/v1/event/stream?index=2")
        try:
            return probe.status == 410
        finally:
            probe.close()

    wait_until(trimmed, 30.0, "the journal to trim past index 2")
    resp = requests.get(f"{base}/v1/event/stream", params={"index": 2}, timeout=TIMEOUT)
    assert resp.status_code == 410
    assert "older than the oldest retained index" in resp.text
    assert int(resp.headers["X-Caravan-Oldest-Index"]) > 2
    # Without an index it streams from the oldest batch kept.
    stream = ChunkedStream(c.nodes[0].http_address, "/v1/event/stream?index=0")
    try:
        assert stream.status == 200
        assert json.loads(stream.lines(1)[0]) == {}
        register(base, job("trim-8"))
        batches = stream.events(has_job("trim-8"))
        assert batches[0]["Index"] > 2
    finally:
        stream.close()
