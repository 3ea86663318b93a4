"""The Caravan snapshot file format (version 1.0).

One format serves both the raft-level snapshot that pysyncobj keeps and ships
to lagging followers, and the operator's ``snapshot save``. All integers are
big-endian.

::

    header      magic  b"CARAVANSNAP\\x00"                      12 bytes
                u16 format major | u16 format minor              4 bytes
    metadata    u32 length | msgpack map (see SnapshotMeta)
    chunks      repeated:
                  u8 kind (1 = records) | u8 record type | u8 codec (0 raw, 1 zlib)
                  | u32 record count | u32 raw length | u32 stored length     15 bytes
                  stored bytes; once decoded, ``count`` records as columns:
                  count x u16 key length | count x u32 value length
                  | every key, concatenated | every value, concatenated
    end         u8 kind (2 = end) | 0 | 0 | u32 0 | u32 raw length | u32 stored length
                msgpack summary: {"types": [[code, count, bytes], ...], "records": n, "chunks": n}
    trailer     b"CVSNPEND" | u64 offset of the end chunk | u64 file length
                | SHA-256 over every byte before the digest          56 bytes

Why this shape:

- One record type per chunk (one per LMDB database), so a reader can skip a
  whole chunk of an ignorable unknown type without decoding it, and restore
  can hand a chunk's records to LMDB in one ``putmulti`` call.
- Records are stored as columns (lengths, then keys, then values): framing
  is checked with array operations in one step (the lengths must add up to
  the chunk exactly) instead of a struct call per record. Decoding cost is
  then dominated by creating the key and value objects LMDB needs.
- Chunks are bounded (``MAX_CHUNK_RAW``), so neither side ever holds more than
  one chunk: a 1,000,000-object state streams through a few MiB of memory.
- Per-type counts are exact in the metadata at the start (LMDB's ``stat`` in
  the same read transaction as the scan, O(1) per database), so a reader knows
  them before the stream. Per-type byte sizes are only known after the scan,
  so they live in the end chunk; the trailer points at it, so ``inspect`` reads
  the header, the end chunk and the trailer, plus one hashing pass.
- The trailer's SHA-256 covers everything before it: any flipped byte fails
  the check, and a truncated file has no trailer (or one that records a
  different length). The file length in the trailer lets the error say
  "truncated" rather than just "corrupt".
- Type codes are stable and never reused. Codes with ``IGNORE_FLAG`` (128) are
  for optional data a future version may add: an older reader skips them.
  An unknown code without the flag is refused.
- Compatibility: a newer *minor* version may add metadata keys and ignorable
  record types; a newer *major* version is refused.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from typing import Any

from fsm.store import ALL_DBS

MAGIC = b"CARAVANSNAP\x00"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0

HEADER = struct.Struct(">12sHH")
META_LEN = struct.Struct(">I")
CHUNK = struct.Struct(">BBBIII")
RECORD_OVERHEAD = 6  # u16 key length + u32 value length per record
TRAILER_MAGIC = b"CVSNPEND"
TRAILER = struct.Struct(">8sQQ32s")
DIGEST_SIZE = 32

KIND_RECORDS = 1
KIND_END = 2

CODEC_RAW = 0
CODEC_ZLIB = 1
ZLIB_LEVEL = 1  # ~220 MB/s and ~7x on our msgpack records; higher levels cost 2x for little gain

CHUNK_TARGET = 1 << 20  # raw bytes per chunk before it is flushed
MAX_CHUNK_RAW = 64 << 20  # a reader refuses larger chunks (bounded buffers)
MAX_META = 16 << 20
MAX_RECORDS_PER_CHUNK = MAX_CHUNK_RAW // RECORD_OVERHEAD
MAX_KEY = 0xFFFF

IGNORE_FLAG = 128

# Stable record type codes, one per LMDB database. Never reuse a code; a new
# database gets a new code (with IGNORE_FLAG if older readers may drop it).
TYPE_CODES: dict[str, int] = {
    # object tables
    "jobs": 1,
    "job_versions": 2,
    "job_summary": 3,
    "evals": 4,
    "allocs": 5,
    "deployments": 6,
    "nodes": 7,
    "acl_tokens": 8,
    # Not ignorable: a reader that dropped it would schedule with another policy than its peers.
    "scheduler_config": 9,
    # Not ignorable: a reader that dropped them would authorize differently from its peers.
    "acl_policies": 10,
    # Not ignorable: a reader that dropped them would admit differently from its peers.
    "queues": 11,
    "priority_classes": 12,
    "workloads": 13,
    "queue_usage": 14,
    # secondary indexes
    "evals_by_job": 32,
    "evals_by_status": 33,
    "evals_live_by_job": 34,
    "allocs_by_job": 35,
    "allocs_live_by_job": 36,
    "allocs_by_eval": 37,
    "allocs_by_node": 38,
    "allocs_by_deployment": 39,
    "deployments_by_job": 40,
    "acl_by_secret": 41,
    "acl_by_expiry": 42,
    "nodes_by_secret": 43,
    "workloads_pending": 44,
    "workloads_admitted": 45,
    # system
    "index": 64,
    "meta": 65,
    "gc_marks": 66,
    "gc_mark_of": 67,
    "journal": 68,
    "requests": 69,
    "requests_by_time": 70,
}
TYPE_NAMES: dict[int, str] = {code: name for name, code in TYPE_CODES.items()}

_missing = [name for name in ALL_DBS if name not in TYPE_CODES]
if _missing:  # a new LMDB database without a code would silently vanish from snapshots
    raise ImportError(f"snapshot.format: no record type code for LMDB databases {_missing}")
if len(set(TYPE_CODES.values())) != len(TYPE_CODES):
    raise ImportError("snapshot.format: duplicate record type codes")


_BIG_ENDIAN = sys.byteorder == "big"
if array("H").itemsize != 2 or array("I").itemsize != 4:  # pragma: no cover - exotic platforms
    raise ImportError("snapshot.format needs 2-byte 'H' and 4-byte 'I' arrays")


def pack_records(keys: list[bytes], values: list[bytes]) -> bytes:
    """One chunk's records in the columnar layout (see the module docstring)."""
    klens = array("H", map(len, keys))
    vlens = array("I", map(len, values))
    if not _BIG_ENDIAN:
        klens.byteswap()
        vlens.byteswap()
    return b"".join((klens.tobytes(), vlens.tobytes(), *keys, *values))


def unpack_records(raw: bytes, count: int) -> list[tuple[bytes, bytes]] | None:
    """The records of one chunk, or None if the lengths do not frame ``raw`` exactly."""
    kend, vend = 2 * count, 6 * count
    if vend > len(raw):
        return None
    klens = array("H")
    klens.frombytes(raw[:kend])
    vlens = array("I")
    vlens.frombytes(raw[kend:vend])
    if not _BIG_ENDIAN:
        klens.byteswap()
        vlens.byteswap()
    koffs = list(accumulate(klens, initial=vend))
    voffs = list(accumulate(vlens, initial=koffs[-1]))
    if voffs[-1] != len(raw):
        return None
    keys = [raw[a:b] for a, b in pairwise(koffs)]
    values = [raw[a:b] for a, b in pairwise(voffs)]
    return list(zip(keys, values, strict=True))


def ignorable(code: int) -> bool:
    """Unknown records with this code may be skipped by an older reader."""
    return bool(code & IGNORE_FLAG)


@dataclass
class RaftData:
    """pysyncobj's ``raftData`` tuple in msgpack-able form.

    pysyncobj passes ``(last_applied_entry, previous_entry, cluster_nodes)``
    to the serializer and needs the same tuple back from the deserializer.
    Entries are ``(command bytes, index, term)``; nodes are rebuilt from their
    class name and id (pysyncobj compares them by id).
    """

    last: tuple[bytes, int, int]
    prev: tuple[bytes, int, int]
    cluster: list[tuple[str, str]]  # (node class name, node id)

    @property
    def index(self) -> int:
        return self.last[1]

    @property
    def term(self) -> int:
        return self.last[2]

    def to_wire(self) -> dict[str, Any]:
        return {
            "last": list(self.last),
            "prev": list(self.prev),
            "cluster": [list(n) for n in self.cluster],
        }

    @classmethod
    def from_wire(cls, data: Any) -> RaftData:
        try:
            last, prev = data["last"], data["prev"]
            cluster = [(str(c), str(i)) for c, i in data["cluster"]]
            return cls(last=_entry(last), prev=_entry(prev), cluster=cluster)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed raft data in metadata: {exc}") from None

    @classmethod
    def from_pysyncobj(cls, raft_data: tuple) -> RaftData:
        from pysyncobj.node import TCPNode

        last, prev, nodes = raft_data
        cluster = sorted(
            ("TCPNode" if isinstance(n, TCPNode) else "Node", str(n.id)) for n in nodes
        )
        return cls(last=tuple(last), prev=tuple(prev), cluster=cluster)  # type: ignore[arg-type]

    def to_pysyncobj(self) -> tuple:
        """The tuple pysyncobj expects back, with real node objects."""
        from pysyncobj.node import Node, TCPNode

        nodes = {TCPNode(i) if c == "TCPNode" else Node(i) for c, i in self.cluster}
        return (tuple(self.last), tuple(self.prev), nodes)


def _entry(value: Any) -> tuple[bytes, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"bad raft entry {value!r}")
    return (bytes(value[0]), int(value[1]), int(value[2]))


@dataclass
class TypeStat:
    """One row of the inspect table: records and their bytes (key + value, uncompressed)."""

    code: int
    name: str
    count: int
    size: int


@dataclass
class SnapshotMeta:
    """The metadata map at the start of the file.

    ``index`` is the FSM's applied index (the state the records reflect);
    ``raft`` is set only in pysyncobj's own dumps. ``counts`` are exact (taken
    in the same read transaction as the records).
    """

    index: int
    created: int  # ns since the epoch, wall clock of the writer (informational)
    term: int | None = None
    last_time: int = 0
    cluster_id: str = ""
    caravan_version: str = ""
    store_schema: int = 0
    codec_schema: int = 0
    types: dict[int, str] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    raft: RaftData | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys from a newer minor version

    def to_wire(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "term": self.term,
            "created": self.created,
            "last_time": self.last_time,
            "cluster_id": self.cluster_id,
            "caravan_version": self.caravan_version,
            "store_schema": self.store_schema,
            "codec_schema": self.codec_schema,
            "types": [[c, n] for c, n in sorted(self.types.items())],
            "counts": [[c, n] for c, n in sorted(self.counts.items())],
            "raft": None if self.raft is None else self.raft.to_wire(),
        }

    @classmethod
    def from_wire(cls, data: Any) -> SnapshotMeta:
        if not isinstance(data, dict):
            raise ValueError("metadata is not a map")
        known = {
            "index",
            "term",
            "created",
            "last_time",
            "cluster_id",
            "caravan_version",
            "store_schema",
            "codec_schema",
            "types",
            "counts",
            "raft",
        }
        try:
            index, created = data["index"], data["created"]
            if not isinstance(index, int) or not isinstance(created, int) or index < 0:
                raise ValueError("index and created must be non-negative integers")
            term = data.get("term")
            if term is not None and not isinstance(term, int):
                raise ValueError("term must be an integer")
            types = {int(c): str(n) for c, n in data.get("types", [])}
            counts = {int(c): int(n) for c, n in data.get("counts", [])}
            raw_raft = data.get("raft")
            return cls(
                index=index,
                created=created,
                term=term,
                last_time=int(data.get("last_time", 0)),
                cluster_id=str(data.get("cluster_id", "")),
                caravan_version=str(data.get("caravan_version", "")),
                store_schema=int(data.get("store_schema", 0)),
                codec_schema=int(data.get("codec_schema", 0)),
                types=types,
                counts=counts,
                raft=None if raw_raft is None else RaftData.from_wire(raw_raft),
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"metadata field missing or malformed: {exc}") from None


def snapshot_id(meta: SnapshotMeta) -> str:
    """Nomad's snapshot ID shape: ``term-index-created_ms``."""
    return f"{meta.term or 0}-{meta.index}-{meta.created // 1_000_000}"
