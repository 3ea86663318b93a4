"""Fix for pysyncobj's follower truncation (defect 1 of pysyncobj.md).

pysyncobj 0.3.17's follower deletes every entry after ``prevLogIdx`` whenever
its log extends past it, even when nothing conflicts. Under pipelining the
leader's view of a follower trails the follower (a late ack rewinds the
leader's ``nextIndex``), so followers keep dropping entries they already
acknowledged; a leader crash in that window loses acknowledged writes.

Raft's rule (paper, Figure 2, AppendEntries receiver step 3-4): delete
existing entries only from the first index whose term differs from the
incoming entry's, and append only entries not already present. We cannot
change pysyncobj's handler without forking it, so :func:`rewrite_append_entries`
runs in front of it (on the transport's message callback) and rewrites each
``append_entries`` message into one that makes pysyncobj do the right thing:

* prev entry missing / term mismatch: untouched (pysyncobj rejects; correct).
* overlap without conflict, new entries past our end: drop the overlap and
  re-anchor ``prevLogIdx`` at our last entry, so pysyncobj only appends.
* real conflict at index ``i``: re-anchor at ``i - 1`` with the entries from
  ``i``; pysyncobj then truncates exactly the conflicting suffix.
* everything already present and our log extends further (the lagging
  heartbeat/append case): re-anchor at our last entry with no entries, so
  pysyncobj truncates nothing. If our last entry carries the sender's term it
  came from this leader and, by log matching, our whole log equals the
  leader's up to it, so acknowledging it is safe. Otherwise the tail holds
  older-term entries that are not proven to match: we keep them (they may be
  committed), but acknowledge and commit only up to the message's last entry
  (``ack_override`` / lowered ``commit_index``), exactly as Raft does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from raft.catchup import conflict_hint


class LogView(Protocol):
    """Read-only view of a follower's log (pysyncobj keeps it in memory)."""

    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def term_at(self, index: int) -> int: ...


@dataclass
class Rewrite:
    """What to hand to pysyncobj for one incoming append_entries message."""

    message: dict[str, Any]
    #: "pass", "append_only", "conflict", "present", "present_unproven_tail",
    #: "below_first" (re-anchored at our first entry, then appended as usual)
    action: str
    #: next_node_idx to acknowledge instead of pysyncobj's (unproven tail case).
    ack_override: int | None = None
    #: next_node_idx to reject with instead of pysyncobj's ``prevLogIdx`` on a
    #: term mismatch (:func:`raft.catchup.conflict_hint`).
    reject_hint: int | None = None


@dataclass
class TruncationStats:
    """Counters exposed through ``RaftNode.status()``.

    ``ack_regressions``/``worst_ack_gap`` are the reproduction's first
    counter (log end fell below an index this follower already acknowledged
    in the same term); ``commit_past_end`` is its second (the leader's commit
    index ran past this follower's log end after an append). With the fix
    both stay zero for followers that keep up; without it pipelined load
    makes them grow. (A follower that is catching up after a restart or a
    partition legitimately trails the commit index, so ``commit_past_end``
    is only meaningful for an in-sync follower.)
    """

    ack_regressions: int = 0
    worst_ack_gap: int = 0
    commit_past_end: int = 0
    worst_commit_gap: int = 0
    truncations_avoided: int = 0
    conflict_truncations: int = 0
    acked_max: int = 0
    acked_term: int = -1
    samples: list[tuple[int, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {
            "ack_regressions": self.ack_regressions,
            "worst_ack_gap": self.worst_ack_gap,
            "commit_past_end": self.commit_past_end,
            "worst_commit_gap": self.worst_commit_gap,
            "truncations_avoided": self.truncations_avoided,
            "conflict_truncations": self.conflict_truncations,
        }

    def on_ack(self, term: int, log_end: int, next_node_idx: int, success: bool) -> None:
        """Record an outgoing next_node_idx (called from the transport's send)."""
        if term != self.acked_term:
            # A new leader may legitimately replace uncommitted entries that
            # an old leader had us acknowledge; only same-term regressions count.
            self.acked_term = term
            self.acked_max = 0
        if log_end < self.acked_max:
            self.ack_regressions += 1
            gap = self.acked_max - log_end
            self.worst_ack_gap = max(self.worst_ack_gap, gap)
            if len(self.samples) < 5:
                self.samples.append((self.acked_max, log_end))
        if success:
            self.acked_max = max(self.acked_max, next_node_idx - 1)

    def on_append_processed(self, leader_commit: int, log_end: int) -> None:
        if leader_commit > log_end:
            self.commit_past_end += 1
            self.worst_commit_gap = max(self.worst_commit_gap, leader_commit - log_end)


def hold_commit_during_snapshot(message: dict[str, Any], current_term: int, commit_index: int) -> dict[str, Any]:
    """A snapshot-install message must not move this follower's commit index.

    pysyncobj sets a follower's commit index to ``min(leader commit, own log
    end)`` after *every* append_entries message, including the chunks of a
    snapshot install (the only ones without ``prevLogIdx``). Before the last
    chunk is loaded, the follower's log still ends with whatever it had: for
    a rejoining ex-leader, a tail of its own uncommitted entries that the
    cluster replaced. It then applied that tail, answered its writers
    "success" and served reads from it until the snapshot overwrote its
    state: acknowledged writes lost (jepsen_like seeds 132 and 135). Raft
    commits on a follower only up to the last entry known to match the
    leader; during a snapshot install that is nothing new, so the commit
    index stays where it is and the next ordinary append_entries (anchored
    at the snapshot's index) moves it.
    """
    if "prevLogIdx" in message or message.get("term", -1) < current_term:
        return message
    if message.get("commit_index", 0) <= commit_index:
        return message
    return dict(message, commit_index=commit_index)


def rewrite_append_entries(
    message: dict[str, Any], log: LogView, current_term: int, commit_index: int = 0
) -> Rewrite:
    """Return the message pysyncobj should see so it truncates only on a real conflict.

    ``commit_index`` is the follower's own: it bounds how far back a term
    mismatch reject may send the leader (:func:`raft.catchup.conflict_hint`).
    """
    if message.get("term", -1) < current_term or "prevLogIdx" not in message:
        return Rewrite(message, "pass")
    if message.get("transmission") is not None:
        # Chunked single-entry transfer: never produced for entries under the
        # configured cap (defect 2 guard); leave pysyncobj's path alone.
        return Rewrite(message, "pass")
    prev_idx = message["prevLogIdx"]
    if prev_idx is None:
        return Rewrite(message, "pass")
    first, last = log.first_index(), log.last_index()
    if prev_idx < first:
        return _reanchor_at_first(message, log, current_term, commit_index)
    if prev_idx > last:
        return Rewrite(message, "pass")
    if log.term_at(prev_idx) != message["prevLogTerm"]:
        return Rewrite(message, "pass", reject_hint=conflict_hint(log, prev_idx, commit_index))
    if prev_idx == last:
        return Rewrite(message, "pass")  # nothing beyond prev: pysyncobj cannot over-truncate

    entries = message.get("entries") or []
    if entries and entries[0][1] != prev_idx + 1:
        return Rewrite(message, "pass")  # not contiguous: not something pysyncobj's leader sends

    i = 0
    n = len(entries)
    while i < n:
        idx = entries[i][1]
        if idx > last:
            break
        if log.term_at(idx) != entries[i][2]:
            # Real conflict: let pysyncobj truncate from idx and append the rest.
            out = dict(message)
            out["prevLogIdx"] = idx - 1
            out["prevLogTerm"] = log.term_at(idx - 1)
            out["entries"] = entries[i:]
            return Rewrite(out, "conflict")
        i += 1

    out = dict(message)
    out["prevLogIdx"] = last
    out["prevLogTerm"] = log.term_at(last)
    if i < n:
        out["entries"] = entries[i:]
        return Rewrite(out, "append_only")
    out["entries"] = []
    if log.term_at(last) == message["term"]:
        return Rewrite(out, "present")
    covered = entries[-1][1] if entries else prev_idx
    out["commit_index"] = min(message["commit_index"], covered)
    return Rewrite(out, "present_unproven_tail", ack_override=covered + 1)


def _reanchor_at_first(
    message: dict[str, Any], log: LogView, current_term: int, commit_index: int
) -> Rewrite:
    """``prevLogIdx`` lies before our first entry (we compacted past it).

    pysyncobj would reject it as "missing" with our last index + 1, a value
    above the leader's nextIndex that the leader's rule (raft/catchup.py)
    ignores, so the leader would repeat the message forever. Our first entry
    is committed (pysyncobj only compacts or loads dumps at applied entries),
    so it agrees with every leader's log: re-anchor the message there, drop
    the entries it already covers, and handle it as usual.
    """
    first = log.first_index()
    entries = message.get("entries") or []
    if entries and entries[0][1] != message["prevLogIdx"] + 1:
        return Rewrite(message, "pass")  # not contiguous: leave it to pysyncobj
    for entry in entries:
        if entry[1] == first and entry[2] != log.term_at(first):
            return Rewrite(message, "pass")  # cannot happen with a correct leader
    out = dict(message)
    out["prevLogIdx"] = first
    out["prevLogTerm"] = log.term_at(first)
    out["entries"] = [e for e in entries if e[1] > first]
    rw = rewrite_append_entries(out, log, current_term, commit_index)
    if rw.action == "pass":
        # Our log ends at `first`: pysyncobj appends after it (or acks it).
        return Rewrite(rw.message, "below_first", rw.ack_override, rw.reject_hint)
    return rw
