"""The append_entries rewrite (defect 1) on synthetic logs: every Raft case."""

from __future__ import annotations

from raft.truncation import TruncationStats, hold_commit_during_snapshot, rewrite_append_entries


class FakeLog:
    """Entries as (index, term), starting at `first`."""

    def __init__(self, terms: list[int], first: int = 1) -> None:
        self.terms = terms
        self.first = first

    def first_index(self) -> int:
        return self.first

    def last_index(self) -> int:
        return self.first + len(self.terms) - 1

    def term_at(self, index: int) -> int:
        return self.terms[index - self.first]


def ae(
    prev: int, prev_term: int, entries: list[tuple[int, int]], term: int = 2, commit: int = 0
) -> dict:
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "entries": [(b"cmd%d" % i, i, t) for i, t in entries],
    }


def pysyncobj_truncates(msg: dict, log: FakeLog) -> bool:
    """Would pysyncobj's handler delete entries for this message?"""
    return msg["prevLogIdx"] < log.last_index()


def test_lagging_heartbeat_does_not_truncate_current_term_tail() -> None:
    log = FakeLog([1, 2, 2, 2, 2, 2])  # indexes 1..6, leader term 2
    rw = rewrite_append_entries(ae(3, 2, [], commit=6), log, current_term=2)
    assert rw.action == "present"
    assert rw.message["prevLogIdx"] == 6 and rw.message["entries"] == []
    assert not pysyncobj_truncates(rw.message, log)
    assert rw.ack_override is None  # acking 6 is safe: the tail is the leader's own
    assert pysyncobj_truncates(ae(3, 2, []), log)  # ...where unpatched pysyncobj would drop 4..6


def test_overlapping_entries_already_present_are_skipped() -> None:
    log = FakeLog([1, 2, 2, 2, 2, 2])
    rw = rewrite_append_entries(ae(2, 2, [(3, 2), (4, 2)], commit=4), log, 2)
    assert rw.action == "present"
    assert not pysyncobj_truncates(rw.message, log)


def test_overlap_then_new_entries_appends_only_the_new_ones() -> None:
    log = FakeLog([1, 2, 2, 2])  # 1..4
    rw = rewrite_append_entries(ae(2, 2, [(3, 2), (4, 2), (5, 2), (6, 2)]), log, 2)
    assert rw.action == "append_only"
    assert rw.message["prevLogIdx"] == 4 and rw.message["prevLogTerm"] == 2
    assert [e[1] for e in rw.message["entries"]] == [5, 6]


def test_real_conflict_truncates_from_the_first_conflicting_index() -> None:
    log = FakeLog([1, 1, 1, 1, 1])  # old leader's uncommitted entries 3..5 (term 1)
    rw = rewrite_append_entries(ae(2, 1, [(3, 1), (4, 2), (5, 2)], term=2), log, 2)
    assert rw.action == "conflict"
    assert rw.message["prevLogIdx"] == 3 and rw.message["prevLogTerm"] == 1
    assert [e[1] for e in rw.message["entries"]] == [4, 5]


def test_unproven_older_term_tail_is_kept_but_not_acked_or_committed() -> None:
    # Entries 4..6 are from term 1 (maybe committed by the old leader); the
    # term-2 leader's heartbeat only proves the log up to index 3.
    log = FakeLog([1, 1, 1, 1, 1, 1])
    rw = rewrite_append_entries(ae(3, 1, [], term=2, commit=6), log, 2)
    assert rw.action == "present_unproven_tail"
    assert not pysyncobj_truncates(rw.message, log)
    assert rw.ack_override == 4  # match index 3, not 6
    assert rw.message["commit_index"] == 3  # never commit entries not proven to match


def test_mismatch_and_gaps_are_left_to_pysyncobj() -> None:
    log = FakeLog([1, 1, 2])
    assert rewrite_append_entries(ae(5, 2, []), log, 2).action == "pass"  # prev beyond our end
    assert rewrite_append_entries(ae(2, 2, [(3, 2)]), log, 2).action == "pass"  # prev term differs
    assert rewrite_append_entries(ae(3, 2, [(4, 2)]), log, 2).action == "pass"  # plain append
    stale = ae(1, 1, [], term=1)
    assert (
        rewrite_append_entries(stale, log, 2).action == "pass"
    )  # stale leader: pysyncobj ignores it
    compacted = FakeLog([3, 3], first=10)
    assert rewrite_append_entries(ae(5, 1, []), compacted, 3).action == "pass"


def test_term_mismatch_reject_carries_the_conflict_hint() -> None:
    # The trace: our log ends 549 term 1, commit 547; the term-3 leader's 549 is term 3.
    log = FakeLog([1] * 549)
    rw = rewrite_append_entries(ae(549, 3, [(550, 3)], term=3, commit=900), log, 3, 547)
    assert rw.action == "pass" and rw.message["prevLogIdx"] == 549  # pysyncobj rejects it ...
    assert rw.reject_hint == 548  # ... but points the leader at our commit index + 1


def test_prev_before_our_first_entry_is_reanchored_there_not_rejected() -> None:
    # We compacted to 10 (our first entry, committed); the leader's nextIndex
    # for us is lower. pysyncobj would reject as "missing" with 13, which
    # the leader's rule ignores (it only lowers nextIndex): answer instead.
    log = FakeLog([3, 3, 3, 3], first=10)  # 10..13
    rw = rewrite_append_entries(ae(5, 2, [(i, 3) for i in range(6, 16)], term=3), log, 3)
    assert rw.action == "append_only"
    assert rw.message["prevLogIdx"] == 13 and [e[1] for e in rw.message["entries"]] == [14, 15]
    beat = rewrite_append_entries(ae(5, 2, [], term=3, commit=13), log, 3)
    assert beat.action == "present" and beat.message["prevLogIdx"] == 13
    only_first = FakeLog([3], first=10)
    rw = rewrite_append_entries(ae(5, 2, [(i, 3) for i in range(6, 13)], term=3), only_first, 3)
    assert rw.action == "below_first"
    assert rw.message["prevLogIdx"] == 10 and [e[1] for e in rw.message["entries"]] == [11, 12]
    # An old-term tail after our first entry is kept but not acknowledged.
    tail = FakeLog([2, 2, 2, 2], first=10)
    rw = rewrite_append_entries(ae(5, 2, [], term=4, commit=13), tail, 4)
    assert rw.action == "present_unproven_tail" and rw.ack_override == 11


def test_stats_count_same_term_ack_regressions_only() -> None:
    st = TruncationStats()
    st.on_ack(term=2, log_end=100, next_node_idx=101, success=True)
    st.on_ack(term=2, log_end=90, next_node_idx=91, success=True)
    assert st.ack_regressions == 1 and st.worst_ack_gap == 10
    st.on_ack(
        term=3, log_end=80, next_node_idx=81, success=True
    )  # new leader may replace uncommitted entries
    assert st.ack_regressions == 1
    st.on_append_processed(leader_commit=85, log_end=80)
    assert st.commit_past_end == 1 and st.worst_commit_gap == 5


def snapshot_chunk(term: int, commit: int, last: bool) -> dict:
    """What pysyncobj's leader sends to install a snapshot: no prevLogIdx."""
    return {"type": "append_entries", "term": term, "commit_index": commit, "serialized": (b"chunk", False, last)}


def test_a_snapshot_chunk_never_advances_the_commit_index() -> None:
    """pysyncobj would commit min(leader commit, own log end): an unproven tail of an ex-leader."""
    for last in (False, True):
        msg = snapshot_chunk(term=9, commit=4600, last=last)
        held = hold_commit_during_snapshot(msg, current_term=6, commit_index=3984)
        assert held["commit_index"] == 3984 and held["serialized"] == msg["serialized"]
        assert msg["commit_index"] == 4600  # the caller's message is not changed in place
    waiting = {"type": "append_entries", "term": 9, "commit_index": 4600, "serialized": None}
    assert hold_commit_during_snapshot(waiting, 9, 3984)["commit_index"] == 3984


def test_ordinary_appends_and_stale_terms_keep_their_commit_index() -> None:
    msg = ae(5, 2, [(6, 2)], commit=6)
    assert hold_commit_during_snapshot(msg, 2, 3) is msg  # anchored: the rewrite above handles it
    stale = snapshot_chunk(term=1, commit=50, last=False)
    assert hold_commit_during_snapshot(stale, 2, 3) is stale  # pysyncobj ignores an older term
    behind = snapshot_chunk(term=2, commit=2, last=False)
    assert hold_commit_during_snapshot(behind, 2, 3) is behind
