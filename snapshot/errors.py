"""Errors of the snapshot package.

Every error carries a one-line message that names what is wrong with the file
(or the restore), so the CLI can print it as is and exit non-zero. A snapshot
that fails any check is never used: nothing is replaced.
"""

from __future__ import annotations


class SnapshotError(Exception):
    """Base class of every error raised by the snapshot package."""

    def __init__(self, message: str) -> None:
        # One line, always: the CLI prints it verbatim.
        message = " ".join(str(message).split())
        super().__init__(message)
        self.message = message


class SnapshotIOError(SnapshotError):
    """The file cannot be opened or read (missing, permissions, I/O error)."""


class NotASnapshotError(SnapshotError):
    """The file does not start with the snapshot magic bytes."""


class TruncatedError(SnapshotError):
    """The file ends before its trailer, or its trailer is damaged."""


class ChecksumError(SnapshotError):
    """The SHA-256 in the trailer does not match the file's contents."""


class CorruptError(SnapshotError):
    """The checksum matched but the structure is invalid (a bad writer or a forged file)."""


class NewerVersionError(SnapshotError):
    """The file was written by a newer major format version than this build reads."""


class UnknownRecordTypeError(SnapshotError):
    """A record type this build does not know and that is not marked ignorable."""


class RestoreError(SnapshotError):
    """Restoring failed; the previous state is intact."""


class SnapshotWriteError(SnapshotError):
    """Writing a snapshot failed (the partial file is removed)."""
