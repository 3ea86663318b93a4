"""Availability under faults: how long the cluster stopped answering after each fault.

A pure function of what a run recorded (the histories and the nemesis's
fault windows), so ``python -m jepsen_like check DIR`` recomputes it.

Times are measured from when the fault took effect (``at``: the nemesis
records a window's start before it injects and the moment the injection was
done, e.g. the partition cut; runs recorded before that field use the start).
For every fault window:

* ``resume`` -- seconds from ``at`` to the first successful operation
  *invoked at or after* it. Only an operation that began after the fault
  proves the cluster served after it: one in flight when the fault hit may
  have committed just before (an isolated leader's answer to an entry its
  followers had already acknowledged). Every counted operation needs a
  quorum (writes, and reads, which are linearizable through a barrier), so
  it was served by the majority side. Reads marked ``stale`` (any server's
  own state) and the final reads after the heal are not counted.
* ``stall`` -- the longest stretch without any successful completion (of any
  operation, in flight or not) from ``at`` to the ``horizon``: the start of
  the next fault that begins after this one ended, or the end of the fault
  phase. It includes what the heal costs (a returning server that deposes
  the leader), since clients feel that too.
* ``leader_hit`` -- whether the leader at the fault's start was among its
  targets (``None`` when the run did not record the leader: runs before the
  field existed, where only a "(leader)" choice in the detail tells).

Windows are grouped by kind and by whether they hit the leader, with the
median ``resume`` and the median and largest ``stall`` of each group.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from jepsen_like.checkers import CheckerResult
from jepsen_like.history import Operation
from jepsen_like.recorder import Fault


@dataclass(frozen=True)
class WindowAvailability:
    """What clients saw in one fault window (times in seconds since the run began)."""

    kind: str
    start: float
    #: when the fault took effect (the nemesis finished injecting it); times are measured from here
    at: float
    end: float | None
    targets: list[str]
    leader: str | None
    leader_hit: bool | None
    #: seconds from ``at`` to the first ok completion of an operation invoked after it
    resume: float | None
    #: longest stretch without an ok completion in [at, horizon]
    stall: float
    horizon: float
    #: kinds of the other windows that overlapped this one
    overlaps: list[str] = field(default_factory=list)

    @property
    def role(self) -> str:
        """``leader``, ``follower`` (the fault missed the leader) or ``unknown``."""
        if self.leader_hit is None:
            return "unknown"
        return "leader" if self.leader_hit else "follower"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"role": self.role}


def counted(op: Operation) -> bool:
    """Whether an ok ``op`` shows the majority serving (not a stale or final read)."""
    if op.status != "ok" or op.return_time is None:
        return False
    value = op.input if isinstance(op.input, dict) else {}
    return not value.get("stale") and not value.get("final")


def leader_hit(fault: Fault) -> bool | None:
    """Whether the leader at the fault's start was a target (None: not recorded)."""
    if fault.leader is not None:
        return fault.leader in fault.targets
    if "(leader)" in fault.detail:  # recorded before the leader was: the nemesis aimed at it
        return True
    return None


def windows(
    ops: Mapping[str, Sequence[Operation]], faults: Sequence[Fault], faults_end: float | None = None
) -> list[WindowAvailability]:
    """Availability of every fault window, in the order the faults began.

    ``faults_end`` is when the run stopped its faults and load (the
    ``faults_end`` phase); without it, the last completion or fault end.
    """
    fresh = _counted(ops)
    done = sorted(ret for _, ret in fresh)
    ordered = sorted(faults, key=lambda f: f.start)
    if faults_end is None:
        faults_end = max(done + [f.end or f.start for f in faults], default=0.0)
    out = []
    for fault in ordered:
        at = effective(fault)
        over = fault.end if fault.end is not None else faults_end
        later = [f.start for f in ordered if f is not fault and f.start >= over]
        horizon = min(later) if later else max(over, faults_end)
        resume = min(
            (ret - at for call, ret in fresh if call >= at and ret <= horizon), default=None
        )
        out.append(
            WindowAvailability(
                kind=fault.kind,
                start=fault.start,
                at=at,
                end=fault.end,
                targets=list(fault.targets),
                leader=fault.leader,
                leader_hit=leader_hit(fault),
                resume=_round(resume),
                stall=_round(_longest_gap(done, at, horizon)) or 0.0,
                horizon=horizon,
                overlaps=[
                    f.kind
                    for f in ordered
                    if f is not fault and f.start < over and (f.end or faults_end) > fault.start
                ],
            )
        )
    return out


def effective(fault: Fault) -> float:
    """When the fault took effect: once injected (runs before that field: its start)."""
    return fault.injected if fault.injected is not None else fault.start


def by_kind(found: Sequence[WindowAvailability]) -> dict[str, dict[str, Any]]:
    """Per ``kind/role``: windows, never resumed, median resume, median and largest stall."""
    groups: dict[str, list[WindowAvailability]] = {}
    for w in found:
        groups.setdefault(f"{w.kind}/{w.role}", []).append(w)
    out = {}
    for name in sorted(groups):
        group = groups[name]
        resumes = [w.resume for w in group if w.resume is not None]
        stalls = [w.stall for w in group]
        out[name] = {
            "windows": len(group),
            "never_resumed": len(group) - len(resumes),
            "median_resume": _round(statistics.median(resumes)) if resumes else None,
            "max_resume": max(resumes) if resumes else None,
            "median_stall": _round(statistics.median(stalls)),
            "max_stall": max(stalls),
        }
    return out


def summary_lines(details: Mapping[str, Any]) -> list[str]:
    """The summary's section, from :func:`result`'s details: a line per window, then per group."""
    found = details.get("windows") or []
    if not found:
        return []
    lines = [
        "availability (resume: from the fault to the first ok operation invoked after it; "
        "stall: longest time without an ok completion until the next fault):"
    ]
    for w in found:
        resume = f"{w['resume']:6.2f}s" if w["resume"] is not None else "  never"
        with_ = f"  with {'+'.join(w['overlaps'])}" if w.get("overlaps") else ""
        lines.append(
            f"  {w['start']:7.1f}s {w['kind']:12} {'+'.join(w['targets']) or '-':16} {w['role']:8} "
            f"resume {resume}  stall {w['stall']:5.2f}s{with_}"
        )
    for name, g in (details.get("by_kind") or {}).items():
        resume = (
            f"median resume {g['median_resume']:.2f}s, max {g['max_resume']:.2f}s"
            if g["median_resume"] is not None
            else "never resumed"
        )
        never = (
            f", {g['never_resumed']} never resumed"
            if g["never_resumed"] and g["median_resume"] is not None
            else ""
        )
        lines.append(
            f"  {name:24} {g['windows']:3} windows: {resume}; stall median "
            f"{g['median_stall']:.2f}s, max {g['max_stall']:.2f}s{never}"
        )
    return lines


def _counted(ops: Mapping[str, Sequence[Operation]]) -> list[tuple[float, float]]:
    return sorted(
        (float(op.call_time), float(op.return_time))  # type: ignore[arg-type]
        for group in ops.values()
        for op in group
        if counted(op)
    )


def _longest_gap(done: Sequence[float], start: float, horizon: float) -> float:
    """Longest stretch of [start, horizon] between successive times in ``done``."""
    points = [start] + [t for t in done if start < t <= horizon] + [horizon]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def result(found: Sequence[WindowAvailability]) -> CheckerResult:
    """The availability figures as an entry of results.json (informational: always ``ok``)."""
    kinds = by_kind(found)
    medians = ", ".join(
        f"{name} {g['median_resume']:.2f}s" if g["median_resume"] is not None else f"{name} never"
        for name, g in kinds.items()
    )
    return CheckerResult(
        "availability",
        None,
        "ok",
        f"{len(found)} fault windows; median time to the first ok operation: {medians or 'n/a'}",
        details={"windows": [w.to_json() for w in found], "by_kind": kinds},
    )
