"""The failover checker (the ``clients`` nemesis's) on hand-built histories, no cluster.

The story in every case: job ``fo-0`` wants 2 allocs, ``a1`` on node n1
and ``a2`` on n2. The nemesis silences n1, the servers mark it down, ``a1``
is lost and ``b1`` replaces it on n3. Each test changes one fact and names
the verdict that must follow: a replacement too many, none, a job short of
its count, or a harness that could not show it either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jepsen_like.failover_check import check_failover
from jepsen_like.history import Event, event_to_json
from jepsen_like.recorder import history_file
from jepsen_like.runner import (
    EXIT_ANOMALY,
    RESULTS_FILE,
    RUN_FILE,
    RunError,
    RunOptions,
    check_dir,
    merge_server_configs,
    workload_names,
)
from tests.jepsen.test_checkers import history, op


def row(alloc_id: str, node: str, desired: str = "run", client: str = "running", prev: str = "", nxt: str = "",
        job: str = "fo-0") -> dict[str, Any]:
    return {"ID": alloc_id, "JobID": job, "TaskGroup": "g", "NodeID": node, "DesiredStatus": desired,
            "ClientStatus": client, "PreviousAllocation": prev, "NextAllocation": nxt}


def listing(t: float, *rows: dict[str, Any]) -> list[Event]:
    return op(0, t, t + 0.1, {"f": "allocs"}, list(rows))


def final(t: float, *rows: dict[str, Any], counts: dict[str, int] | None = None) -> list[Event]:
    jobs = {job: {"count": n, "status": "running", "stop": False} for job, n in (counts or {"fo-0": 2}).items()}
    return op(1, t, t + 0.1, {"f": "final"}, {"jobs": jobs, "allocs": list(rows), "nodes": {}, "settled": True})


def window(*allocs: tuple[str, str], down: bool = True, listed: bool = True, acted: bool = True) -> dict[str, Any]:
    return {"nodes": sorted({node for _, node in allocs}) or ["n1"], "of": 3, "listed": listed, "down": down, "acted": acted,
            "allocs": [{"ID": a, "JobID": "fo-0", "TaskGroup": "g", "NodeID": node} for a, node in allocs]}


BEFORE = listing(1.0, row("a1", "n1"), row("a2", "n2"))
LOST = row("a1", "n1", "stop", "lost", nxt="b1")
REPLACEMENT = row("b1", "n3", prev="a1")
WINDOWS = [window(("a1", "n1"))]
LOST_A2 = row("a2", "n2", "stop", "lost", nxt="b2")


def test_each_lost_alloc_replaced_once_is_valid() -> None:
    h = history(BEFORE, listing(5.0, LOST, row("a2", "n2"), REPLACEMENT), final(9.0, LOST, row("a2", "n2"), REPLACEMENT))
    result = check_failover(h, WINDOWS)
    assert result.status == "ok", result.summary
    assert result.details["needed_replacement"] == 1 and result.details["replaced"] == 1


def test_a_replacement_seen_before_the_lost_alloc_was_collected_still_counts() -> None:
    """GC may take the lost alloc before the end; its replacement still names it."""
    h = history(BEFORE, listing(5.0, LOST, row("a2", "n2"), REPLACEMENT), final(9.0, row("a2", "n2"), REPLACEMENT))
    assert check_failover(h, WINDOWS).status == "ok"


def test_an_alloc_replaced_twice_is_an_anomaly() -> None:
    second = row("b2", "n2", prev="a1")
    h = history(
        BEFORE,
        listing(5.0, LOST, row("a2", "n2"), REPLACEMENT, second),
        final(9.0, LOST, row("a2", "n2"), REPLACEMENT, row("b2", "n2", "stop", "complete", prev="a1")),
    )
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly", result.summary
    assert "replaced more than once" in result.summary and "a1 replaced 2 times" in result.summary
    assert any("second replacement of a1" in m["why"] for m in result.highlight)


def test_a_next_allocation_that_does_not_name_it_back_is_an_anomaly() -> None:
    h = history(BEFORE, final(9.0, LOST, row("a2", "n2"), REPLACEMENT, row("c1", "n2", prev="a2"),
                              row("a2x", "n2", nxt="c1")))
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly" and "a2x names c1" in result.summary, result.summary


def test_a_read_showing_a_replacement_without_the_link_back_is_an_anomaly() -> None:
    """The plan that places b1 also sets a1's NextAllocation: one read must not show only half."""
    h = history(BEFORE, listing(5.0, row("a1", "n1", "stop", "lost"), row("a2", "n2"), REPLACEMENT),
                final(9.0, LOST, row("a2", "n2"), REPLACEMENT))
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly" and "NextAllocation empty" in result.summary, result.summary
    assert any("does not name its replacement" in m["why"] for m in result.highlight)


def test_rows_of_different_reads_in_one_listing_are_not_one_cut() -> None:
    """A listing reads each job (and each page) on its own: a1 read before b1 was placed is no broken link."""
    early = {**row("a1", "n1", "stop", "lost"), "Read": 0}
    h = history(BEFORE, listing(5.0, early, {**REPLACEMENT, "Read": 1}), final(9.0, LOST, row("a2", "n2"), REPLACEMENT))
    assert check_failover(h, WINDOWS).status == "ok"


def test_a_lost_alloc_never_replaced_is_an_anomaly() -> None:
    lost = row("a1", "n1", "stop", "lost")
    h = history(BEFORE, listing(5.0, lost, row("a2", "n2")), final(9.0, lost, row("a2", "n2"), row("c1", "n3")))
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly", result.summary
    assert "never replaced" in result.summary and "a1" in result.details["not_replaced"][0]
    assert result.details["lost"] == []  # c1 (a fresh placement, not a replacement) keeps the count


def test_an_alloc_still_running_on_a_node_marked_down_is_not_replaced() -> None:
    h = history(BEFORE, final(9.0, row("a1", "n1"), row("a2", "n2")))
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly" and "last seen run/running" in result.summary, result.summary


def test_a_node_back_before_the_servers_acted_keeps_its_allocs() -> None:
    """Down, then ready again before its evaluation ran: the allocs never became lost, nothing to replace."""
    quick = [window(("a1", "n1"), acted=False), window(("a2", "n2"))]
    h = history(BEFORE, final(9.0, row("a1", "n1"), LOST_A2, row("b2", "n3", prev="a2")))
    result = check_failover(h, quick)
    assert result.status == "unknown" and "had not stopped" in result.summary, result.summary
    assert result.details["needed_replacement"] == 1 and result.details["not_replaced"] == []


def test_an_alloc_seen_lost_needs_a_replacement_even_if_the_nemesis_gave_up_waiting() -> None:
    h = history(BEFORE, listing(5.0, row("a1", "n1", "stop", "lost"), row("a2", "n2")), final(9.0, row("a2", "n2")))
    result = check_failover(h, [window(("a1", "n1"), acted=False)])
    assert result.status == "anomaly" and "never replaced" in result.summary, result.summary


def test_a_job_short_of_its_count_at_the_end_is_lost() -> None:
    h = history(BEFORE, final(9.0, LOST, REPLACEMENT, row("a2", "n2", "stop", "lost")))
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly", result.summary
    assert result.details["lost"] == ["fo-0 runs 1 of 2 allocs (lost)"]


def test_a_job_running_more_than_its_count_is_reported() -> None:
    h = history(BEFORE, final(9.0, LOST, REPLACEMENT, row("a2", "n2"), row("x", "n2")))
    result = check_failover(h, WINDOWS)
    assert result.status == "anomaly" and "one too many" in result.summary, result.summary


def test_allocs_of_jobs_the_workload_does_not_own_need_no_replacement() -> None:
    """A lifecycle job may be rescaled or stopped while its node is down: its wants are not known."""
    other = [{**window(("z1", "n1")), "allocs": [{"ID": "z1", "JobID": "keep-3", "TaskGroup": "g", "NodeID": "n1"}]}]
    h = history(BEFORE, final(9.0, row("a1", "n1"), row("a2", "n2")))
    result = check_failover(h, other)
    assert result.status == "ok", result.summary
    assert result.details["needed_replacement"] == 0


def test_harness_gaps_are_unknown_not_anomalies() -> None:
    valid = history(BEFORE, final(9.0, LOST, row("a2", "n2"), REPLACEMENT))
    cases = {
        "no final state": (history(BEFORE), WINDOWS),
        "could not be listed": (valid, [window(("a1", "n1"), listed=False)]),
        "never marked the silenced nodes down": (history(BEFORE, final(9.0, row("a1", "n1"), row("a2", "n2"))),
                                                  [window(("a1", "n1"), down=False, acted=False)]),
    }
    for words, (h, windows) in cases.items():
        result = check_failover(h, windows)
        assert result.status == "unknown" and words in result.summary, (words, result.summary)


def test_a_run_that_silenced_no_alloc_still_checks_the_final_state() -> None:
    """Nothing to replace (no window, or no alloc on the silenced nodes): ok on the final state, marked not exercised."""
    valid = history(BEFORE, final(9.0, LOST, row("a2", "n2"), REPLACEMENT))
    for words, windows in (("silenced no node", []), ("carried an alloc", [window()])):
        result = check_failover(valid, windows)
        assert result.status == "ok" and words in result.summary, (words, result.summary)
        assert result.details["exercised"] is False
    short = history(BEFORE, final(9.0, LOST, row("a2", "n2")))  # a job below its count is an anomaly all the same
    assert check_failover(short, []).status == "anomaly"


def test_check_dir_reads_the_nemesis_windows_and_reports_the_anomaly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    meta = {"active_workloads": ["failover"], "lanes": {"failover": [0, 1], "final": [1, 1]}, "total_lanes": 2,
            "phases": {"end": 10.0}, "nemesis_stats": {"clients": {"faults": 1, "windows": WINDOWS}}}
    (run / RUN_FILE).write_text(json.dumps(meta))
    lost = row("a1", "n1", "stop", "lost")
    events = history(BEFORE, final(9.0, lost, row("a2", "n2")))
    (run / history_file("failover")).write_text("".join(event_to_json(e) + "\n" for e in events))
    assert check_dir(run, log=lambda *_: None) == EXIT_ANOMALY
    result = next(r for r in json.loads((run / RESULTS_FILE).read_text()) if r["checker"] == "failover")
    assert result["status"] == "anomaly" and "never replaced" in result["summary"]


def test_the_clients_nemesis_is_known_and_brings_its_workload(tmp_path: Path) -> None:
    options = RunOptions(out=str(tmp_path / "run"), nemeses=["kill", "clients"], workloads=["register", "set"])
    options.validate()
    assert workload_names(options) == ["register", "set", "failover"]
    assert workload_names(RunOptions(out="x", nemeses=["kill"])) == ["register", "set"]
    with pytest.raises(RunError, match="clients"):
        RunOptions(out=str(tmp_path / "run"), nemeses=["client"]).validate()  # the message lists the real names


def test_server_configs_that_share_a_table_are_merged() -> None:
    lifecycle = '[gc]\njob_interval = "2s"\n\n# why\n[scheduler]\nmin_heartbeat_ttl = "5s"\n'
    failover = '\n[scheduler]\nmin_heartbeat_ttl = "5s"\nheartbeat_grace = "3s"\n'
    merged = merge_server_configs([lifecycle, failover])
    assert merged.count("[scheduler]") == 1 and 'heartbeat_grace = "3s"' in merged and 'job_interval = "2s"' in merged
    import tomllib

    assert tomllib.loads(merged) == {"gc": {"job_interval": "2s"}, "scheduler": {"min_heartbeat_ttl": "5s", "heartbeat_grace": "3s"}}
    assert merge_server_configs([]) == ""
