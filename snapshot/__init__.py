"""Snapshot file format: write, read, verify, inspect, restore, and pysyncobj hooks.

One checksummed, streamed format (see ``snapshot.format``) for raft
compaction dumps and operators' ``snapshot save``. The CLI and RPC layers
call these functions; nothing here prints or exits.
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
