"""The hub's fan-out shares each round's work among subscribers: it must not change what any of them gets.

A round's items are made once per distinct filter and encoding, a batch's
records are indexed once and picked by lookup (``node.core.stream``). These
properties hold the result to a plain reference -- each subscriber filtering
every batch itself, as the hub once did -- for random batches, filters,
encodings, groups, buffers and hand-overs from catch-up: the same items, in
the same grouping, the same bytes on the wire, the same overflows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm.topics import full_records
from node.core.hub import Hub
from node.core.stream import (
    TOPICS,
    Batch,
    Chunk,
    Entry,
    Filter,
    Item,
    Subscription,
    read_chunk,
    shared_runs,
)
from node.wire.framing import SharedItem, encode_item
from tests.journal.support import Harness, job, node, place

KEYS = ("a", "b", "c", "")
TOPIC_POOL = (*TOPICS[:4], TOPICS[-1], "Elsewhere")  # a few real topics, and one no filter names whole


# -- the reference: every subscriber filters every batch itself ------------------------
def reference_select(records: list[Any], flt: Filter) -> list[Any]:
    return [r for r in records if r[0] in flt.topics or (r[0], r[2]) in flt.keys]


def reference_item(batch: Batch, flt: Filter, raw: bool) -> Item | None:
    if flt.everything:
        return SharedItem(index=batch.index, raw=batch.raw) if raw else SharedItem(index=batch.index, events=batch.records)
    selected = reference_select(batch.records, flt)
    if not selected:
        return None
    return {"index": batch.index, "raw": codec.pack(selected)} if raw else {"index": batch.index, "events": selected}


def reference_offer(sub: Subscription, batches: list[Batch], through: int) -> bool:
    """``Subscription.offer`` as it was: unfiltered subscribers queue shared runs, the others their own."""
    if sub.filter.everything:
        runs: list[list[Entry]] = list(shared_runs([(b.index, reference_item(b, sub.filter, sub.raw), len(b.raw))
                                                    for b in batches]))
        for run in runs:
            sub.queue.add([e for e in run if e[0] > sub.through] if run[0][0] <= sub.through else run)
    else:
        own: list[Entry] = []
        for batch in batches:
            if batch.index <= sub.through:
                continue
            item = reference_item(batch, sub.filter, sub.raw)
            if item is not None:
                own.append((batch.index, item, len(batch.raw)))
        sub.queue.add(own)
    sub.through = max(sub.through, through)
    if len(sub.queue) > sub.max_buffer:
        sub.queue.clear()
        sub.overflowed = True
        return False
    return True


# -- strategies --------------------------------------------------------------------------
records_st = st.lists(
    st.tuples(st.sampled_from(TOPIC_POOL), st.sampled_from(("Put", "Del")), st.sampled_from(KEYS),
              st.one_of(st.none(), st.integers(0, 3).map(lambda v: {"v": v}))).map(list),
    max_size=8,
)

filters_st = st.one_of(
    st.just(Filter(frozenset(TOPICS))),
    st.builds(
        Filter,
        st.frozensets(st.sampled_from(TOPICS[:4] + TOPICS[-1:]), max_size=3),
        st.frozensets(st.tuples(st.sampled_from(TOPIC_POOL), st.sampled_from(KEYS)), max_size=4),
    ),
)


def make_batches(first: int, bodies: list[list[Any]]) -> list[Batch]:
    """Fresh ``Batch`` objects (nothing cached) over the same records and bytes."""
    return [Batch(first + i, codec.pack(records), records) for i, records in enumerate(bodies)]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Rounds of batches, subscribers, and when each subscriber's connection takes how many items."""
    rounds = draw(st.lists(st.tuples(st.lists(records_st, max_size=5), st.integers(0, 2)), min_size=1, max_size=4))
    total = sum(len(bodies) + gap for bodies, gap in rounds)
    pool = draw(st.lists(filters_st, min_size=1, max_size=3))  # few filters: subscribers share them
    subs = draw(st.lists(
        st.fixed_dictionaries({
            "filter": st.sampled_from(pool),
            "raw": st.booleans(),
            "group": st.sampled_from((1, 2, 256)),
            "buffer": st.integers(1, 12),
            "through": st.integers(0, total),  # where its catch-up left it
        }),
        min_size=1, max_size=6,
    ))
    takes = draw(st.lists(st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=len(subs), max_size=len(subs)),
                          min_size=len(rounds), max_size=len(rounds)))  # None: everything queued
    return {"rounds": rounds, "subs": subs, "takes": takes}


# -- the hub under test --------------------------------------------------------------------
@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    h = Harness()
    loop = asyncio.new_event_loop()
    try:
        yield Hub(h.fsm, loop)
    finally:
        loop.close()
        h.close()


def take(sub: Subscription, most: int | None) -> list[tuple[int, Item]]:
    out = []
    while sub.queue and (most is None or len(out) < most):
        out.append(sub.take())
    return out


def new_subscription(spec: dict[str, Any]) -> Subscription:
    return Subscription(spec["filter"], spec["through"], spec["buffer"], raw=spec["raw"], group=spec["group"],
                        through=spec["through"])


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_subscriber_gets_what_filtering_each_batch_itself_gave(hub: Hub, scenario: dict[str, Any]) -> None:
    mine = [new_subscription(s) for s in scenario["subs"]]
    theirs = [new_subscription(s) for s in scenario["subs"]]
    hub.live = set(mine)
    got: list[list[tuple[int, Item]]] = [[] for _ in mine]
    expected: list[list[tuple[int, Item]]] = [[] for _ in theirs]
    first = 1
    for (bodies, gap), takes in zip(scenario["rounds"], scenario["takes"], strict=True):
        through = first + len(bodies) - 1 + gap  # a chunk may reach past its last batch
        hub._fan_out(Chunk(make_batches(first, bodies), through, through, 0, 1))
        for ref in theirs:
            if not ref.overflowed:  # the hub drops an overflowed subscriber from the live set
                reference_offer(ref, make_batches(first, bodies), through)
        for i, most in enumerate(takes):
            got[i] += take(mine[i], most)
            expected[i] += take(theirs[i], most)
        first = through + 1
    for i, (sub, ref) in enumerate(zip(mine, theirs, strict=True)):
        assert got[i] == expected[i]
        assert [encode_item(item) for _, item in got[i]] == [encode_item(item) for _, item in expected[i]]
        assert (sub.overflowed, sub.through, len(sub.queue)) == (ref.overflowed, ref.through, len(ref.queue))
        assert (sub in hub.live) == (not ref.overflowed)
    hub.live = set()


@settings(max_examples=400, deadline=None)
@given(records_st, st.lists(st.tuples(filters_st, st.booleans()), min_size=1, max_size=6))
def test_a_batch_picks_each_filters_records_as_a_scan_would(records: list[Any], asks: list[tuple[Filter, bool]]) -> None:
    """The first filter scans, the later ones look up: either way the records a scan finds, in order."""
    batch = Batch(7, codec.pack(records), records)
    for flt, raw in asks:
        assert batch.select(flt) == (records if flt.everything else reference_select(records, flt))
        item, expected = batch.item(flt, raw), reference_item(batch, flt, raw)
        assert item == expected
        assert item is None or encode_item(item) == encode_item(expected)


# -- stored records, filled in only for the subscribers that get them ---------------------
def test_only_the_jobs_and_evals_a_records_subscriber_gets_are_filled_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's batch (a Job and an Evaluation, both stored without their default
    fields) and a plan's (an Allocation): an allocation subscriber costs no
    filling-in at all, a job subscriber fills in the job alone, once, however
    many items take it; every ``records`` item equals filling in the whole
    batch, and ``msgpack`` items carry the records as stored."""
    h = Harness()
    try:
        h.apply(node("n1"))
        h.apply(job("web"))
        h.apply(place("a1", "web", "n1"))
        with h.fsm.read() as reader:
            raws = {b.index: b.raw for b in read_chunk(reader, 0, decode=False).batches}
    finally:
        h.close()
    stored = {i: codec.unpack(raw) for i, raw in raws.items()}
    job_index = next(i for i, recs in stored.items() if any(r[0] == "Job" for r in recs))
    plan_index = next(i for i, recs in stored.items() if any(r[0] == "Allocation" for r in recs))
    whole = full_records(stored[job_index])
    fills: list[str] = []
    real = codec.full_map
    monkeypatch.setattr(codec, "full_map", lambda cls, data: fills.append(cls.__name__) or real(cls, data))

    allocs, jobs = Filter(frozenset({"Allocation"})), Filter(frozenset({"Job"}))
    for index in (job_index, plan_index):
        batch = Batch(index, raws[index])
        got = batch.item(allocs, raw=False)
        want = [r for r in stored[index] if r[0] == "Allocation"]
        assert (got is None and not want) or got["events"] == want
    assert fills == []

    batch = Batch(job_index, raws[job_index])
    first, second = batch.item(jobs, raw=False), batch.item(jobs, raw=False)
    assert first["events"] == second["events"] == [r for r in whole if r[0] == "Job"]
    assert fills == ["Job"]
    stored_job = next(r for r in stored[job_index] if r[0] == "Job")[3]
    assert set(first["events"][0][3]) > set(stored_job)  # every field, where the journal left the defaults out
    assert batch.item(Filter(frozenset(TOPICS)), raw=False)["events"] == whole
    assert fills == ["Job", "Evaluation"]  # the job's filling is kept; the eval's is made once now

    packed = batch.item(jobs, raw=True)
    assert codec.unpack(packed["raw"]) == [r for r in stored[job_index] if r[0] == "Job"]
