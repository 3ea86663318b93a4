"""The change journal as subscribers take it: filters, batches, chunked reads, subscriptions.

The pieces the hub (``node.core.hub``) and the ``event.stream`` endpoint
(``node.endpoints.events``, where the protocol is described) share.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

import structlog

from fsm import codec
from fsm.keys import from_u64, u64
from fsm.store import StateReader
from fsm.topics import (
    TOPIC_ALLOC,
    TOPIC_CLIENT_GC,
    TOPIC_DEPLOYMENT,
    TOPIC_EVAL,
    TOPIC_JOB,
    TOPIC_NODE,
    TOPIC_OPERATOR,
    TOPIC_PRIORITY_CLASS,
    TOPIC_QUEUE,
    TOPIC_TOKEN,
    TOPIC_WORKLOAD,
    full_record,
)
from node.wire.errors import BAD_REQUEST, RPCError
from node.wire.framing import SharedItem

log = structlog.get_logger("caravan.stream")

TOPICS = (
    TOPIC_JOB, TOPIC_EVAL, TOPIC_ALLOC, TOPIC_DEPLOYMENT, TOPIC_NODE, TOPIC_TOKEN, TOPIC_OPERATOR, TOPIC_CLIENT_GC,
    TOPIC_QUEUE, TOPIC_WORKLOAD, TOPIC_PRIORITY_CLASS,
)
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

    Its items are shared by every subscriber that gets them (items are never
    mutated after they are made), and encoded once for all of their frames
    (``SharedItem``): the unfiltered ones, and, in a fan-out round, the
    filtered ones per distinct filter and encoding (``Fanout``). Many
    subscribers follow the same topics (each simulated client follows
    Allocation and ClientGC), and encoding a batch's records for each of
    them was most of the fan-out's cost.

    Filters pick records by topic and key, so they work on the records as
    stored with their objects still packed (``packed``), and only the
    records some ``records`` subscriber gets are decoded, with a job or eval
    filled in to every field (``full_record``), each once: filling in every
    record of every batch was half of a busy leader's fan-out, most of them
    for no subscriber (a simulated client follows allocations only).
    ``msgpack`` items carry the records as stored, their objects' own bytes,
    as the journal's own bytes do.
    """

    __slots__ = ("index", "raw", "_packed", "_full", "_records", "_raw_item", "_records_item", "_scanned", "_lookup")

    def __init__(self, index: int, raw: bytes, records: list[Any] | None = None) -> None:
        self.index = index
        self.raw = raw
        # ``records``: already as subscribers get them (tests, and a caller that has them).
        self._packed = records
        self._records = records
        self._full: list[Any] | None = None  # per position, the filled-in record once made
        self._raw_item: Item | None = None
        self._records_item: Item | None = None
        self._scanned = False  # a filter has scanned the records (the next one indexes them)
        self._lookup: RecordLookup | None = None

    @property
    def packed(self) -> list[Any]:
        """The records as the journal stores them, each object still packed (``codec.unpack_shallow``)."""
        if self._packed is None:
            self._packed = codec.unpack_shallow(self.raw)
        return self._packed

    @property
    def records(self) -> list[Any]:
        """Every record as subscribers get them: jobs and evals with every field."""
        if self._records is None:
            self._records = self._fill(range(len(self.packed)))
        return self._records

    def _fill(self, positions: range | list[int]) -> list[Any]:
        packed = self.packed
        if self._records is not None:
            return [self._records[i] for i in positions]
        full = self._full
        if full is None:
            full = self._full = [None] * len(packed)
        out = []
        for i in positions:
            record = full[i]
            if record is None:
                record = full[i] = full_record(codec.unpack_record(packed[i]))
            out.append(record)
        return out

    def raw_item(self) -> Item:
        if self._raw_item is None:
            self._raw_item = SharedItem(index=self.index, raw=self.raw)
        return self._raw_item

    def records_item(self) -> Item:
        if self._records_item is None:
            self._records_item = SharedItem(index=self.index, events=self.records)
        return self._records_item

    def decode(self) -> Batch:
        _ = self.packed
        return self

    def positions(self, flt: Filter) -> list[int] | None:
        """The positions of the records ``flt`` matches, in apply order (None: every record, and there is one).

        The first filter scans the records; from the second on they are
        indexed once (``RecordLookup``) and each filter looks its records up:
        a lone subscriber pays no index, many distinct filters one each.
        """
        packed = self.packed
        if flt.everything:
            return None
        if self._lookup is None:
            if not self._scanned:
                self._scanned = True
                found = scan(packed, flt)
                return None if found and len(found) == len(packed) else found
            self._lookup = RecordLookup(packed)
        found = self._lookup.positions(flt)
        return None if found and len(found) == len(packed) else found

    def select(self, flt: Filter) -> list[Any]:
        """The records ``flt`` matches, in apply order, as subscribers get them."""
        positions = self.positions(flt)
        return self.records if positions is None else self._fill(positions)

    def item(self, flt: Filter, raw: bool) -> Item | None:
        """The item of this batch for a subscriber with ``flt`` (None if it matches nothing).

        Made once per distinct filter and encoding in a fan-out round
        (``Fanout``), so a ``SharedItem``: its encoding too is made once.
        """
        positions = self.positions(flt)
        if positions is None:  # all of it: the unfiltered item, whose encoding unfiltered subscribers share
            return self.raw_item() if raw else self.records_item()
        if not positions:
            return None
        if raw:
            packed = self.packed
            return SharedItem(index=self.index, raw=codec.pack([packed[i] for i in positions]))
        return SharedItem(index=self.index, events=self._fill(positions))


def scan(records: list[Any], flt: Filter) -> list[int]:
    """The positions of the records ``flt`` matches, in apply order, by looking at each."""
    topics, keys = flt.topics, flt.keys
    if not keys:
        return [i for i, r in enumerate(records) if r[0] in topics]
    return [i for i, r in enumerate(records) if r[0] in topics or (r[0], r[2]) in keys]


class RecordLookup:
    """Where each topic's and each (topic, key)'s records sit in one batch.

    Built once per batch, so each distinct filter picks its records by a few
    lookups instead of scanning every record of a plan of thousands of
    allocations.
    """

    __slots__ = ("records", "by_topic", "_at_key", "_all_at_key")

    def __init__(self, records: list[Any]) -> None:
        self.records = records
        self.by_topic: dict[str, list[int]] = {}
        for i, record in enumerate(records):
            positions = self.by_topic.get(record[0])
            if positions is None:
                self.by_topic[record[0]] = [i]
            else:
                positions.append(i)
        # Built when a filter first names keys: the position of each key, or
        # (when some key is there twice, which is rare) all of its positions.
        self._at_key: dict[tuple[str, Any], int] | None = None
        self._all_at_key: dict[tuple[str, Any], list[int]] | None = None

    def _index_keys(self) -> dict[tuple[str, Any], int]:
        if self._at_key is None:
            self._at_key = {(r[0], r[2]): i for i, r in enumerate(self.records)}
            if len(self._at_key) < len(self.records):
                self._all_at_key = {}
                for i, record in enumerate(self.records):
                    self._all_at_key.setdefault((record[0], record[2]), []).append(i)
        return self._at_key

    def _keyed(self, keys: frozenset[tuple[str, str]]) -> list[int]:
        """The positions of the records of ``keys``, in any order."""
        at_key = self._index_keys()
        fewer = keys if len(keys) <= len(at_key) else at_key.keys()
        matched = [k for k in fewer if k in at_key and k in keys]
        if self._all_at_key is None:
            return [at_key[k] for k in matched]
        return [i for k in matched for i in self._all_at_key[k]]

    def positions(self, flt: Filter) -> list[int]:
        """The ascending positions of the records ``flt`` matches."""
        by_topic = self.by_topic
        if len(flt.topics) <= len(by_topic):
            found = [by_topic[t] for t in flt.topics if t in by_topic]
        else:
            found = [p for t, p in by_topic.items() if t in flt.topics]
        keyed = self._keyed(flt.keys) if flt.keys else []
        if keyed:
            found.append(keyed)
        if len(found) == 1 and not keyed:
            return found[0]  # one topic's positions: ascending already
        return sorted(set().union(*found))  # a key of a topic also wanted whole is one record, not two


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
        return batch.item(self.filter, self.raw)

    def take(self) -> tuple[int, Item]:
        """The next item from the queue (several batches if ``group`` allows): (last index, item)."""
        if self.raw and self.group > 1:
            run = self.queue.pop_shared(self.group, GROUP_BYTES)
            if run is not None:
                return run[-1][0], run.packed() if len(run) > 1 else run[0][1]
        entries = self.queue.pop(self.group, GROUP_BYTES)
        return entries[-1][0], grouped([e[1] for e in entries])

    def offer(self, runs: list[list[Entry]], through: int) -> bool:
        """Queue this round's entries (``Fanout.runs``) after ``through``-so-far; False on overflow.

        The runs are shared by every subscriber with the same filter and
        encoding, and queued by reference: a round costs each one O(runs).
        """
        for run in runs:
            if run[0][0] <= self.through:  # hand-over from catch-up: skip what it sent
                self.queue.add([e for e in run if e[0] > self.through])
            else:
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


class Fanout:
    """One fan-out round's entries, built once per distinct filter and encoding.

    Subscribers with the same filter and encoding get the same items, so
    the entries (and each item's encoding) are made for the first of them
    and queued by reference for the others. Unfiltered subscribers get
    ``SharedRun``s (taken whole as one packed item by grouped msgpack
    subscribers); filtered ones a plain list, which ``take`` unpacks entry
    by entry as it always did.
    """

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches
        self._runs: dict[tuple[Filter | None, bool], list[list[Entry]]] = {}

    def runs(self, sub: Subscription) -> list[list[Entry]]:
        """The round's entries for ``sub``, as runs of ascending batch indexes (no empty run)."""
        key = (None if sub.filter.everything else sub.filter, sub.raw)
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = self._build(sub.filter, sub.raw)
        return runs

    def _build(self, flt: Filter, raw: bool) -> list[list[Entry]]:
        if flt.everything:
            return list(shared_runs([(b.index, b.raw_item() if raw else b.records_item(), len(b.raw)) for b in self.batches]))
        entries: list[Entry] = []
        for batch in self.batches:
            item = batch.item(flt, raw)
            if item is not None:
                entries.append((batch.index, item, len(batch.raw)))
        return [entries] if entries else []


def grouped(items: list[Item]) -> Item:
    return items[0] if len(items) == 1 else {"batches": items}
