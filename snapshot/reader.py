"""Read, verify and inspect snapshot files, streaming with bounded buffers.

Checks run in the order that gives the most useful one-line error:

1. header: magic (``NotASnapshotError``), then format version
   (``NewerVersionError`` for a newer major);
2. trailer: present and recording this file's length (``TruncatedError``);
3. SHA-256 over everything before the digest (``ChecksumError``);
4. structure: metadata, every chunk and record, the end chunk, and that the
   counts in the metadata, the end chunk and the records agree
   (``CorruptError``); unknown record types without the ignore flag
   (``UnknownRecordTypeError``).

``inspect`` does 1-3 and reads the metadata and the end chunk (no record
decoding); ``verify`` does all four. Restore scans again while writing and
re-hashes, so a file changed between verify and restore is still caught.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from fsm import codec
from fsm.errors import CodecError
from snapshot.errors import (
    ChecksumError,
    CorruptError,
    NewerVersionError,
    NotASnapshotError,
    SnapshotIOError,
    TruncatedError,
    UnknownRecordTypeError,
)
from snapshot.format import (
    CHUNK,
    CODEC_RAW,
    CODEC_ZLIB,
    DIGEST_SIZE,
    FORMAT_MAJOR,
    HEADER,
    KIND_END,
    KIND_RECORDS,
    MAGIC,
    MAX_CHUNK_RAW,
    MAX_META,
    MAX_RECORDS_PER_CHUNK,
    META_LEN,
    RECORD_OVERHEAD,
    TRAILER,
    TRAILER_MAGIC,
    TYPE_NAMES,
    SnapshotMeta,
    TypeStat,
    ignorable,
    snapshot_id,
    unpack_records,
)
from snapshot.info import SnapshotInfo

_READ = 1 << 20


@dataclass
class Chunk:
    """One records chunk, decompressed: ``count`` records of one type (``raw`` is None if skipped)."""

    code: int
    count: int
    raw_size: int
    raw: bytes | None


class _Prefetch:
    """Run a chunk iterator on a helper thread, a few chunks ahead.

    Reading, hashing and decompressing (which release the GIL) overlap with
    decoding records and writing them to LMDB on the caller's thread. The
    queue is bounded, so memory stays at a few chunks. ``close`` stops the
    helper and waits for it (before the caller closes the file).
    """

    _END = object()

    def __init__(self, it: Iterator[Chunk], depth: int = 4) -> None:
        self._it = it
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapshot-read", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._it:
                if self._stop.is_set():
                    return
                self._q.put((True, item))
            self._q.put((True, self._END))
        except BaseException as exc:  # handed to the consumer, raised there
            self._q.put((False, exc))

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            ok, item = self._q.get()
            if not ok:
                raise item
            if item is self._END:
                return
            yield item

    def close(self) -> None:
        self._stop.set()
        while True:  # free a slot so a blocked put returns and the helper sees the stop
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._thread.join()


@dataclass
class _Layout:
    major: int
    minor: int
    size: int
    end_offset: int
    digest: bytes


class _Hashing:
    """A forward-only reader that hashes what it reads, up to ``limit`` bytes."""

    def __init__(self, f: BinaryIO, limit: int, name: str) -> None:
        self.f = f
        self.limit = limit
        self.name = name
        self.offset = 0
        self.hash = hashlib.sha256()
        self.end_head: tuple[int, ...] | None = None  # the end chunk's header, once seen
        self.end_at = -1

    def read(self, n: int, what: str) -> bytes:
        if self.offset + n > self.limit:
            raise CorruptError(
                f"{self.name}: {what} at offset {self.offset} runs past the end of the data"
            )
        data = self.f.read(n)
        if len(data) != n:
            raise TruncatedError(f"{self.name}: file ends inside {what} at offset {self.offset}")
        self.hash.update(data)
        self.offset += n
        return data


def _name(path: str) -> str:
    return os.path.basename(path) or path


def _open(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise SnapshotIOError(
            f"{_name(path)}: cannot open snapshot: {exc.strerror or exc}"
        ) from exc


def read_layout(f: BinaryIO, path: str) -> _Layout:
    """Check header and trailer; return where things are. Does not hash."""
    name = _name(path)
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    head = f.read(HEADER.size)
    if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
        if MAGIC.startswith(head):
            raise TruncatedError(f"{name}: file is {size} bytes, shorter than a snapshot header")
        raise NotASnapshotError(f"{name}: not a Caravan snapshot (bad magic bytes)")
    if len(head) < HEADER.size:
        raise TruncatedError(f"{name}: file is {size} bytes, shorter than a snapshot header")
    _, major, minor = HEADER.unpack(head)
    if major > FORMAT_MAJOR:
        raise NewerVersionError(
            f"{name}: snapshot format {major}.{minor} is newer than this build reads "
            f"({FORMAT_MAJOR}.x); upgrade caravan to read it"
        )
    if major < 1:
        raise CorruptError(f"{name}: invalid snapshot format version {major}.{minor}")
    if size < HEADER.size + META_LEN.size + CHUNK.size + TRAILER.size:
        raise TruncatedError(
            f"{name}: file is {size} bytes, too short to hold a snapshot (truncated)"
        )
    f.seek(size - TRAILER.size)
    tail = f.read(TRAILER.size)
    magic, end_offset, recorded, digest = TRAILER.unpack(tail)
    if magic != TRAILER_MAGIC:
        raise TruncatedError(
            f"{name}: no snapshot trailer at the end of the file (truncated or damaged end)"
        )
    if recorded != size:
        raise TruncatedError(
            f"{name}: file is {size} bytes but its trailer records {recorded} (truncated or damaged trailer)"
        )
    if not HEADER.size + META_LEN.size <= end_offset <= size - TRAILER.size - CHUNK.size:
        raise CorruptError(f"{name}: trailer points at offset {end_offset}, outside the file")
    f.seek(0)
    return _Layout(major, minor, size, end_offset, digest)


def check_digest(f: BinaryIO, layout: _Layout, path: str) -> None:
    """Hash everything before the digest and compare (one sequential pass)."""
    h = hashlib.sha256()
    f.seek(0)
    left = layout.size - DIGEST_SIZE
    while left:
        data = f.read(min(_READ, left))
        if not data:
            raise TruncatedError(f"{_name(path)}: file shrank while it was being read")
        h.update(data)
        left -= len(data)
    if h.digest() != layout.digest:
        raise ChecksumError(
            f"{_name(path)}: checksum mismatch, the file is corrupt "
            f"(trailer says {layout.digest.hex()[:16]}..., contents hash to {h.hexdigest()[:16]}...)"
        )
    f.seek(0)


def _read_meta(r: _Hashing) -> SnapshotMeta:
    r.read(HEADER.size, "the header")
    (length,) = META_LEN.unpack(r.read(META_LEN.size, "the metadata length"))
    if length > MAX_META:
        raise CorruptError(f"{r.name}: metadata length {length} exceeds the {MAX_META}-byte limit")
    raw = r.read(length, "the metadata")
    try:
        return SnapshotMeta.from_wire(codec.unpack(raw))
    except (CodecError, ValueError) as exc:
        raise CorruptError(f"{r.name}: bad metadata: {exc}") from None


def _decode_records(raw: bytes, count: int, name: str, code: int) -> list[tuple[bytes, bytes]]:
    records = unpack_records(raw, count)
    if records is None:
        raise CorruptError(
            f"{name}: records of type {code} do not fill their chunk exactly (bad framing)"
        )
    return records


def iter_chunks(r: _Hashing, meta: SnapshotMeta) -> Iterator[Chunk]:
    """Yield records chunks, decompressed, up to the end chunk (which ``read_end`` reads).

    Chunks of unknown ignorable types are skipped (still hashed and framed).
    Unknown codes without the ignore flag are refused here, before anything
    is done with them.
    """
    decompress = zlib.decompressobj
    while True:
        head = r.read(CHUNK.size, "a chunk header")
        kind, code, codec_id, count, raw_len, stored_len = CHUNK.unpack(head)
        if kind == KIND_END:
            r.end_head = (kind, code, codec_id, count, raw_len, stored_len)
            r.end_at = r.offset - CHUNK.size
            return
        if kind != KIND_RECORDS:
            raise CorruptError(
                f"{r.name}: unknown chunk kind {kind} at offset {r.offset - CHUNK.size}"
            )
        if raw_len > MAX_CHUNK_RAW or stored_len > MAX_CHUNK_RAW or count > MAX_RECORDS_PER_CHUNK:
            raise CorruptError(
                f"{r.name}: chunk at offset {r.offset - CHUNK.size} exceeds the size limits"
            )
        if code not in TYPE_NAMES and not ignorable(code):
            label = meta.types.get(code, "?")
            raise UnknownRecordTypeError(
                f"{r.name}: record type {code} ({label}) is unknown to this build and not ignorable; "
                "upgrade caravan to restore this snapshot"
            )
        body = r.read(stored_len, "a chunk")
        want = code in TYPE_NAMES
        if codec_id == CODEC_RAW:
            if stored_len != raw_len:
                raise CorruptError(
                    f"{r.name}: raw chunk with stored length {stored_len} != {raw_len}"
                )
            raw = body
        elif codec_id == CODEC_ZLIB:
            if not want:
                yield Chunk(code, count, raw_len, None)
                continue
            d = decompress()
            try:
                raw = d.decompress(body, raw_len + 1)
            except zlib.error as exc:
                raise CorruptError(
                    f"{r.name}: chunk of type {code} does not decompress: {exc}"
                ) from None
            if len(raw) != raw_len or not d.eof or d.unused_data:
                raise CorruptError(
                    f"{r.name}: chunk of type {code} decompresses to the wrong length"
                )
        else:
            raise CorruptError(f"{r.name}: unknown chunk codec {codec_id}")
        if not want:
            yield Chunk(code, count, raw_len, None)
            continue
        yield Chunk(code, count, raw_len, raw)


def read_end(r: _Hashing, layout: _Layout) -> dict[int, tuple[int, int]]:
    """Parse the end chunk; returns {code: (count, bytes)}. Checks it sits where the trailer says."""
    if r.end_head is None:
        r.end_at = r.offset
        r.end_head = CHUNK.unpack(r.read(CHUNK.size, "the end chunk"))
    if r.end_at != layout.end_offset:
        raise CorruptError(
            f"{r.name}: end chunk found at offset {r.end_at}, trailer says {layout.end_offset}"
        )
    kind, _code, codec_id, _count, raw_len, stored_len = r.end_head
    if kind != KIND_END or codec_id != CODEC_RAW or raw_len != stored_len or raw_len > MAX_META:
        raise CorruptError(f"{r.name}: malformed end chunk")
    raw = r.read(raw_len, "the end summary")
    try:
        summary = codec.unpack(raw)
        types = {int(c): (int(n), int(b)) for c, n, b in summary["types"]}
    except (CodecError, KeyError, TypeError, ValueError) as exc:
        raise CorruptError(f"{r.name}: bad end summary: {exc}") from None
    if r.offset != layout.size - TRAILER.size:
        raise CorruptError(
            f"{r.name}: {layout.size - TRAILER.size - r.offset} stray bytes before the trailer"
        )
    r.read(TRAILER.size - DIGEST_SIZE, "the trailer")
    return types


def _info(
    path: str, layout: _Layout, meta: SnapshotMeta, types: dict[int, tuple[int, int]]
) -> SnapshotInfo:
    stats = [
        TypeStat(code, TYPE_NAMES.get(code) or meta.types.get(code) or f"unknown({code})", n, b)
        for code, (n, b) in types.items()
    ]
    stats.sort(key=lambda s: (-s.size, s.name))
    return SnapshotInfo(
        path=path,
        id=snapshot_id(meta),
        size=layout.size,
        index=meta.index,
        term=meta.term,
        raft_index=None if meta.raft is None else meta.raft.index,
        version=f"{layout.major}.{layout.minor}",
        caravan_version=meta.caravan_version,
        created=meta.created,
        cluster_id=meta.cluster_id,
        sha256=layout.digest.hex(),
        types=stats,
        meta=meta,
        unknown_types=sorted(c for c in types if c not in TYPE_NAMES),
    )


def _check_counts(name: str, meta: SnapshotMeta, end: dict[int, tuple[int, int]]) -> None:
    if {c: n for c, (n, _) in end.items()} != meta.counts:
        raise CorruptError(f"{name}: record counts in the metadata and the end summary disagree")
    if set(meta.types) != set(end):
        raise CorruptError(f"{name}: record types in the metadata and the end summary disagree")
    for code, label in meta.types.items():
        known = TYPE_NAMES.get(code)
        if known is not None and known != label:
            raise CorruptError(
                f"{name}: record type {code} is {label!r} in the file but {known!r} here"
            )


def inspect(path: str) -> SnapshotInfo:
    """What ``snapshot inspect`` shows, without loading anything into LMDB.

    Verifies header, trailer and checksum, then reads the metadata and the
    end summary (sizes per type); records are not decoded, so this is one
    sequential hash pass plus two small reads. Works on operator snapshots
    and on a server's own raft dump alike.
    """
    with _open(path) as f:
        layout = read_layout(f, path)
        check_digest(f, layout, path)
        r = _Hashing(f, layout.size - DIGEST_SIZE, _name(path))
        meta = _read_meta(r)
        f.seek(layout.end_offset)
        r.offset = layout.end_offset
        end = read_end(r, layout)
    _check_counts(_name(path), meta, end)
    return _info(path, layout, meta, end)


def scan(
    path: str,
    consume: Callable[[int, list[tuple[bytes, bytes]]], None] | None = None,
    *,
    check_first: bool = True,
    check_order: bool = True,
    on_meta: Callable[[SnapshotMeta], None] | None = None,
) -> SnapshotInfo:
    """Full structural pass: decode every chunk of a known type, check everything.

    ``consume(code, records)`` receives each chunk's records in file order
    (keys strictly increasing per type, as LMDB wants for append). The pass
    re-hashes the file and fails with ``ChecksumError`` at the end if the bytes
    changed, so a consumer must treat its output as provisional until this
    returns. ``check_first`` runs the checksum pass before decoding anything,
    so a corrupt file is reported as such and the consumer never sees it.
    ``check_order=False`` leaves the key-order check to a consumer that
    enforces it anyway (LMDB's append mode does).
    """
    name = _name(path)
    with _open(path) as f:
        layout = read_layout(f, path)
        if check_first:
            check_digest(f, layout, path)
        r = _Hashing(f, layout.size - DIGEST_SIZE, name)
        meta = _read_meta(r)
        if on_meta is not None:
            on_meta(meta)
        seen: dict[int, list[int]] = {}
        last_key: dict[int, bytes] = {}
        chunks = _Prefetch(iter_chunks(r, meta))
        try:
            for chunk in chunks:
                acc = seen.setdefault(chunk.code, [0, 0])
                acc[0] += chunk.count
                if chunk.raw is None:
                    acc[1] = -1  # skipped: byte size unknown, take the summary's
                    continue
                records = _decode_records(chunk.raw, chunk.count, name, chunk.code)
                if check_order and records:
                    keys = [k for k, _ in records]
                    # strictly increasing = sorted and no duplicates (C-speed checks)
                    if keys[0] <= last_key.get(chunk.code, b"") or keys != sorted(set(keys)):
                        raise CorruptError(unordered(name, chunk.code))
                    last_key[chunk.code] = keys[-1]
                acc[1] += chunk.raw_size - RECORD_OVERHEAD * chunk.count  # framing checked
                if consume is not None:
                    consume(chunk.code, records)
        finally:
            chunks.close()
        end = read_end(r, layout)
        if r.hash.digest() != layout.digest:
            raise ChecksumError(
                f"{name}: checksum mismatch, the file is corrupt or changed while being read"
            )
    _check_counts(name, meta, end)
    for code, (n, b) in seen.items():
        want = end.get(code)
        if want is None or want[0] != n or (b >= 0 and want[1] != b):
            raise CorruptError(f"{name}: records of type {code} do not match the end summary")
    for code, (n, _) in end.items():
        if n and code not in seen:
            raise CorruptError(
                f"{name}: end summary lists {n} records of type {code} that are missing"
            )
    return _info(path, layout, meta, end)


def unordered(name: str, code: int) -> str:
    return f"{name}: keys of type {code} are not strictly increasing"


def verify(path: str) -> SnapshotInfo:
    """Check everything (header, trailer, checksum, structure, counts, types) before use.

    Raises a ``SnapshotError`` subclass with a one-line message naming the
    problem; returns the snapshot's info when the file is usable for restore.
    """
    return scan(path)
