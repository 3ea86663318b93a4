"""How a leader finds where a lagging follower's log agrees with its own.

The livelock (found by jepsen_like, campaign seed 106, pause nemesis): a
deposed leader's log ends with uncommitted entries of its old term (e.g. last
549 term 1, commit 547) and the new leader is more than one append batch
ahead. Each round the new leader pipelines batches from ``nextIndex`` =550,
raising ``nextIndex`` optimistically after each: prevLogIdx 549 (term 3),
605, 661, ... The follower rejects the first on the term mismatch with
``next_node_idx=549, reset`` and every later one (prevLogIdx beyond its log)
with ``next_node_idx=550, reset``. pysyncobj's leader *sets* nextIndex to
whatever a reset reply says, in arrival order, so after every round it is
back at 550 and never reaches 548, where the logs agree.

The fix is Raft's own rule, on the leader (paper, Figure 2, "Rules for
Servers", Leaders: "If AppendEntries fails because of log inconsistency:
decrement nextIndex and retry"): a failed reply may only *lower* a follower's
nextIndex, never raise it (:func:`filter_reply`). A reject that points higher
than the current nextIndex answers a message the leader has already
superseded (a later batch of the same round, or an earlier round); it carries
no information the leader does not already have. etcd's raft does the same
(``Progress.MaybeDecrTo`` ignores stale rejections). Why the leader and not
the follower: the follower cannot tell which of the leader's messages are
stale (pysyncobj's messages carry no round or request id), while the leader
knows the one number that matters -- where it will send from next -- and the
rule needs no state that outlives a message. It is also robust to any number
of batches, reordering of rounds and reconnects.

Liveness with the rule: each round starts at nextIndex; its first message
either succeeds (and later messages of the round chain on it) or is rejected
with a value below nextIndex (a mismatch at prevLogIdx, or "missing" with the
follower's last index + 1 <= prevLogIdx), so nextIndex strictly decreases
until the logs agree. It cannot fall below the follower's first log index: a
mismatch is only ever reported at an uncommitted entry, and pysyncobj's first
log entry is always committed (compaction and dumps cut at applied entries);
:func:`raft.truncation.rewrite_append_entries` additionally answers a
``prevLogIdx`` below the follower's first entry positively instead of with a
"missing" reject that the rule would ignore.

Speed: pysyncobj's follower rejects a mismatch with ``prevLogIdx``, so the
leader backs up one entry per round; a paused leader with a thousand
uncommitted entries would take a thousand rounds. :func:`conflict_hint` is
the Raft paper's optimisation (section 5.3): the follower skips back over the
whole run of the conflicting term, but never below its commit index + 1
(entries up to its commit index are committed, so every leader has them).
Lowering nextIndex further than necessary is always safe -- it only resends
entries, which the truncation fix then recognises as already present.
"""

from __future__ import annotations

from typing import Any, Protocol


class TermLog(Protocol):
    """What :func:`conflict_hint` needs from a follower's log."""

    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def term_at(self, index: int) -> int: ...


def filter_reply(message: dict[str, Any], next_index: int | None, match_index: int = 0) -> dict[str, Any] | None:
    """The leader's rule for a ``next_node_idx`` reply: failures only lower nextIndex, never to matchIndex.

    Returns a replacement message for pysyncobj's handler, or ``None`` to
    deliver ``message`` unchanged. A failed ``reset`` reply pointing above
    ``next_index`` (the leader's current nextIndex for that follower) loses
    its ``reset`` flag, so pysyncobj keeps nextIndex (and still records the
    reply as a sign of life).

    One pointing at or below ``match_index`` is stale too: the follower has
    since acknowledged entries up to ``match_index`` in this term, and its
    log never loses them (the truncation fix; a restart reconnects, which
    resets matchIndex). etcd's raft ignores such rejections the same way
    (``Progress.MaybeDecrTo``). Obeying it sent the follower a snapshot it
    did not need, and pysyncobj's install dropped the entries it held past
    the snapshot -- acknowledged ones among them (seed 172: three installs
    in 3 s, the last older than what the follower had applied). Such a
    reply lowers nextIndex only to ``match_index + 1``.
    """
    if next_index is None or message.get("success") or not message.get("reset"):
        return None
    hint = message.get("next_node_idx")
    if not isinstance(hint, int):
        return None
    floor = max(hint, match_index + 1)
    if floor >= next_index:
        return None if hint == next_index else dict(message, reset=False)
    return None if floor == hint else dict(message, next_node_idx=floor)


#: How long a leader trusts a snapshot it sent to reach the follower before
#: that follower confirms it (see :class:`SnapshotFloors`). A stale reject
#: is already on the wire when the last chunk leaves, so it arrives within
#: a round trip; the bound only matters if the follower never confirms.
SNAPSHOT_ACK_WAIT = 10.0


class SnapshotFloors:
    """Per follower: the log index a snapshot the leader just sent brings it to.

    Seed 233: a follower paused far behind is sent a snapshot; a reject it
    sent *before* it got the snapshot (for an append of the previous round)
    reaches the leader after the last chunk left but before the follower's
    confirmation, while matchIndex is still the old, low value.
    :func:`filter_reply` then lets it lower nextIndex below the leader's
    compacted log, and the leader sends the same snapshot again. The second
    install cleared the follower's raft log back to the snapshot's index,
    dropping entries after it that the follower had since received and
    acknowledged.

    Until the follower confirms (a success reply at or above the floor), a
    failed reply may lower nextIndex no further than the snapshot's index +
    1, as if the follower had acknowledged the snapshot: over one TCP
    connection the follower installs it before it answers anything sent
    later. The floor is dropped when the follower reconnects (the snapshot
    may not have arrived), in a new term, and after
    :data:`SNAPSHOT_ACK_WAIT` seconds without a confirmation (a follower
    that could not install it gets a fresh one).
    """

    def __init__(self, wait: float = SNAPSHOT_ACK_WAIT) -> None:
        self.wait = wait
        self._floors: dict[Any, tuple[int, int, float]] = {}  # node -> (floor, term, sent at)

    def sent(self, node: Any, floor: int, term: int, now: float) -> None:
        """The last chunk of a snapshot covering the log up to ``floor - 1`` left for ``node``."""
        self._floors[node] = (floor, term, now)

    def match_index(self, node: Any, match_index: int, term: int, now: float) -> int:
        """What the leader may treat ``node`` as having acknowledged when filtering a reply."""
        entry = self._floors.get(node)
        if entry is None:
            return match_index
        floor, sent_term, at = entry
        if sent_term != term or now - at > self.wait:
            del self._floors[node]
            return match_index
        return max(match_index, floor - 1)

    def on_reply(self, node: Any, message: dict[str, Any]) -> None:
        """A success at or above the floor is the follower's confirmation: matchIndex covers it now."""
        entry = self._floors.get(node)
        if entry is not None and message.get("success") and message.get("next_node_idx", 0) >= entry[0]:
            del self._floors[node]

    def forget(self, node: Any) -> None:
        self._floors.pop(node, None)


def conflict_hint(log: TermLog, prev_idx: int, commit_index: int) -> int:
    """Where the leader should resume after a term mismatch at ``prev_idx``.

    pysyncobj answers ``prev_idx`` (back up one entry). Returns the first
    index of the run of entries with the conflicting term that ends at
    ``prev_idx``, but not below ``commit_index + 1`` nor below the first
    entry after the log's start (both are known to agree with any leader).
    Terms never decrease along a log, so the run's start is found by binary
    search.
    """
    term = log.term_at(prev_idx)
    lo = max(commit_index + 1, log.first_index() + 1)
    if lo >= prev_idx:
        return prev_idx
    # Smallest i in [lo, prev_idx] with term_at(i) == term (terms are monotonic).
    hi = prev_idx
    while lo < hi:
        mid = (lo + hi) // 2
        if log.term_at(mid) < term:
            lo = mid + 1
        else:
            hi = mid
    return lo
