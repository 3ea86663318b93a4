"""One hub per server: reads each committed batch of the journal once and fans it out.

Design: one ``Hub`` per server. Woken by FSM commits, it reads new batches
once and fans them out to the *live* subscribers (those at the tail). A new
subscriber first catches up by reading LMDB itself, paced by its own
connection, and joins the live set when it reaches the hub's tail; batches
are deduplicated by index at the hand-over, so it is gapless. A round's
items are made once per distinct filter and encoding and queued by
reference (``Fanout``): subscribers following the same topics (every
simulated client) share them and their encoding. Under a steady
stream of commits, fan-out rounds are spaced by 3 ms per live subscriber
(``FANOUT_INTERVAL_PER_SUBSCRIBER``), 25 to 100 ms apart: many subscribers
add a little latency rather than take CPU from apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from fsm.machine import FSM
from node.core.reads import read_committed
from node.core.stream import (
    DEFAULT_HEARTBEAT,
    ENCODINGS,
    FANOUT_INTERVAL_MAX,
    FANOUT_INTERVAL_MIN,
    FANOUT_INTERVAL_PER_SUBSCRIBER,
    GROUP_BYTES,
    INLINE_READ_BATCHES,
    MAX_BUFFER,
    Chunk,
    Fanout,
    Filter,
    Item,
    StreamError,
    Subscription,
    grouped,
    read_chunk,
    reset_error,
)
from node.core.wakeup import CoalescedWake
from node.wire.errors import UNAVAILABLE, RPCError

log = structlog.get_logger("caravan.stream")

if TYPE_CHECKING:
    from node.core.api import ServerAPI


class Hub:
    """The journal fan-out of one server; all methods run on its event loop.

    ``fsm``'s ``on_commit`` listener only posts to the loop, so apply never
    waits for a subscriber.
    """

    def __init__(self, fsm: FSM, loop: asyncio.AbstractEventLoop) -> None:
        self.fsm = fsm
        self.loop = loop
        self.live: set[Subscription] = set()
        self.subscribers = 0
        self.tail = 0  # every batch <= tail has been fanned out to the live set
        self._target = 0  # newest committed index the loop has taken in
        self._wake = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None
        self.stats = {"reads": 0, "fanned_batches": 0, "overflows": 0, "resets": 0}
        # Written by the tick thread, taken in by the loop (_absorb):
        self._commit_lock = threading.Lock()
        with fsm.read() as reader:
            self._latest = reader.applied_index  # newest committed index
        self._backward: int | None = None  # lowest commit below its predecessor since the last _absorb
        self._waker = CoalescedWake(loop, self._absorb)
        fsm.on_commit(self._committed_from_thread)

    # -- commits ---------------------------------------------------------------------------
    def _committed_from_thread(self, index: int) -> None:
        """On the tick thread: note the commit; wake the loop only if someone is live.

        With nobody at the tail there is nothing to fan out (``join`` takes
        the newest index in itself), and under a stream of commits the loop
        is woken once per burst, not once per commit: a wake-up per commit
        cost a follower several percent of its CPU.
        """
        with self._commit_lock:
            # Commits only ever rise, unless the store went backwards (an older
            # snapshot restored). Compare with the previous commit, not with the
            # tail: the pump reads the store directly and may be past commits
            # the loop has not taken in yet.
            if index < self._latest and (self._backward is None or index < self._backward):
                self._backward = index
            self._latest = index
        if self.live:
            self._waker.notify()

    def _absorb(self) -> None:
        """On the loop: take in the commits noted since the last call."""
        with self._commit_lock:
            latest, lowest = self._latest, self._backward
            self._backward = None
        if lowest is not None and lowest < self.tail:
            # The store went backwards (an older snapshot was restored): the
            # live subscribers hold batches that no longer exist.
            for sub in self.live:
                sub.fail(RPCError.reset_required(sub.through, lowest + 1))
                self.stats["resets"] += 1
            self.live.clear()
            self.tail = lowest
        if latest != self._target:
            self._target = latest
            self._wake.set()

    def start(self) -> None:
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = self.loop.create_task(self._pump(), name="journal-hub")

    async def close(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task

    # -- reads ------------------------------------------------------------------------------
    async def read(self, after: int, decode: bool = True, inline: bool = False) -> Chunk:
        """Batches after ``after``, read off the loop -- or on it (``inline``) for a few at the tail.

        A read in the executor costs two thread hand-offs through the GIL,
        contended by the tick thread applying entries; the few batches a
        fan-out round reads cost less than that to read right here.
        """
        def run() -> Chunk:
            # A read cut off by a snapshot restore is ``unavailable`` (retryable),
            # as every other read of the store is: the pump retries it, and a
            # subscriber catching up gets it instead of an internal error.
            return read_committed(self.fsm, lambda reader: read_chunk(reader, after, decode))

        self.stats["reads"] += 1
        if inline:
            return run()
        return await self.loop.run_in_executor(None, run)

    # -- fan-out ----------------------------------------------------------------------------
    async def _pump(self) -> None:
        last_round = 0.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._target > self.tail:
                if not self.live:
                    self.tail = self._target  # nobody at the tail: nothing to read
                    break
                # Commits that come closer together than the interval are fanned
                # out together (see FANOUT_INTERVAL_PER_SUBSCRIBER).
                interval = min(FANOUT_INTERVAL_MAX, max(FANOUT_INTERVAL_MIN, FANOUT_INTERVAL_PER_SUBSCRIBER * len(self.live)))
                delay = last_round + interval - self.loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                last_round = self.loop.time()
                start = self.tail
                try:
                    chunk = await self.read(start, any(sub.needs_records for sub in self.live),
                                            inline=self._target - start <= INLINE_READ_BATCHES)
                except Exception as exc:  # noqa: BLE001 - store being swapped (snapshot restore): retry
                    log.warning("journal read failed; retrying", error=repr(exc), after=start)
                    await asyncio.sleep(0.05)
                    continue
                if chunk.trimmed > start or start > chunk.applied:
                    # The journal moved past the live set (a restored snapshot):
                    # every live subscriber must reset, explicitly.
                    log.warning("journal moved past the live subscribers; they must reset",
                                tail=start, trimmed=chunk.trimmed, applied=chunk.applied, subscribers=len(self.live))
                    for sub in self.live:
                        sub.fail(reset_error(sub.through, chunk))
                        self.stats["resets"] += 1
                    self.live.clear()
                    self.tail = chunk.applied
                    continue
                self._fan_out(chunk)
                self.stats["fanned_batches"] += len(chunk.batches)
                self.tail = max(self.tail, chunk.through)
                if chunk.through >= chunk.applied and self._target < chunk.applied:
                    self._target = chunk.applied

    def _fan_out(self, chunk: Chunk) -> None:
        """Queue a chunk for every live subscriber; one that overflows leaves the live set.

        The items are made once per distinct filter and encoding
        (``Fanout``), not once per subscriber: many subscribers follow the
        same topics.
        """
        fanout = Fanout(chunk.batches)
        for sub in list(self.live):
            if not sub.offer(fanout.runs(sub), chunk.through):
                self.live.discard(sub)
                self.stats["overflows"] += 1

    def join(self, sub: Subscription, applied: int) -> bool:
        """Move a caught-up subscriber to the live set if nothing lies between it and the tail.

        ``applied`` is the committed index its last read saw. With nobody
        live the tail may simply move to the newcomer (backwards too): the
        pump then reads what lies between it and the newest commit. The tail
        never passes a committed index: a subscriber may be *ahead* of this
        server (it came from a server further along), and a commit below the
        tail means the store went backwards (an older snapshot restored).
        """
        if self.live and sub.position < self.tail:
            return False
        if not self.live:
            # Commits noted while nobody was live did not wake the loop: take
            # them in (they say nothing about this newcomer's tail).
            self._absorb()
            self.tail = min(sub.position, applied)
        sub.through = sub.position
        self.live.add(sub)
        self._absorb()  # any commit noted before the add (one noted after it wakes the loop)
        if self._target > self.tail:
            self._wake.set()
        return True

    def leave(self, sub: Subscription) -> None:
        self.live.discard(sub)

    # -- one subscriber -------------------------------------------------------------------
    async def subscribe(
        self,
        after: int,
        filter: Filter,
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        buffer: int = MAX_BUFFER,
        encoding: str = "records",
        group: int = 1,
        recheck: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[Item]:
        """Yield stream items for one subscriber (see ``node.endpoints.events``): catch up, then live."""
        if after < 0:
            raise StreamError("index must be >= 0")
        if encoding not in ENCODINGS:
            raise StreamError(f"encoding must be one of {ENCODINGS}")
        self.start()
        sub = Subscription(filter, after, max(1, buffer), raw=encoding == "msgpack", group=max(1, group))
        self.subscribers += 1
        pace = _Pace(heartbeat)
        try:
            async for item in self._catch_up(sub, pace):
                yield item
            yield {"progress": sub.position}  # caught up: a bookmark at the live tail
            pace.sent()
            async for item in self._live(sub, pace, recheck):
                yield item
        finally:
            self.leave(sub)
            self.subscribers -= 1

    async def _catch_up(self, sub: Subscription, pace: _Pace) -> AsyncIterator[Item]:
        """Read LMDB directly, paced by this connection, until the subscriber joins the live set."""
        while True:
            chunk = await self.read(sub.position, sub.needs_records)
            if chunk.trimmed > sub.position:
                raise reset_error(sub.position, chunk)
            pending: list[Item] = []
            size = 0
            for batch in chunk.batches:
                item = sub.item(batch)
                if item is None:
                    continue
                pending.append(item)
                size += len(batch.raw)
                if len(pending) >= sub.group or size >= GROUP_BYTES:
                    yield grouped(pending)
                    sub.position = batch.index
                    pending, size = [], 0
                    pace.sent()
            if pending:
                yield grouped(pending)
                pace.sent()
            sub.position = max(sub.position, chunk.through)
            if chunk.through >= chunk.applied and self.join(sub, chunk.applied):
                return
            if pace.remaining() <= 0:
                yield {"progress": sub.position}
                pace.sent()

    async def _live(
        self, sub: Subscription, pace: _Pace, recheck: Callable[[], Awaitable[None]] | None
    ) -> AsyncIterator[Item]:
        """Batches from the hub's fan-out, with progress notifications when idle for a heartbeat."""
        timer: asyncio.TimerHandle | None = None
        try:
            while True:
                if sub.queue:
                    index, item = sub.take()
                    yield item
                    sub.position = index
                    pace.sent()
                    continue
                _raise_if_ended(sub)
                sub.position = max(sub.position, sub.through)
                remaining = pace.remaining()
                if remaining <= 0:
                    if recheck is not None:
                        await recheck()
                    yield {"progress": sub.position}
                    pace.sent()
                    continue
                sub.wake.clear()
                if sub.queue or sub.error is not None or sub.overflowed:
                    continue
                # One heartbeat timer at a time, not one per wait: a busy
                # stream waits many times per heartbeat. An early timer just
                # loops back here and is set again for the rest.
                if timer is None or timer.when() > self.loop.time() + remaining or timer.cancelled():
                    if timer is not None:
                        timer.cancel()
                    timer = self.loop.call_later(remaining, sub.wake.set)
                await sub.wake.wait()
                if timer.when() <= self.loop.time():
                    timer = None
        finally:
            if timer is not None:
                timer.cancel()


class _Pace:
    """When a subscriber was last sent anything: a progress notification is due a heartbeat later."""

    def __init__(self, heartbeat: float) -> None:
        self.heartbeat = heartbeat
        self.last_sent = time.monotonic()

    def sent(self) -> None:
        self.last_sent = time.monotonic()

    def remaining(self) -> float:
        return self.heartbeat - (time.monotonic() - self.last_sent)


def _raise_if_ended(sub: Subscription) -> None:
    """End the stream if the hub failed this subscriber or it fell too far behind."""
    if sub.error is not None:
        raise sub.error
    if sub.overflowed:
        raise RPCError(
            UNAVAILABLE,
            f"subscriber fell more than {sub.max_buffer} batches behind; resubscribe with index={sub.position}",
            reason="slow_subscriber",
            resume_index=sub.position,
        )

_HUBS: weakref.WeakKeyDictionary[Any, Hub] = weakref.WeakKeyDictionary()


def hub_of(server: ServerAPI) -> Hub:
    """The server's hub, created on first use (on the server's loop)."""
    hub = _HUBS.get(server)
    if hub is None:
        hub = _HUBS[server] = Hub(server.fsm, asyncio.get_running_loop())
    return hub


def existing_hub(server: ServerAPI) -> Hub | None:
    """The server's hub if one was made: a metrics scrape must never create one."""
    return _HUBS.get(server)
