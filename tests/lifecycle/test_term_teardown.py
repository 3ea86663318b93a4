"""A leader's term leaves no cycle behind: its lifecycle and placement index are freed by reference counting.

A follower owns its journal cursor; with the cursor holding it strongly the
two made a cycle, and a dropped term (its index holds a claim per alloc)
waited for the collector's full pass: 2.4 million objects at 1M allocs,
and 1.3 s with every thread stopped, raft's tick thread included, which
cost elections (bench-failover). The cursor holds its follower weakly.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from fsm import messages as m
from fsm.cursor import Cursor
from node.leader import lifecycle
from node.leader.lifecycle import Lifecycle
from tests.conditions import wait_until_async
from tests.fsm.support import Harness
from tests.lifecycle.support import node
from tests.lifecycle.test_node_down_covered import FakeServer, _place


@pytest.fixture
def h() -> Iterator[Harness]:
    h = Harness.temp()
    try:
        for i in range(5):
            h.ok(m.NodeRegister(node=node(f"n{i}", cpu=100_000, mem=100_000)))
            _place(h, f"j{i}", f"n{i}", 10)
        yield h
    finally:
        h.destroy()


def test_a_dropped_term_is_freed_at_once_without_the_cyclic_collector(h: Harness) -> None:
    gc.disable()  # only reference counting may free it
    try:
        lc = Lifecycle(FakeServer(h))  # type: ignore[arg-type]
        asyncio.run(lc.follow())
        with h.reader() as r:
            lc.placement.catch_up(r)
        assert len(lc.placement.nodes) == 5
        gone = [weakref.ref(lc), weakref.ref(lc.placement), weakref.ref(lc.cursor)]
        del lc
        assert [ref() is None for ref in gone] == [True, True, True]
    finally:
        gc.enable()


def test_a_cursor_whose_follower_is_gone_says_so() -> None:
    class Follower:
        def rebuild(self, reader: object) -> None: ...
        def apply(self, index: int, records: object) -> None: ...

    cursor = Cursor(Follower())  # nobody keeps the follower
    with pytest.raises(ReferenceError, match="follower is gone"):
        cursor.follower  # noqa: B018 - the property is the check


def test_a_term_that_ends_empties_its_placement_index_for_good(h: Harness) -> None:
    """Even if a cycle (a cancelled task's traceback) still reaches the term, its claims are gone,
    and a read still queued when it ended does not build them again."""
    server = FakeServer(h)
    lc = Lifecycle(server)  # type: ignore[arg-type]

    async def term() -> None:
        task = asyncio.create_task(lc.run())
        # A term that ended at once (it raised) never shows as current: fail with why, not a timeout.
        await wait_until_async(lambda: task.done() or lifecycle.current(server) is lc, 10, "the term running")  # type: ignore[arg-type]
        if task.done():
            task.result()
            raise AssertionError("the term ended by itself before it was cancelled")
        with h.reader() as r:
            lc.placement.catch_up(r)
        assert len(lc.placement.nodes) == 5
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(term())
    assert lc.placement.nodes == {} and lc.placement.usage == {}
    with h.reader() as r:
        assert lc.placement.catch_up(r) is False
    assert lc.placement.nodes == {} and lc.placement.stats.rebuilds == 1
