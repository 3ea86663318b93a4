"""The quota workload and its checker: hand-built histories (no cluster), and one short real run.

The story of every hand-built history: the workload's queues are set up;
service ``qt-1`` (300 MHz) is admitted in lab-a, batch ``qt-2`` runs in
lab-c and finishes, service ``qt-3`` is registered in farm-y and stopped;
the ledger is sampled; after healing the census and every server's own
state agree. Each test changes one fact and names the verdict that must
follow, so the checker cannot pass a history vacuously.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from fsm.quota import Ledger
from jepsen_like.catalogue import WORKLOAD_CHECKS, WORKLOADS
from jepsen_like.history import Event, load_events
from jepsen_like.quota import QUEUES
from jepsen_like.quota_check import check_quota, queue_records, quota_violations
from jepsen_like.recorder import history_file
from jepsen_like.runner import EXIT_OK
from tests.jepsen.support import short_run
from tests.jepsen.test_checkers import history, op

SERVICE = {"cpu": 300, "memory": 64}
BATCH = {"cpu": 200, "memory": 32}


def view(
    used: dict[str, dict[str, int]], counts: dict[str, tuple[int, int]] | None = None
) -> dict[str, Any]:
    """Every queue's ledger view as ``queue.list`` shows it, for ``used`` (queue -> resource -> amount)."""
    records = queue_records(QUEUES)
    ledger = Ledger.build(records, used.items())
    out = {}
    for q in records:
        lent = ledger.lent(q.name)
        admitted, pending = (counts or {}).get(q.name, (0, 0))
        out[q.name] = {
            "cohort": q.cohort,
            "admitted": admitted,
            "pending": pending,
            "ledger": {
                r.name: {
                    "nominal": r.nominal,
                    "borrowing_limit": r.borrowing_limit,
                    "lending_limit": r.lending_limit,
                    "used": ledger.usage(q.name, r.name),
                    "borrowed": ledger.borrowed(q.name, r.name),
                    "lent": lent.get(r.name, 0),
                }
                for r in q.resources
            },
        }
    return out


def wl(state: str, queue: str, usage: dict[str, int], evictions: int = 0) -> dict[str, Any]:
    return {
        "state": state,
        "queue": queue,
        "usage": usage,
        "priority": 0,
        "evictions": evictions,
        "position": 0,
    }


CENSUS = {
    "qt-1": wl("admitted", "lab-a", SERVICE, evictions=1),
    "qt-2": wl("finished", "lab-c", BATCH),
    "qt-3": wl("finished", "farm-y", SERVICE),
}
FINAL_USED = {"lab-a": {"cpu": 300}}
FINAL_COUNTS = {"lab-a": (1, 0)}


def replicas(census: dict[str, Any], used: dict[str, Any], index: int = 90) -> dict[str, Any]:
    read = {
        "index_before": index,
        "index_after": index,
        "queues": view(used, FINAL_COUNTS),
        "workloads": census,
    }
    return {
        "servers": {s: copy.deepcopy(read) for s in ("server1", "server2", "server3")},
        "consistent": True,
    }


def story(
    samples: list[dict[str, dict[str, int]]] | None = None,
    census: dict[str, Any] | None = None,
    reps: dict[str, Any] | None = None,
    extra: list[list[Event]] | None = None,
    stop_status: str = "ok",
) -> list[Event]:
    register = {"f": "register", "priority_class": "qt-low"}
    parts = [
        op(0, 0.0, 0.1, {"f": "setup", "queues": QUEUES, "classes": {"qt-low": 0}}),
        op(
            1,
            1.0,
            1.1,
            register | {"job": "qt-1", "kind": "service", "queue": "lab-a", "usage": SERVICE},
        ),
        op(
            2,
            1.0,
            1.1,
            register | {"job": "qt-2", "kind": "batch", "queue": "lab-c", "usage": BATCH},
        ),
        op(
            1,
            2.0,
            2.1,
            register | {"job": "qt-3", "kind": "service", "queue": "farm-y", "usage": SERVICE},
        ),
        op(
            2,
            3.0,
            3.1 if stop_status != "info" else None,
            {"f": "stop", "job": "qt-3"},
            status=stop_status,
        ),
        op(3, 4.0, 4.1, {"f": "workload", "job": "qt-1"}, wl("admitted", "lab-a", SERVICE)),
    ]
    for n, used in enumerate(
        samples if samples is not None else [{"lab-a": {"cpu": 300}, "lab-c": {"cpu": 200}}]
    ):
        t = 5.0 + n
        parts.append(
            op(
                0,
                t,
                t + 0.1,
                {"f": "ledger", "server": "leader", "stale": False},
                {"index": 10, "queues": view(used)},
            )
        )
    parts.append(
        op(
            4,
            20.0,
            21.0,
            {"f": "census"},
            {"workloads": CENSUS if census is None else census, "settled": True},
        )
    )
    parts.append(
        op(
            4,
            22.0,
            23.0,
            {"f": "replicas"},
            reps if reps is not None else replicas(CENSUS, FINAL_USED),
        )
    )
    return history(*parts, *(extra or []))


def test_the_story_passes() -> None:
    r = check_quota(story())
    assert r.status == "ok", r.summary
    assert r.details["jobs_registered"] == 3 and r.details["evicted_workloads"] == 1


def test_an_over_admitted_queue_is_an_anomaly() -> None:
    """lab-a's cap is 1200 nominal + 600 borrowing: a sample showing 1900 breaks it, in both arithmetics."""
    r = check_quota(story(samples=[{"lab-a": {"cpu": 300}}, {"lab-a": {"cpu": 1900}}]))
    assert r.status == "anomaly", r.summary
    assert "over-admitted" in r.summary
    assert any(
        "Ledger.violations: queue lab-a uses 1900 cpu" in p for p in r.details["over_admitted"]
    )
    assert any("queue lab-a uses 1900 cpu, above its nominal 1200 plus borrowing limit 600" in p
               for p in r.details["over_admitted"])  # fmt: skip
    assert r.highlight and r.highlight[0]["call_time"] == 6.0


def test_a_queue_without_a_cohort_above_its_nominal_is_an_anomaly() -> None:
    r = check_quota(story(samples=[{"solo": {"cpu": 900}}]))
    assert r.status == "anomaly" and "queue solo uses 900 cpu, above its nominal 800" in r.summary


def test_a_broken_lending_limit_is_an_anomaly_even_within_every_borrowing_limit() -> None:
    """lab-a borrows 600 and lab-c 300 (each within its borrowing limit, the cohort under its 3000),
    but lab-b may lend only 600 and lab-c uses all of its own: 900 borrowed > 600 lendable."""
    used = {"lab-a": {"cpu": 1800}, "lab-c": {"cpu": 900}}
    problems = quota_violations(QUEUES, used)
    assert problems == [
        "cohort lab's queues borrow 900 cpu above their nominal, but the others leave only 600 of their "
        "lendable quota unused (a lending limit is broken)"
    ]
    assert check_quota(story(samples=[used])).status == "anomaly"


def test_a_ledger_view_that_contradicts_itself_is_an_anomaly() -> None:
    h = story()
    for e in h:
        if (
            e.type == "ok"
            and isinstance(e.value, dict)
            and "queues" in e.value
            and "index" in e.value
        ):
            e.value["queues"]["lab-b"]["ledger"]["cpu"]["lent"] = 500  # nobody borrows that much
    r = check_quota(h)
    assert r.status == "anomaly" and "lent 500" in r.summary, r.summary


def test_a_lost_workload_is_an_anomaly() -> None:
    """qt-1 was acknowledged and never stopped; the census after healing has no workload for it."""
    r = check_quota(story(census={**CENSUS, "qt-1": None}))
    assert r.status == "anomaly", r.summary
    assert "lost workloads" in r.summary and "qt-1" in r.details["lost"][0]


def test_a_service_that_finished_without_a_stop_is_lost_but_a_finished_batch_job_is_not() -> None:
    r = check_quota(story(census={**CENSUS, "qt-1": wl("finished", "lab-a", SERVICE)}))
    assert r.status == "anomaly" and "was never stopped, yet its workload finished" in r.summary
    # qt-2 (batch) finished in the story itself, and the story passes.


@pytest.mark.parametrize(
    ("job", "status", "lost"),
    [
        ("qt-2", None, False),  # a finished batch job collected by the GC, its workload with it
        ("qt-2", "dead", True),  # the batch job is still there: its workload was lost
        ("qt-1", None, True),  # a service is never collected unless it was stopped
    ],
)
def test_a_missing_workload_is_excused_only_for_a_collected_batch_job(
    job: str, status: str | None, lost: bool
) -> None:
    h = story(census={**CENSUS, job: None})
    for e in h:
        if e.type == "ok" and isinstance(e.value, dict) and "settled" in e.value:
            e.value["jobs"] = {job: status}
    r = check_quota(h)
    assert (r.status == "anomaly") == lost, r.summary
    assert (r.details["collected"] == [job]) == (status is None)


def test_a_read_during_the_run_that_shows_the_workload_gone_is_an_anomaly() -> None:
    gone = op(5, 4.5, 4.6, {"f": "workload", "job": "qt-1"}, None)
    r = check_quota(story(extra=[gone]))
    assert r.status == "anomaly" and "in a read at 4.5s" in r.summary, r.summary


def test_a_stop_of_unknown_outcome_excuses_a_missing_workload() -> None:
    r = check_quota(story(census={**CENSUS, "qt-3": None}, stop_status="info"))
    assert r.status == "ok", r.summary


def test_a_stopped_job_still_holding_quota_is_an_anomaly() -> None:
    census = {**CENSUS, "qt-3": wl("admitted", "farm-y", SERVICE)}
    r = check_quota(story(census=census))
    assert r.status == "anomaly" and "qt-3 was stopped (acknowledged)" in r.summary


def test_replicas_that_admit_different_sets_are_an_anomaly() -> None:
    reps = replicas(CENSUS, FINAL_USED)
    reps["servers"]["server2"]["workloads"]["qt-1"] = wl("pending", "lab-a", SERVICE)
    reps["servers"]["server2"]["queues"] = view({}, {"lab-a": (0, 1)})
    r = check_quota(story(reps=reps))
    assert r.status == "anomaly", r.summary
    assert any("admit different sets" in p for p in r.details["replicas_disagree"])


def test_a_server_ledger_that_is_not_its_workloads_sum_is_an_anomaly() -> None:
    reps = replicas(CENSUS, {"lab-a": {"cpu": 600}})  # one admitted 300 MHz workload
    r = check_quota(story(reps=reps))
    assert r.status == "anomaly" and "admitted workloads ask 300" in r.summary, r.summary


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"samples": []}, "no ledger sample"),
        ({"reps": {"servers": {}, "consistent": False}}, "one unchanged applied index"),
    ],
)
def test_a_run_that_cannot_show_the_properties_is_unknown(change: dict[str, Any], why: str) -> None:
    r = check_quota(story(**change))
    assert r.status == "unknown" and why in r.summary, r.summary


def test_the_workload_and_its_checker_are_in_the_catalogue() -> None:
    assert "quota" in WORKLOADS and WORKLOAD_CHECKS["quota"] is check_quota


@pytest.mark.cluster
@pytest.mark.slow  # a whole run (CI time): `make test-slow`
def test_a_short_run_under_kill_and_pause_keeps_every_quota(tmp_path: Path) -> None:
    """Three servers, the simulated client, queued jobs under kill and pause for 20 s: the quota checker passes."""
    out = tmp_path / "quota"
    r = short_run(out, 5, ["kill", "pause"], workloads=["quota"], time=20.0)
    assert r.code == EXIT_OK, r.explain()
    check = WORKLOAD_CHECKS["quota"](load_events(out / history_file("quota")))
    assert check.status == "ok", check.summary
    d = check.details
    assert d["samples"] > 20 and d["jobs_registered"] > 10 and d["replicas_consistent"], d
    assert len(d["samples_per_server"]) == 4, d  # the leader's view and each server's own
