"""``event.stream``: the change journal, streamed to subscribers of any server.

Every replica writes the identical journal (it is written by the
deterministic FSM), so a subscriber may follow any server — leader or
follower — and move to another one (or to the same one after a restart) by
resubscribing with the last index it received.

Protocol (streaming RPC ``event.stream``)
-----------------------------------------

Arguments:

``index`` (int, default 0)
    **Exclusive**: the stream delivers the batches whose raft index is
    *greater than* ``index``. Pass the last index you received (from a batch
    or a progress notification) to resume exactly where you stopped; 0 means
    "from the beginning of the retained journal".
``topics`` (list of str, default all)
    ``"Topic"``, ``"Topic:Key"`` or ``"*"``. Topics: Job, Evaluation,
    Allocation, Deployment, Node, ACLToken. A key matches the record's key
    exactly (the object's id). With ACLs on, ACLToken needs a management
    token; without one the default/``*`` subscription leaves it out.
``heartbeat`` (seconds, default 10)
    After this long without sending anything, the server sends a progress
    notification.
``buffer`` (batches, default and maximum ``MAX_BUFFER``)
    How many batches may wait for this subscriber before it is cut off.
``group`` (batches, default 1, at most ``MAX_GROUP``)
    Up to this many consecutive batches per item when several are ready
    (catching up, or a burst of commits): one frame instead of many, which
    is what makes a busy stream cheap for the server and the subscriber.
``encoding`` (``"records"``, default, or ``"msgpack"``)
    ``msgpack`` sends each batch's records as one msgpack byte string
    (``raw``) instead of decoded lists. For an unfiltered subscription these
    are the journal's own bytes, passed through without decoding: the cheap
    way for a cache or an exporter to catch up on millions of records.

Items:

``{"index": N, "events": [[topic, type, key, object-or-None], ...]}``
(or ``{"index": N, "raw": msgpack-of-that-list}`` with ``encoding=msgpack``)
    The records of batch N that match the filter, in apply order; a batch is
    never split across items, and batches come in increasing index order,
    each once. Objects are in the store's wire shape (``codec.to_wire``);
    ACL tokens never carry their secret.
``{"batches": [batch-item, batch-item, ...]}`` (only with ``group`` > 1)
    Several whole consecutive batches, each shaped as above, in order.
``{"packed": msgpack-of-[batch-item, ...]}`` (``encoding=msgpack``, ``group`` > 1)
    The same, packed once by the server for every subscriber that gets
    exactly that run of batches (the usual case at the live tail): fan-out
    then costs one shared byte string per subscriber, not one encoding.
``{"progress": N}``
    Everything up to index N that matches the filter has been delivered
    (a bookmark: resubscribing with ``index=N`` loses nothing). Sent once when
    the subscriber has caught up with the live tail, and whenever the stream
    was idle for ``heartbeat``.

Endings (the stream never ends on its own):

``reset_required`` (details ``requested_index``, ``oldest_index``)
    ``index`` is older than the retention window (batches after it were
    trimmed). Reload the full state with reads, and resubscribe with the
    ``applied_index`` they reported (the lowest, if several). Never a silent
    jump to the oldest batch.
``unavailable`` with ``reason="slow_subscriber"`` and ``resume_index``
    The subscriber fell more than ``buffer`` batches behind; resubscribe with
    ``index=resume_index``. A slow subscriber never slows apply: the FSM
    only posts "committed up to N" to the event loop; this module reads the
    journal from LMDB (read transactions, off the loop) and buffers at most
    ``buffer`` batches per subscriber.
A lost connection (server stopped or killed)
    Resubscribe (to any server) with the last index received.

Design: one ``Hub`` per server. Woken by FSM commits, it reads new batches
once and fans them out to the *live* subscribers (those at the tail). A new
subscriber first catches up by reading LMDB itself, paced by its own
connection, and joins the live set when it reaches the hub's tail; batches
are deduplicated by index at the hand-over, so it is gapless. Under a steady
stream of commits, fan-out rounds are spaced by 3 ms per live subscriber
(``FANOUT_INTERVAL_PER_SUBSCRIBER``), 25 to 100 ms apart: many subscribers
add a little latency rather than take CPU from apply.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from fsm import codec
from fsm.keys import from_u64, u64
from fsm.machine import FSM
from fsm.store import StateReader
from fsm.writer import (
    TOPIC_ALLOC,
    TOPIC_DEPLOYMENT,
    TOPIC_EVAL,
    TOPIC_JOB,
    TOPIC_NODE,
    TOPIC_TOKEN,
    full_records,
)
from node.core.acl import Need
from node.core.reads import read_committed
from node.core.rpc_server import RequestContext
from node.core.wakeup import CoalescedWake
from node.endpoints.base import stream_method
from node.wire.errors import BAD_REQUEST, PERMISSION_DENIED, UNAVAILABLE, RPCError
from node.wire.framing import SharedItem

if TYPE_CHECKING:
    from node.server import Server

log = structlog.get_logger("caravan.stream")

TOPICS = (TOPIC_JOB, TOPIC_EVAL, TOPIC_ALLOC, TOPIC_DEPLOYMENT, TOPIC_NODE, TOPIC_TOKEN)
ALL_TOPICS = frozenset(TOPICS)
WILDCARD = "*"

DEFAULT_HEARTBEAT = 10.0
MIN_HEARTBEAT = 0.05
MAX_HEARTBEAT = 300.0
MAX_BUFFER = 4096  # batches waiting for one subscriber before it is cut off
CHUNK_BATCHES = 256  # batches per LMDB read (catch-up and fan-out)
CHUNK_RECORDS = 20_000  # ... or this many records, whichever comes first
# Fan-out rounds under a stream of commits are at least this far apart, per
# live subscriber: a round costs each live subscriber a wake-up and a frame
# (~16 us of the loop's CPU in isolation, several times that when the tick
# thread contends for the GIL), whatever it carries, so the spacing bounds
# the fan-out's share of the server however many subscribers there are;
# their lag grows instead (10 subscribers -> rounds at most every 30 ms,
# 34 or more -> every 100 ms). A round also has a fixed cost whatever the
# number of subscribers -- waking the loop, a read off it, GIL hand-offs
# with the tick thread applying entries (measured: 10 subscribers on three
# servers, rounds every 9 ms, cost +25-30% of the servers' CPU per write) --
# so rounds are at least FANOUT_INTERVAL_MIN apart. A commit after a quiet
# spell goes out at once.
FANOUT_INTERVAL_PER_SUBSCRIBER = 0.003
FANOUT_INTERVAL_MIN = 0.025
FANOUT_INTERVAL_MAX = 0.1
INLINE_READ_BATCHES = 64  # a fan-out round reads this few batches on the loop (see Hub.read)
MAX_GROUP = 1024  # batches in one item
GROUP_BYTES = 1 << 20  # ... and about this many bytes (the default frame limit is 4 MiB)
OVERFLOW_GRACE = 30.0  # a cut-off subscriber that reads nothing is dropped after this

Item = dict[str, Any]
ENCODINGS = ("records", "msgpack")


class StreamError(Exception):
    """Misuse of this module's API (not an RPC answer)."""


# -- filters ------------------------------------------------------------------------
@dataclass(frozen=True)
class Filter:
    """Which records a subscriber wants: whole topics and/or single keys of a topic."""

    topics: frozenset[str] = frozenset()  # every record of these
    keys: frozenset[tuple[str, str]] = frozenset()  # (topic, key) pairs
    everything: bool = field(init=False, compare=False)  # no filtering at all

    def __post_init__(self) -> None:
        object.__setattr__(self, "everything", self.topics >= ALL_TOPICS)

    def select(self, records: list[Any]) -> list[Any]:
        if self.everything:
            return records
        topics, keys = self.topics, self.keys
        return [r for r in records if r[0] in topics or (r[0], r[2]) in keys]

    def wants(self, topic: str) -> bool:
        return topic in self.topics or any(t == topic for t, _ in self.keys)

    def without(self, topic: str) -> Filter:
        return Filter(self.topics - {topic}, frozenset(k for k in self.keys if k[0] != topic))


def parse_topics(specs: Any) -> tuple[Filter, bool]:
    """(filter, explicit) from the ``topics`` argument; raises bad_request.

    ``explicit`` is False for the default / wildcard subscription, which may
    quietly leave out topics the caller is not allowed to see.
    """
    if specs is None or specs == []:
        return Filter(frozenset(TOPICS)), False
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        raise RPCError(BAD_REQUEST, "argument 'topics' must be a list of strings like Job or Job:web")
    topics: set[str] = set()
    keys: set[tuple[str, str]] = set()
    explicit = True
    for spec in specs:
        topic, sep, key = spec.partition(":")
        if topic == WILDCARD and not key:
            topics.update(TOPICS)
            explicit = False
            continue
        if topic not in TOPICS:
            raise RPCError(BAD_REQUEST, f"unknown topic {topic!r} in {spec!r}; topics: {', '.join(TOPICS)} or *")
        if sep and not key:
            raise RPCError(BAD_REQUEST, f"empty key in topic filter {spec!r}; use {topic} or {topic}:ID")
        if not sep or key == WILDCARD:
            topics.add(topic)
        else:
            keys.add((topic, key))
    keys = {k for k in keys if k[0] not in topics}
    return Filter(frozenset(topics), frozenset(keys)), explicit


# -- reading the journal (executor threads) -----------------------------------------
class Batch:
    """One journal batch: its stored bytes, decoded only if some subscriber needs records.

    The unfiltered items are built once and shared by every subscriber that
    gets them (items are never mutated after they are made), and encoded
    once for all of their frames (``SharedItem``).
    """

    __slots__ = ("index", "raw", "_records", "_raw_item", "_records_item")

    def __init__(self, index: int, raw: bytes, records: list[Any] | None = None) -> None:
        self.index = index
        self.raw = raw
        self._records = records
        self._raw_item: Item | None = None
        self._records_item: Item | None = None

    @property
    def records(self) -> list[Any]:
        if self._records is None:
            self._records = full_records(codec.unpack(self.raw))  # jobs and evals with every field
        return self._records

    def raw_item(self) -> Item:
        if self._raw_item is None:
            self._raw_item = SharedItem(index=self.index, raw=self.raw)
        return self._raw_item

    def records_item(self) -> Item:
        if self._records_item is None:
            self._records_item = SharedItem(index=self.index, events=self.records)
        return self._records_item

    def decode(self) -> Batch:
        _ = self.records
        return self


def record_count(raw: bytes) -> int:
    """Length of a packed batch (a msgpack array) from its header, without decoding it."""
    first = raw[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC:
        return int.from_bytes(raw[1:3], "big")
    if first == 0xDD:
        return int.from_bytes(raw[1:5], "big")
    return len(codec.unpack(raw))


@dataclass
class Chunk:
    """What one read transaction saw after some index."""

    batches: list[Batch]
    through: int  # every batch <= through is in ``batches`` or before the start
    applied: int
    trimmed: int
    oldest: int


def read_chunk(reader: StateReader, after: int, decode: bool = True) -> Chunk:
    """Batches after ``after`` (bounded), and how far they reach, from one read txn.

    ``decode=False`` leaves the records packed (pass-through subscribers).
    """
    applied = reader.applied_index
    trimmed = reader.journal_trimmed()
    oldest, _ = reader.journal_bounds()
    batches: list[Batch] = []
    if trimmed > after or after > applied:
        return Chunk(batches, after, applied, trimmed, oldest)
    cursor = reader.txn.cursor(db=reader.dbs["journal"])
    if not cursor.set_range(u64(after + 1)):
        return Chunk(batches, applied, applied, trimmed, oldest)
    records = 0
    for key, raw in cursor:
        batch = Batch(from_u64(key), bytes(raw))
        batches.append(batch.decode() if decode else batch)
        records += record_count(batch.raw)
        if len(batches) >= CHUNK_BATCHES or records >= CHUNK_RECORDS:
            return Chunk(batches, batch.index, applied, trimmed, oldest)
    return Chunk(batches, applied, applied, trimmed, oldest)


def reset_error(requested: int, chunk: Chunk) -> RPCError:
    return RPCError.reset_required(requested, chunk.oldest or chunk.applied + 1)


# -- subscribers ----------------------------------------------------------------------
Entry = tuple[int, Item, int]  # (batch index, item, packed size)
SHARED_RUN = 256  # entries in one shared run (follow() asks for groups of this size)


class SharedRun(list[Entry]):
    """Entries of one fan-out round, queued by reference by every unfiltered subscriber.

    Packs itself once into a ``{"packed": ...}`` item for the subscribers
    that take it whole.
    """

    nbytes: int = 0
    _packed: Item | None = None

    def packed(self) -> Item:
        if self._packed is None:
            self._packed = SharedItem(packed=codec.pack([entry[1] for entry in self]))
        return self._packed


def shared_runs(entries: list[Entry]) -> list[SharedRun]:
    """``entries`` cut into shared runs of at most SHARED_RUN entries and about GROUP_BYTES."""
    runs: list[SharedRun] = []
    run = SharedRun()
    for entry in entries:
        if run and (len(run) >= SHARED_RUN or run.nbytes + entry[2] > GROUP_BYTES):
            runs.append(run)
            run = SharedRun()
        run.append(entry)
        run.nbytes += entry[2]
    if run:
        runs.append(run)
    return runs


class Segments:
    """A subscriber's queue: runs of entries, often shared with every other subscriber.

    The hub builds the entries of an unfiltered round once; each subscriber
    queues a reference to that list, so fanning a round out costs O(1) per
    subscriber instead of O(batches). ``len`` counts batches.
    """

    def __init__(self) -> None:
        self._runs: collections.deque[list[Entry]] = collections.deque()
        self._offset = 0  # consumed entries of the first run
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def add(self, run: list[Entry]) -> None:
        if run:
            self._runs.append(run)
            self._count += len(run)

    def clear(self) -> None:
        self._runs.clear()
        self._offset = self._count = 0

    def pop_shared(self, most: int, max_bytes: int) -> SharedRun | None:
        """The first run whole, if it is a shared one that fits in one item."""
        if self._offset or not self._runs:
            return None
        run = self._runs[0]
        if not isinstance(run, SharedRun) or len(run) > most or run.nbytes > max_bytes:
            return None
        self._runs.popleft()
        self._count -= len(run)
        return run

    def pop(self, most: int, max_bytes: int) -> list[Entry]:
        """Up to ``most`` entries (and about ``max_bytes``), oldest first."""
        out: list[Entry] = []
        size = 0
        runs = self._runs
        while runs and len(out) < most and size < max_bytes:
            run = runs[0]
            while self._offset < len(run) and len(out) < most and size < max_bytes:
                entry = run[self._offset]
                out.append(entry)
                size += entry[2]
                self._offset += 1
            if self._offset == len(run):
                runs.popleft()
                self._offset = 0
        self._count -= len(out)
        return out


@dataclass(eq=False)
class Subscription:
    """One subscriber's position and (once live) its bounded queue."""

    filter: Filter
    position: int  # all matching batches <= position have been handed to the connection
    max_buffer: int
    raw: bool = False  # encoding=msgpack
    group: int = 1  # batches per item at most
    through: int = 0  # all matching batches <= through are handed over or queued
    queue: Segments = field(default_factory=Segments)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    error: RPCError | None = None
    overflowed: bool = False

    @property
    def needs_records(self) -> bool:
        """Whether batches must be decoded for this subscriber (else they pass through packed)."""
        return not (self.raw and self.filter.everything)

    def item(self, batch: Batch) -> Item | None:
        """The stream item for ``batch``, or None when the filter leaves nothing of it."""
        if self.filter.everything:
            return batch.raw_item() if self.raw else batch.records_item()
        selected = self.filter.select(batch.records)
        if not selected:
            return None
        if self.raw:
            return {"index": batch.index, "raw": codec.pack(selected)}
        return {"index": batch.index, "events": selected}

    def take(self) -> tuple[int, Item]:
        """The next item from the queue (several batches if ``group`` allows): (last index, item)."""
        if self.raw and self.group > 1:
            run = self.queue.pop_shared(self.group, GROUP_BYTES)
            if run is not None:
                return run[-1][0], run.packed() if len(run) > 1 else run[0][1]
        entries = self.queue.pop(self.group, GROUP_BYTES)
        return entries[-1][0], grouped([e[1] for e in entries])

    def offer(self, batches: list[Batch], through: int, shared: list[SharedRun] | None = None) -> bool:
        """Queue the matching batches after ``through``-so-far; False on overflow.

        ``shared``: this round's unfiltered entries in this subscriber's
        encoding, when the hub built them (queued by reference).
        """
        if shared is not None:
            for run in shared:
                if run[0][0] <= self.through:  # hand-over from catch-up: skip what it sent
                    self.queue.add([e for e in run if e[0] > self.through])
                else:
                    self.queue.add(run)
        else:
            run = []
            for batch in batches:
                if batch.index <= self.through:
                    continue  # already caught up past it (hand-over from catch-up)
                item = self.item(batch)
                if item is not None:
                    run.append((batch.index, item, len(batch.raw)))
            self.queue.add(run)
        self.through = max(self.through, through)
        self.wake.set()
        if len(self.queue) > self.max_buffer:
            self.queue.clear()
            self.overflowed = True
            return False
        return True

    def fail(self, error: RPCError) -> None:
        self.error = error
        self.queue.clear()
        self.wake.set()


def grouped(items: list[Item]) -> Item:
    return items[0] if len(items) == 1 else {"batches": items}


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
                shared: dict[bool, list[SharedRun]] = {}
                for sub in list(self.live):
                    runs = None
                    if sub.filter.everything:
                        runs = shared.get(sub.raw)
                        if runs is None:
                            runs = shared[sub.raw] = shared_runs(
                                [(b.index, b.raw_item() if sub.raw else b.records_item(), len(b.raw)) for b in chunk.batches]
                            )
                    if not sub.offer(chunk.batches, chunk.through, runs):
                        self.live.discard(sub)
                        self.stats["overflows"] += 1
                self.stats["fanned_batches"] += len(chunk.batches)
                self.tail = max(self.tail, chunk.through)
                if chunk.through >= chunk.applied and self._target < chunk.applied:
                    self._target = chunk.applied

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
        """Yield stream items for one subscriber (see the module docstring)."""
        if after < 0:
            raise StreamError("index must be >= 0")
        if encoding not in ENCODINGS:
            raise StreamError(f"encoding must be one of {ENCODINGS}")
        self.start()
        sub = Subscription(filter, after, max(1, buffer), raw=encoding == "msgpack", group=max(1, group))
        self.subscribers += 1
        last_sent = time.monotonic()
        timer: asyncio.TimerHandle | None = None
        try:
            # Catch-up: read LMDB directly, paced by this connection.
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
                        last_sent = time.monotonic()
                if pending:
                    yield grouped(pending)
                    last_sent = time.monotonic()
                sub.position = max(sub.position, chunk.through)
                if chunk.through >= chunk.applied and self.join(sub, chunk.applied):
                    break
                if time.monotonic() - last_sent >= heartbeat:
                    yield {"progress": sub.position}
                    last_sent = time.monotonic()
            yield {"progress": sub.position}  # caught up: a bookmark at the live tail
            last_sent = time.monotonic()
            # Live: batches come from the hub's fan-out.
            while True:
                if sub.queue:
                    index, item = sub.take()
                    yield item
                    sub.position = index
                    last_sent = time.monotonic()
                    continue
                if sub.error is not None:
                    raise sub.error
                if sub.overflowed:
                    raise RPCError(
                        UNAVAILABLE,
                        f"subscriber fell more than {sub.max_buffer} batches behind; "
                        f"resubscribe with index={sub.position}",
                        reason="slow_subscriber",
                        resume_index=sub.position,
                    )
                sub.position = max(sub.position, sub.through)
                remaining = heartbeat - (time.monotonic() - last_sent)
                if remaining <= 0:
                    if recheck is not None:
                        await recheck()
                    yield {"progress": sub.position}
                    last_sent = time.monotonic()
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
            self.leave(sub)
            self.subscribers -= 1


# -- the RPC method ------------------------------------------------------------------------
_HUBS: weakref.WeakKeyDictionary[Any, Hub] = weakref.WeakKeyDictionary()


def hub_of(server: Server) -> Hub:
    """The server's hub, created on first use (on the server's loop)."""
    hub = _HUBS.get(server)
    if hub is None:
        hub = _HUBS[server] = Hub(server.fsm, asyncio.get_running_loop())
    return hub


def _number(args: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RPCError(BAD_REQUEST, f"argument {name!r} must be a number from {low:g} to {high:g}")
    return float(value)


@dataclass(frozen=True)
class StreamArgs:
    index: int
    filter: Filter
    explicit: bool  # topics named (not the default / wildcard)
    heartbeat: float
    buffer: int
    encoding: str
    group: int


def parse_args(args: dict[str, Any]) -> StreamArgs:
    """The checked ``event.stream`` arguments; raises bad_request."""
    index = args.get("index", 0)
    if index is None:
        index = 0
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise RPCError(BAD_REQUEST, "argument 'index' must be an integer >= 0 (the last index you received)")
    flt, explicit = parse_topics(args.get("topics"))
    heartbeat = _number(args, "heartbeat", DEFAULT_HEARTBEAT, MIN_HEARTBEAT, MAX_HEARTBEAT)
    buffer = int(_number(args, "buffer", MAX_BUFFER, 1, MAX_BUFFER))
    encoding = args.get("encoding") or "records"
    if encoding not in ENCODINGS:
        raise RPCError(BAD_REQUEST, f"argument 'encoding' must be one of {', '.join(ENCODINGS)}")
    group = int(_number(args, "group", 1, 1, MAX_GROUP))
    return StreamArgs(index, flt, explicit, heartbeat, buffer, encoding, group)


async def _allowed_filter(server: Server, ctx: RequestContext, flt: Filter, explicit: bool) -> Filter:
    """Check the token; ACLToken events need management (dropped from a default subscription)."""
    await server.authorize(ctx, Need.READ)
    if flt.wants(TOPIC_TOKEN):
        try:
            await server.authorize(ctx, Need.MANAGEMENT)
        except RPCError as err:
            if err.code != PERMISSION_DENIED or explicit:
                raise
            flt = flt.without(TOPIC_TOKEN)
    return flt


@stream_method("event.stream")
async def event_stream(server: Server, ctx: RequestContext, args: dict[str, Any]) -> AsyncIterator[Item]:
    """Stream journal batches after ``index`` (exclusive); see the module docstring."""
    a = parse_args(args)
    flt = await _allowed_filter(server, ctx, a.filter, a.explicit)
    need = Need.MANAGEMENT if flt.wants(TOPIC_TOKEN) else Need.READ

    async def recheck() -> None:  # a revoked or expired token ends the stream
        await server.authorize(ctx, need)

    items = hub_of(server).subscribe(
        a.index, flt, heartbeat=a.heartbeat, buffer=a.buffer, encoding=a.encoding, group=a.group, recheck=recheck
    )
    try:
        async for item in items:
            yield item
    except RPCError as err:
        if err.details.get("reason") == "slow_subscriber":
            # The final answer goes out only once the client reads what is
            # already buffered; a client that never reads is dropped.
            ctx.loop.call_later(OVERFLOW_GRACE, _drop_if_stuck, ctx)
        raise
    finally:
        await items.aclose()


def _drop_if_stuck(ctx: RequestContext) -> None:
    transport = getattr(ctx, "_transport", None)
    if transport is not None and not transport.is_closing() and transport.get_write_buffer_size() > 0:
        ctx.abort_connection()

