"""A scheduler's plan, and how it becomes raft entries.

A plan holds what one evaluation wants: allocations to place (new ones and
in-place updates), allocations to stop, an optional new deployment, and the
evaluations to write once the plan is whole (the eval's own new status, a
blocked eval, follow-up evals).

One raft entry may hold at most ``max_entry_bytes``, so a large plan is cut
into several PlanApply entries, each self-consistent on its own: the new
deployment goes in the first (placed allocs refer to it), stops before
placements (they free what the placements use), and the evaluations only in
the last. A plan cut short — leadership lost between entries — thus never
marks its eval complete: the eval stays pending, and the next leader plans
again on a state that includes whatever did commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fsm import codec
from fsm.messages import AllocStop, PlanApply
from fsm.structs import Allocation, Deployment, Evaluation
from scheduler.errors import PlanTooLargeError

ENTRY_MARGIN = 512  # bytes kept free per entry for what measuring cannot see (time, request id)


@dataclass
class Plan:
    eval_id: str
    job_id: str
    snapshot_index: int = 0
    place: list[Allocation] = field(default_factory=list)
    stop: list[AllocStop] = field(default_factory=list)
    deployment: Deployment | None = None
    evals: list[Evaluation] = field(default_factory=list)  # written only with the whole plan
    inplace: set[str] = field(default_factory=set)  # ids in ``place`` that already exist
    blocked_eval_id: str = ""  # the blocked eval this plan creates or re-blocks
    failed: dict[str, int] = field(default_factory=dict)  # group -> placements that found no node

    @property
    def new_placements(self) -> list[Allocation]:
        return [a for a in self.place if a.id not in self.inplace]

    def nodes(self) -> set[str]:
        return {a.node_id for a in self.place}

    def without_nodes(self, rejected: Iterable[str]) -> Plan:
        """This plan minus every placement on ``rejected`` nodes, and without its evals."""
        drop = set(rejected)
        return Plan(
            eval_id=self.eval_id,
            job_id=self.job_id,
            snapshot_index=self.snapshot_index,
            place=[a for a in self.place if a.node_id not in drop],
            stop=list(self.stop),
            deployment=self.deployment,
            evals=[],
            inplace=set(self.inplace),
        )

    def empty(self) -> bool:
        return not (self.place or self.stop or self.deployment is not None or self.evals)


def approx_size(obj: Any) -> int:
    """Worst-case bytes one record adds to an entry (msgpack; the raft log may double high bytes)."""
    return 2 * len(codec.pack(codec.to_wire(obj)))


def to_entries(
    plan: Plan,
    max_bytes: int,
    measure: Callable[[Any], int] | None = None,
    *,
    margin: int = ENTRY_MARGIN,
) -> list[PlanApply]:
    """PlanApply bodies of at most ``max_bytes`` each (as ``measure`` counts them), in commit order."""
    measure = measure or (lambda body: approx_size(body))
    base = measure(PlanApply(eval_id=plan.eval_id, job_id=plan.job_id))

    def sized(kind: str, obj: Any) -> int:
        probe = PlanApply(eval_id=plan.eval_id, job_id=plan.job_id)
        if kind == "deployment":
            probe.deployment = obj
        elif kind == "stop":
            probe.allocs_to_stop = [obj]
        elif kind == "place":
            probe.allocs_to_place = [obj]
        else:
            probe.evals = [obj]
        return measure(probe) - base

    budget = max_bytes - margin - base
    items: list[tuple[str, Any]] = []
    if plan.deployment is not None:
        items.append(("deployment", plan.deployment))
    items += [("stop", s) for s in plan.stop]
    items += [("place", a) for a in plan.place]
    tail = [("eval", e) for e in plan.evals]

    bodies: list[PlanApply] = []
    current = PlanApply(eval_id=plan.eval_id, job_id=plan.job_id)
    used = 0

    def add(kind: str, obj: Any) -> None:
        if kind == "deployment":
            current.deployment = obj
        elif kind == "stop":
            current.allocs_to_stop.append(obj)
        elif kind == "place":
            current.allocs_to_place.append(obj)
        else:
            current.evals.append(obj)

    def has_any(body: PlanApply) -> bool:
        return bool(body.allocs_to_place or body.allocs_to_stop or body.deployment is not None or body.evals)

    tail_size = sum(sized(k, o) for k, o in tail)
    if tail_size > budget:
        raise PlanTooLargeError(f"the evaluations of plan {plan.eval_id} need {tail_size} bytes, more than one entry")
    for kind, obj in items:
        size = sized(kind, obj)
        if size > budget:
            raise PlanTooLargeError(f"one {kind} of plan {plan.eval_id} needs {size} bytes, more than one entry")
        if used + size > budget and has_any(current):
            bodies.append(current)
            current = PlanApply(eval_id=plan.eval_id, job_id=plan.job_id)
            used = 0
        add(kind, obj)
        used += size
    # The evaluations go last, in an entry of their own if they do not fit.
    if used + tail_size > budget and has_any(current):
        bodies.append(current)
        current = PlanApply(eval_id=plan.eval_id, job_id=plan.job_id)
    for kind, obj in tail:
        add(kind, obj)
    if has_any(current) or not bodies:
        bodies.append(current)
    return bodies
