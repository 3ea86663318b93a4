"""Snapshot file format: write, read, verify, inspect, restore, and pysyncobj hooks.

One checksummed, streamed format (see ``snapshot.format``) for raft
compaction dumps and operators' ``snapshot save``. The CLI and RPC layers
call these functions; nothing here prints or exits. Every failure is a
``SnapshotError`` subclass whose message is one line naming the problem.

- ``save(fsm, path)``: the committed state to a file (atomic rename).
- ``write_stream(reader, out)``: the same into any binary stream, from a
  ``StateReader`` (one read txn), e.g. an RPC response for ``snapshot save``.
- ``inspect(path) -> SnapshotInfo``: header, checksum, metadata and per-type
  counts/sizes without decoding records; ``format_info(info)`` is the text
  of ``snapshot inspect``, ``info.to_json()`` its ``--json`` form. Works on
  a server's raft dump too.
- ``verify(path) -> SnapshotInfo``: every check, records included.
- ``restore(path, fsm_or_store_dir)``: verify, build a fresh store beside
  the live one, swap it in with one rename, reopen.
- ``BackgroundSnapshotter(fsm, dump_file).conf_kwargs()``: pysyncobj hooks
  that compact without stalling the tick; ``make_serializer`` /
  ``make_deserializer`` are the synchronous pair.
"""

from snapshot.errors import (
    ChecksumError,
    CorruptError,
    NewerVersionError,
    NotASnapshotError,
    RestoreError,
    SnapshotError,
    SnapshotIOError,
    SnapshotWriteError,
    TruncatedError,
    UnknownRecordTypeError,
)
from snapshot.format import RaftData, SnapshotMeta, TypeStat
from snapshot.info import SnapshotInfo, format_info, human_bytes
from snapshot.raft_hooks import BackgroundSnapshotter, make_deserializer, make_serializer
from snapshot.reader import inspect, scan, verify
from snapshot.restore import restore
from snapshot.writer import save, write_file, write_stream

Info = SnapshotInfo

__all__ = [
    "BackgroundSnapshotter",
    "ChecksumError",
    "CorruptError",
    "Info",
    "NewerVersionError",
    "NotASnapshotError",
    "RaftData",
    "RestoreError",
    "SnapshotError",
    "SnapshotIOError",
    "SnapshotInfo",
    "SnapshotMeta",
    "SnapshotWriteError",
    "TruncatedError",
    "TypeStat",
    "UnknownRecordTypeError",
    "format_info",
    "human_bytes",
    "inspect",
    "make_deserializer",
    "make_serializer",
    "restore",
    "save",
    "scan",
    "verify",
    "write_file",
    "write_stream",
]
