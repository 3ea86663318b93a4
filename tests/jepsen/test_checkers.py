"""jepsen_like's checkers, report and CLI on hand-made histories (no cluster).

Each anomaly the checkers claim to catch is fed to them here in its smallest
form, so a checker that silently stops catching it fails a fast test, not a
60-second campaign.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jepsen_like import checkers
from jepsen_like.history import Event
from jepsen_like.recorder import FAULTS_FILE, Fault, history_file
from jepsen_like.runner import CONVERGENCE_FILE, RESULTS_FILE, RUN_FILE, check_dir
from jepsen_like.workloads import classify, set_element, set_job_id
from node.wire.errors import RPCError

ROOT = Path(__file__).resolve().parents[2]


def op(process: int, start: float, end: float | None, value: Any, out: Any = None, status: str = "ok", key: Any = None) -> list[Event]:
    events = [Event(process, "invoke", start, value, key)]
    if end is not None:
        events.append(Event(process, status, end, out, key))  # type: ignore[arg-type]
    return events


def history(*ops: list[Event]) -> list[Event]:
    return sorted((e for o in ops for e in o), key=lambda e: e.time)


# -- set ----------------------------------------------------------------------------------
def final_read(t: float, elements: list[int]) -> list[Event]:
    return op(9, t, t + 0.1, {"f": "read", "final": True}, elements)


def test_set_valid_with_unknown_adds_either_way() -> None:
    h = history(
        op(0, 0.0, 0.1, {"f": "add", "value": 1}),
        op(1, 0.0, None, {"f": "add", "value": 2}),  # info, applied
        op(2, 0.0, None, {"f": "add", "value": 3}),  # info, never applied
        op(3, 0.2, 0.3, {"f": "add", "value": 4}, status="fail"),
        final_read(1.0, [1, 2]),
    )
    result = checkers.check_set(h)
    assert result.status == "ok", result.summary
    assert result.details["recovered"] == 1


def test_set_lost_acknowledged_add() -> None:
    h = history(op(0, 0.0, 0.1, {"f": "add", "value": 1}), op(0, 0.2, 0.3, {"f": "add", "value": 2}), final_read(1.0, [2]))
    result = checkers.check_set(h)
    assert result.status == "anomaly"
    assert result.details["lost"] == [1]
    assert any(h["process"] == 0 and h["call_time"] == 0.0 for h in result.highlight)


def test_set_unexpected_and_failed_but_present() -> None:
    h = history(op(0, 0.0, 0.1, {"f": "add", "value": 1}, status="fail"), final_read(1.0, [1, 77]))
    result = checkers.check_set(h)
    assert result.status == "anomaly"
    assert result.details["unexpected"] == [77]
    assert result.details["failed_but_present"] == [1]


def test_set_stale_read_and_vanished_element() -> None:
    h = history(
        op(0, 0.0, 0.1, {"f": "add", "value": 1}),
        op(1, 0.5, 0.6, {"f": "read"}, [1]),
        op(1, 0.7, 0.8, {"f": "read"}, []),  # started after an ack and after a read that saw 1
        final_read(2.0, [1]),
    )
    result = checkers.check_set(h)
    assert result.status == "anomaly"
    assert result.details["stale_reads"] and result.details["vanished"]


def test_set_concurrent_read_may_miss_an_add() -> None:
    h = history(op(0, 0.0, 1.0, {"f": "add", "value": 1}), op(1, 0.5, 0.6, {"f": "read"}, []), final_read(2.0, [1]))
    assert checkers.check_set(h).status == "ok"


def test_set_without_final_read_is_unknown() -> None:
    assert checkers.check_set(history(op(0, 0.0, 0.1, {"f": "add", "value": 1}))).status == "unknown"


# -- register (the cas encoding the workload records) --------------------------------------------
def test_register_cas_history() -> None:
    k = "reg-0"
    good = history(
        op(0, 0.0, 0.1, {"f": "write", "value": 1}, key=k),
        op(0, 0.2, 0.3, {"f": "read"}, 1, key=k),
        op(0, 0.4, 0.5, {"f": "cas", "from": 1, "to": 2}, True, key=k),
        op(1, 0.45, 0.55, {"f": "cas", "from": 1, "to": 3}, False, key=k),
        op(1, 0.6, 0.7, {"f": "read"}, 2, key=k),
    )
    assert checkers.check_register(good).status == "ok"
    # Both compare-and-sets from 1 succeeding is exactly what enforce_index must prevent.
    bad = history(
        op(0, 0.0, 0.1, {"f": "write", "value": 1}, key=k),
        op(0, 0.4, 0.5, {"f": "cas", "from": 1, "to": 2}, True, key=k),
        op(1, 0.45, 0.55, {"f": "cas", "from": 1, "to": 3}, True, key=k),
    )
    result = checkers.check_register(bad)
    assert result.status == "anomaly"
    assert "not linearizable" in result.details["explanation"]
    assert result.highlight


# -- convergence ------------------------------------------------------------------------------------
def test_convergence_verdicts() -> None:
    same = {"digest": "aa", "index": 10}
    assert checkers.check_convergence({"final": {"s1": same, "s2": same}}).status == "ok"
    assert checkers.check_convergence({"final": {"s1": same, "s2": {"digest": "bb", "index": 10}}}).status == "anomaly"
    assert checkers.check_convergence({"final": {"s1": same, "s2": {"digest": "aa", "index": 9}}, "waited": 60}).status == "anomaly"
    assert "never answered" in checkers.check_convergence({"final": {"s1": same, "s2": None}}).summary
    assert checkers.check_convergence(None).status == "unknown"


# -- outcome classification ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        ("not_leader", "fail"),
        ("no_leader", "fail"),
        ("unavailable", "fail"),
        ("bad_request", "fail"),
        ("conflict", "fail"),
        ("timeout", "info"),
        ("unknown_outcome", "info"),
        ("internal", "info"),
    ],
)
def test_classify(code: str, outcome: str) -> None:
    assert classify(RPCError(code, "x")) == outcome


def test_classify_transport_errors_are_unknown() -> None:
    assert classify(ConnectionResetError()) == "info"


def test_set_job_ids_round_trip() -> None:
    for e in (1, 15, 16, 12345):
        assert set_element(set_job_id(e)) == e
    assert set_element("reg-1") is None


# -- run directories: re-check and report ------------------------------------------------------------
def write_run(directory: Path, set_events: list[Event], register_events: list[Event] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "seed": 7,
        "options": {"nodes": 3, "time": 1.0, "nemeses": ["kill"], "workloads": ["register", "set"]},
        "lanes": {"register": [0, 2], "set": [2, 1], "final": [9, 1]},
        "total_lanes": 10,
        "active_workloads": ["register", "set"],
        "phases": {"end": 3.0},
    }
    (directory / RUN_FILE).write_text(json.dumps(meta))
    from jepsen_like.history import event_to_json

    (directory / history_file("set")).write_text("".join(event_to_json(e) + "\n" for e in set_events))
    (directory / history_file("register")).write_text("".join(event_to_json(e) + "\n" for e in register_events or []))
    (directory / FAULTS_FILE).write_text(json.dumps(Fault("kill", 0.2, 0.9, ["server1"], "kill -9 server1").to_json()) + "\n")
    same = {"digest": "aa", "index": 10}
    (directory / CONVERGENCE_FILE).write_text(json.dumps({"final": {"server1": same, "server2": same}}))
    return directory


def test_check_dir_reports_a_lost_write(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", history(op(2, 0.0, 0.1, {"f": "add", "value": 1}), final_read(2.0, [])))
    assert check_dir(run, log=lambda *_: None) == 1
    results = json.loads((run / RESULTS_FILE).read_text())
    assert any(r["checker"] == "set" and r["status"] == "anomaly" for r in results)
    page = (run / "timeline.html").read_text()
    assert "stroke=\"#d50000\"" in page and "lost write" in page  # the blamed add is outlined and explained
    assert "kill -9 server1" in page  # the fault window is drawn
    summary = (run / "summary.txt").read_text()
    assert summary.startswith("verdict: ANOMALY")
    pytest.importorskip("matplotlib")
    assert (run / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_dir_valid_run(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run",
        history(op(2, 0.0, 0.1, {"f": "add", "value": 1}), final_read(2.0, [1])),
        history(op(0, 0.0, 0.1, {"f": "write", "value": 5}, key="reg-0"), op(1, 0.2, 0.3, {"f": "read"}, 5, key="reg-0")),
    )
    assert check_dir(run, log=lambda *_: None) == 0
    assert (run / "summary.txt").read_text().startswith("verdict: VALID")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jepsen_like", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_cli_check_exit_codes(tmp_path: Path) -> None:
    bad = write_run(tmp_path / "bad", history(op(2, 0.0, 0.1, {"f": "add", "value": 1}), final_read(2.0, [])))
    assert run_cli("check", str(bad)).returncode == 1
    good = write_run(tmp_path / "good", history(op(2, 0.0, 0.1, {"f": "add", "value": 1}), final_read(2.0, [1])))
    assert run_cli("check", str(good)).returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--out", "{tmp}/x", "--nemesis", "flood"],
        ["run", "--out", "{tmp}/x", "--workload", "bank"],
        ["run", "--out", "{tmp}/x", "--nodes", "4"],
        ["run", "--out", "{tmp}/x", "--hold", "5:1"],
        ["run", "--out", "{tmp}/x", "--server-env", "NOEQUALS"],
        ["check", "{tmp}"],
    ],
)
def test_cli_bad_input_is_one_line_and_starts_nothing(tmp_path: Path, args: list[str]) -> None:
    proc = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


# -- journal -----------------------------------------------------------------------------------------
def journal_file(tmp_path: Path, per_server: dict[str, list[tuple[int, str]]], target: int, extra: list[dict] | None = None) -> Path:
    lines = []
    for server, batches in per_server.items():
        lines.append({"server": server, "kind": "subscribe", "index": 0})
        lines += [{"server": server, "kind": "batch", "index": i, "hash": h, "size": 1} for i, h in batches]
        lines.append({"server": server, "kind": "end", "index": max((i for i, _ in batches), default=0)})
    lines += extra or []
    lines.append({"server": "*", "kind": "target", "index": target})
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_journal_identical_ordered_gap_free(tmp_path: Path) -> None:
    batches = [(3, "a"), (5, "b"), (9, "c")]  # gaps in raft indexes are normal (no records there)
    result = checkers.check_journal(journal_file(tmp_path, {"s1": batches, "s2": batches}, 9))
    assert result.status == "ok", result.summary
    assert result.operations == 6


@pytest.mark.parametrize(
    ("s2", "needle"),
    [
        ([(3, "a"), (9, "c")], "never delivered"),  # a gap
        ([(3, "a"), (5, "b"), (5, "b"), (9, "c")], "out of order or twice"),  # a duplicate
        ([(3, "a"), (9, "c"), (5, "b")], "out of order or twice"),  # disorder
        ([(3, "a"), (5, "X"), (9, "c")], "differ between servers"),  # not identical
    ],
)
def test_journal_anomalies(tmp_path: Path, s2: list[tuple[int, str]], needle: str) -> None:
    result = checkers.check_journal(journal_file(tmp_path, {"s1": [(3, "a"), (5, "b"), (9, "c")], "s2": s2}, 9))
    assert result.status == "anomaly" and needle in result.summary, result.summary


def test_journal_reset_window_is_not_a_gap(tmp_path: Path) -> None:
    reset = [{"server": "s2", "kind": "reset", "oldest_index": 5}]
    path = journal_file(tmp_path, {"s1": [(3, "a"), (5, "b"), (9, "c")], "s2": [(9, "c")]}, 9, reset)
    # the reset is recorded before s2's batches in a real run; order it so here
    lines = path.read_text().splitlines()
    reset_line = next(line for line in lines if '"reset"' in line)
    lines.remove(reset_line)
    lines.insert(lines.index(next(line for line in lines if '"s2"' in line)) + 1, reset_line)
    path.write_text("\n".join(lines) + "\n")
    result = checkers.check_journal(path)
    assert result.status == "ok", result.summary


def test_journal_subscriber_behind_target_is_unknown(tmp_path: Path) -> None:
    result = checkers.check_journal(journal_file(tmp_path, {"s1": [(3, "a")], "s2": [(3, "a")]}, 9))
    assert result.status == "unknown"


# -- gc safety -----------------------------------------------------------------------------------------
def run_job(p: int, t: float, job: str, kind: str = "batch") -> list[Event]:
    return op(p, t, t + 0.1, {"f": "run", "job": job, "kind": kind})


def listing(t: float, jobs: dict[str, str]) -> list[Event]:
    return op(5, t, t + 0.1, {"f": "list"}, jobs)


def final_state(t: float, jobs: dict[str, str], evals: list | None = None, allocs: list | None = None) -> list[Event]:
    return op(6, t, t + 0.1, {"f": "final"}, {"jobs": jobs, "evals": evals or [], "allocs": allocs or []})


def test_gc_valid_collection() -> None:
    h = history(
        run_job(0, 0.0, "life-1"),
        run_job(1, 0.0, "keep-2", "keep"),
        listing(0.5, {"life-1": "running", "keep-2": "running"}),
        listing(1.0, {"keep-2": "running"}),
        final_state(2.0, {"keep-2": "running"}, evals=[["e1", "keep-2", "complete"]]),
    )
    result = checkers.check_gc(h)
    assert result.status == "ok", result.summary
    assert result.details["collected_jobs"] == 1


@pytest.mark.parametrize(
    ("steps", "needle"),
    [
        ([listing(0.5, {"keep-2": "running"}), listing(1.0, {}), final_state(2.0, {})], "running jobs disappeared"),
        ([listing(0.5, {}), listing(1.0, {"life-1": "dead"}), final_state(2.0, {})], "came back"),
        ([final_state(2.0, {"keep-2": "running"}, allocs=[["a1", "life-1", "complete"]])], "outlive their job"),
    ],
    ids=["collected-while-running", "resurrected", "orphan"],
)
def test_gc_anomalies(steps: list[list[Event]], needle: str) -> None:
    h = history(run_job(0, 0.0, "life-1"), run_job(1, 0.0, "keep-2", "keep"), *steps)
    result = checkers.check_gc(h)
    assert result.status == "anomaly" and needle in result.summary, result.summary
    assert result.highlight


def test_gc_that_collected_nothing_proves_nothing() -> None:
    h = history(run_job(0, 0.0, "life-1"), final_state(2.0, {"life-1": "dead"}))
    assert checkers.check_gc(h).status == "unknown"


# -- nemesis schedule ------------------------------------------------------------------------------------
def test_overlap_picks_two_different_faults_never_with_kill_all() -> None:
    import random
    import threading

    from jepsen_like.nemesis import FAULTS, Nemesis

    faults = [FAULTS[name]() for name in ("kill", "kill-all", "pause", "partition")]
    nemesis = Nemesis(None, faults, random.Random(5), None, threading.Event(), overlap=True)  # type: ignore[arg-type]
    picks = [[f.name for f in nemesis._pick()] for _ in range(400)]
    pairs = [p for p in picks if len(p) == 2]
    assert pairs and all(p[0] != p[1] and "kill-all" not in p for p in pairs)
    assert any(len(p) == 1 for p in picks)
    same_seed = Nemesis(None, faults, random.Random(5), None, threading.Event(), overlap=True)  # type: ignore[arg-type]
    assert [[f.name for f in same_seed._pick()] for _ in range(400)] == picks  # one seed, one schedule
    single = Nemesis(None, faults, random.Random(5), None, threading.Event())  # type: ignore[arg-type]
    assert all(len(single._pick()) == 1 for _ in range(100))


# -- server logs -----------------------------------------------------------------------------------------
def test_server_logs_flag_applied_entries_truncated_and_fatal_errors(tmp_path: Path) -> None:
    (tmp_path / "server1").mkdir()
    (tmp_path / "server2").mkdir()
    (tmp_path / "server1" / "server.log").write_text(
        json.dumps({"event": "rpc request failed", "level": "error"}) + "\n" + "not json\n"
    )
    result = checkers.check_server_logs(tmp_path)
    assert result.status == "ok" and result.details["levels"]["server1"]["error"] == 1
    (tmp_path / "server2" / "server.log").write_text(
        json.dumps({"event": "truncating already-applied log entries from index 5 (last applied: 9)", "level": "critical"}) + "\n"
    )
    result = checkers.check_server_logs(tmp_path)
    assert result.status == "anomaly" and "server2 truncated already-applied" in result.summary


def test_journal_unknown_stream_items_make_the_verdict_unknown(tmp_path: Path) -> None:
    extra = [{"server": "s2", "kind": "unknown_item", "keys": ["novel"]}]
    result = checkers.check_journal(journal_file(tmp_path, {"s1": [(3, "a"), (5, "b")], "s2": [(3, "a")]}, 5, extra))
    assert result.status == "unknown" and "does not know" in result.summary


def test_stream_item_shapes() -> None:
    import msgpack

    from jepsen_like.workloads import _stream_batches

    one = {"index": 3, "raw": b"x"}
    assert _stream_batches(one) == [one]
    assert _stream_batches({"batches": [one, one]}) == [one, one]
    assert _stream_batches({"packed": msgpack.packb([one, {"index": 4, "raw": b"y"}])}) == [one, {"index": 4, "raw": b"y"}]
    assert _stream_batches({"progress": 9}) == []
    assert _stream_batches({"novel": 1}) is None
