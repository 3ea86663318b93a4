"""node.ids: object UUIDs and request ids without a system call per id."""

from __future__ import annotations

import os
import uuid

import pytest

from node import ids
from node.ids import UUIDSource, new_request_id, new_uuid


def test_ids_are_version_4_uuids_in_canonical_form() -> None:
    for _ in range(1000):
        text = new_uuid()
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_ids_do_not_repeat() -> None:
    ids = {new_uuid() for _ in range(200_000)}
    assert len(ids) == 200_000


def test_two_sources_do_not_share_a_sequence() -> None:
    a, b = UUIDSource(), UUIDSource()
    assert {a.uuid4() for _ in range(1000)}.isdisjoint({b.uuid4() for _ in range(1000)})


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the at-fork hook reseeded the module's source
        try:
            os.write(write, "\n".join(new_uuid() for _ in range(100)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = set(f.read().split("\n"))
    os.waitpid(pid, 0)
    parent = {new_uuid() for _ in range(100)}
    assert len(child) == 100 and child.isdisjoint(parent)


# ---- request ids ----


def test_request_ids_are_unique_and_as_long_as_a_uuid() -> None:
    made = [new_request_id() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in made)


def test_request_ids_get_a_new_random_prefix_when_the_counter_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ids, "_COUNTER_LIMIT", 3)
    ids._reseed_ids()
    made = [new_request_id() for _ in range(9)]
    assert len(set(made)) == 9
    assert len({i[:24] for i in made}) == 3  # three ids per 96-bit prefix
    assert [i[24:] for i in made[:3]] == ["00000000", "00000001", "00000002"]


def test_a_forked_child_does_not_reuse_its_parents_ids() -> None:
    parent_prefix = new_request_id()[:24]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave without running pytest's teardown
        os.write(write_end, new_request_id().encode())
        os._exit(0)
    os.close(write_end)
    child_id = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert len(child_id) == 32 and child_id[:24] != parent_prefix
