"""The FSM invariants of DESIGN.md, each tested directly.

deterministic; exactly once across restarts; never raises; unknown entry
types; replicas converge (digest); plus the codec's strictness, on which
"a malformed entry is rejected, not half-applied" rests.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import subprocess
import sys
import textwrap
import time
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm import machine as fsm_machine
from fsm import messages as m
from fsm.errors import CodecError, FatalApplyError
from fsm.machine import FSM
from fsm.messages import IGNORE_FLAG, MessageType, decode_entry, encode_entry
from fsm.record import Record, field
from fsm.structs import (
    SECOND,
    Job,
    JobSummary,
    ReschedulePolicy,
    Task,
    TaskGroup,
    TaskGroupSummary,
    TaskState,
)
from tests.fsm.support import (
    SMALL_MAP,
    T0,
    FatalCalled,
    Harness,
    check_invariants,
    dump,
    make_alloc,
    make_eval,
    make_job,
    make_node,
    ordered,
    packed_map,
    raise_fatal,
    sample_bodies,
    sample_log,
    without_bookkeeping,
)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Codes this build does not know (computed: new message types keep being added).
UNKNOWN_UNFLAGGED = [c for c in range(IGNORE_FLAG) if c not in MessageType._value2member_map_]
UNKNOWN_FLAGGED = [c for c in range(IGNORE_FLAG, 256) if c not in MessageType._value2member_map_]


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


def apply_all(h: Harness, entries: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
    results = h.fsm.apply_batch(entries)
    h.index = max(h.index, entries[-1][0])
    return [{**r.to_wire(), "skipped": r.skipped, "duplicate": r.duplicate} for r in results]


# == deterministic ==========================================================
class Forbidden(Exception):
    pass


class _NoEnviron(dict):
    def __getitem__(self, key: str) -> str:
        raise Forbidden(f"os.environ[{key!r}] read during apply")

    def get(self, key: str, default: Any = None) -> Any:
        raise Forbidden(f"os.environ.get({key!r}) during apply")


@contextlib.contextmanager
def no_clock_randomness_or_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every clock, random source and the environment raise while the block runs."""

    def forbid(name: str) -> Any:
        def raiser(*args: Any, **kwargs: Any) -> Any:
            raise Forbidden(f"{name} called during apply")

        return raiser

    with monkeypatch.context() as mp:
        for mod, names in (
            (
                time,
                (
                    "time",
                    "time_ns",
                    "monotonic",
                    "monotonic_ns",
                    "perf_counter",
                    "perf_counter_ns",
                    "localtime",
                    "gmtime",
                ),
            ),
            (
                random,
                ("random", "randint", "randrange", "choice", "getrandbits", "shuffle", "uniform"),
            ),
            (uuid, ("uuid1", "uuid4")),
            (os, ("urandom", "getenv", "getpid")),
            (secrets, ("token_bytes", "token_hex", "randbits")),
        ):
            for name in names:
                mp.setattr(mod, name, forbid(f"{mod.__name__}.{name}"))
        mp.setattr(os, "environ", _NoEnviron())
        yield


class _SilentLog:
    """Logging is not state; structlog's timestamper reads the clock, so mute it here."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def test_apply_reads_no_clock_randomness_or_environment(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = sample_log()
    reference = Harness.temp()
    try:
        expected = apply_all(reference, entries)
        monkeypatch.setattr(fsm_machine, "log", _SilentLog())
        with no_clock_randomness_or_env(monkeypatch):
            results = apply_all(h, entries)
            h.fsm.commit()
        assert results == expected
        assert h.fsm.digest() == reference.fsm.digest()
        assert dump(h.fsm) == dump(reference.fsm)
    finally:
        reference.destroy()


def test_time_comes_from_the_entry(h: Harness) -> None:
    h.ok(m.JobRegister(job=make_job("web")), time=T0 + 123)
    with h.reader() as r:
        job = r.job("web")
        assert job.create_time == job.modify_time == job.submit_time == T0 + 123


@given(
    times=st.lists(st.integers(0, 2**63), min_size=1, max_size=25),
    bad=st.lists(st.booleans(), min_size=25, max_size=25),
)
@settings(FUZZ, max_examples=60)
def test_last_time_is_the_running_max(times: list[int], bad: list[bool]) -> None:
    h = Harness.temp()
    try:
        expected = 0
        for t, malformed in zip(times, bad, strict=False):
            entry = encode_entry(m.Barrier(), time=t, rid="")
            if malformed:
                entry = entry[:-1] + b"\xc1"  # never-used msgpack byte: decoding fails, time unused
            else:
                expected = max(expected, t)
            h.raw(entry, commit=False)
            assert h.fsm.last_time == expected
        h.fsm.commit()
        with h.reader() as r:
            assert r.last_time == expected
    finally:
        h.destroy()


# == exactly once across restarts ===========================================
def test_crash_mid_group_loses_only_the_uncommitted_group(h: Harness) -> None:
    entries = sample_log()
    full = Harness.temp()
    prefix = Harness.temp()
    try:
        apply_all(full, entries)
        apply_all(prefix, entries[:10])
        h.fsm.apply_batch(entries[:10])
        for index, entry in entries[10:20]:
            assert h.fsm.apply(index, entry).index == index
        assert h.fsm.applied_index == 20
        h.fsm.store.env.close()  # crash: the open write transaction dies with the process
        h.fsm = h._open()
        assert h.fsm.applied_index == 10
        assert h.fsm.digest() == prefix.fsm.digest()
        # pysyncobj replays its whole journal: the first 10 are skipped, the rest applied once
        results = h.fsm.apply_batch(entries)
        assert [r.skipped for r in results[:10]] == [True] * 10
        assert h.fsm.digest() == full.fsm.digest()
    finally:
        full.destroy()
        prefix.destroy()


def test_restart_then_replay_changes_nothing(h: Harness) -> None:
    entries = sample_log()
    apply_all(h, entries)
    before = dump(h.fsm)
    h.reopen()
    times = []
    for _, entry in entries:
        with contextlib.suppress(CodecError):
            times.append(decode_entry(entry).time)
    assert h.fsm.applied_index == len(entries) and h.fsm.last_time == max(times)
    assert all(r.skipped for r in h.fsm.apply_batch(entries))
    assert dump(h.fsm) == before


def test_same_index_twice_in_one_group_is_applied_once(h: Harness) -> None:
    entry = encode_entry(m.JobRegister(job=make_job("web", count=1)), time=T0, rid="")
    first = h.fsm.apply(1, entry)
    second = h.fsm.apply(
        1, encode_entry(m.JobRegister(job=make_job("web", count=2)), time=T0, rid="")
    )
    h.fsm.commit()
    assert first.ok and not first.skipped and second.skipped
    with h.reader() as r:
        assert r.job("web").task_groups[0].count == 1 and r.job("web").version == 0


def test_entry_rejected_after_writing_is_undone_inside_a_group(h: Harness) -> None:
    """No nested transactions: a rejection after a write replays the group, then commits it."""
    setup = [
        m.NodeRegister(node=make_node("n1")),
        m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web")),
        m.PlanApply(
            allocs_to_place=[make_alloc("a1")], evals=[make_eval("e1", "web", status="complete")]
        ),
    ]
    # stops a1 (a write), then fails on a placement for a missing node
    bad = m.PlanApply(
        allocs_to_stop=[m.AllocStop(id="a1")], allocs_to_place=[make_alloc("a2", node_id="n9")]
    )
    after = [m.AllocClientUpdate(allocs=[m.AllocClientState(id="a1", client_status="running")])]
    bodies = [*setup, bad, *after]
    entries = [
        (i, encode_entry(b, time=T0 + i * SECOND, rid=f"r{i}")) for i, b in enumerate(bodies, 1)
    ]
    reference = Harness.temp()
    try:
        expected = [reference.fsm.apply_batch([e])[0] for e in entries]  # one commit per entry
        assert expected[3].code == "conflict"
        results = [h.fsm.apply(i, e) for i, e in entries[:3]]
        with h.reader() as r:
            assert r.applied_index == 0  # still one open group
        results.append(h.fsm.apply(*entries[3]))
        with h.reader() as r:
            assert r.applied_index == 4  # undone, replayed and committed
            assert r.alloc("a1").desired_status == "run"
        results.append(h.fsm.apply(*entries[4]))
        h.fsm.commit()
        assert [r.to_wire() for r in results] == [r.to_wire() for r in expected]
        assert h.fsm.digest() == reference.fsm.digest()
        # a retry of the rejected request returns its rejection
        again = h.fsm.apply(6, entries[3][1])
        assert again.duplicate and again.code == "conflict"
    finally:
        reference.destroy()


def test_entry_rejected_before_writing_keeps_the_group_open(h: Harness) -> None:
    h.fsm.apply(1, encode_entry(m.NodeRegister(node=make_node("n1")), time=T0, rid=""))
    rejected = h.fsm.apply(2, encode_entry(m.JobDeregister(job_id="nope"), time=T0, rid="x"))
    assert rejected.code == "not_found"
    with h.reader() as r:
        assert r.applied_index == 0  # nothing to undo, no early commit
    h.fsm.commit()
    with h.reader() as r:
        assert (
            r.applied_index == 2
            and r.node("n1") is not None
            and r.request_result("x")["code"] == "not_found"
        )


CHILD = textwrap.dedent(
    """
    import os, sys
    from fsm.machine import FSM
    from tests.fsm.support import SMALL_MAP, sample_log

    path, committed, pending = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    entries = sample_log()
    fsm = FSM(path, map_size=SMALL_MAP)
    fsm.apply_batch(entries[:committed])
    for index, entry in entries[committed:committed + pending]:
        fsm.apply(index, entry)
    sys.stdout.write(str(fsm.applied_index))
    sys.stdout.flush()
    os._exit(0)  # killed mid-tick: no commit, no close
    """
)


def test_process_killed_mid_group_replays_to_the_same_state(tmp_path: Path) -> None:
    entries = sample_log()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "db"), "12", "9"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "21"
    fsm = FSM(str(tmp_path / "db"), map_size=SMALL_MAP, on_fatal=raise_fatal)
    reference = Harness.temp()
    try:
        assert fsm.applied_index == 12
        fsm.apply_batch(entries)
        apply_all(reference, entries)
        assert fsm.digest() == reference.fsm.digest()
    finally:
        fsm.close()
        reference.destroy()


# == never raises ===========================================================
def _unknown_unflagged(entry: bytes) -> bool:
    return bool(entry) and entry[0] not in MessageType._value2member_map_ and not entry[0] & IGNORE_FLAG


def expect_apply(h: Harness, entry: bytes) -> None:
    """Apply one entry: a result, or on_fatal exactly when its type is unknown and unflagged."""
    committed = h.fsm.applied_index
    fatal = _unknown_unflagged(entry)
    if not fatal and entry and entry[0] == MessageType.BATCH:
        # A batch stops the server too if an item's type is unknown (a newer leader's write).
        try:
            items = decode_entry(entry).body.entries
        except CodecError:
            items = []
        fatal = any(_unknown_unflagged(item) for item in items)
    h.index += 1
    if fatal:
        with pytest.raises(FatalCalled):
            h.fsm.apply(h.index, entry)
        # the pending group was abandoned (the node stops; pysyncobj replays it)
        assert h.fsm.applied_index == committed
        h.index = committed
        return
    result = h.fsm.apply(h.index, entry)
    assert result.index == h.index or result.duplicate
    assert result.code != "internal", result.error
    h.fsm.commit()


def test_random_bytes_never_raise(h: Harness) -> None:
    @given(data=st.binary(max_size=120))
    @FUZZ
    def run(data: bytes) -> None:
        expect_apply(h, data)

    run()
    with h.reader() as r:
        check_invariants(r)


def test_mutated_valid_entries_never_raise(h: Harness) -> None:
    valid = [entry for _, entry in sample_log()]

    @given(
        which=st.integers(0, len(valid) - 1),
        edits=st.lists(
            st.tuples(
                st.integers(0, 10_000), st.integers(0, 255), st.sampled_from(["set", "del", "ins"])
            ),
            min_size=1,
            max_size=4,
        ),
    )
    @settings(FUZZ, max_examples=250)
    def run(which: int, edits: list[tuple[int, int, str]]) -> None:
        entry = bytearray(valid[which])
        for pos, byte, op in edits:
            pos %= max(1, len(entry))
            if op == "set" and entry:
                entry[pos] = byte
            elif op == "del" and entry:
                del entry[pos]
            else:
                entry.insert(pos, byte)
        expect_apply(h, bytes(entry))

    run()
    with h.reader() as r:
        check_invariants(r, purged={"web"})


def test_empty_entry_is_a_bad_request_not_fatal(h: Harness) -> None:
    """Regression: an empty entry was treated as unknown type -1 and stopped the node."""
    result = h.raw(b"")
    assert not result.ok and result.code == "bad_request"


def test_handler_exception_becomes_an_internal_error_and_changes_nothing(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h.ok(m.JobRegister(job=make_job("web")))
    before = without_bookkeeping(h.dump())

    def broken(w: Any, msg: Any) -> dict:
        w.put_job(make_job("other"))  # a write that must be rolled back
        raise RuntimeError("bug")

    monkeypatch.setitem(fsm_machine.HANDLERS, MessageType.BARRIER, broken)
    monkeypatch.setattr(fsm_machine, "log", _SilentLog())
    result = h.apply(m.Barrier(), rid="b")
    assert not result.ok and result.code == "internal" and "RuntimeError('bug')" in result.error
    assert without_bookkeeping(h.dump()) == before
    assert h.fsm.applied_index == h.index


# == unknown entry types ====================================================
@pytest.mark.parametrize("code", sorted({UNKNOWN_FLAGGED[0], UNKNOWN_FLAGGED[19], 200, 255}))
def test_unknown_type_with_ignore_flag_is_skipped(h: Harness, code: int) -> None:
    h.ok(m.NodeRegister(node=make_node()))
    before = without_bookkeeping(h.dump())
    result = h.raw(bytes([code]) + b"\x80anything")
    assert result.ok and result.skipped and result.index == h.index
    assert without_bookkeeping(h.dump()) == before
    assert h.fsm.applied_index == h.index


@pytest.mark.parametrize(
    "code", sorted({0, UNKNOWN_UNFLAGGED[1], UNKNOWN_UNFLAGGED[2], 99, IGNORE_FLAG - 1})
)
def test_unknown_type_without_flag_stops_the_node(h: Harness, code: int) -> None:
    h.ok(m.Barrier())
    h.fsm.apply(2, encode_entry(m.Barrier(), time=T0 + 5 * SECOND, rid=""))  # pending, uncommitted
    seen: list[BaseException] = []

    def on_fatal(exc: BaseException) -> None:
        seen.append(exc)
        raise FatalCalled(str(exc))

    h.fsm.on_fatal = on_fatal
    with pytest.raises(FatalCalled):
        h.fsm.apply(3, bytes([code]) + codec.pack({}))
    assert len(seen) == 1 and isinstance(seen[0], FatalApplyError)
    assert f"unknown entry type {code} at index 3" in str(seen[0])
    assert h.fsm.applied_index == 1  # the pending group is dropped, not half-committed
    with h.reader() as r:
        assert r.applied_index == 1


def test_default_on_fatal_exits_the_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from fsm.machine import FSM
        fsm = FSM(sys.argv[1], map_size=1 << 24)
        fsm.apply(1, bytes([int(sys.argv[2])]))
        print("still running")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "db"), str(UNKNOWN_UNFLAGGED[-1])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 70
    assert "still running" not in proc.stdout
    assert "fatal apply error" in proc.stderr
    assert f"unknown entry type {UNKNOWN_UNFLAGGED[-1]}" in proc.stderr


# == replicas converge ======================================================
def test_equal_logs_give_equal_digests_and_different_logs_do_not() -> None:
    entries = sample_log()
    a, b, c = Harness.temp(), Harness.temp(), Harness.temp()
    try:
        apply_all(a, entries)
        for i in range(0, len(entries), 4):  # different group boundaries
            b.fsm.apply_batch(entries[i : i + 4])
        # the same log but for its last entry, a barrier with a request id
        apply_all(c, entries[:-1] + [(len(entries), encode_entry(m.Barrier(), time=T0, rid="x"))])
        assert a.fsm.digest() == b.fsm.digest()
        assert dump(a.fsm) == dump(b.fsm)
        assert a.fsm.digest() != c.fsm.digest()
        assert a.fsm.digest()[1] == len(entries)
    finally:
        for x in (a, b, c):
            x.destroy()


def test_digest_commits_the_pending_group(h: Harness) -> None:
    h.fsm.apply(1, encode_entry(m.Barrier(), time=T0, rid=""))
    digest, index = h.fsm.digest()
    assert index == 1
    with h.reader() as r:
        assert r.applied_index == 1 and r.digest() == digest


# == codec strictness =======================================================
def register_wire() -> dict[str, Any]:
    job = Job(id="web", task_groups=[TaskGroup(name="g", tasks=[Task(name="t")])])
    return codec.to_wire(m.JobRegister(job=job))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda w: w["job"].update(colour="blue"), "JobRegister.job: unknown field 'colour'"),
        (lambda w: w.update(extra=1), "JobRegister: unknown field 'extra'"),
        (
            lambda w: w["job"]["task_groups"][0].update(count="3"),
            "JobRegister.job.task_groups[0].count: expected integer, got str",
        ),
        (
            lambda w: w["job"]["task_groups"][0].update(count=True),
            "JobRegister.job.task_groups[0].count: expected integer, got bool",
        ),
        (lambda w: w["job"].update(stop=1), "JobRegister.job.stop: expected boolean, got int"),
        (
            lambda w: w["job"].update(meta={"a": 1}),
            "JobRegister.job.meta.a: expected string, got int",
        ),
        (
            lambda w: w["job"].update(meta={1: "a"}),
            "JobRegister.job.meta: map keys must be strings",
        ),
        (
            lambda w: w["job"].update(datacenters="dc1"),
            "JobRegister.job.datacenters: expected list, got str",
        ),
        (lambda w: w["job"].pop("id"), "JobRegister.job: missing required field 'id'"),
        # as many keys as fields, but not the fields
        (
            lambda w: w["job"].update(colour=w["job"].pop("name")),
            "JobRegister.job: unknown field 'colour'",
        ),
        (
            lambda w: w["job"]["task_groups"][0]["tasks"][0]["resources"].update(cpu=1.5),
            "JobRegister.job.task_groups[0].tasks[0].resources.cpu: expected integer, got float",
        ),
        (lambda w: w.update(job=[1]), "JobRegister.job: expected map, got list"),
        (
            lambda w: w.update(enforce_index="1"),
            "JobRegister.enforce_index: expected integer, got str",
        ),
    ],
)
def test_from_wire_rejects_with_the_path(mutate: Any, message: str) -> None:
    wire = register_wire()
    mutate(wire)
    with pytest.raises(CodecError) as info:
        codec.from_wire(m.JobRegister, wire)
    assert str(info.value) == message


def test_from_wire_path_through_optional_map_of_records() -> None:
    wire = {
        "allocs": [
            {"id": "a1", "client_status": "running", "task_states": {"t": {"restarts": "x"}}}
        ]
    }
    with pytest.raises(
        CodecError,
        match=r"^AllocClientUpdate\.allocs\[0\]\.task_states\.t\.restarts: expected integer",
    ):
        codec.from_wire(m.AllocClientUpdate, wire)


def envelope(**kw: Any) -> bytes:
    env = {"v": codec.SCHEMA_VERSION, "time": T0, "rid": "", "body": {}}
    env.update(kw)
    return bytes([MessageType.BARRIER]) + codec.pack(env)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (b"", "empty entry"),
        (bytes([99]) + codec.pack({}), "unknown entry type 99"),
        (bytes([MessageType.BARRIER]) + b"\xc1", "malformed msgpack"),
        (bytes([MessageType.BARRIER]) + codec.pack([1]), "not a map"),
        (envelope(v=2), "unsupported schema version 2"),
        (envelope(time=-1), "time must be a non-negative integer"),
        (envelope(time=True), "time must be a non-negative integer"),
        (envelope(time="now"), "time must be a non-negative integer"),
        (envelope(rid=5), "rid must be a string"),
        # regression: the limit counted characters; 65 two-byte characters passed
        (envelope(rid="é" * 65), "at most 128 bytes"),
        (envelope(extra=1), "unknown envelope fields ['extra']"),
        (envelope(body={"x": 1}), "Barrier: unknown field 'x'"),
    ],
)
def test_decode_entry_is_strict(entry: bytes, message: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_entry(entry)
    assert message in str(info.value)


def test_every_message_type_round_trips() -> None:
    bodies = sample_bodies()
    assert {type(b) for b in bodies} == set(m.PAYLOADS.values()), "sample covers every type"
    for body in bodies:
        entry = encode_entry(body, time=T0, rid="rid")
        # The entry holds the maps packed_map builds: every field of a Record,
        # a CompactRecord's without those at their default.
        plain = {"v": codec.SCHEMA_VERSION, "time": T0, "rid": "rid", "body": packed_map(body)}
        assert entry[0] == m.MESSAGE_OF[type(body)]
        assert ordered(codec.unpack(entry[1:])) == ordered(plain)
        decoded = decode_entry(entry)
        assert decoded.body == body and decoded.type == m.MESSAGE_OF[type(body)]
        assert (decoded.time, decoded.rid) == (T0, "rid")


def test_msgspec_takes_what_encode_entry_writes_and_nothing_it_would_drop() -> None:
    """msgspec decodes every entry the leader writes, and refuses a field it would drop.

    msgspec alone ignores fields a record lacks: a field from a newer
    version deep inside a job would vanish on this replica and not on one
    that knows it. ``Record`` forbids unknown fields, so such an entry takes
    the strict path and is refused with the field's path.
    """
    for body in sample_bodies():
        if isinstance(body, m.Batch):
            continue  # its items are decoded one by one
        entry = encode_entry(body, time=T0, rid="rid")
        envelope_class = m._ENVELOPES[m.MESSAGE_OF[type(body)]]
        typed = codec.decode_typed(envelope_class, memoryview(entry)[1:])
        assert typed is not None and typed.body == body, type(body).__name__
    wire = codec.to_wire(m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web")))
    wire["job"]["task_groups"][0]["tasks"][0]["colour"] = "red"
    raw = bytes([MessageType.JOB_REGISTER]) + codec.pack({"v": 1, "time": T0, "rid": "", "body": wire})
    assert codec.decode_typed(m._ENVELOPES[MessageType.JOB_REGISTER], memoryview(raw)[1:]) is None
    with pytest.raises(CodecError, match=r"^JobRegister\.job\.task_groups\[0\]\.tasks\[0\]: unknown field 'colour'$"):
        decode_entry(raw)
    # A record given as a map with its fields in another order, or without
    # its optional fields, is built as the strict path builds it.
    wire = codec.to_wire(m.JobRegister(job=make_job("web")))
    wire["job"] = dict(reversed(list(wire["job"].items())))
    del wire["job"]["meta"]
    raw = bytes([MessageType.JOB_REGISTER]) + codec.pack({"v": 1, "time": T0, "rid": "", "body": wire})
    typed = codec.decode_typed(m._ENVELOPES[MessageType.JOB_REGISTER], memoryview(raw)[1:])
    assert typed is not None and typed.body == m.JobRegister(job=make_job("web"))
    assert typed.body == codec.from_wire(m.JobRegister, wire)


def test_a_record_stored_before_a_field_was_removed_still_loads_without_it() -> None:
    """Records refuse unknown fields in log entries, but an upgraded server must read its old store.

    An upgrade is every server restarted on its data directory; a field the
    new version dropped is still in the records stored before, at any depth,
    and a field it added is missing from them.
    """
    job = Job(
        id="j",
        task_groups=[
            TaskGroup(
                name="g",
                reschedule_policy=ReschedulePolicy(attempts=2),
                tasks=[Task(name="t", config={"image": {"retired": 1}})],
            )
        ],
    )
    wire = codec.to_wire(job)
    wire["retired"] = "x"  # top level
    wire["task_groups"][0]["retired"] = [1]  # a record in a list
    wire["task_groups"][0]["reschedule_policy"]["retired"] = 1  # an optional record
    del wire["task_groups"][0]["tasks"][0]["resources"]  # and one added since: its default
    summary = JobSummary(job_id="j", summary={"g": TaskGroupSummary(running=2)})
    summary_wire = codec.to_wire(summary)
    summary_wire["summary"]["g"]["retired"] = 3  # a record in a map
    assert codec.load(Job, codec.pack(wire)) == job  # the task config (data, not a record) keeps its keys
    assert codec.load(JobSummary, codec.pack(summary_wire)) == summary
    entry = bytes([MessageType.JOB_REGISTER]) + codec.pack({"v": 1, "time": T0, "rid": "", "body": {"job": wire}})
    with pytest.raises(CodecError, match=r"^JobRegister\.job\.task_groups\[0\]\.reschedule_policy: unknown field 'retired'$"):
        decode_entry(entry)


def _record_classes() -> list[type]:
    out, todo = [], list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _holds_float(hint: Any) -> bool:
    return hint is float or any(_holds_float(arg) for arg in typing.get_args(hint))


def test_no_record_has_a_float_field() -> None:
    """msgspec takes an int for a float field where the strict path may not: ``decode_typed`` relies on there being none."""
    classes = _record_classes()
    assert Job in classes and m.JobRegister in classes and len(classes) > 30
    floats = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for name, hint in typing.get_type_hints(cls).items()
        if _holds_float(hint)
    ]
    assert not floats, f"decode_typed would take an int for {floats}: give them int nanoseconds or units"


def _maps_in(value: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every map inside a wire value (records and data maps), outermost first."""
    if isinstance(value, dict):
        out.append(value)
        for v in value.values():
            _maps_in(v, out)
    elif isinstance(value, list):
        for v in value:
            _maps_in(v, out)
    return out


_ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, width=32),
    st.text(max_size=3), st.binary(max_size=3), st.builds(lambda: [1]), st.builds(lambda: {"k": 1}),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body_index=st.integers(0, 10_000),
    edits=st.lists(
        st.tuples(st.sampled_from(["add", "drop", "set", "reorder"]), st.integers(0, 10_000), _ODD_VALUES),
        max_size=3,
    ),
)
def test_decode_entry_agrees_with_the_strict_path_on_any_payload(body_index: int, edits: list[Any]) -> None:
    """Whatever the payload, decode_entry answers as the strict Python path alone does.

    The msgspec path may only ever take what the strict path builds the same
    way: a body equal to the strict one, or the strict path's own error.
    """
    bodies = [b for b in sample_bodies() if not isinstance(b, m.Batch)]
    body = bodies[body_index % len(bodies)]
    wire = codec.to_wire(body)
    for action, at, value in edits:
        maps = _maps_in(wire, [])
        target = maps[at % len(maps)]
        keys = list(target)
        if action == "add":
            target[f"x{at % 7}"] = value
        elif action == "drop" and keys:
            del target[keys[at % len(keys)]]
        elif action == "set" and keys:
            target[keys[at % len(keys)]] = value
        elif action == "reorder":
            items = list(target.items())
            target.clear()
            target.update(reversed(items))
    cls = type(body)
    raw = bytes([m.MESSAGE_OF[cls]]) + codec.pack({"v": codec.SCHEMA_VERSION, "time": T0, "rid": "r", "body": wire})
    try:
        expected: Any = codec.from_wire(cls, codec.unpack(codec.pack(wire)))
    except CodecError as exc:
        expected = str(exc)
    try:
        got: Any = decode_entry(raw).body
    except CodecError as exc:
        got = str(exc)
    assert got == expected
    if not isinstance(got, str):
        assert codec.encode(got) == codec.encode(expected), "the same bytes are stored"


def test_exact_shape_builders_agree_with_the_general_path() -> None:
    """``from_wire``'s generated builders build what ``_strict_build`` builds; ``encode`` packs ``packed_map``."""
    for body in sample_bodies():
        wire = codec.unpack(codec.pack(codec.to_wire(body)))
        cls = type(body)
        fast = codec._fast_builder(cls)(codec.unpack(codec.pack(wire)))
        assert fast == codec._strict_build(cls, wire) == body
        assert type(fast) is cls
        assert ordered(codec.unpack(codec.encode(body))) == ordered(packed_map(body))
        assert codec.full_map(cls, codec.unpack(codec.encode(body))) == codec.dump(body)
    wire = codec.to_wire(m.JobRegister(job=Job(id="web", task_groups=[TaskGroup(name="g")])))
    aliased = codec.from_wire(m.JobRegister, wire)
    assert aliased.job.datacenters is not wire["job"]["datacenters"], "lists are copied, as before"
    assert aliased.job.meta is not wire["job"]["meta"], "maps are copied, as before"


class _Tree(Record):
    """A record that holds itself: its generated builder looks its own up when called."""

    name: str
    children: list[_Tree] = field(default_factory=list)
    parent: _Tree | None = None


def test_builder_of_a_record_that_holds_itself() -> None:
    leaf = {"name": "b", "children": [], "parent": None}
    assert codec.from_wire(_Tree, {"name": "a", "children": [leaf], "parent": None}) == _Tree(
        "a", [_Tree("b")]
    )
    with pytest.raises(CodecError, match=r"^_Tree\.children\[0\]\.name: expected string, got int$"):
        codec.from_wire(_Tree, {"name": "a", "children": [dict(leaf, name=1)], "parent": None})


def test_encode_rejects_what_pack_rejects() -> None:
    with pytest.raises(TypeError):
        codec.encode(object())


def test_wire_field_order_and_omitted_defaults_do_not_change_the_state() -> None:
    """The leader's field order leaves no trace; neither does leaving out a default.

    A default written out in full is kept: msgspec leaves a field out by
    identity, and a decoded "default" is not the constant. Every replica
    decodes the same entry bytes alike, so they still agree; the leader's
    encode_entry leaves defaults out, so a live cluster stores the sparse form.
    """
    body = m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web"))
    wire = codec.to_wire(body)

    def reorder(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reorder(v) for k, v in reversed(list(value.items()))}
        if isinstance(value, list):
            return [reorder(v) for v in value]
        return value

    sparse = {
        "job": {
            "id": "web",
            "name": "web",
            "task_groups": [{"name": "g", "tasks": [{"name": "t"}]}],
        }
    }
    sparse["eval"] = {"id": "e1", "job_id": "web"}

    def state(raw: bytes) -> tuple[str, dict[str, Any]]:
        assert decode_entry(raw).body == body
        h = Harness.temp()
        try:
            assert h.raw(raw).ok
            with h.reader() as r:
                records = {"job": r.job("web"), "eval": r.eval("e1")}
            return h.fsm.digest()[0], records
        finally:
            h.destroy()

    def entry(variant: Any) -> bytes:
        return bytes([MessageType.JOB_REGISTER]) + codec.pack({"v": 1, "time": T0, "rid": "", "body": variant})

    full, reordered = state(entry(wire)), state(entry(reorder(wire)))
    leaders, omitted = state(encode_entry(body, time=T0, rid="")), state(entry(sparse))
    assert full == reordered
    assert leaders == omitted
    assert full[1] == leaders[1], "the same records either way"


def test_optional_map_of_records_encodes() -> None:
    """Regression: encode_entry raised TypeError on AllocClientState.task_states."""
    body = m.AllocClientUpdate(
        allocs=[m.AllocClientState(id="a", client_status="running", task_states={"t": TaskState()})]
    )
    assert decode_entry(encode_entry(body, time=0, rid="")).body == body


def test_fsm_refuses_a_newer_store_schema(tmp_path: Path) -> None:
    fsm = FSM(str(tmp_path), map_size=SMALL_MAP)
    fsm.apply_batch([(1, encode_entry(m.Barrier(), time=T0, rid=""))])
    with fsm.store.env.begin(write=True) as txn:
        txn.put(b"schema_version", (99).to_bytes(8, "big"), db=fsm.store.dbs["meta"])
    fsm.close()
    with pytest.raises(FatalApplyError, match="schema 99"):
        FSM(str(tmp_path), map_size=SMALL_MAP)
