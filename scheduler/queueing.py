"""Admission cycles and preemption for queues with cohorts, as Kueue decides them.

Pure functions of a ``Line`` (the queues, their ledger, and who waits and
runs where): the leader runs them and commits what they decide as one
``QueueAdmission`` entry; the FSM re-checks each admission against the
ledger when it applies it (``fsm.quota``). A reference model in the tests
runs the same cycles one decision at a time.

One cycle, as Kueue's scheduler:

- each queue that is not held offers a head: the first in line (priority,
  then submission) with StrictFIFO; with BestEffortFIFO the first that can
  be admitted, by quota or by preempting;
- heads are taken in order: those that fit without borrowing first, then by
  priority, then by submission;
- a head that fits is admitted (borrowing within its limits, from what its
  cohort leaves unused of its lendable quota);
- one that does not may preempt (``victims``); the victims return to their
  lines and the preemptor is admitted in a later cycle, once they are gone;
  no other head of that cohort is admitted in this cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fsm.queues import (
    ANY,
    LOWER_OR_NEWER_EQUAL,
    LOWER_PRIORITY,
    NEVER,
    REASON_DRAIN,
    REASON_PRIORITY,
    REASON_RECLAIM,
    STOP_HOLD_AND_DRAIN,
    STOP_NONE,
    STRICT_FIFO,
    WL_ADMITTED,
    Queue,
    Workload,
)
from fsm.quota import Ledger
from fsm.store import StateReader


@dataclass(frozen=True)
class Waiting:
    """A workload in a queue's line, or admitted in it (``admitted_index`` > 0)."""

    job_id: str
    queue: str
    priority: int
    create_index: int
    usage: Mapping[str, int]
    admitted_index: int = 0
    namespace: str = "default"

    @classmethod
    def of(cls, wl: Workload) -> Waiting:
        admitted = wl.admitted_index if wl.state == WL_ADMITTED else 0
        return cls(
            wl.job_id, wl.queue, wl.priority, wl.create_index, wl.usage, admitted, wl.namespace
        )


@dataclass
class Line:
    """Everything a cycle reads: the ledger (queues and usage), and the lines and admitted sets."""

    ledger: Ledger
    pending: dict[str, list[Waiting]] = field(default_factory=dict)  # queue -> line order
    admitted: dict[str, list[Waiting]] = field(default_factory=dict)  # queue -> admitted workloads


@dataclass(frozen=True)
class Evicted:
    victim: Waiting
    reason: str  # fsm.queues REASON_*
    message: str
    preemptor: str = ""


@dataclass
class Decisions:
    admits: list[Waiting] = field(default_factory=list)
    evictions: list[Evicted] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.admits or self.evictions)


def load_ledger(reader: StateReader) -> Ledger:
    """Every queue and what each has admitted, at one index."""
    queues = reader.queues()
    return Ledger.build(queues, ((q.name, reader.queue_usage(q.name)) for q in queues))


def load_line(reader: StateReader, *, per_queue: int | None = 256) -> Line:
    """The queues, their ledger, and (the first ``per_queue`` of) each line, at one index."""
    line = Line(load_ledger(reader))
    queues = line.ledger.queues.values()
    for q in queues:
        line.pending[q.name] = [Waiting.of(w) for w in reader.pending_workloads(q.name, per_queue)]
        line.admitted[q.name] = [Waiting.of(w) for w in reader.admitted_workloads(q.name)]
    return line


def line_order(w: Waiting) -> tuple[int, int, str]:
    """Kueue's order within a queue: higher priority first, then earlier submission."""
    return (-w.priority, w.create_index, w.job_id)


def path(queue: Queue) -> str:
    """Kueue's workload path in messages: /cohort/queue (a queue without a cohort: /queue)."""
    return f"/{queue.cohort}/{queue.name}" if queue.cohort else f"/{queue.name}"


def plan(line: Line, *, max_admits: int = 256, max_cycles: int = 64) -> Decisions:
    """Run cycles on ``line`` (changing it) until nothing moves or ``max_admits`` are admitted."""
    out = Decisions()
    out.evictions.extend(drain(line))
    for _ in range(max_cycles):
        step = cycle(line)
        out.admits.extend(step.admits)
        out.evictions.extend(step.evictions)
        if not step or len(out.admits) >= max_admits:
            break
    return out


def drain(line: Line) -> list[Evicted]:
    """Evict everything admitted in a HoldAndDrain queue (it returns to its line)."""
    out = []
    for name in sorted(line.admitted):
        queue = line.ledger.queues.get(name)
        if queue is None or queue.stop_policy != STOP_HOLD_AND_DRAIN:
            continue
        for victim in list(line.admitted[name]):
            message = f"The queue {name} is stopped (HoldAndDrain); preemptee path: {path(queue)}"
            out.append(_evict(line, Evicted(victim, REASON_DRAIN, message)))
    return out


def cycle(line: Line) -> Decisions:
    """One admission cycle (see the module docstring); changes ``line`` as it decides."""
    out = Decisions()
    heads = [h for h in (_head(line, q) for q in sorted(line.ledger.queues)) if h is not None]
    ledger = line.ledger
    heads.sort(key=lambda h: (not ledger.fits(h.queue, h.usage, borrow=False), *line_order(h)))
    preempting: set[str] = set()
    for head in heads:
        queue = ledger.queues[head.queue]
        cohort = queue.cohort or f"/{queue.name}"
        if cohort in preempting:
            continue
        if ledger.fits(head.queue, head.usage):
            _admit(line, head)
            out.admits.append(head)
            continue
        targets = victims(line, head)
        if targets:
            preempting.add(cohort)
            out.evictions.extend(_evict(line, ev) for ev in targets)
    return out


def _head(line: Line, name: str) -> Waiting | None:
    queue = line.ledger.queues[name]
    waiting = line.pending.get(name) or []
    if queue.stop_policy != STOP_NONE or not waiting:
        return None
    if queue.queueing_strategy == STRICT_FIFO:
        return waiting[0]
    refused: set[tuple[tuple[str, int], ...]] = set()
    for w in waiting:
        shape = tuple(sorted(w.usage.items()))
        if shape in refused:
            continue
        if line.ledger.fits(name, w.usage) or victims(line, w):
            return w
        refused.add(shape)
    return None


def _admit(line: Line, w: Waiting) -> None:
    line.pending[w.queue].remove(w)
    line.ledger.add(w.queue, w.usage)
    line.admitted.setdefault(w.queue, []).append(w)


def _evict(line: Line, ev: Evicted) -> Evicted:
    victim = ev.victim
    line.admitted[victim.queue].remove(victim)
    line.ledger.remove(victim.queue, victim.usage)
    back = Waiting(
        victim.job_id,
        victim.queue,
        victim.priority,
        victim.create_index,
        victim.usage,
        namespace=victim.namespace,
    )
    waiting = line.pending.setdefault(victim.queue, [])
    waiting.append(back)
    waiting.sort(key=line_order)
    return ev


# -- preemption ---------------------------------------------------------------------
def _within_queue_allows(policy: str, victim: Waiting, w: Waiting) -> bool:
    if policy == LOWER_PRIORITY:
        return victim.priority < w.priority
    if policy == LOWER_OR_NEWER_EQUAL:
        return victim.priority < w.priority or (
            victim.priority == w.priority and victim.create_index > w.create_index
        )
    return False


def _reclaim_allows(policy: str, victim: Waiting, w: Waiting) -> bool:
    return policy == ANY or (policy == LOWER_PRIORITY and victim.priority < w.priority)


def candidates(line: Line, w: Waiting) -> tuple[list[Waiting], list[Waiting]]:
    """Who ``w`` may preempt: in its own queue, and in the other queues of its cohort."""
    queue = line.ledger.queues[w.queue]
    same = [
        v for v in line.admitted.get(w.queue, []) if _within_queue_allows(queue.within_queue, v, w)
    ]
    others: list[Waiting] = []
    if queue.cohort and queue.reclaim_within_cohort != NEVER:
        for member in line.ledger.members(queue):
            if member.name != queue.name:
                others += [
                    v
                    for v in line.admitted.get(member.name, [])
                    if _reclaim_allows(queue.reclaim_within_cohort, v, w)
                ]
    return same, others


def victim_order(v: Waiting, own_queue: str) -> tuple[int, int, int, int, str]:
    """Kueue's candidate order: other queues' (borrowing) workloads first, lower priority,
    then the most recently admitted (within one entry, the later submission: cycles admit
    in line order)."""
    return (v.queue == own_queue, v.priority, -v.admitted_index, -v.create_index, v.job_id)


def victims(line: Line, w: Waiting) -> list[Evicted]:
    """A minimal set of admitted workloads whose eviction lets ``w`` fit, or [] if none does.

    As Kueue's classical preemption: with candidates in other queues, first
    try to fit ``w`` without borrowing (reclaiming what its queue lent);
    failing that (or with none), preempt in its own queue, borrowing allowed.
    """
    same, others = candidates(line, w)
    if not same and not others:
        return []
    found: list[Waiting] | None = None
    if others:
        found = minimal(
            line, w, sorted(same + others, key=lambda v: victim_order(v, w.queue)), borrow=False
        )
    if found is None and same:
        found = minimal(
            line, w, sorted(same, key=lambda v: victim_order(v, w.queue)), borrow=True
        )
    if not found:
        return []
    return [_record(line, w, v) for v in found]


def minimal(
    line: Line, w: Waiting, ordered: list[Waiting], *, borrow: bool
) -> list[Waiting] | None:
    """Remove candidates in order until ``w`` fits, then put back each one not needed (Kueue's fill-back)."""
    ledger = line.ledger.copy()
    if ledger.fits(w.queue, w.usage, borrow=borrow):
        return []  # nothing to preempt
    targets: list[Waiting] = []
    for v in ordered:
        if v.queue != w.queue and not any(ledger.borrowed(v.queue, r) > 0 for r in w.usage):
            continue  # its queue no longer borrows what w needs: evicting it reclaims nothing
        ledger.remove(v.queue, v.usage)
        targets.append(v)
        if ledger.fits(w.queue, w.usage, borrow=borrow):
            break
    else:
        return None
    for v in reversed(targets[:-1]):
        ledger.add(v.queue, v.usage)
        if ledger.fits(w.queue, w.usage, borrow=borrow):
            targets.remove(v)
        else:
            ledger.remove(v.queue, v.usage)
    return targets


def _record(line: Line, w: Waiting, v: Waiting) -> Evicted:
    """Kueue's preemption message: who, whom, why."""
    queues = line.ledger.queues
    reclaim = v.queue != w.queue
    why = "reclamation within the cohort" if reclaim else "prioritization in the queue"
    message = (
        f"Preempted to accommodate a workload (UID: {w.namespace}/{w.job_id}) due to {why}; "
        f"preemptor path: {path(queues[w.queue])}; preemptee path: {path(queues[v.queue])}"
    )
    return Evicted(v, REASON_RECLAIM if reclaim else REASON_PRIORITY, message, preemptor=w.job_id)


def reason(ledger: Ledger, queue_name: str, w: Waiting, head: str) -> str:
    """Why a workload in the queue's line waits, as ``queue pending`` shows it (one line).

    ``head``: the job id first in line (StrictFIFO holds the rest behind it).
    """
    queue = ledger.queues.get(queue_name)
    if queue is None:
        return f"queue {queue_name!r} does not exist"
    if queue.stop_policy != STOP_NONE:
        return f"queue {queue_name} is stopped ({queue.stop_policy}): it admits nothing new"
    if w.job_id != head and queue.queueing_strategy == STRICT_FIFO:
        return f"waiting behind {head}, the head of the line (StrictFIFO)"
    return ledger.shortfall(queue_name, w.usage) or "fits: admitted in the next cycle"
