"""Corruption: every single-byte change and every truncation of a small snapshot is refused.

Each damaged file goes through ``restore`` into a live FSM (which verifies
first); the test collects every case that was *not* refused, or was refused
with a multi-line message or an unexpected error type, and reports them all
with their offsets. The live state must be untouched afterwards.
"""

from __future__ import annotations

import os

import pytest

from snapshot import (
    ChecksumError,
    CorruptError,
    NewerVersionError,
    NotASnapshotError,
    SnapshotError,
    SnapshotIOError,
    TruncatedError,
    inspect,
    restore,
    save,
    verify,
)
from snapshot.format import HEADER, MAGIC
from tests.snapshot.support import apply_entries, example_entries, new_fsm, tree


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("corrupt")
    src = new_fsm(str(d / "src"))
    apply_entries(src, example_entries(n=8))
    path = str(d / "small.snap")
    save(src, path)
    data = open(path, "rb").read()
    digest = src.digest()
    src.close()
    assert 1000 < len(data) < 20000, len(data)
    return d, data, digest


def _expected(offset: int, size: int) -> tuple[type[SnapshotError], ...]:
    """Which errors a change at ``offset`` may produce (all name what is wrong)."""
    if offset < len(MAGIC):
        return (NotASnapshotError,)
    if offset < HEADER.size:  # version: a newer major, an invalid one, or (minor) the checksum
        return (NewerVersionError, CorruptError, ChecksumError)
    if offset >= size - 56:  # the trailer itself
        return (TruncatedError, CorruptError, ChecksumError)
    return (ChecksumError,)


def _attempt(path: str, live, allowed: tuple[type[SnapshotError], ...]) -> str | None:
    try:
        restore(path, live)
    except SnapshotError as exc:
        if "\n" in str(exc) or not str(exc):
            return f"multi-line or empty message {str(exc)!r}"
        if not isinstance(exc, allowed):
            return f"{type(exc).__name__}: {exc}"
        return None
    except Exception as exc:  # anything else is a crash, not a clear rejection
        return f"unexpected {type(exc).__name__}: {exc}"
    return "ACCEPTED"


def test_every_single_byte_change_is_rejected(small, tmp_path) -> None:
    d, data, digest = small
    live = new_fsm(str(tmp_path / "live"))
    apply_entries(live, example_entries(seed=9, n=3))
    before = live.digest()
    path = str(tmp_path / "flip.snap")
    failures = []
    for offset in range(len(data)):
        for mask in (0xFF, 0x01):
            damaged = bytearray(data)
            damaged[offset] ^= mask
            with open(path, "wb") as f:
                f.write(damaged)
            problem = _attempt(path, live, _expected(offset, len(data)))
            if problem:
                failures.append(f"offset {offset} ^0x{mask:02x}: {problem}")
    assert not failures, f"{len(failures)} damaged files not cleanly rejected:\n" + "\n".join(
        failures[:40]
    )
    assert live.digest() == before
    assert tree(str(tmp_path / "live")) == []


def test_every_truncation_point_is_rejected(small, tmp_path) -> None:
    d, data, digest = small
    live = new_fsm(str(tmp_path / "live"))
    apply_entries(live, example_entries(seed=9, n=3))
    before = live.digest()
    path = str(tmp_path / "cut.snap")
    failures = []
    for length in range(len(data)):
        with open(path, "wb") as f:
            f.write(data[:length])
        allowed: tuple[type[SnapshotError], ...] = (TruncatedError,)
        if length < len(MAGIC):
            allowed = (TruncatedError, NotASnapshotError)
        problem = _attempt(path, live, allowed)
        if problem:
            failures.append(f"length {length}: {problem}")
    assert not failures, f"{len(failures)} truncated files not cleanly rejected:\n" + "\n".join(
        failures[:40]
    )
    assert live.digest() == before
    assert tree(str(tmp_path / "live")) == []


def test_appended_bytes_are_rejected(small, tmp_path) -> None:
    _, data, _ = small
    path = str(tmp_path / "long.snap")
    with open(path, "wb") as f:
        f.write(data + b"\x00")
    with pytest.raises(TruncatedError):
        verify(path)


def test_error_messages_name_the_problem(small, tmp_path) -> None:
    _, data, _ = small
    cases = {
        "magic": (b"XX" + data[2:], NotASnapshotError, "bad magic"),
        "flip": (
            data[:100] + bytes([data[100] ^ 1]) + data[101:],
            ChecksumError,
            "checksum mismatch",
        ),
        "cut": (data[:-10], TruncatedError, "truncated"),
        "empty": (b"", TruncatedError, "shorter than a snapshot header"),
        "newer": (
            data[:12] + b"\x00\x02" + data[14:],
            NewerVersionError,
            "newer than this build reads",
        ),
    }
    for name, (content, exc_type, words) in cases.items():
        path = str(tmp_path / f"{name}.snap")
        with open(path, "wb") as f:
            f.write(content)
        for fn in (verify, inspect):
            with pytest.raises(exc_type) as err:
                fn(path)
            msg = str(err.value)
            assert words in msg and f"{name}.snap" in msg and "\n" not in msg, (name, msg)


def test_not_a_file(tmp_path) -> None:
    with pytest.raises(SnapshotIOError, match="missing.snap: cannot open snapshot"):
        verify(str(tmp_path / "missing.snap"))
    assert not os.path.exists(tmp_path / "missing.snap")
