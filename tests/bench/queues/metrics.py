"""The figures, from the workloads' records, as Kueue's recorder and checker compute them.

Kueue (``runner/recorder/recorder.go``, ``checker/checker_test.go``):

- **wall time**: the lifetime of the minimalkueue process, started before the
  generator creates the ClusterQueues and stopped once generation is done and
  no queue holds a pending or reserving workload. Here: from just before the
  queues are created to the entry that finished the last workload (cluster
  and simulated clients already up, as Kueue's envtest is).
- **minimum ClusterQueue usage**: per ClusterQueue *class* (the baseline has
  one, ``cq``: all 30 queues), the integral over time of each queue's cpu
  usage (``status.flavorsUsage``: what its admitted workloads hold), summed
  over the class's queues, divided by the sum of their nominal quotas times
  the monitoring window (first queue event to last), in percent; the check
  takes the minimum over classes, so with one class it is that class's
  figure. Here the usage of a queue moves exactly when an admission,
  eviction or finish is applied, so the integral is the sum over workloads
  of request x time admitted, each interval from ``admitted_time`` to the
  entry time (``modify_time``) of the record that took the workload out of
  the admitted state. The window runs from the first ``queue.upsert`` to the
  last finish. We also show the minimum over the 30 queues of each queue's
  own average (borrowing lets one exceed 100%).
- **average time to admission, per workload class**: from the recorder's
  first sight of the workload to its last transition to Admitted (an
  evicted workload's figure is its re-admission). Here: ``admitted_time``
  (last admission) minus ``create_time`` (the entry that registered the
  job), from the Workload records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.bench.queues.plan import NOMINAL, UNIT_MHZ, Plan, class_of

NS = 1e9


def queue_of(job: str) -> str:
    return job.rsplit("-", 2)[0]


@dataclass
class Track:
    """One workload (or, with no queue, one job) as its records went by."""

    cls: str
    create_ns: int
    units: float = 0.0
    admitted_ns: int = 0  # the last admission
    open_ns: int | None = None  # admitted since, and not yet out
    held: list[tuple[int, int]] = field(default_factory=list)  # (admitted, out) intervals
    evictions: int = 0
    finished_ns: int = 0
    # ``--breakdown``: alloc id -> [created, running, ended]; eval id -> (trigger, status, time)
    allocs: dict[str, list[int]] = field(default_factory=dict)
    evals: dict[str, tuple[str, str, int]] = field(default_factory=dict)


class Tracks:
    """Every workload's history, fed with ``event.stream`` records (Workload or Job topic)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Track] = {}
        self.finished = 0
        self.admitted_now = 0
        self.last_ns = 0

    def workload(self, key: str, wl: dict[str, Any] | None) -> None:
        """A Workload record (``WorkloadUpdated``; a deletion is ignored)."""
        if wl is None:
            return
        t = self.jobs.get(key)
        if t is None:
            usage = wl.get("usage") or {}
            t = self.jobs[key] = Track(class_of(key), int(wl.get("create_time") or 0),
                                       usage.get("cpu", 0) / UNIT_MHZ)  # fmt: skip
        state, at = wl.get("state"), int(wl.get("modify_time") or 0)
        if state == "admitted":
            if t.open_ns is None:
                t.open_ns = int(wl.get("admitted_time") or at)
                self.admitted_now += 1
            t.admitted_ns = int(wl.get("admitted_time") or at)
            return
        if t.open_ns is not None:
            t.held.append((t.open_ns, at))
            t.open_ns = None
            self.admitted_now -= 1
            if state == "pending":
                t.evictions += 1
        if state == "finished" and not t.finished_ns:
            t.finished_ns = at
            self.finished += 1
            self.last_ns = max(self.last_ns, at)

    def alloc(self, alloc: dict[str, Any] | None) -> None:
        """An Allocation record (``--breakdown``): when it was placed, reported running, and ended."""
        if alloc is None or alloc.get("job_id") not in self.jobs:
            return
        times = self.jobs[alloc["job_id"]].allocs.setdefault(alloc["id"], [0, 0, 0])
        times[0] = times[0] or int(alloc.get("create_time") or 0)
        status, at = alloc.get("client_status"), int(alloc.get("modify_time") or 0)
        if status == "running" and not times[1]:
            times[1] = at
        elif status in ("complete", "failed", "lost") and not times[2]:
            times[2] = at

    def eval(self, ev: dict[str, Any] | None) -> None:
        """An Evaluation record (``--breakdown``): its trigger, and when it last changed status."""
        if ev is None or ev.get("job_id") not in self.jobs:
            return
        t = self.jobs[ev["job_id"]]
        t.evals[ev["id"]] = (ev.get("triggered_by", ""), ev.get("status", ""),
                             int(ev.get("modify_time") or 0))  # fmt: skip

    def job(self, key: str, job: dict[str, Any] | None) -> None:
        """A Job record (the no-queue baseline): created, and dead once its alloc completed."""
        if job is None:
            return
        t = self.jobs.get(key)
        if t is None:
            t = self.jobs[key] = Track(class_of(key), int(job.get("create_time") or 0))
        if job.get("status") == "dead" and not t.finished_ns:
            t.finished_ns = int(job.get("modify_time") or 0)
            self.finished += 1
            self.last_ns = max(self.last_ns, t.finished_ns)


@dataclass
class Figures:
    workloads: int
    finished: int
    wall_s: float
    usage_pct: float  # Kueue's: the class's usage integral over nominal x window
    min_queue_usage_pct: float  # the least of the 30 queues' own averages
    useful_usage_pct: float  # the work (request x runtime) over nominal x window
    admission_s: dict[str, float]  # class -> mean time to admission
    admission_from_send_s: dict[str, float]  # class -> mean from the bench's register call
    turnaround_s: dict[str, float]  # class -> mean create -> finished
    evictions: int
    # ``--breakdown``: step -> mean seconds (and eval counts)
    breakdown: dict[str, float] = field(default_factory=dict)


def breakdown(tracks: Tracks) -> dict[str, float]:
    """Where a workload's time goes after admission, from its completed alloc's records: means, s."""
    steps: dict[str, list[float]] = {}
    for t in tracks.jobs.values():
        done = [a for a in t.allocs.values() if all(a)]
        if not done or not t.admitted_ns or not t.finished_ns:
            continue
        placed, running, ended = max(done, key=lambda a: a[0])
        for name, a, b in (("admitted -> placed (eval, schedule, plan)", t.admitted_ns, placed),
                           ("placed -> running reported (client)", placed, running),
                           ("running -> ended reported (run_for + report)", running, ended),
                           ("ended -> workload finished", ended, t.finished_ns)):  # fmt: skip
            steps.setdefault(name, []).append((b - a) / NS)
    out = {k: sum(v) / len(v) for k, v in steps.items()}
    evals = [len(t.evals) for t in tracks.jobs.values() if t.evals]
    if evals:
        out["evals per workload"] = sum(evals) / len(evals)
        last: dict[str, int] = {}
        for t in tracks.jobs.values():
            if t.evals and t.finished_ns:
                trig = max(t.evals.values(), key=lambda e: e[2])
                key = f"last eval before finished: {trig[0]} ({trig[1]})"
                last[key] = last.get(key, 0) + 1
        out.update({k: float(v) for k, v in last.items()})
    return out


def figures(plan: Plan, tracks: Tracks, t0: float, submitted: dict[str, float],
            *, queued: bool) -> Figures:  # fmt: skip
    """The run's figures; ``t0``: wall time just before the queues were created."""
    done = [t for t in tracks.jobs.values() if t.finished_ns]
    end_ns = max((t.finished_ns for t in done), default=0)
    window_s = max(1e-9, end_ns / NS - t0)
    used: dict[str, float] = {}
    for job, t in tracks.jobs.items():
        held = sum(b - a for a, b in t.held) / NS
        used[queue_of(job)] = used.get(queue_of(job), 0.0) + t.units * held
    names = [q for q, _ in plan.queues()]
    usage = 100 * sum(used.values()) / (plan.nominal_units * window_s)
    per_queue = [100 * used.get(q, 0.0) / (NOMINAL * window_s) for q in names]

    def mean_by_class(value: Any) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for job, t in tracks.jobs.items():
            v = value(job, t)
            if v is not None:
                out.setdefault(t.cls, []).append(v)
        return {c: sum(v) / len(v) for c, v in out.items()}

    admission = mean_by_class(
        lambda j, t: (t.admitted_ns - t.create_ns) / NS if t.admitted_ns else None
    )
    from_send = mean_by_class(
        lambda j, t: t.admitted_ns / NS - submitted[j] if t.admitted_ns and j in submitted else None
    )
    turnaround = mean_by_class(
        lambda j, t: (t.finished_ns - t.create_ns) / NS if t.finished_ns else None
    )
    return Figures(
        workloads=len(tracks.jobs),
        finished=len(done),
        wall_s=window_s,
        usage_pct=usage if queued else 0.0,
        min_queue_usage_pct=min(per_queue) if queued and per_queue else 0.0,
        useful_usage_pct=100 * plan.unit_seconds / (plan.nominal_units * window_s),
        admission_s=admission,
        admission_from_send_s=from_send,
        turnaround_s=turnaround,
        evictions=sum(t.evictions for t in tracks.jobs.values()),
        breakdown=breakdown(tracks),
    )
