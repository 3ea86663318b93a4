"""The tick thread's stalls: measured between tick starts, logged now and then, and the longest recent one."""

from __future__ import annotations

from raft.ticks import LOG_EVERY_S, TickGaps, TickLoad


def test_a_tick_later_than_the_stall_bound_is_reported_and_kept() -> None:
    gaps = TickGaps(stall=0.25)
    assert gaps.note(100.0) is None  # the first tick has nothing before it
    assert gaps.note(100.1) is None
    gap = gaps.note(101.0)
    assert gap is not None and abs(gap - 0.9) < 1e-9
    assert gaps.stalls == 1


def test_stalls_are_logged_at_most_once_per_interval_and_counted_in_between() -> None:
    gaps = TickGaps(stall=0.25)
    gaps.note(0.0)
    assert gaps.note(1.0) is not None
    assert gaps.note(2.0) is None and gaps.note(3.0) is None  # within LOG_EVERY_S of the last line
    assert gaps.take_unlogged() == 2 and gaps.take_unlogged() == 0
    assert gaps.note(1.0 + LOG_EVERY_S + 1.0) is not None
    assert gaps.stalls == 4


def test_longest_looks_back_a_window_only() -> None:
    gaps = TickGaps(stall=0.25)
    gaps.note(0.0)
    gaps.note(2.0)  # a 2 s stall
    gaps.note(2.1)
    gaps.note(2.6)  # a 0.5 s stall
    assert gaps.longest(window=5.0, now=3.0) == 2.0
    assert gaps.longest(window=5.0, now=7.5) == 0.5
    assert gaps.longest(window=5.0, now=20.0) == 0.0


def test_tick_load_is_the_share_of_time_spent_working() -> None:
    load = TickLoad(window=1.0, now=0.0)
    t = 0.0
    for _ in range(400):  # 4 s of 10 ms ticks, each working 3 ms, then waiting 7 ms in poll
        load.started(t)
        load.finished(t + 0.003)
        load.finished(t + 0.009)  # _finish_tick runs again after the poll: that second call adds nothing
        t += 0.010
    assert abs(load.load - 0.3) < 0.01
    for _ in range(500):  # then 5 s of ticks that work all the time
        load.started(t)
        t += 0.010
        load.finished(t)
    assert load.load > 0.99


def test_an_idle_tick_thread_reads_near_zero_and_one_long_tick_counts_whole() -> None:
    load = TickLoad(window=1.0, now=0.0)
    load.started(0.0)
    load.finished(0.0005)  # too soon to update the average
    assert load.load == 0.0
    load.started(1.0)
    load.finished(1.0005)  # one short tick in a second of waiting
    assert load.load < 0.01
    load.started(1.0005)
    load.finished(3.0)  # a 2 s apply
    assert load.load == 1.0
