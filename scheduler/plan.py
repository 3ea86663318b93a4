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
# A plan of at most this many records is first measured whole: one encoding instead of one per
# record and another per body (most plans place one alloc; a larger one that does not fit wastes one).
WHOLE_MAX_RECORDS = 64


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


def logged_size(obj: Any) -> int:
    """Bytes one record adds to an entry as the raft log stores it.

    pysyncobj pickles the entry's bytes as a latin-1 string written in UTF-8
    (bytes >= 0x80 take two), which this reproduces exactly for the record's
    msgpack; list headers add a few bytes more, which the margin covers.
    """
    return len(codec.pack(codec.to_wire(obj)).decode("latin-1").encode("utf-8"))


def to_entries(
    plan: Plan,
    max_bytes: int,
    measure: Callable[[Any], int] | None = None,
    *,
    margin: int = ENTRY_MARGIN,
    item_size: Callable[[Any], int] | None = None,
) -> list[PlanApply]:
    """PlanApply bodies of at most ``max_bytes`` each (as ``measure`` counts them), in commit order.

    A small plan that fits in one body whole (the common case) is that body,
    measured once. Otherwise items are packed greedily by ``item_size``
    (default: what they add as ``measure`` sees it, one probe body per item);
    every body is then measured whole and split again in the rare case it
    came out too big.
    """
    measure = measure or (lambda body: approx_size(body))
    if _records(plan) <= WHOLE_MAX_RECORDS:
        whole = _whole_body(plan)
        if measure(whole) <= max_bytes - margin:
            return [whole]
    base = measure(_empty_body(plan))
    sized = _item_sizer(plan, measure, base, item_size)
    out: list[PlanApply] = []
    for body in _pack(plan, sized, max_bytes - margin - base):
        out.extend(_fit(body, max_bytes - margin // 2, measure))
    return out


def _records(plan: Plan) -> int:
    return len(plan.place) + len(plan.stop) + len(plan.evals) + (plan.deployment is not None)


def _whole_body(plan: Plan) -> PlanApply:
    """The whole plan in one body, in the order ``_pack`` fills one (deployment, stops, placements, evals)."""
    body = _empty_body(plan)
    body.deployment = plan.deployment
    body.allocs_to_stop.extend(plan.stop)
    body.allocs_to_place.extend(plan.place)
    body.evals.extend(plan.evals)
    return body


def _empty_body(plan: Plan) -> PlanApply:
    """A body with only the plan's ids: each entry starts as one, and sizes are measured beyond one."""
    return PlanApply(eval_id=plan.eval_id, job_id=plan.job_id)


def _add(body: PlanApply, kind: str, obj: Any) -> None:
    """Put one of a plan's records (its ``kind``: deployment, stop, place or eval) in ``body``."""
    if kind == "deployment":
        body.deployment = obj
    elif kind == "stop":
        body.allocs_to_stop.append(obj)
    elif kind == "place":
        body.allocs_to_place.append(obj)
    else:
        body.evals.append(obj)


def _has_any(body: PlanApply) -> bool:
    """Whether ``body`` holds a record: an empty one is only written when the plan has none at all."""
    return bool(body.allocs_to_place or body.allocs_to_stop or body.deployment is not None or body.evals)


def _item_sizer(
    plan: Plan, measure: Callable[[Any], int], base: int, item_size: Callable[[Any], int] | None
) -> Callable[[str, Any], int]:
    """How many bytes one record adds to a body: by ``item_size`` (plus a few for its place in a list),
    else what a probe body holding just that record measures beyond an empty one (``base``)."""

    def sized(kind: str, obj: Any) -> int:
        if item_size is not None:
            return item_size(obj) + 8
        probe = _empty_body(plan)
        _add(probe, kind, obj)
        return measure(probe) - base

    return sized


def _pack(plan: Plan, sized: Callable[[str, Any], int], budget: int) -> list[PlanApply]:
    """The plan's records packed greedily into bodies of at most ``budget`` bytes (as ``sized`` counts).

    The deployment comes first (placed allocs refer to it), stops before placements
    (they free what the placements use), and the evaluations together in the last
    body, one of their own if they do not fit beside the rest.
    """
    items: list[tuple[str, Any]] = []
    if plan.deployment is not None:
        items.append(("deployment", plan.deployment))
    items += [("stop", s) for s in plan.stop]
    items += [("place", a) for a in plan.place]
    tail = [("eval", e) for e in plan.evals]
    tail_size = sum(sized(k, o) for k, o in tail)
    if tail_size > budget:
        raise PlanTooLargeError(f"the evaluations of plan {plan.eval_id} need {tail_size} bytes, more than one entry")
    bodies: list[PlanApply] = []
    current = _empty_body(plan)
    used = 0
    for kind, obj in items:
        size = sized(kind, obj)
        if size > budget:
            raise PlanTooLargeError(f"one {kind} of plan {plan.eval_id} needs {size} bytes, more than one entry")
        if used + size > budget and _has_any(current):
            bodies.append(current)
            current = _empty_body(plan)
            used = 0
        _add(current, kind, obj)
        used += size
    if used + tail_size > budget and _has_any(current):
        bodies.append(current)
        current = _empty_body(plan)
    for kind, obj in tail:
        _add(current, kind, obj)
    if _has_any(current) or not bodies:
        bodies.append(current)
    return bodies


def _fit(body: PlanApply, limit: int, measure: Callable[[Any], int]) -> list[PlanApply]:
    """``body`` as is if it measures within ``limit``, else halved (evals stay in the last half)."""
    if measure(body) <= limit:
        return [body]
    items: list[tuple[str, Any]] = [("stop", s) for s in body.allocs_to_stop] + [("place", a) for a in body.allocs_to_place]
    if len(items) < 2:
        raise PlanTooLargeError(f"an entry of plan {body.eval_id} does not fit in {limit} bytes")
    half = len(items) // 2
    first = PlanApply(eval_id=body.eval_id, job_id=body.job_id, deployment=body.deployment)
    second = PlanApply(eval_id=body.eval_id, job_id=body.job_id, evals=list(body.evals))
    for target, chunk in ((first, items[:half]), (second, items[half:])):
        for kind, obj in chunk:
            (target.allocs_to_stop if kind == "stop" else target.allocs_to_place).append(obj)
    return _fit(first, limit, measure) + _fit(second, limit, measure)
