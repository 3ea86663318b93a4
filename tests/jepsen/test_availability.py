"""Availability figures of a run (jepsen_like.availability), on hand-built histories (no cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jepsen_like import availability
from jepsen_like.history import Event, Operation, event_to_json, operations_from_events
from jepsen_like.recorder import FAULTS_FILE, Fault, history_file, load_faults
from jepsen_like.runner import RESULTS_FILE, RUN_FILE, check_dir


def op(
    process: int, start: float, end: float | None, value: Any, status: str = "ok"
) -> list[Event]:
    events = [Event(process, "invoke", start, value)]
    if end is not None:
        events.append(Event(process, status, end, None))  # type: ignore[arg-type]
    return events


def ops(*groups: list[Event]) -> list[Operation]:
    return operations_from_events(sorted((e for g in groups for e in g), key=lambda e: e.time))


def add(process: int, start: float, end: float | None, status: str = "ok") -> list[Event]:
    return op(process, start, end, {"f": "add", "value": int(start * 1000)}, status)


# Leader isolated at 10.0 (injected at 10.05), healed at 13.0; a follower isolated
# at 20.0 (injected at once), healed at 22.0; the faults stop at 30.0.
LEADER_CUT = Fault(
    "partition", 10.0, 13.0, ["s1"], "isolate s1 (leader)", leader="s1", injected=10.05
)
FOLLOWER_CUT = Fault(
    "partition", 20.0, 22.0, ["s3"], "isolate s3 (random)", leader="s1", injected=20.0
)


def history() -> list[Operation]:
    return ops(
        add(0, 9.9, 10.2),  # in flight at the fault: committed before it, says nothing
        add(1, 10.0, 10.1),  # invoked before the fault took effect (10.05)
        add(2, 10.1, 11.6),  # invoked after it, answered at 11.6: the resume
        add(3, 10.3, None),  # never answered (info): no success
        add(4, 10.4, 11.0, status="fail"),  # a definite failure is no success either
        op(0, 10.5, 10.6, {"f": "read", "stale": True}),  # any server's own state: not counted
        add(0, 11.7, 11.8),
        add(1, 12.0, 14.5),  # in flight across the heal: the longest gap ends here
        add(0, 20.0, 20.01),
        add(1, 20.5, 20.6),
        add(0, 20.9, 21.0),
        op(9, 40.0, 40.1, {"f": "read", "final": True}),
    )


def test_resume_counts_only_successes_invoked_after_the_fault_took_effect() -> None:
    found = availability.windows({"set": history()}, [FOLLOWER_CUT, LEADER_CUT], faults_end=30.0)
    assert [w.kind for w in found] == ["partition", "partition"]
    leader, follower = found  # in the order the faults began
    assert leader.at == 10.05 and leader.role == "leader" and leader.leader_hit is True
    assert leader.resume == round(11.6 - 10.05, 3)
    assert leader.horizon == 20.0  # the next fault
    # ok completions after 10.05: 10.1, 10.2, 11.6, 11.8, 14.5; then 20.0 (the horizon)
    assert leader.stall == round(20.0 - 14.5, 3)
    assert follower.role == "follower" and follower.leader_hit is False
    assert follower.resume == 0.01
    assert follower.horizon == 30.0  # the end of the fault phase
    assert follower.stall == round(30.0 - 21.0, 3)


def test_a_window_without_a_success_never_resumed_and_stalled_throughout() -> None:
    found = availability.windows({"set": ops(add(0, 10.1, None))}, [LEADER_CUT], faults_end=15.0)
    assert found[0].resume is None and found[0].stall == round(15.0 - 10.05, 3)
    groups = availability.by_kind(found)
    assert groups["partition/leader"]["never_resumed"] == 1
    assert groups["partition/leader"]["median_resume"] is None


def test_leader_hit_from_older_recordings_and_overlaps() -> None:
    old = Fault("kill", 1.0, 2.0, ["s2"], "kill -9 s2 (leader)")  # no leader, no injection time
    unknown = Fault("pause", 1.5, 3.0, ["s1"], "SIGSTOP s1 (random)")
    found = availability.windows({"set": ops(add(0, 1.2, 1.4))}, [old, unknown], faults_end=5.0)
    assert found[0].at == 1.0 and found[0].leader_hit is True and found[0].role == "leader"
    assert found[1].leader_hit is None and found[1].role == "unknown"
    assert found[0].overlaps == ["pause"] and found[1].overlaps == ["kill"]
    assert found[0].resume == 0.4 and found[1].resume is None


def test_by_kind_medians_per_kind_and_role() -> None:
    windows = [
        availability.WindowAvailability("partition", s, s, s + 1, ["s1"], "s1", True, r, st, s + 5)
        for s, r, st in ((0.0, 0.5, 0.6), (10.0, 1.5, 1.5), (20.0, 0.9, 2.0))
    ]
    windows.append(
        availability.WindowAvailability(
            "partition", 30.0, 30.0, 31.0, ["s2"], "s1", False, 0.02, 0.1, 35.0
        )
    )
    groups = availability.by_kind(windows)
    assert groups["partition/leader"] == {
        "windows": 3,
        "never_resumed": 0,
        "median_resume": 0.9,
        "max_resume": 1.5,
        "median_stall": 1.5,
        "max_stall": 2.0,
    }
    assert groups["partition/follower"]["median_resume"] == 0.02


def test_fault_log_round_trip_keeps_leader_and_injection_time(tmp_path: Path) -> None:
    path = tmp_path / FAULTS_FILE
    path.write_text(json.dumps(LEADER_CUT.to_json()) + "\n")
    assert load_faults(path) == [LEADER_CUT]
    old = {"kind": "kill", "start": 1.0, "end": 2.0, "targets": ["s1"], "detail": ""}
    path.write_text(json.dumps(old) + "\n")
    fault = load_faults(path)[0]
    assert fault.leader is None and fault.injected is None


def test_check_dir_recomputes_the_figures_into_results_and_summary(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    meta = {
        "seed": 777,
        "options": {"nodes": 3, "time": 30.0, "nemeses": ["partition"], "workloads": ["set"]},
        "lanes": {"set": [0, 5], "final": [9, 1]},
        "total_lanes": 10,
        "active_workloads": ["set"],
        "phases": {"faults_end": 30.0, "end": 41.0},
    }
    (run / RUN_FILE).write_text(json.dumps(meta))
    events = sorted(
        (e for o in history() for e in _events(o)), key=lambda e: (e.time, e.type != "invoke")
    )
    (run / history_file("set")).write_text("".join(event_to_json(e) + "\n" for e in events))
    (run / FAULTS_FILE).write_text(
        "".join(json.dumps(f.to_json()) + "\n" for f in (LEADER_CUT, FOLLOWER_CUT))
    )
    check_dir(run, log=lambda *_: None)
    results = json.loads((run / RESULTS_FILE).read_text())
    figures = next(r for r in results if r["checker"] == "availability")
    assert figures["status"] == "ok"  # informational: never changes the verdict
    first = figures["details"]["windows"][0]
    assert (first["role"], first["targets"], first["resume"]) == ("leader", ["s1"], 1.55)
    assert figures["details"]["by_kind"]["partition/follower"]["median_resume"] == 0.01
    summary = (run / "summary.txt").read_text()
    assert "availability (" in summary
    assert "partition/leader" in summary and "median resume 1.55s" in summary


def _events(o: Operation) -> list[Event]:
    out = [Event(o.process, "invoke", o.call_time, o.input)]
    if o.status != "info" and o.return_time is not None:
        out.append(Event(o.process, o.status, o.return_time, o.output))
    return out
