"""Round trip: any state built through the real FSM -> save -> restore -> same digest."""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, given, settings

from snapshot import inspect, restore, save, verify
from tests.snapshot.support import apply_entries, entries, example_entries, new_fsm, tree


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=entries)
def test_any_state_round_trips_to_the_same_digest(items: list) -> None:
    with tempfile.TemporaryDirectory() as d:
        src = new_fsm(os.path.join(d, "src"))
        apply_entries(src, items)
        digest, index = src.digest()
        path = os.path.join(d, "s.snap")
        info = save(src, path)
        assert info.index == index
        dst = new_fsm(os.path.join(d, "dst"))
        restore(path, dst)
        assert dst.digest() == (digest, index)
        assert dst.applied_index == index
        # and into a store directory that nobody has open
        restore(path, os.path.join(d, "closed"))
        reopened = new_fsm(os.path.join(d, "closed"))
        assert reopened.digest() == (digest, index)
        for fsm in (src, dst, reopened):
            fsm.close()


def test_restore_replaces_a_different_live_state_and_keeps_working(tmp_path) -> None:
    src = new_fsm(str(tmp_path / "src"))
    apply_entries(src, example_entries(seed=1))
    digest, index = src.digest()
    path = str(tmp_path / "s.snap")
    save(src, path)

    live = new_fsm(str(tmp_path / "live"))
    apply_entries(live, example_entries(seed=2, n=10))
    assert live.digest()[0] != digest
    seen: list[int] = []
    live.on_commit(seen.append)
    restore(path, live)
    assert live.digest() == (digest, index)
    assert seen == [index]  # blocking queries are woken after the swap
    assert tree(str(tmp_path / "live")) == []

    # The restored FSM applies further entries exactly as the source does.
    more = example_entries(seed=3, n=5)
    nxt = apply_entries(src, more, start=index + 1)
    assert apply_entries(live, more, start=index + 1) == nxt
    assert live.digest() == src.digest()


def test_inspect_matches_what_was_written(tmp_path) -> None:
    src = new_fsm(str(tmp_path / "src"))
    apply_entries(src, example_entries())
    path = str(tmp_path / "s.snap")
    written = save(src, path, term=4, cluster_id="c-1")
    seen = inspect(path)
    checked = verify(path)
    for info in (seen, checked):
        assert info.sha256 == written.sha256
        assert info.size == written.size == os.path.getsize(path)
        assert info.id == written.id
        assert [(t.name, t.count, t.size) for t in info.types] == [
            (t.name, t.count, t.size) for t in written.types
        ]
    with src.read() as r:
        for t in seen.types:
            assert t.count == r.count(t.name)
            assert t.size == sum(len(k) + len(v) for k, v in r.iter_raw(t.name))


def test_empty_store_round_trips(tmp_path) -> None:
    src = new_fsm(str(tmp_path / "src"))
    path = str(tmp_path / "s.snap")
    save(src, path)
    dst = new_fsm(str(tmp_path / "dst"))
    restore(path, dst)
    assert dst.digest() == src.digest()


def test_save_holds_the_last_committed_group_unless_asked_to_commit(tmp_path) -> None:
    from fsm import messages as m
    from tests.snapshot.support import T0

    src = new_fsm(str(tmp_path / "src"))
    nxt = apply_entries(src, example_entries(n=3))
    committed = src.applied_index
    src.apply(nxt, m.encode_entry(m.Barrier(), time=T0 + 10**12, rid="pending"))
    assert (
        save(src, str(tmp_path / "a.snap")).index == committed
    )  # the pending group is not visible
    assert save(src, str(tmp_path / "b.snap"), commit=True).index == nxt
