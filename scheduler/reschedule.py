"""Rescheduling failed allocations per the task group's ReschedulePolicy (Nomad's rules).

- Eligible only if the policy is unlimited, or the reschedule events inside
  the sliding ``interval`` (counted back from the failure) are fewer than
  ``attempts``.
- The next delay is ``delay`` (constant), the last delay doubled
  (exponential) or the sum of the last two (fibonacci: 5, 5, 10, 15, 25 s),
  capped at ``max_delay``; once at the cap the series starts again at
  ``delay`` if the alloc ran longer than ``max_delay`` since its last
  reschedule.
- An alloc is replaced now if its reschedule time is within a one-second
  window of ``now`` (or it is this follow-up eval's own alloc); otherwise a
  follow-up evaluation waits until then. Failures within five seconds of
  each other share one follow-up evaluation.
- Node loss and drain replace allocs without consulting the policy; system
  jobs have no policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fsm.structs import (
    CLIENT_FAILED,
    HOUR,
    SECOND,
    Allocation,
    Job,
    RescheduleEvent,
    ReschedulePolicy,
    RescheduleTracker,
    TaskGroup,
)

RESCHEDULE_WINDOW = 1 * SECOND
FOLLOWUP_BATCH_WINDOW = 5 * SECOND

Decision = Literal["now", "later", "never"]


def default_policy(job_type: str) -> ReschedulePolicy | None:
    """Nomad's defaults (``structs.DefaultBatchJobReschedulePolicy`` and the service one): batch 1 attempt
    in 24h, 5s constant, no delay ceiling; service unlimited, 30s exponential up to 1h.

    The job spec fills the same defaults in (``node.spec.reschedule``); this is
    for a stored job whose group has none.
    """
    if job_type == "batch":
        return ReschedulePolicy(
            attempts=1, interval=24 * HOUR, delay=5 * SECOND, delay_function="constant", max_delay=0, unlimited=False
        )
    if job_type == "service":
        return ReschedulePolicy()
    return None


def policy_for(job: Job, group: TaskGroup) -> ReschedulePolicy | None:
    if job.type == "system":
        return None
    return group.reschedule_policy if group.reschedule_policy is not None else default_policy(job.type)


def fail_time(alloc: Allocation, skew: int = 0) -> int:
    """When the alloc failed, in the state's time: its tasks' latest finish time (a client's
    wall clock, moved by ``skew``, how far the state's time runs ahead), else its modify time."""
    finished = [t.finished_at for t in alloc.task_states.values() if t.finished_at]
    return max(finished) + skew if finished else alloc.modify_time


def _events(alloc: Allocation) -> list[RescheduleEvent]:
    return alloc.reschedule_tracker.events if alloc.reschedule_tracker is not None else []


def eligible(policy: ReschedulePolicy | None, alloc: Allocation, failed_at: int) -> bool:
    if policy is None:
        return False
    if policy.unlimited:
        return True
    if policy.attempts <= 0:
        return False
    window_start = failed_at - policy.interval
    attempted = sum(1 for e in _events(alloc) if e.reschedule_time > window_start)
    return attempted < policy.attempts


def next_delay(policy: ReschedulePolicy, alloc: Allocation, skew: int = 0) -> int:
    events = _events(alloc)
    delay = policy.delay
    if not events:
        return delay
    if policy.delay_function == "exponential":
        delay = events[-1].delay * 2
    elif policy.delay_function == "fibonacci":
        if len(events) >= 2:
            n1, n2 = events[-1].delay, events[-2].delay
            # A series reset at the cap starts over: (max, delay) -> delay.
            delay = n1 if (n2 == policy.max_delay and n1 == policy.delay) else n1 + n2
    else:
        return delay
    if policy.max_delay > 0 and delay > policy.max_delay:
        delay = policy.max_delay
        if fail_time(alloc, skew) - events[-1].reschedule_time > delay:
            delay = policy.delay
    return delay


@dataclass(frozen=True)
class RescheduleDecision:
    decision: Decision
    at: int = 0  # when to replace it (for "now" and "later")
    delay: int = 0


def decide(policy: ReschedulePolicy | None, alloc: Allocation, now: int, eval_id: str, skew: int = 0) -> RescheduleDecision:
    """Whether a failed alloc is replaced now, later (follow-up eval) or never.

    ``now`` is the state's time. After a leader whose clock ran ahead, that time
    stays ahead of the wall clock (the FSM's time never goes back) by ``skew``;
    a client's finish time is moved by it, so a failure is as old as it really is.
    """
    failed_at = min(fail_time(alloc, skew), now)
    if not eligible(policy, alloc, failed_at):
        return RescheduleDecision("never")
    assert policy is not None
    delay = next_delay(policy, alloc, skew)
    if not policy.unlimited and _events(alloc) and delay >= policy.interval:
        return RescheduleDecision("never")  # as Nomad: a limited policy's next delay must fit in its interval
    at = failed_at + delay
    if alloc.followup_eval_id and alloc.followup_eval_id == eval_id:
        return RescheduleDecision("now", at, delay)
    if at <= now + RESCHEDULE_WINDOW:
        return RescheduleDecision("now", at, delay)
    return RescheduleDecision("later", at, delay)


def penalty_nodes(prev: Allocation) -> frozenset[str]:
    """The nodes a replacement of ``prev`` should avoid: where it failed, and every node its tracker lists.

    Nomad's ``getSelectOptions`` feeds these to ``NodeReschedulingPenaltyIterator``:
    an alloc that failed on node A, then on B, is not sent back to A.
    """
    nodes = {e.prev_node_id for e in _events(prev) if e.prev_node_id}
    if prev.client_status == CLIENT_FAILED and prev.node_id:
        nodes.add(prev.node_id)
    return frozenset(nodes)


def next_tracker(prev: Allocation, now: int, delay: int, policy: ReschedulePolicy | None) -> RescheduleTracker:
    """The replacement's tracker: the previous events (within the interval, or the last few) plus this one."""
    events = list(_events(prev))
    if policy is not None and not policy.unlimited and policy.interval > 0:
        events = [e for e in events if e.reschedule_time > now - policy.interval]
    else:
        events = events[-9:]
    events.append(RescheduleEvent(reschedule_time=now, prev_alloc_id=prev.id, prev_node_id=prev.node_id, delay=delay))
    return RescheduleTracker(events=events)


def batch_followups(times: list[tuple[str, int]]) -> list[tuple[int, list[str]]]:
    """Group (alloc id, reschedule time) pairs into follow-up evals: one per 5 s window."""
    out: list[tuple[int, list[str]]] = []
    for alloc_id, at in sorted(times, key=lambda p: (p[1], p[0])):
        if out and at - out[-1][0] <= FOLLOWUP_BATCH_WINDOW:
            out[-1][1].append(alloc_id)
        else:
            out.append((at, [alloc_id]))
    return out
