"""Linearizability checking: Wing & Gong's search with Lowe's memoization.

The question is whether the operations can be put in one sequential order that
(a) respects real time -- if A returned before B was called, A comes first --
and (b) is a legal run of the model. Trying all orders is factorial; the
search below stays tractable on real histories for three reasons (the design
of Porcupine):

* Histories are partitioned (per key) and each part checked on its own;
  linearizability is compositional, and the search is exponential in the
  size of what it is given.
* Call and return events sit in one time-ordered doubly linked list. The
  search walks it from the front; an operation whose call is reached may be
  linearized next, and reaching a *return* means that operation had to be
  linearized already, so the search backtracks. Linearizing an operation
  unlinks ("lifts") both of its events, and backtracking relinks them in
  O(1), so no copying of the history happens during the search.
* Every (set of linearized operations, model state) pair reached is cached.
  Two different orders of the same operations that end in the same state
  have the same future, so the second is pruned. The set is a Python int used
  as a bitset, which makes the cache key cheap to build and hash.

``info`` operations (unknown outcome) return at +infinity, so they can be
linearized anywhere after their call, and models accept any output for them.
The search stops as soon as every definite operation is placed: the info
operations left over "never happened" (equivalently, happened last, where
nothing observes them), and not placing them saves search steps.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jepsen_like.history import Operation
from jepsen_like.models import Model

# How many search steps run between clock reads: often enough that a timeout
# is honoured within milliseconds, rarely enough not to show in profiles.
_CLOCK_EVERY = 0x1000


class Verdict(enum.StrEnum):
    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not-linearizable"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PartitionFailure:
    """Why one partition is not linearizable, in terms a person can follow.

    ``longest_linearization`` is the longest prefix of a legal sequential
    order the search found. After it, none of ``stuck`` could be placed next
    (each was illegal in that state, or led only to dead ends already
    explored), yet ``blocking`` returned and so must already have taken effect.
    ``state`` is the model state after the prefix, usually the quickest clue.
    """

    key: Hashable | None
    operations: int
    longest_linearization: tuple[Operation, ...]
    stuck: tuple[Operation, ...]
    blocking: Operation
    state: Any = None


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    partitions: int
    elapsed: float
    explanation: str = ""
    failure: PartitionFailure | None = None
    timed_out_keys: tuple[Hashable | None, ...] = field(default_factory=tuple)

    @property
    def linearizable(self) -> bool:
        return self.verdict is Verdict.LINEARIZABLE


class _Entry:
    """A call or return event in the search's doubly linked list.

    A call entry's ``match`` is its return entry; a return entry has none,
    which is how the search tells the two apart without another field.
    """

    __slots__ = ("index", "bit", "input", "output", "required", "match", "prev", "next")

    def __init__(self, index: int, input: Any = None, output: Any = None, required: bool = True):
        self.index = index
        self.bit = 1 << index if index >= 0 else 0
        self.input = input
        self.output = output
        self.required = required
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _build_entries(ops: Sequence[Operation]) -> _Entry:
    """Return the head sentinel of the time-ordered event list.

    At equal timestamps calls sort before returns: with coarse clocks, two
    operations stamped with the same instant may have overlapped, and
    treating them as concurrent can only avoid a false alarm, never hide one
    that a finer clock would have shown as ordered.
    """
    events: list[tuple[float, int, int, _Entry]] = []
    for index, op in enumerate(ops):
        call = _Entry(index, op.input, op.output, required=op.status != "info")
        ret = _Entry(index)
        call.match = ret
        events.append((op.call_time, 0, index, call))
        events.append((op.effective_return_time, 1, index, ret))
    events.sort(key=lambda event: event[:3])
    head = _Entry(-1)
    previous = head
    for *_, entry in events:
        previous.next = entry
        entry.prev = previous
        previous = entry
    return head


def _lift(call: _Entry) -> None:
    """Unlink an operation's call and return; they stay reachable from ``call`` for unlifting."""
    call.prev.next = call.next
    call.next.prev = call.prev
    ret = call.match
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(call: _Entry) -> None:
    """Undo ``_lift``; valid because backtracking undoes lifts in reverse order."""
    ret = call.match
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    call.prev.next = call
    call.next.prev = call


@dataclass
class _Outcome:
    verdict: Verdict
    longest: list[int] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)
    blocking: int = -1
    state: Any = None


def _search(model: Model[Any], ops: Sequence[Operation], deadline: float | None) -> _Outcome:
    """Depth-first search for a linearization of one partition."""
    head = _build_entries(ops)
    remaining = sum(1 for op in ops if op.status != "info")
    step = model.step
    state = model.init()
    linearized = 0
    seen: set[tuple[int, Hashable]] = set()
    stack: list[tuple[_Entry, Hashable]] = []
    best = _Outcome(Verdict.NOT_LINEARIZABLE)
    best_depth = -1
    steps = 0
    entry = head.next
    while remaining:
        steps += 1
        if deadline is not None and steps % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
            return _Outcome(Verdict.UNKNOWN)
        if entry.match is not None:  # a call: try to linearize it now
            ok, new_state = step(state, entry.input, entry.output)
            if ok:
                key = (linearized | entry.bit, new_state)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry, state))
                    state = new_state
                    linearized = key[0]
                    remaining -= entry.required
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
            continue
        # A return: this operation must already be linearized, but no
        # candidate before it could be placed, so undo the last choice.
        if len(stack) > best_depth:
            best_depth = len(stack)
            best.longest = [e.index for e, _ in stack]
            best.stuck = []
            candidate = head.next
            while candidate is not entry:
                best.stuck.append(candidate.index)
                candidate = candidate.next
            best.blocking = entry.index
            best.state = state
        if not stack:
            return best
        entry, state = stack.pop()
        linearized ^= entry.bit
        remaining += entry.required
        _unlift(entry)
        entry = entry.next
    return _Outcome(Verdict.LINEARIZABLE)


def check(
    model: Model[Any], history: Sequence[Operation], timeout: float | None = None
) -> CheckResult:
    """Decide whether ``history`` is linearizable with respect to ``model``.

    ``fail`` operations are dropped (they did not happen). Partitions are
    checked smallest first against one shared deadline, so a timeout in one
    big partition still leaves room to find a violation in the small ones;
    any violation is definitive, while a timeout only makes the answer
    ``unknown``.
    """
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    ops = [op for op in history if op.status != "fail"]
    partitions = sorted(model.partition(ops), key=len)
    timed_out: list[Hashable | None] = []
    for part in partitions:
        outcome = _search(model, part, deadline)
        if outcome.verdict is Verdict.NOT_LINEARIZABLE:
            failure = PartitionFailure(
                key=_common_key(part),
                operations=len(part),
                longest_linearization=tuple(part[i] for i in outcome.longest),
                stuck=tuple(part[i] for i in outcome.stuck),
                blocking=part[outcome.blocking],
                state=outcome.state,
            )
            return CheckResult(
                verdict=Verdict.NOT_LINEARIZABLE,
                partitions=len(partitions),
                elapsed=time.monotonic() - started,
                explanation=explain(model, failure),
                failure=failure,
            )
        if outcome.verdict is Verdict.UNKNOWN:
            timed_out.append(_common_key(part))
    elapsed = time.monotonic() - started
    if timed_out:
        return CheckResult(
            verdict=Verdict.UNKNOWN,
            partitions=len(partitions),
            elapsed=elapsed,
            explanation=f"timed out after {timeout}s on {len(timed_out)} of "
            f"{len(partitions)} partitions (keys {timed_out!r}); no violation found in the rest",
            timed_out_keys=tuple(timed_out),
        )
    return CheckResult(
        verdict=Verdict.LINEARIZABLE,
        partitions=len(partitions),
        elapsed=elapsed,
        explanation=f"all {len(ops)} operations in {len(partitions)} partitions linearized",
    )


def _common_key(part: Sequence[Operation]) -> Hashable | None:
    """The partition's key, or None when it mixes keys (an unpartitioned model)."""
    keys = {op.key for op in part}
    return keys.pop() if len(keys) == 1 else None


def explain(model: Model[Any], failure: PartitionFailure, tail: int = 10) -> str:
    """Render a failure: the end of the longest legal prefix and what could not follow it."""

    def line(op: Operation) -> str:
        end = "never" if op.status == "info" else op.return_time
        return f"    {model.describe_operation(op)}  (process {op.process}, {op.call_time}..{end})"

    prefix = failure.longest_linearization
    lines = [
        f"not linearizable: partition key={failure.key!r} ({failure.operations} operations)",
        f"  longest linearizable prefix: {len(prefix)} operations"
        + (f", last {tail}:" if len(prefix) > tail else ":"),
    ]
    lines += [line(op) for op in prefix[-tail:]] or ["    (none)"]
    lines.append(f"  model state after it: {failure.state!r}")
    lines.append("  none of these could be linearized next:")
    lines += [line(op) for op in failure.stuck]
    lines.append("  yet this one had already returned, so it must have taken effect:")
    lines.append(line(failure.blocking))
    return "\n".join(lines)
