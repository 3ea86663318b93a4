"""The leader's write lanes: a client's write never waits for, nor shares an entry with, the leader's bulk work.

A raft stand-in records each submitted entry and answers only when the test
says so, so "in flight" is exact; the queue under test is the real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog.testing

from fsm import messages as m
from fsm.machine import ApplyResult
from fsm.messages import decode_entry, encode_entry
from node.core import writes
from node.core.writes import (
    CLIENT,
    LEADER,
    MAX_WRITE_ENTRIES_IN_FLIGHT,
    WriteQueue,
)


class HeldRaft:
    """Takes entries and holds their callbacks until ``commit``."""

    max_entry_bytes = 48 * 1024

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, Any]] = []

    def submit(self, entry: bytes, done: Any) -> None:
        self.entries.append((entry, done))

    def commit(self, i: int) -> None:
        entry, done = self.entries[i]
        items = _items(entry)
        result = (
            ApplyResult(ok=True, index=i + 1)
            if len(items) == 1
            else ApplyResult(
                ok=True, index=i + 1, batch=[ApplyResult(ok=True, index=i + 1)] * len(items)
            )
        )
        done(result, i + 1, None)


def _items(entry: bytes) -> list[str]:
    """The request ids an entry carries: one, or each of a Batch's."""
    msg = decode_entry(entry)
    if isinstance(msg.body, m.Batch):
        return [decode_entry(item).rid for item in msg.body.entries]
    return [msg.rid]


def _entry(tag: str) -> bytes:
    return encode_entry(m.NodeUpdateStatus(node_id=tag, status="ready"), time=1, rid=tag)


async def _turn() -> None:
    """Let queued callbacks run (the flush is scheduled with call_soon): no time passes."""
    for _ in range(3):
        await asyncio.sleep(0)


async def _scenario() -> tuple[HeldRaft, list[asyncio.Task[Any]]]:
    """The leader lane's slots full (one entry each) and three bulk writes waiting; then a client write."""
    raft = HeldRaft()
    queue = WriteQueue(raft, lambda fut, value: fut.set_result(value), {})  # type: ignore[arg-type]
    tasks = []
    for i in range(MAX_WRITE_ENTRIES_IN_FLIGHT + 3):
        tasks.append(asyncio.ensure_future(queue.submit(_entry(f"bulk{i}"), LEADER)))
        if i < MAX_WRITE_ENTRIES_IN_FLIGHT:
            await _turn()
    await _turn()
    assert queue.in_flight(LEADER) == MAX_WRITE_ENTRIES_IN_FLIGHT
    tasks.append(asyncio.ensure_future(queue.submit(_entry("client"), CLIENT)))
    await _turn()
    return raft, tasks


def test_a_client_write_goes_out_while_the_leader_lane_is_full_and_alone() -> None:
    async def run() -> None:
        raft, tasks = await _scenario()
        # The leader lane holds its slots; the client's write went out at once, in an entry of its own.
        assert len(raft.entries) == MAX_WRITE_ENTRIES_IN_FLIGHT + 1
        assert _items(raft.entries[-1][0]) == ["client"]
        raft.commit(len(raft.entries) - 1)
        await _turn()
        assert tasks[-1].done() and not any(t.done() for t in tasks[:-1])
        # The waiting bulk writes go out together, never with a client write, once a leader slot frees.
        raft.commit(0)
        await _turn()
        assert _items(raft.entries[-1][0]) == ["bulk2", "bulk3", "bulk4"]
        for i in range(1, len(raft.entries)):
            if i != MAX_WRITE_ENTRIES_IN_FLIGHT:  # the client's entry, committed above
                raft.commit(i)
        await asyncio.gather(*tasks)

    asyncio.run(run())


def _full_entry(tag: str, size: int) -> bytes:
    """A write that fills most of an entry alone (a plan's head entry)."""
    return encode_entry(m.NodeUpdateStatus(node_id=tag + "x" * size, status="ready"), time=1, rid=tag)


def test_the_leader_lane_holds_one_entry_of_bytes_in_flight_and_a_client_write_passes_it() -> None:
    async def run() -> None:
        raft = HeldRaft()
        queue = WriteQueue(raft, lambda fut, value: fut.set_result(value), {})  # type: ignore[arg-type]
        # Two of them never share an entry, nor fit in flight together.
        big = writes.leader_entry_bytes(raft.max_entry_bytes) * 3 // 4
        tasks = [asyncio.ensure_future(queue.submit(_full_entry(f"plan{i}", big), LEADER)) for i in range(6)]
        await _turn()
        assert queue.in_flight(LEADER) == 1 and len(raft.entries) == 1
        tasks.append(asyncio.ensure_future(queue.submit(_entry("client"), CLIENT)))
        await _turn()
        assert _items(raft.entries[-1][0]) == ["client"]  # not behind the five plans still queued
        # Each answered entry lets exactly the next one out, in order, until all are through.
        sent = 0
        while sent < len(raft.entries):
            raft.commit(sent)
            sent += 1
            await _turn()
            assert queue.in_flight(LEADER) <= 1
        assert [_items(e)[0] for e, _ in raft.entries if _items(e)[0] != "client"] == [f"plan{i}" for i in range(6)]
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_small_leader_entries_go_two_at_a_time_within_one_entry_of_bytes() -> None:
    async def run() -> None:
        raft = HeldRaft()
        queue = WriteQueue(raft, lambda fut, value: fut.set_result(value), {})  # type: ignore[arg-type]
        first = asyncio.ensure_future(queue.submit(_entry("reap"), LEADER))
        await _turn()
        second = asyncio.ensure_future(queue.submit(_entry("evals"), LEADER))
        await _turn()
        assert queue.in_flight(LEADER) == MAX_WRITE_ENTRIES_IN_FLIGHT
        # A plan entry that fits the lane's bytes only alone (short of the limit by less than a small entry).
        limit = writes.leader_entry_bytes(raft.max_entry_bytes) - writes.BATCH_OVERHEAD
        size = limit - len(_full_entry("plan", 0)) - writes.ITEM_OVERHEAD - 30
        big = asyncio.ensure_future(queue.submit(_full_entry("plan", size), LEADER))
        await _turn()
        assert len(raft.entries) == 2  # the full one waits for both
        raft.commit(0)
        await _turn()
        assert len(raft.entries) == 2  # one small one still holds too many bytes with it
        raft.commit(1)
        await _turn()
        assert _items(raft.entries[-1][0]) == ["plan"]
        raft.commit(2)
        await asyncio.gather(first, second, big)

    asyncio.run(run())


def test_leader_batches_are_cut_to_the_leader_entry_size_and_client_batches_to_the_raft_limit() -> None:
    """The leader's bulk writes go out in entries of ``leader_entry_bytes``: a user's write waits for
    the apply of at most that much of them (issue #34). Users' writes still fill whole entries."""

    async def run(lane: str) -> list[bytes]:
        raft = HeldRaft()
        queue = WriteQueue(raft, lambda fut, value: fut.set_result(value), {})  # type: ignore[arg-type]
        tasks = []
        for i in range(MAX_WRITE_ENTRIES_IN_FLIGHT):  # the lane's slots, one small entry each
            tasks.append(asyncio.ensure_future(queue.submit(_entry(f"gate{i}"), lane)))
            await _turn()
        size = writes.LEADER_ENTRY_BYTES // 12  # 24 of them: twice a leader entry, half the raft limit
        tasks += [asyncio.ensure_future(queue.submit(_full_entry(f"w{i}", size), lane)) for i in range(24)]
        await _turn()
        sent = 0
        while sent < len(raft.entries):
            raft.commit(sent)
            sent += 1
            await _turn()
        await asyncio.gather(*tasks)
        return [entry for entry, _ in raft.entries[MAX_WRITE_ENTRIES_IN_FLIGHT:]]

    leader = asyncio.run(run(LEADER))
    assert len(leader) == 3 and all(len(e) <= writes.leader_entry_bytes(HeldRaft.max_entry_bytes) for e in leader)
    assert [rid for e in leader for rid in _items(e)] == [f"w{i}" for i in range(24)]
    client = asyncio.run(run(CLIENT))
    assert len(client) == 1 and _items(client[0]) == [f"w{i}" for i in range(24)]
    assert len(client[0]) > writes.LEADER_ENTRY_BYTES


def test_a_slow_write_is_logged_once_per_interval_with_what_was_ahead(monkeypatch: Any) -> None:
    monkeypatch.setattr(writes, "SLOW_WRITE_S", 0.0)  # every write counts as slow

    async def run() -> list[dict[str, Any]]:
        raft = HeldRaft()
        queue = WriteQueue(raft, lambda fut, value: fut.set_result(value), {})  # type: ignore[arg-type]
        with structlog.testing.capture_logs() as logs:
            bulk = asyncio.ensure_future(queue.submit(_entry("bulk"), LEADER))
            await _turn()
            tasks = []
            for i in range(2):  # one entry each
                tasks.append(asyncio.ensure_future(queue.submit(_entry(f"c{i}"), CLIENT)))
                await _turn()
            for i in range(len(raft.entries)):
                raft.commit(i)
                await _turn()
            await asyncio.gather(bulk, *tasks)
        assert queue.slow[CLIENT].count == 2
        return [line for line in logs if line["event"] == "write_slow"]

    lines = asyncio.run(run())
    client = [line for line in lines if line["lane"] == CLIENT]
    assert len(client) == 1  # the second within the interval is counted, not logged
    assert client[0]["ahead"] == {LEADER: {"entries": 1, "bytes": len(_entry("bulk"))}}
    assert [line["lane"] for line in lines].count(LEADER) == 1
