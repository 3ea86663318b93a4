"""The leader's write path: writes coalesced into as few raft entries as keep raft busy.

Every write the leader proposes (clients' through ``ServerAPI.write``, its
own through ``propose``) is encoded, then queued here in one of three lanes:

* ``CLIENT`` -- what a caller waits on: users' writes, nodes' status;
* ``LEADER`` -- the leader's own bulk work: plans, GC reaps, eval
  batches, admissions;
* ``STATUS`` -- node status the leader decides (the heartbeat monitor's
  mark-downs): few entries, and late ones leave lost allocs counted as
  running, so they never wait behind a backlog of plans.

Each lane has at most ``MAX_WRITE_ENTRIES_IN_FLIGHT`` uncommitted entries;
the writes that arrive meanwhile go out together as one ``Batch`` entry,
each keeping its request id, result and error. This is what lets pipelined
registrations run near raw pysyncobj's rate: the log carries fewer, larger
entries, and the tick thread wakes the loop once per batch of commits.
A client or status lane whose queue already fills an entry may send it
beyond that count, so raft stays busy. The leader lane may not: its
entries in flight hold at most one leader entry's size between them (one
full entry, or two smaller ones). Every server applies the log in order, so
a client's write waits for the apply of every entry proposed before it; in
a node-loss storm the plan applier keeps dozens of full plan entries
proposed, and with four of them in flight a client's write still waited
100-240 ms for theirs (150 KB at about 1 ms per KB on a loaded leader).

The leader's own bulk entries are also smaller than the raft limit:
``LEADER_ENTRY_BYTES`` (``leader_entry_bytes``), which the plan applier,
eval writer, admitter and GC cut their entries to. A write waits for the
ticks that apply the entries ahead of it, so the biggest entry the leader
itself proposes sets how long a user's write waits in a storm: with
48 KiB plan entries the leader's tick thread spent about 12 ms applying
each, and a client's write took about three such ticks (p50 39 ms, p99
103 ms during the 2,000-node storm of ``bench-failover``). Cut to 16 KiB,
the same storm gave p50 16-19 ms and p99 53-72 ms, and its rescheduling
took 63-75 s instead of 55 s. Heartbeat mark-downs (the status lane) keep
the full size: fewer entries bring every lost node down sooner.

A write slower than ``SLOW_WRITE_S`` is logged (``write_slow``, at most
once per ``SLOW_LOG_EVERY_S``, with how many were not), with where its time
went and what the lanes held when it went out, as etcd warns "apply request
took too long".

The lanes never share an entry or a slot. A client's write that shared a
Batch with a mark-down of a thousand nodes would wait for that entry's
apply (tens of ms on every server), and one that waited for a slot held by
plans would wait for the leader's whole backlog: during a node-loss storm
that made client write p99 thirty times its quiet value (issue #34).
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from fsm.machine import ApplyResult
from fsm.messages import encode_batch, encode_entry
from node.wire.errors import (
    BAD_REQUEST,
    UNAVAILABLE,
    UNKNOWN_OUTCOME,
    RPCError,
)
from raft import errors as raft_errors
from raft.node import RaftNode, encoded_entry_size

WRITE_TIMEOUT = 10.0  # seconds a write may wait for its entry to commit before its outcome is unknown
# Leader-side coalescing: while this many raft entries of a lane's writes are in
# flight, its new writes wait and go out together as one Batch entry (fsm/messages.py).
MAX_WRITE_ENTRIES_IN_FLIGHT = 2
# What the leader's own bulk entries are cut to (module doc; never above the raft limit).
LEADER_ENTRY_BYTES = 16 * 1024
SLOW_WRITE_S = 0.5
SLOW_LOG_EVERY_S = 10.0
CLIENT = "client"
LEADER = "leader"
STATUS = "status"
LANES = (CLIENT, LEADER, STATUS)
# Room a Batch entry needs besides its items (envelope, msgpack and pickle framing).
BATCH_OVERHEAD = 256
ITEM_OVERHEAD = 16

log = structlog.get_logger("caravan.writes")


def entry_size(body: Any) -> int:
    """Bytes ``body`` takes in the raft log once encoded and stamped (what ``max_entry_bytes`` limits).

    The leader's own writers (plans, GC reaps) measure what they batch with
    this, so their entries are cut to the same limit raft enforces.
    """
    return encoded_entry_size(encode_entry(body, time=time.time_ns(), rid=uuid.uuid4().hex))


def leader_entry_bytes(max_entry_bytes: int) -> int:
    """The size the leader's own bulk entries are cut to, under raft's ``max_entry_bytes``."""
    return min(max_entry_bytes, LEADER_ENTRY_BYTES)


@dataclass
class _Queued:
    """A write waiting for the next raft entry: its encoded entry, its stored size bound, its answer."""

    entry: bytes
    cost: int
    future: asyncio.Future[tuple[ApplyResult, int]]
    queued_at: float


@dataclass
class _Lane:
    """One lane's writes waiting for an entry, and its entries in flight."""

    name: str
    entry_bytes: int  # room for the items of one of its entries (the leader lane's entries are smaller)
    bounded: bool = False  # its entries in flight hold at most one entry's size between them
    queue: collections.deque[_Queued] = field(default_factory=collections.deque)
    queued_cost: int = 0
    in_flight: dict[object, int] = field(default_factory=dict)  # entry -> its bytes
    flush_scheduled: bool = False

    def may_send(self) -> bool:
        """Whether the next entry (at most ``entry_bytes`` of items) may go out now."""
        limit = self.entry_bytes
        if self.bounded:
            if not self.in_flight:
                return True
            entries, held = self.held()
            return entries < MAX_WRITE_ENTRIES_IN_FLIGHT and held + min(self.queued_cost, limit) <= limit
        return len(self.in_flight) < MAX_WRITE_ENTRIES_IN_FLIGHT or self.queued_cost >= limit

    def held(self) -> tuple[int, int]:
        """(entries, bytes) of this lane in flight."""
        return len(self.in_flight), sum(self.in_flight.values())


@dataclass
class _Sent:
    """One entry on its way: when it went out, and what was ahead of it (for the slow-write line)."""

    at: float
    waited: float  # seconds its oldest write queued before it went out
    ahead: dict[str, tuple[int, int]]  # lane -> (entries, bytes) in flight as it went out


class SlowWrites:
    """Writes slower than ``SLOW_WRITE_S``: counted, and logged at most once per ``SLOW_LOG_EVERY_S``."""

    def __init__(self) -> None:
        self.count = 0
        self._logged_at = -float("inf")
        self._unlogged = 0

    def note(self, lane: str, sent: _Sent, items: int, now: float) -> None:
        took = now - sent.at + sent.waited
        if took < SLOW_WRITE_S:
            return
        self.count += 1
        if now - self._logged_at < SLOW_LOG_EVERY_S:
            self._unlogged += 1
            return
        self._logged_at, unlogged, self._unlogged = now, self._unlogged, 0
        log.warning(
            "write_slow",
            lane=lane,
            took_s=round(took, 3),
            queued_s=round(sent.waited, 3),
            commit_apply_s=round(now - sent.at, 3),
            writes=items,
            ahead={name: {"entries": e, "bytes": b} for name, (e, b) in sent.ahead.items() if e},
            not_logged=unlogged,
        )


def _lane_entry_bytes(lane: str, max_entry_bytes: int) -> int:
    """Room for a lane's Batch entry's items: the entry's size less the Batch's own framing."""
    size = leader_entry_bytes(max_entry_bytes) if lane == LEADER else max_entry_bytes
    return size - BATCH_OVERHEAD


class WriteQueue:
    """Coalesces encoded entries into raft submissions; one per server, used only while it leads."""

    def __init__(
        self,
        raft: RaftNode,
        settle: Callable[[asyncio.Future[Any], Any], None],
        rpc_of_raft: Mapping[str, str],
    ) -> None:
        self.raft = raft
        self.settle = settle  # hands a tick-thread result to the loop (the server batches the wake-ups)
        self.rpc_of_raft = rpc_of_raft
        self.lanes = {name: _Lane(name, _lane_entry_bytes(name, raft.max_entry_bytes), name == LEADER) for name in LANES}
        self.slow = {name: SlowWrites() for name in LANES}  # each lane's line apart: plans are slow by design

    def in_flight(self, lane: str) -> int:
        """Entries of ``lane`` proposed and not yet answered."""
        return len(self.lanes[lane].in_flight)

    async def submit(self, entry: bytes, lane: str = CLIENT) -> tuple[ApplyResult, int]:
        """Put ``entry`` on the log, alone or in one Batch entry with other writes of its lane.

        A write goes out at once when fewer than MAX_WRITE_ENTRIES_IN_FLIGHT of
        its lane's entries are uncommitted (after the writes already runnable on
        the loop joined it), else it waits for one to commit, and the writes that
        waited go out together. Each keeps its own request id, result and
        error; a batch never exceeds the entry size limit (an entry too large
        alone is submitted alone and refused as before).
        """
        waiting = self.lanes[lane]
        # What the entry adds to a Batch entry in the raft log: its bytes and
        # their msgpack header (raft.encoded_entry_size: pickle adds a few bytes).
        cost = len(entry) + ITEM_OVERHEAD
        future: asyncio.Future[tuple[ApplyResult, int]] = asyncio.get_running_loop().create_future()
        waiting.queue.append(_Queued(entry, cost, future, time.monotonic()))
        waiting.queued_cost += cost
        if not waiting.flush_scheduled and waiting.may_send():
            waiting.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, waiting)
        # No wait_for/shield per write (two extra futures and a timer each):
        # the entry's own timer answers every write in it at WRITE_TIMEOUT, and
        # a write still queued then goes out with the next entry. A cancelled
        # waiter (its connection closed) leaves the write queued or in flight.
        return await future

    def _flush(self, lane: _Lane) -> None:
        """Loop: submit what ``lane`` has queued, as one entry per size-limited run."""
        lane.flush_scheduled = False
        limit = lane.entry_bytes
        while lane.queue and lane.may_send():
            items = [lane.queue.popleft()]
            size = items[0].cost
            while lane.queue and size + lane.queue[0].cost <= limit:
                item = lane.queue.popleft()
                items.append(item)
                size += item.cost
            lane.queued_cost -= size
            self._submit_items(lane, items)

    def _submit_items(self, lane: _Lane, items: list[_Queued]) -> None:
        loop = asyncio.get_running_loop()
        if len(items) == 1:
            entry = items[0].entry
        else:
            entry = encode_batch([item.entry for item in items], time=time.time_ns())
        token = object()
        future: asyncio.Future[Any] = loop.create_future()
        now = time.monotonic()
        sent = _Sent(now, now - items[0].queued_at, {name: other.held() for name, other in self.lanes.items()})

        def done(result: Any, index: Any, error: Any) -> None:
            self.settle(future, ((result, index), error))

        try:
            self.raft.submit(entry, done)
        except raft_errors.NotLeaderError as exc:
            self._fail_items(items, RPCError.not_leader(self.rpc_of_raft.get(exc.leader_address or "")))
            return
        except raft_errors.EntryTooLargeError as exc:
            self._fail_items(items, RPCError(BAD_REQUEST, str(exc)))
            return
        except raft_errors.RaftError as exc:
            self._fail_items(items, RPCError(UNAVAILABLE, str(exc)))
            return
        lane.in_flight[token] = len(entry)
        # Never let a lost callback stall the queue or its writers: at the
        # deadline the entry stops counting as in flight and its writers
        # learn that the outcome is unknown.
        expiry = loop.call_later(WRITE_TIMEOUT, self._entry_expired, lane, items, token)
        future.add_done_callback(lambda f: self._entry_done(f, lane, items, token, expiry, sent))

    def _entry_expired(self, lane: _Lane, items: list[_Queued], token: object) -> None:
        self._entry_settled(lane, token)
        self._fail_items(items, RPCError(UNKNOWN_OUTCOME, "the write was not confirmed in time; retry with the same request id"))

    def _entry_settled(self, lane: _Lane, token: object) -> None:
        if token in lane.in_flight:
            del lane.in_flight[token]
            if lane.queue and not lane.flush_scheduled:
                lane.flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush, lane)

    def _entry_done(
        self,
        future: asyncio.Future[Any],
        lane: _Lane,
        items: list[_Queued],
        token: object,
        expiry: asyncio.TimerHandle,
        sent: _Sent,
    ) -> None:
        expiry.cancel()
        self._entry_settled(lane, token)
        self.slow[lane.name].note(lane.name, sent, len(items), time.monotonic())
        (result, index), error = future.result()
        if error is not None:
            if isinstance(error, raft_errors.OverloadedError):
                exc = RPCError(UNAVAILABLE, str(error))
            elif isinstance(error, raft_errors.NotLeaderError):
                # raft says so only for an entry that can never be applied
                # (discarded by a new leader, or refused before its append):
                # the writer may send it anywhere again, even without its id.
                exc = RPCError.not_leader(self.rpc_of_raft.get(error.leader_address or ""))
            else:
                exc = RPCError(UNKNOWN_OUTCOME, f"write outcome unknown ({error}); retry with the same request id")
            self._fail_items(items, exc)
            return
        if len(items) == 1:
            if not items[0].future.done():
                items[0].future.set_result((result, index))
            return
        if result.batch is None or len(result.batch) != len(items):  # cannot happen: the FSM answers every item
            self._fail_items(items, RPCError(UNKNOWN_OUTCOME, "the batch's results were lost; retry with the same request id"))
            return
        for item, sub in zip(items, result.batch, strict=True):
            if not item.future.done():
                item.future.set_result((sub, index))

    @staticmethod
    def _fail_items(items: list[_Queued], exc: RPCError) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(exc)
                item.future.exception()  # retrieved here: a writer that gave up must not log it
