"""/v1/metrics: Prometheus text (format=prometheus) and Nomad's JSON, fed by the server's hooks."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from node.core.metrics import REQUEST_BUCKETS, Metrics, MetricsError
from tests.http.support import ChunkedStream, HTTPCluster, job, wait_until

TIMEOUT = 30


def scrape(base: str) -> dict[str, list[Any]]:
    resp = requests.get(f"{base}/v1/metrics", params={"format": "prometheus"}, timeout=TIMEOUT)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    found = [
        s.value
        for s in samples.get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(found)


@pytest.mark.cluster
def test_prometheus_text_on_leader_and_follower(http_cluster: HTTPCluster) -> None:
    leader, follower = http_cluster.leader(), http_cluster.followers()[0]
    job_id = f"m-{uuid.uuid4().hex[:8]}"
    requests.post(
        f"{http_cluster.url(follower)}/v1/jobs", json={"Job": job(job_id)}, timeout=TIMEOUT
    ).raise_for_status()

    lead = scrape(http_cluster.url(leader))
    assert (
        value(lead, "caravan_raft_role", role="leader") == 1
        and value(lead, "caravan_raft_leader") == 1
    )
    assert value(lead, "caravan_raft_term") >= 1
    # The tick thread's load and stalls (raft/ticks.py): present, and a share of time.
    assert "caravan_raft_tick_busy_ratio" in lead and "caravan_raft_tick_stalls_total" in lead
    assert 0 < value(lead, "caravan_raft_tick_busy_ratio") < 1
    assert (
        value(lead, "caravan_raft_commit_index") >= 1
        and value(lead, "caravan_fsm_applied_index") >= 1
    )
    assert value(lead, "caravan_fsm_apply_duration_seconds_count", type="job_register") >= 1
    assert value(lead, "caravan_fsm_commit_duration_seconds_count") >= 1
    # The follower forwarded the write over RPC: the leader counted it by method and code.
    assert value(lead, "caravan_rpc_requests_total", method="job.register", code="ok") >= 1
    assert (
        value(lead, "caravan_rpc_request_duration_seconds_count", method="job.register", code="ok")
        >= 1
    )
    assert "caravan_eval_broker_depth" in lead and "caravan_eval_blocked" in lead
    assert "caravan_journal_subscribers" in lead and "caravan_journal_subscriber_lag" in lead

    foll = scrape(http_cluster.url(follower))
    assert value(foll, "caravan_raft_role", role="follower") == 1
    assert (
        value(foll, "caravan_http_requests_total", route="/v1/jobs", method="POST", code="200") >= 1
    )
    assert (
        value(
            foll,
            "caravan_http_request_duration_seconds_count",
            route="/v1/jobs",
            method="POST",
            code="200",
        )
        >= 1
    )
    requests.get(f"{http_cluster.url(follower)}/v1/job/definitely-missing", timeout=TIMEOUT)
    foll = scrape(http_cluster.url(follower))
    assert (
        value(
            foll, "caravan_http_requests_total", route="/v1/job/{job_id}", method="GET", code="404"
        )
        >= 1
    )


@pytest.mark.cluster
def test_journal_subscribers_and_open_streams(http_cluster: HTTPCluster) -> None:
    follower = http_cluster.followers()[0]
    stream = ChunkedStream(follower.http_address, "/v1/event/stream?topic=Job")
    try:
        assert stream.status == 200
        stream.lines(1)
        samples = scrape(http_cluster.url(follower))
        assert value(samples, "caravan_journal_subscribers") >= 1
        assert value(samples, "caravan_http_event_streams") >= 1
    finally:
        stream.close()
    wait_until(
        lambda: value(scrape(http_cluster.url(follower)), "caravan_http_event_streams") == 0,
        15.0,
        "the closed stream to be released",
    )


@pytest.mark.cluster
def test_gc_reaps_are_counted_by_kind(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    job_id = f"mgc-{uuid.uuid4().hex[:8]}"
    requests.post(f"{base}/v1/jobs", json={"Job": job(job_id)}, timeout=TIMEOUT).raise_for_status()
    requests.delete(f"{base}/v1/job/{job_id}", timeout=TIMEOUT).raise_for_status()

    def collected() -> bool:
        requests.put(f"{base}/v1/system/gc", timeout=TIMEOUT).raise_for_status()
        return requests.get(f"{base}/v1/job/{job_id}", timeout=TIMEOUT).status_code == 404

    wait_until(collected, 60.0, "GC to collect the stopped job")
    lead = scrape(http_cluster.leader_url)
    assert value(lead, "caravan_gc_reaped_objects_total", kind="jobs") >= 1
    assert value(lead, "caravan_gc_reaped_objects_total", kind="evals") >= 1


@pytest.mark.cluster
def test_json_format_and_bad_format(http_cluster: HTTPCluster) -> None:
    base = http_cluster.follower_url
    out = requests.get(f"{base}/v1/metrics", timeout=TIMEOUT)
    assert out.status_code == 200 and out.headers["Content-Type"].startswith("application/json")
    body = out.json()
    assert {"Timestamp", "Gauges", "Counters", "Samples"} <= set(body)
    term = next(g for g in body["Gauges"] if g["Name"] == "caravan_raft_term")
    assert term["Value"] >= 1 and term["Labels"] == {}
    http = [c for c in body["Counters"] if c["Name"] == "caravan_http_requests_total"]
    assert http and {"Count", "Sum", "Labels"} <= set(http[0]) and "route" in http[0]["Labels"]
    assert any(
        s["Name"] == "caravan_http_request_duration_seconds" and s["Count"] >= 1
        for s in body["Samples"]
    )
    bad = requests.get(f"{base}/v1/metrics", params={"format": "xml"}, timeout=TIMEOUT)
    assert bad.status_code == 400 and "prometheus" in bad.text


# -- the hooks, without a server -------------------------------------------------------------------
class FakeFSM:
    def __init__(self) -> None:
        self.applied: list[int] = []
        self.commits = 0

    def apply(self, index: int, entry: bytes) -> str:
        if entry == b"boom":
            raise RuntimeError("apply failed")
        self.applied.append(index)
        return "ok"

    def commit(self) -> None:
        self.commits += 1


def test_instrumented_fsm_times_apply_and_commit_and_passes_errors_through() -> None:
    m = Metrics()
    fsm = FakeFSM()
    m.instrument_fsm(fsm)
    m.instrument_fsm(fsm)  # idempotent: wrapped once
    assert fsm.apply(7, bytes([1]) + b"payload") == "ok"
    assert fsm.apply(8, bytes([200])) == "ok"
    fsm.commit()
    with pytest.raises(RuntimeError):
        fsm.apply(9, b"boom")
    assert fsm.applied == [7, 8] and fsm.commits == 1
    text = m.prometheus().decode()
    assert 'caravan_fsm_apply_duration_seconds_count{type="job_register"} 1.0' in text
    assert 'caravan_fsm_apply_duration_seconds_count{type="type_200"} 1.0' in text
    assert "caravan_fsm_commit_duration_seconds_count 1.0" in text
    assert "_created" not in text


def test_counters_json_and_registered_gauges() -> None:
    m = Metrics()
    m.observe_rpc("job.get", "not_found", 0.002)
    m.observe_http("/v1/job/{job_id}", "GET", 404, 0.003)
    m.record_gc({"jobs": 2, "evals": 0, "allocs": 5})
    m.observe_snapshot("save", 1.5)
    m.register_gauge("caravan_test_depth", "a test gauge", lambda: 4)
    m.register_gauge(
        "caravan_test_by_state", "by state", lambda: {"ready": 1, "waiting": 2}, label="state"
    )
    m.register_gauge("caravan_test_broken", "raises", lambda: 1 / 0)
    with pytest.raises(MetricsError):
        m.register_gauge("not caravan", "x", lambda: 1)
    text = m.prometheus().decode()
    assert 'caravan_rpc_requests_total{code="not_found",method="job.get"} 1.0' in text
    assert (
        'caravan_gc_reaped_objects_total{kind="allocs"} 5.0' in text and 'kind="evals"' not in text
    )
    assert "caravan_test_depth 4.0" in text and 'caravan_test_by_state{state="waiting"} 2.0' in text
    assert "caravan_test_broken" not in text  # a broken source is skipped, the scrape still works
    body = m.nomad_json()
    assert {"Name": "caravan_test_depth", "Value": 4, "Labels": {}} in body["Gauges"]
    gc = next(
        c
        for c in body["Counters"]
        if c["Name"] == "caravan_gc_reaped_objects_total" and c["Labels"] == {"kind": "jobs"}
    )
    assert gc["Count"] == 2
    snap = next(s for s in body["Samples"] if s["Name"] == "caravan_snapshot_duration_seconds")
    assert snap["Count"] == 1 and snap["Sum"] == 1.5 and snap["Labels"] == {"op": "save"}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["job.get", "job.register", "status"]),
            st.sampled_from(["ok", "not_found"]),
            st.one_of(st.floats(0, 400, allow_nan=False), st.sampled_from(REQUEST_BUCKETS)),
        ),
        max_size=40,
    )
)
def test_rpc_stats_expose_what_prometheus_clients_counter_and_histogram_would(
    calls: list[tuple[str, str, float]],
) -> None:
    """The RPC series are kept by hand (no locks on the leader's loop); a scrape must not tell."""
    ours = Metrics()
    registry = CollectorRegistry()
    requests_ = Counter("caravan_rpc_requests", "RPC requests served, by method and result code",
                        ["method", "code"], registry=registry)
    seconds = Histogram("caravan_rpc_request_duration_seconds", "RPC request latency, by method and result code",
                        ["method", "code"], buckets=REQUEST_BUCKETS, registry=registry)
    for method, code, took in calls:
        ours.observe_rpc(method, code, took)
        requests_.labels(method, code).inc()
        seconds.labels(method, code).observe(took)

    def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            if family.name.startswith("caravan_rpc_")
            for s in family.samples
        }

    theirs = samples(generate_latest(registry).decode())
    mine = samples(ours.prometheus().decode())
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert mine[key] == pytest.approx(value), key
