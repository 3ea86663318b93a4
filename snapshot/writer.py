"""Write a snapshot from one LMDB read transaction, streaming.

The state is read with cursors inside a single read transaction (one raft
index), framed into bounded chunks and written as it goes: memory use is a
few chunks regardless of the state's size. Compression runs on a helper
thread (zlib releases the GIL), overlapping the Python record loop.

The output can be any binary file object (a file, a socket file for the RPC
``snapshot save``); ``save`` wraps it for the common case of a file path,
writing ``path.partial`` and renaming it into place only once complete.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, BinaryIO

from fsm import codec
from fsm.store import STORE_SCHEMA, StateReader
from snapshot.errors import SnapshotWriteError
from snapshot.format import (
    CHUNK,
    CHUNK_TARGET,
    CODEC_RAW,
    CODEC_ZLIB,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER,
    KIND_END,
    KIND_RECORDS,
    MAGIC,
    MAX_CHUNK_RAW,
    META_LEN,
    RECORD_OVERHEAD,
    TRAILER,
    TRAILER_MAGIC,
    TYPE_CODES,
    ZLIB_LEVEL,
    RaftData,
    SnapshotMeta,
    TypeStat,
    pack_records,
    snapshot_id,
)
from snapshot.info import SnapshotInfo

if TYPE_CHECKING:
    from fsm.machine import FSM

_PIPELINE_DEPTH = 4  # chunks in flight to the compressor (bounded memory)


def caravan_version() -> str:
    try:
        from importlib.metadata import version

        return version("caravan")
    except Exception:  # not installed as a distribution (a bare checkout)
        return "unknown"


def _pack(keys: list[bytes], values: list[bytes]) -> tuple[int, bytes]:
    """Frame and compress one chunk (runs on the helper thread; zlib releases the GIL)."""
    raw = pack_records(keys, values)
    packed = zlib.compress(raw, ZLIB_LEVEL)
    if len(packed) < len(raw):
        return CODEC_ZLIB, packed
    return CODEC_RAW, raw


class _Out:
    """Counts and hashes every byte written, so the trailer can cover them."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.offset = 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.hash.update(data)
        self.offset += len(data)


def write_stream(
    reader: StateReader,
    out: BinaryIO,
    *,
    raft: RaftData | None = None,
    term: int | None = None,
    cluster_id: str = "",
    path: str = "",
    cancel: threading.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> SnapshotInfo:
    """Write the whole state visible to ``reader`` (one read txn) to ``out``.

    ``raft`` is pysyncobj's raft data (raft dumps only); ``term`` defaults to
    its term. ``cancel`` aborts at the next chunk boundary with
    ``SnapshotWriteError``. ``on_ready`` is called once counts and metadata
    are taken (the read txn is pinned), before the long scan.
    """
    txn, dbs = reader.txn, reader.dbs
    order = sorted(TYPE_CODES.items(), key=lambda item: item[1])
    counts = {code: reader.count(name) for name, code in order}
    meta = SnapshotMeta(
        index=reader.applied_index,
        created=time.time_ns(),
        term=term if term is not None else (raft.term if raft is not None else None),
        last_time=reader.last_time,
        cluster_id=cluster_id,
        caravan_version=caravan_version(),
        store_schema=STORE_SCHEMA,
        codec_schema=codec.SCHEMA_VERSION,
        types={code: name for name, code in order},
        counts=counts,
        raft=raft,
    )
    if on_ready is not None:
        on_ready()
    w = _Out(out)
    w.write(HEADER.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR))
    raw_meta = codec.pack(meta.to_wire())
    w.write(META_LEN.pack(len(raw_meta)) + raw_meta)

    stats: dict[int, TypeStat] = {}
    pending: deque[tuple[int, int, int, Future]] = deque()
    chunks = 0

    def drain(limit: int) -> None:
        nonlocal chunks
        while len(pending) > limit:
            code, count, raw_len, fut = pending.popleft()
            codec_id, body = fut.result()
            w.write(CHUNK.pack(KIND_RECORDS, code, codec_id, count, raw_len, len(body)))
            w.write(body)
            chunks += 1

    big = MAX_CHUNK_RAW - RECORD_OVERHEAD - 512
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-zlib") as pool:
        try:
            for name, code in order:
                total_n = total_bytes = 0
                keys: list[bytes] = []
                values: list[bytes] = []
                size = 0
                cursor = txn.cursor(db=dbs[name])
                for k, v in cursor.iternext():
                    lv = len(v)
                    if lv > big:
                        raise SnapshotWriteError(
                            f"record {k[:40]!r} in {name} is {lv} bytes, larger than a chunk may be"
                        )
                    keys.append(k)
                    values.append(v)
                    size += RECORD_OVERHEAD + len(k) + lv
                    if size >= CHUNK_TARGET:
                        if cancel is not None and cancel.is_set():
                            raise SnapshotWriteError("snapshot cancelled")
                        n = len(keys)
                        pending.append((code, n, size, pool.submit(_pack, keys, values)))
                        drain(_PIPELINE_DEPTH)
                        total_n += n
                        total_bytes += size - RECORD_OVERHEAD * n
                        keys, values, size = [], [], 0
                if keys:
                    n = len(keys)
                    pending.append((code, n, size, pool.submit(_pack, keys, values)))
                    drain(_PIPELINE_DEPTH)
                    total_n += n
                    total_bytes += size - RECORD_OVERHEAD * n
                if total_n != counts[code]:
                    raise SnapshotWriteError(
                        f"{name}: scanned {total_n} records but LMDB counted {counts[code]}"
                    )
                stats[code] = TypeStat(code, name, total_n, total_bytes)
            drain(0)
        finally:
            for *_, fut in pending:
                fut.cancel()

    summary = {
        "types": [[s.code, s.count, s.size] for s in stats.values()],
        "records": sum(s.count for s in stats.values()),
        "chunks": chunks,
    }
    raw_summary = codec.pack(summary)
    end_offset = w.offset
    w.write(CHUNK.pack(KIND_END, 0, CODEC_RAW, 0, len(raw_summary), len(raw_summary)))
    w.write(raw_summary)
    file_len = w.offset + TRAILER.size
    head = TRAILER.pack(TRAILER_MAGIC, end_offset, file_len, b"")[: TRAILER.size - 32]
    w.write(head)
    digest = w.hash.digest()
    out.write(digest)
    types = sorted(stats.values(), key=lambda s: (-s.size, s.name))
    return SnapshotInfo(
        path=path,
        id=snapshot_id(meta),
        size=file_len,
        index=meta.index,
        term=meta.term,
        raft_index=None if raft is None else raft.index,
        version=f"{FORMAT_MAJOR}.{FORMAT_MINOR}",
        caravan_version=meta.caravan_version,
        created=meta.created,
        cluster_id=cluster_id,
        sha256=digest.hex(),
        types=types,
        meta=meta,
    )


def fsync_dir(path: str) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(
    reader: StateReader,
    path: str,
    *,
    raft: RaftData | None = None,
    term: int | None = None,
    cluster_id: str = "",
    cancel: threading.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> SnapshotInfo:
    """Write to ``path`` exactly (no rename) and fsync; remove it on failure.

    pysyncobj's serializer contract: it hands us a temporary name and renames
    it itself.
    """
    try:
        with open(path, "wb", buffering=1 << 20) as f:
            info = write_stream(
                reader,
                f,
                raft=raft,
                term=term,
                cluster_id=cluster_id,
                path=path,
                cancel=cancel,
                on_ready=on_ready,
            )
            f.flush()
            os.fsync(f.fileno())
        return info
    except BaseException as exc:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise SnapshotWriteError(f"writing snapshot {path} failed: {exc}") from exc
        raise


def save(
    fsm: FSM, path: str, *, term: int | None = None, cluster_id: str = "", commit: bool = False
) -> SnapshotInfo:
    """Save the FSM's committed state to ``path`` atomically (``path.partial`` then rename).

    The file holds the last committed group, consistent at the applied index
    recorded in its metadata (one read transaction). ``commit=True`` first
    commits the pending group; only the thread that applies entries (the raft
    tick) may do that, because the pending write transaction belongs to it.
    From any other thread (an RPC handler), pass a barrier through the log
    first if the snapshot must include a given write.
    """
    if commit:
        fsm.commit()
    partial = path + ".partial"
    with fsm.read() as reader:
        info = write_file(reader, partial, term=term, cluster_id=cluster_id)
    os.replace(partial, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    info.path = path
    return info
