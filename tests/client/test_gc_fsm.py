"""The ``ClientGC`` entry: a forced client GC request, replicated and journalled for the clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fsm import codec
from fsm import messages as m
from fsm.topics import CLIENT_GC_REQUESTED, TOPIC_CLIENT_GC
from tests.fsm.support import Harness, make_alloc, make_eval, make_job, make_node


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


def gc_records(h: Harness) -> list[tuple[int, list[Any]]]:
    out = []
    with h.reader() as r:
        for index, batch in r.journal_batches():
            records = codec.unpack(batch) if isinstance(batch, bytes | memoryview) else batch
            records = [rec if isinstance(rec, list) else codec.unpack(rec) for rec in records]
            out += [(index, rec) for rec in records if rec[0] == TOPIC_CLIENT_GC]
    return out


def test_a_request_is_journalled_under_its_node_with_its_index(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")))
    assert h.ok(m.ClientGC(node_id="n1")) == {"node_id": "n1", "alloc_id": ""}
    h.ok(m.ClientGC())  # every node
    (i1, r1), (i2, r2) = gc_records(h)
    assert r1 == [
        TOPIC_CLIENT_GC,
        CLIENT_GC_REQUESTED,
        "n1",
        {"node_id": "n1", "alloc_id": "", "index": i1},
    ]
    assert r2 == [
        TOPIC_CLIENT_GC,
        CLIENT_GC_REQUESTED,
        "",
        {"node_id": "", "alloc_id": "", "index": i2},
    ]


def test_the_alloc_form_goes_to_the_allocs_node_and_unknown_ids_are_refused(h: Harness) -> None:
    h.ok(m.NodeRegister(node=make_node("n1")))
    h.ok(m.NodeRegister(node=make_node("n2")))
    h.ok(m.JobRegister(job=make_job("web"), eval=make_eval("e1", "web")))
    h.ok(m.PlanApply(eval_id="e1", job_id="web", allocs_to_place=[make_alloc("a1", node_id="n2")]))
    assert h.ok(m.ClientGC(alloc_id="a1")) == {"node_id": "n2", "alloc_id": "a1"}
    assert gc_records(h)[-1][1][2:] == ["n2", {"node_id": "n2", "alloc_id": "a1", "index": h.index}]
    assert h.apply(m.ClientGC(node_id="n1", alloc_id="a1")).code == "bad_request"  # not that node's
    assert h.apply(m.ClientGC(node_id="nope")).code == "not_found"
    assert h.apply(m.ClientGC(alloc_id="nope")).code == "not_found"
    assert len(gc_records(h)) == 1  # a refused request journals nothing
