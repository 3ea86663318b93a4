"""Batch entries (type 21): client writes the leader coalesced into one raft entry.

Each item keeps its own request id (dedupe), result and rejection; a rejected
item changes nothing and fails no other item; the journal has one batch at the
index; a crash loses the batch whole or not at all; replicas converge.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fsm import codec
from fsm import messages as m
from fsm.keys import SEP, u64
from fsm.machine import IDS_OF_INDEX
from fsm.messages import MessageType, decode_entry, encode_batch, encode_entry
from fsm.structs import MINUTE, SECOND
from tests.fsm.support import T0, Harness, dump, make_alloc, make_eval, make_job, make_node


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


def item(body: object, rid: str, t: int = T0) -> bytes:
    return encode_entry(body, time=t, rid=rid)


def setup_allocs(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")))
    h.ok(m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web")))
    h.ok(m.PlanApply(allocs_to_place=[make_alloc("a1")], evals=[make_eval("e1", "web", status="complete")]))


# stops a1 (a write), then fails on a placement for a missing node: rejected after writing
REJECTED_AFTER_WRITE = m.PlanApply(
    allocs_to_stop=[m.AllocStop(id="a1")], allocs_to_place=[make_alloc("a2", node_id="n9")]
)


def test_batch_round_trips_and_items_apply_at_its_index(h: Harness) -> None:
    items = [item(m.JobRegister(job=make_job(f"j{i}")), f"r{i}", T0 + i) for i in range(3)]
    entry = encode_batch(items, time=T0 + 5)
    decoded = decode_entry(entry)
    assert decoded.type is MessageType.BATCH and decoded.body.entries == items and decoded.rid == ""
    result = h.raw(entry)
    assert result.ok and [r.ok for r in result.batch] == [True] * 3
    assert {r.index for r in result.batch} == {h.index}
    assert [r.value["job_modify_index"] for r in result.batch] == [h.index] * 3
    with h.reader() as r:
        assert [r.job(f"j{i}").modify_index for i in range(3)] == [h.index] * 3
        assert r.request_result("r1")["index"] == h.index
    assert h.fsm.last_time == T0 + 5


def test_rejected_items_fail_alone(h: Harness) -> None:
    setup_allocs(h)
    items = [
        item(m.JobRegister(job=make_job("a")), "ok1"),
        item(m.JobDeregister(job_id="nope"), "missing"),  # rejected before writing
        item(REJECTED_AFTER_WRITE, "undone"),  # rejected after writing: rolled back
        b"\x01\xc1",  # undecodable item
        encode_batch([item(m.Barrier(), "inner")], time=T0),  # nested batch
        item(m.AllocClientUpdate(allocs=[m.AllocClientState(id="a1", client_status="running")]), "ok2"),
    ]
    result = h.raw(encode_batch(items, time=T0))
    codes = [(r.ok, r.code) for r in result.batch]
    assert codes == [(True, ""), (False, "not_found"), (False, "conflict"), (False, "bad_request"),
                     (False, "bad_request"), (True, "")]
    with h.reader() as r:
        assert r.job("a") is not None
        alloc = r.alloc("a1")
        assert alloc.desired_status == "run" and alloc.client_status == "running"  # the undone stop left nothing
        assert r.alloc("a2") is None
        assert r.request_result("undone")["code"] == "conflict"
        assert r.request_result("inner") is None
        assert r.applied_index == h.index


def test_retries_return_the_first_result(h: Harness) -> None:
    first = h.apply(m.JobRegister(job=make_job("web")), rid="r1")
    items = [
        item(m.JobRegister(job=make_job("web", count=5)), "r1"),  # a retry of an applied write
        item(m.JobRegister(job=make_job("api")), "r2"),
        item(m.JobRegister(job=make_job("api", count=7)), "r2"),  # a retry inside the same batch
    ]
    result = h.raw(encode_batch(items, time=T0 + 9 * SECOND))
    dup1, new, dup2 = result.batch
    assert dup1.duplicate and dup1.to_wire() == first.to_wire()
    assert new.ok and not new.duplicate
    assert dup2.duplicate and dup2.to_wire() == new.to_wire()
    with h.reader() as r:
        assert r.job("web").task_groups[0].count == 1 and r.job("api").task_groups[0].count == 1
    # and a later retry of a batched write (alone, or in another batch) gets its result too
    assert h.apply(m.JobRegister(job=make_job("api", count=3)), rid="r2").to_wire() == new.to_wire()


def test_journal_has_one_batch_at_the_index(h: Harness) -> None:
    single = Harness.temp()
    try:
        bodies = [m.JobRegister(job=make_job(f"j{i}")) for i in range(3)]
        for i, body in enumerate(bodies):
            single.raw(item(body, f"r{i}"))
        h.raw(encode_batch([item(b, f"r{i}") for i, b in enumerate(bodies)], time=T0))
        journal = dump(h.fsm)["journal"]
        assert list(journal) == [h.index.to_bytes(8, "big")]
        records = codec.unpack(journal[h.index.to_bytes(8, "big")])
        per_entry = [r for raw in dump(single.fsm)["journal"].values() for r in codec.unpack(raw)]
        assert len(records) == len(per_entry) and len(records) >= 3
    finally:
        single.destroy()


def _log() -> list[tuple[int, bytes]]:
    setup = [
        m.NodeRegister(node=make_node("n1")),
        m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web")),
        m.PlanApply(allocs_to_place=[make_alloc("a1")], evals=[make_eval("e1", "web", status="complete")]),
    ]
    log = [(i, item(b, f"s{i}", T0 + i * SECOND)) for i, b in enumerate(setup, 1)]
    batch = [
        item(m.JobRegister(job=make_job("b1")), "b1", T0 + 10 * SECOND),
        item(REJECTED_AFTER_WRITE, "bad1", T0 + 11 * SECOND),
        item(m.AllocClientUpdate(allocs=[m.AllocClientState(id="a1", client_status="running")]), "b2", T0 + 12 * SECOND),
        item(REJECTED_AFTER_WRITE, "bad2", T0 + 13 * SECOND),
        item(m.JobRegister(job=make_job("b3")), "b3", T0 + 14 * SECOND),
    ]
    log.append((4, encode_batch(batch, time=T0 + 14 * SECOND)))
    log.append((5, encode_batch([item(m.JobRegister(job=make_job("b4")), "b4", T0 + 15 * SECOND)], time=T0 + 15 * SECOND)))
    log.append((6, item(m.JobDeregister(job_id="b1"), "d1", T0 + 16 * SECOND)))
    return log


def test_group_commit_crash_and_replay_converge() -> None:
    """One commit per entry, one group for the whole log (rollbacks inside the batch replay the
    group), and a crash anywhere then a full replay: all the same results, state and journal."""
    log = _log()
    one = Harness.temp()
    group = Harness.temp()
    try:
        expected = [one.fsm.apply_batch([e])[0] for e in log]
        assert [r.code for r in expected[3].batch] == ["", "conflict", "", "conflict", ""]
        got = group.fsm.apply_batch(log)
        assert [r.to_wire() for r in got] == [r.to_wire() for r in expected]
        assert group.fsm.digest() == one.fsm.digest() and dump(group.fsm) == dump(one.fsm)
        for crash_after in range(len(log)):
            c = Harness.temp()
            try:
                c.fsm.apply_batch(log[:2])
                for index, entry in log[2 : crash_after + 1]:
                    c.fsm.apply(index, entry)
                c.fsm.store.env.close()  # crash: the open group is lost
                c.fsm = c._open()
                applied = c.fsm.applied_index
                # the group is committed right after a batch that rolled an item back
                assert applied == (4 if crash_after >= 3 else 2)
                replay = c.fsm.apply_batch(log)
                assert all(r.skipped for r in replay[:applied])
                assert c.fsm.digest() == one.fsm.digest()
            finally:
                c.destroy()
    finally:
        one.destroy()
        group.destroy()


def time_rows(h: Harness) -> list[tuple[int, bytes, Any]]:
    """``requests_by_time`` as (time, marker byte, ids or index), oldest first."""
    with h.reader() as r:
        rows = list(r.txn.cursor(db=r.dbs["requests_by_time"]))
    return [
        (int.from_bytes(k[:8], "big"), k[8:9], codec.unpack(v) if k[8:9] == IDS_OF_INDEX else k[9:]) for k, v in rows
    ]


def test_a_batch_notes_its_request_ids_in_one_row_even_after_a_rollback() -> None:
    """One time row per index: a Batch's items share it, under its newest item's time."""
    h = Harness.temp(request_ttl=MINUTE, request_min_entries=0)
    try:
        setup_allocs(h)
        items = [
            item(m.JobRegister(job=make_job("a")), "b1", h.time + 1),
            item(REJECTED_AFTER_WRITE, "undone", h.time + 3),  # rolls the group back: the batch is applied again
            item(m.JobRegister(job=make_job("b")), "b2", h.time + 2),
        ]
        h.raw(encode_batch(items, time=h.time))
        assert h.fsm.last_time == h.time + 3, "the newest item's time"
        batch_row = [row for row in time_rows(h) if row[2] and row[2][0] == b"b1"]
        assert batch_row == [(h.fsm.last_time, IDS_OF_INDEX, [b"b1", b"undone", b"b2"])]
        h.time = h.fsm.last_time + 2 * MINUTE
        h.ok(m.Barrier(), rid="later")
        with h.reader() as r:
            assert [r.request_result(x) for x in ("b1", "undone", "b2")] == [None] * 3
            assert r.request_result("later") is not None
        assert [row[2] for row in time_rows(h)] == [[b"later"]]
    finally:
        h.destroy()


def test_request_rows_of_one_id_written_before_still_expire_in_time_order() -> None:
    """A store from before ids were noted per index keeps (time, SEP, id) -> index rows; expiry takes both kinds."""
    h = Harness.temp(request_ttl=MINUTE, request_min_entries=0)
    try:
        h.ok(m.Barrier(), rid="new-old")
        with h.fsm.store.env.begin(write=True) as txn:
            dbs = h.fsm.store.dbs
            for t, rid in ((T0 - 1, b"older"), (T0 + 3 * MINUTE, b"younger")):
                txn.put(rid, codec.pack({"index": 1, "ok": True, "value": {}, "code": "", "error": ""}), db=dbs["requests"])
                txn.put(u64(t) + SEP + rid, u64(1), db=dbs["requests_by_time"])
        h.time = T0 + 2 * MINUTE
        h.ok(m.Barrier(), rid="now")
        with h.reader() as r:
            assert r.request_result("older") is None and r.request_result("new-old") is None
            assert r.request_result("younger") is not None and r.request_result("now") is not None
        assert [(row[1], row[2]) for row in time_rows(h)] == [(IDS_OF_INDEX, [b"now"]), (SEP, b"younger")]
    finally:
        h.destroy()
