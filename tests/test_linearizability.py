"""Tests for jepsen_like's linearizability checker.

The recorded vectors are the real test: a checker that gets any known verdict
wrong cannot be trusted to judge our own cluster. The hand-written histories
pin down the semantics of ``info`` and ``fail`` operations, and the property
tests check the checker against histories whose linearizability is known by
construction.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jepsen_like.history import (
    UNKNOWN,
    Event,
    Operation,
    load_history,
    operations_from_events,
    save_history,
)
from jepsen_like.linearizability import Verdict, check
from jepsen_like.models import KeyValueModel, RegisterModel
from jepsen_like.parsers import load_verdicts, parse_etcd_log, parse_kv_log

SHARED = Path(__file__).parents[1].parent / "shared"
TESTDATA = SHARED / "testdata" / "linearizability"
C50_BUDGET_SECONDS = 60.0


def _verdict_cases(subdir: str) -> list[Any]:
    """One pytest param per history listed in VERDICTS.tsv, or a single skip if the data is absent."""
    tsv = TESTDATA / subdir / "VERDICTS.tsv"
    if not tsv.is_file():
        reason = f"shared linearizability testdata not found at {tsv}"
        return [pytest.param(None, None, id="absent", marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(name, verdict, id=name) for name, verdict in load_verdicts(tsv).items()]


def _require_testdata() -> None:
    if not TESTDATA.is_dir():
        pytest.skip(f"shared linearizability testdata not found at {TESTDATA}")


# --- recorded vectors --------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), _verdict_cases("etcd"))
def test_etcd_register_log_verdict(name: str, expected: str) -> None:
    history = parse_etcd_log(TESTDATA / "etcd" / name)
    result = check(RegisterModel(), history, timeout=60)
    assert result.verdict == expected, result.explanation


@pytest.mark.parametrize(("name", "expected"), _verdict_cases("kv"))
def test_kv_history_verdict(name: str, expected: str) -> None:
    started = time.monotonic()
    history = parse_kv_log(TESTDATA / "kv" / name)
    result = check(KeyValueModel(), history, timeout=C50_BUDGET_SECONDS)
    wall = time.monotonic() - started
    print(f"{name}: {len(history)} ops, {result.partitions} partitions, {wall:.3f}s wall")
    assert result.verdict == expected, result.explanation
    if name.startswith("c50"):
        assert wall < C50_BUDGET_SECONDS


@pytest.mark.parametrize("name", ["c01-ok.txt", "c01-bad.txt", "c10-ok.txt", "c10-bad.txt"])
def test_kv_partitioning_does_not_change_the_verdict(name: str) -> None:
    """Partitioning is only an optimization; checking the whole history as one object must agree."""
    _require_testdata()
    history = parse_kv_log(TESTDATA / "kv" / name)
    whole = check(KeyValueModel(partitioned=False), history, timeout=60)
    split = check(KeyValueModel(), history, timeout=60)
    assert whole.partitions == 1 and split.partitions > 1
    assert whole.verdict == split.verdict != Verdict.UNKNOWN


def test_testdata_covers_what_its_readme_promises() -> None:
    """Guards against silently testing fewer histories (e.g. a truncated VERDICTS.tsv)."""
    _require_testdata()
    etcd = load_verdicts(TESTDATA / "etcd" / "VERDICTS.tsv")
    assert len(etcd) == 102
    assert sorted(etcd.values()).count("linearizable") == 23
    assert all((TESTDATA / "etcd" / name).is_file() for name in etcd)
    kv = load_verdicts(TESTDATA / "kv" / "VERDICTS.tsv")
    assert {name[:3] for name in kv} == {"c01", "c10", "c50"}


def test_etcd_failure_explanation_names_the_culprit() -> None:
    _require_testdata()
    result = check(RegisterModel(), parse_etcd_log(TESTDATA / "etcd" / "etcd_000.log"))
    assert result.verdict == Verdict.NOT_LINEARIZABLE
    failure = result.failure
    assert failure is not None
    assert failure.blocking in failure.stuck
    assert "longest linearizable prefix" in result.explanation
    assert RegisterModel().describe_operation(failure.blocking) in result.explanation


# --- hand-written histories --------------------------------------------------


def op(
    call: float,
    ret: float | None,
    input: dict[str, Any],
    output: Any = None,
    status: str = "ok",
    process: int = 0,
    key: Any = None,
) -> Operation:
    if status == "info":
        ret, output = None, UNKNOWN
    return Operation(process, call, ret, input, output, key=key, status=status)


def read(call: float, ret: float | None, value: Any, **kw: Any) -> Operation:
    return op(call, ret, {"f": "read"}, value, **kw)


def write(call: float, ret: float | None, value: Any, **kw: Any) -> Operation:
    return op(call, ret, {"f": "write", "value": value}, None, **kw)


def cas(call: float, ret: float | None, old: Any, new: Any, swapped: bool, **kw: Any) -> Operation:
    return op(call, ret, {"f": "cas", "from": old, "to": new}, swapped, **kw)


def verdict(history: list[Operation]) -> Verdict:
    return check(RegisterModel(), history, timeout=10).verdict


L, N = Verdict.LINEARIZABLE, Verdict.NOT_LINEARIZABLE


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        pytest.param([], L, id="empty"),
        pytest.param(
            [write(0, 5, 1), read(1, 2, None), read(3, 4, 1)], L, id="write-lands-mid-call"
        ),
        pytest.param([write(0, 1, 1), read(2, 3, None)], N, id="stale-read"),
        pytest.param([write(0, 1, 1), write(2, 3, 2), read(4, 5, 1)], N, id="lost-write"),
        pytest.param([write(0, 10, 1), read(1, 2, 1), read(3, 4, None)], N, id="read-goes-back"),
        pytest.param([write(0, 10, 1), read(1, 2, 1), read(3, 4, 1)], L, id="reads-agree"),
        pytest.param(
            [write(0, 1, 0), cas(2, 3, 0, 1, True), cas(4, 5, 0, 2, False), read(6, 7, 1)],
            L,
            id="cas-sequence",
        ),
        pytest.param([write(0, 1, 0), cas(2, 3, 0, 1, False)], N, id="cas-wrongly-failed"),
        pytest.param([write(0, 1, 0), cas(2, 3, 1, 2, True)], N, id="cas-wrongly-succeeded"),
        # Equal timestamps count as overlapping: clocks are too coarse to order them.
        pytest.param([write(0, 5, 1), read(5, 6, None)], L, id="tie-is-concurrent"),
    ],
)
def test_register_histories(history: list[Operation], expected: Verdict) -> None:
    assert verdict(history) == expected


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        pytest.param(
            [write(0, None, 1, status="info"), read(1, 2, None), read(10, 11, 1)],
            L,
            id="info-takes-effect-late",
        ),
        pytest.param(
            [write(0, None, 1, status="info"), read(1, 2, None), read(10, 11, None)],
            L,
            id="info-never-takes-effect",
        ),
        pytest.param(
            [write(0, None, 1, status="info"), write(5, 6, 2), read(10, 11, 1)],
            L,
            id="info-takes-effect-after-a-later-op",
        ),
        pytest.param(
            [read(0, 1, 1), write(5, None, 1, status="info")],
            N,
            id="info-not-before-its-invoke",
        ),
        pytest.param(
            [write(0, None, 1, status="info"), read(1, 2, 1), read(3, 4, None)],
            N,
            id="info-takes-effect-at-most-once",
        ),
        pytest.param(
            [write(0, 1, 0), cas(2, None, 0, 5, False, status="info"), read(10, 11, 5)],
            L,
            id="info-cas",
        ),
        pytest.param([write(0, 1, 1, status="fail"), read(2, 3, None)], L, id="fail-ignored"),
        pytest.param(
            [write(0, 1, 1, status="fail"), read(2, 3, 1)], N, id="fail-cannot-explain-a-read"
        ),
    ],
)
def test_info_and_fail_semantics(history: list[Operation], expected: Verdict) -> None:
    assert verdict(history) == expected


def test_failure_explanation_for_stale_read() -> None:
    stale = read(2, 3, None, process=1)
    result = check(RegisterModel(), [write(0, 1, 1), stale])
    assert result.failure is not None
    assert result.failure.blocking == stale
    assert result.failure.state == 1
    assert [o.input for o in result.failure.longest_linearization] == [{"f": "write", "value": 1}]
    assert "read() -> nil" in result.explanation


def kv(call: float, ret: float, f: str, key: str, value: str | None = None) -> Operation:
    op_input: dict[str, Any] = {"f": f, "key": key}
    if f == "get":
        return Operation(0, call, ret, op_input, value, key=key)
    op_input["value"] = value
    return Operation(0, call, ret, op_input, None, key=key)


@pytest.mark.parametrize("partitioned", [True, False])
def test_kv_model_partitions_by_key(partitioned: bool) -> None:
    model = KeyValueModel(partitioned=partitioned)
    good = [
        kv(0, 1, "put", "x", "a"),
        kv(2, 3, "append", "x", "b"),
        kv(0, 9, "append", "y", "c"),
        kv(4, 5, "get", "x", "ab"),
        kv(1, 2, "get", "y", ""),
        kv(10, 11, "get", "y", "c"),
    ]
    assert check(model, good).verdict == L
    bad = [*good, kv(12, 13, "get", "x", "ba")]
    result = check(model, bad)
    assert result.verdict == N
    assert result.failure is not None
    assert result.failure.key == ("x" if partitioned else None)


def test_timeout_gives_unknown() -> None:
    """Sixteen overlapping writes then an impossible read: ~n*2^n states, far beyond 50 ms."""
    history = [write(0, 100, i, process=i) for i in range(16)]
    history.append(read(200, 201, 999, process=99))
    result = check(RegisterModel(), history, timeout=0.05)
    assert result.verdict == Verdict.UNKNOWN
    assert result.elapsed < 5


# --- JSONL histories ---------------------------------------------------------


def test_jsonl_round_trip(tmp_path: Path) -> None:
    history = [
        write(0, 3, 1, process=1),
        cas(1, None, 1, 2, False, status="info", process=2),
        read(2, 4, 1, process=3),
        write(5, 6, 7, status="fail", process=1),
        op(7, 8, {"f": "get", "key": "k"}, "v", key="k", process=4),
    ]
    path = tmp_path / "history.jsonl"
    save_history(path, history)
    assert load_history(path) == history


def test_open_invoke_becomes_info() -> None:
    """A run that stops mid-operation leaves an invoke with no completion: outcome unknown."""
    events = [
        Event(1, "invoke", 0, {"f": "write", "value": 1}),
        Event(2, "invoke", 1, {"f": "read"}),
        Event(2, "ok", 2, 1),
        Event(3, "invoke", 3, {"f": "write", "value": 2}),
        Event(3, "info", 4),
    ]
    ops = operations_from_events(events)
    assert [o.status for o in ops] == ["info", "ok", "info"]
    assert ops[0].return_time is None and ops[0].output is UNKNOWN
    assert verdict(ops) == L


def test_event_pairing_rejects_broken_recordings() -> None:
    with pytest.raises(ValueError):
        operations_from_events([Event(1, "invoke", 0, {"f": "read"})] * 2)
    with pytest.raises(ValueError):
        operations_from_events([Event(1, "ok", 0, None)])


# --- properties --------------------------------------------------------------

FATES = ["ok", "ok", "ok", "info-applied", "info-never", "fail"]


@st.composite
def sequential_register_runs(draw: st.DrawFn) -> list[Operation]:
    """Run real registers sequentially, then blur each operation into a random window.

    Operation i takes effect at time 10*i; its call and return are drawn
    around that point, so the true order is always a valid linearization.
    Some operations are recorded as info (applied or not) or as failed (not
    applied, with a garbage output that must be ignored).
    """
    registers: dict[int, int | None] = {}
    history: list[Operation] = []
    for i in range(draw(st.integers(0, 14))):
        key = draw(st.integers(0, 1))
        kind = draw(st.sampled_from(["read", "write", "cas"]))
        fate = draw(st.sampled_from(FATES))
        point = 10 * i
        call = point - draw(st.integers(0, 35))
        ret = point + draw(st.integers(0, 35))
        current = registers.get(key)
        if kind == "read":
            op_input: dict[str, Any] = {"f": "read"}
            output: Any = current
        elif kind == "write":
            op_input = {"f": "write", "value": draw(st.integers(0, 3))}
            output = None
            new = op_input["value"]
        else:
            old, new_value = draw(st.integers(0, 3)), draw(st.integers(0, 3))
            op_input = {"f": "cas", "from": old, "to": new_value}
            output = current == old
            new = new_value if output else current
        if fate in ("ok", "info-applied") and kind != "read":
            registers[key] = new
        if fate == "ok":
            history.append(Operation(i, call, ret, op_input, output, key=key))
        elif fate == "fail":
            history.append(Operation(i, call, ret, op_input, 12345, key=key, status="fail"))
        else:
            history.append(Operation(i, call, None, op_input, UNKNOWN, key=key, status="info"))
    return history


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequential_register_runs())
def test_sequential_runs_are_linearizable(history: list[Operation]) -> None:
    result = check(RegisterModel(), history, timeout=30)
    assert result.verdict == Verdict.LINEARIZABLE, result.explanation


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequential_register_runs(), st.integers(-40, 200), st.integers(0, 40), st.integers(0, 1))
def test_read_of_a_never_written_value_is_not_linearizable(
    history: list[Operation], call: int, length: int, key: int
) -> None:
    ghost = Operation(999, call, call + length, {"f": "read"}, 99, key=key)
    result = check(RegisterModel(), [*history, ghost], timeout=30)
    assert result.verdict == Verdict.NOT_LINEARIZABLE
    assert result.failure is not None and result.failure.key == key
