"""fsm.ids: object UUIDs and request ids without a system call per id."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from fsm import ids
from fsm.ids import UUIDSource, new_request_id, new_uuid


def test_ids_are_version_8_uuids_in_canonical_form() -> None:
    for _ in range(1000):
        text = new_uuid()
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 8 and parsed.variant == uuid.RFC_4122


def test_ids_sort_in_the_order_they_were_made_and_their_short_forms_differ() -> None:
    """What the stores' B-trees need (new keys side by side) and what the CLI shows (8 characters).

    The clock runs at the real rate but starts far from the 19.5-hour wrap,
    where the order starts again (the wrap is the next test's).
    """
    start = time.monotonic_ns()
    source = UUIDSource(lambda: (1 << (32 + ids.TICK_SHIFT)) + time.monotonic_ns() - start)
    made = [source.uuid() for _ in range(50_000)]
    assert sorted(made) == made
    assert len({i[:8] for i in made}) == len(made)
    assert new_uuid() < new_uuid()  # the module's source, on the wall clock


class _Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_a_clock_stepped_back_does_not_step_the_ids_back() -> None:
    clock = _Clock(1_800_000_000 * 10**9)
    source = UUIDSource(clock)
    before = [source.uuid() for _ in range(3)]
    clock.now -= 3600 * 10**9  # an NTP step of an hour back
    after = [source.uuid() for _ in range(3)]
    assert sorted(before + after) == before + after
    assert len({i[:8] for i in before + after}) == 6


def test_the_tick_is_the_clocks_and_wraps_after_32_bits() -> None:
    clock = _Clock(0x1_2345_6789 << ids.TICK_SHIFT)
    source = UUIDSource(clock)
    assert source.uuid()[:8] == "23456789"
    clock.now = (0x2_0000_0000 + 5) << ids.TICK_SHIFT
    assert source.uuid()[:8] == "00000005"


def test_ids_do_not_repeat() -> None:
    ids = {new_uuid() for _ in range(200_000)}
    assert len(ids) == 200_000


def test_two_sources_do_not_share_a_sequence() -> None:
    a, b = UUIDSource(), UUIDSource()
    assert {a.uuid() for _ in range(1000)}.isdisjoint({b.uuid() for _ in range(1000)})


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
