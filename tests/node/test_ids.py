"""node.ids: random UUIDs without a system call per id."""

from __future__ import annotations

import os
import uuid

from node.ids import UUIDSource, new_uuid


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
