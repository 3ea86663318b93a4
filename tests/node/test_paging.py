"""List pages over a real store: complete, in key order, never over budget, filtered before counting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsm import codec
from fsm.machine import FSM
from fsm.store import StateReader
from node.core import paging
from node.core.paging import (
    PageRequest,
    Row,
    collect,
    index_rows,
    page_budget,
    page_request,
    table_rows,
)
from node.spec.nomadjson import to_nomad
from node.wire.errors import RPCError
from tests.bench.snapshot_bench import build

JOBS = 6  # snapshot_bench.build: 100 allocs a job, one node per 4 jobs
RowsOf = Callable[[StateReader, PageRequest], Iterator[Row]]


@pytest.fixture(scope="module")
def fsm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FSM]:
    machine = FSM(str(tmp_path_factory.mktemp("paging") / "store"))
    build(machine, JOBS * 104)
    try:
        yield machine
    finally:
        machine.close()


def every_page(fsm: FSM, rows: RowsOf, budget: int = 1 << 20, **ask: Any) -> list[paging.Page]:
    """Follow next_token from the first page to the last, as a client does."""
    out = []
    token = ""
    while True:
        req = page_request({**ask, "next_token": token})
        with fsm.read() as reader:
            page = collect(rows(reader, req), req, to_nomad, budget)
        out.append(page)
        token = page.next_token
        if not token:
            return out
        assert len(out) < 10_000, "paging does not end"


def ids(pages: list[paging.Page]) -> list[str]:
    return [item["ID"] for page in pages for item in page.items]


def all_allocs(r: StateReader, req: PageRequest) -> Iterator[Row]:
    return table_rows(r, "allocs", req)


def test_pages_cover_the_table_once_in_id_order(fsm: FSM) -> None:
    with fsm.read() as reader:
        expected = [a.id for a in reader.allocs()]
    pages = every_page(fsm, all_allocs, per_page=7)
    assert ids(pages) == expected
    assert all(len(p.items) == 7 for p in pages[:-1])
    # The token is the ID of the next page's first item, as Nomad's.
    assert all(a.next_token == b.items[0]["ID"] for a, b in zip(pages, pages[1:], strict=False))


def test_reverse_walks_down(fsm: FSM) -> None:
    with fsm.read() as reader:
        expected = [a.id for a in reader.allocs()][::-1]
    assert ids(every_page(fsm, all_allocs, per_page=50, reverse=True)) == expected


def test_prefix_limits_the_scan(fsm: FSM) -> None:
    with fsm.read() as reader:
        expected = [j.id for j in reader.jobs("job-000000")]
    assert expected and len(expected) < JOBS + 1
    got = ids(every_page(fsm, lambda r, req: table_rows(r, "jobs", req), per_page=2, prefix="job-000000"))
    assert got == expected
    got = ids(every_page(fsm, lambda r, req: table_rows(r, "jobs", req), per_page=2, prefix="job-000000", reverse=True))
    assert got == expected[::-1]


def test_a_jobs_allocs_through_its_index(fsm: FSM) -> None:
    with fsm.read() as reader:
        expected = sorted(a.id for a in reader.allocs_by_job("job-0000003"))

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        return index_rows(r, "allocs_by_job", "job-0000003", r.alloc, req)

    pages = every_page(fsm, rows, per_page=30)
    assert [len(p.items) for p in pages] == [30, 30, 30, 10]
    assert ids(pages) == expected
    assert ids(every_page(fsm, rows, per_page=30, reverse=True)) == expected[::-1]


def test_a_nodes_allocs_through_its_index(fsm: FSM) -> None:
    with fsm.read() as reader:
        node_id = reader.nodes()[0].id
        expected = sorted(a.id for a in reader.allocs_by_node(node_id))

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        return index_rows(r, "allocs_by_node", node_id, r.alloc, req)

    pages = every_page(fsm, rows, per_page=40)
    assert sorted(ids(pages)) == expected and len(ids(pages)) == len(expected)
    assert "\x00" not in "".join(p.next_token for p in pages)  # tokens travel in headers


def test_filter_runs_before_paging(fsm: FSM) -> None:
    pages = every_page(fsm, all_allocs, per_page=40, filter='JobID == "job-0000002"')
    assert [len(p.items) for p in pages] == [40, 40, 20]  # rejected rows do not count toward per_page
    assert {item["JobID"] for p in pages for item in p.items} == {"job-0000002"}
    assert pages[-1].next_token == ""  # the scan looked ahead: no empty last page


def test_byte_budget_ends_pages_early(fsm: FSM) -> None:
    with fsm.read() as reader:
        expected = [a.id for a in reader.allocs()]
        one = len(codec.pack(to_nomad(reader.allocs(limit=1)[0])))
    pages = every_page(fsm, all_allocs, budget=one * 10)
    assert ids(pages) == expected
    assert max(len(p.items) for p in pages) <= 10
    for page in pages:
        assert sum(len(codec.pack(item)) for item in page.items) <= one * 10 + one  # items vary a little


def test_scan_limit_answers_with_a_token_to_go_on(fsm: FSM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "SCAN_LIMIT", 25)
    pages = every_page(fsm, all_allocs, filter='JobID == "job-0000005"')
    assert len(ids(pages)) == 100
    assert any(not p.items and p.next_token for p in pages)  # pages that only scanned


def test_page_budget_stays_under_the_frame() -> None:
    assert page_budget(4 << 20) == 1 << 20
    assert page_budget(64 << 10) == 16 << 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"per_page": -1}, "per_page"),
        ({"per_page": "10"}, "per_page"),
        ({"per_page": True}, "per_page"),
        ({"reverse": "yes"}, "reverse"),
        ({"next_token": 5}, "next_token"),
        ({"next_token": "x" * 600}, "next_token"),
        ({"filter": 'Status = "x"'}, "column 8"),
    ],
)
def test_bad_paging_arguments(args: dict[str, Any], message: str) -> None:
    with pytest.raises(RPCError) as info:
        page_request(args)
    assert info.value.code == "bad_request" and message in info.value.message


def test_per_page_is_capped(fsm: FSM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "MAX_PER_PAGE", 64)
    pages = every_page(fsm, all_allocs, per_page=1_000_000)
    assert max(len(p.items) for p in pages) == 64


def test_filter_type_errors_are_bad_requests(fsm: FSM) -> None:
    with pytest.raises(RPCError) as info:
        every_page(fsm, all_allocs, filter='JobVersion == "two"')
    assert info.value.code == "bad_request" and "JobVersion is a number" in info.value.message
