"""The deployment watcher: ends rollouts of service jobs (leader only).

A deployment is created by the scheduler when a service job's new version
(or first version) places allocations; clients report each new alloc's
health once it has run for the group's ``min_healthy_time`` (or unhealthy
if it fails first), and the FSM counts them per task group. The watcher
decides, for every active deployment:

- *successful* when every group has ``healthy >= desired_total``;
- *failed* when no alloc became healthy within ``progress_deadline`` of the
  last progress (the deployment's start, the newest healthy alloc, or a
  resume: the FSM keeps ``require_progress_by``); or at once when an alloc
  was unhealthy and either its group has no progress deadline or the alloc
  cannot be rescheduled (its policy's attempts are used up). Any other
  unhealthy alloc the scheduler replaces within the rollout, as Nomad's
  ``shouldFailEarly`` and ``allowReplacements`` do;
- *cancelled* when the job was stopped or a newer version replaced it;
- on failure, if a group has ``auto_revert``, the newest stable version (one
  whose rollout succeeded) is registered again as a new version in the same
  entry, unless its spec is the failed version's (Nomad's rules and words);
- otherwise, each time more allocs became healthy it creates a
  ``deployment-watcher`` eval so the scheduler places the next
  ``max_parallel`` batch of the rolling update.

An operator can fail a rollout, or pause and resume it (``deployment.fail``,
``deployment.pause``); a paused one waits, frozen, unless its job is stopped
or replaced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from fsm import messages as m
from fsm.apply.deployments import healthy_canaries
from fsm.apply.jobs import same_spec
from fsm.queues import WL_PENDING
from fsm.store import StateReader
from fsm.structs import (
    DEPLOYMENT_CANCELLED,
    DEPLOYMENT_DESC_NEEDS_PROMOTION,
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_FAILED,
    DEPLOYMENT_PAUSED,
    DEPLOYMENT_RUNNING,
    DEPLOYMENT_SUCCESSFUL,
    Deployment,
    Evaluation,
    Job,
)
from node.core.wakeup import wait_event
from node.leader.broker import EvalBroker
from node.leader.evalwriter import EvalWriter
from node.leader.shims import RaftApplier, StateReads
from node.wire.errors import CONFLICT, RPCError
from scheduler import reschedule
from scheduler.evals import new_eval

TRIGGER_DEPLOYMENT = "deployment-watcher"
WATCH_INTERVAL = 1.0

DESC_SUCCESSFUL = "Deployment completed successfully"
DESC_UNHEALTHY = "Failed due to unhealthy allocations"
DESC_DEADLINE = "Failed due to progress deadline"
DESC_STOPPED = "Cancelled because job is stopped"
DESC_EVICTED = "Cancelled because the job was evicted and waits in its queue"
DESC_NEWER = "Cancelled due to newer version of job"
DESC_FAILED_BY_USER = "Deployment marked as failed"
DESC_PAUSED = "Deployment is paused"
DESC_RUNNING = DEPLOYMENT_DESC_RUNNING
DESC_NEEDS_PROMOTION = DEPLOYMENT_DESC_NEEDS_PROMOTION


class DeploymentError(Exception):
    """A deployment cannot take the operation asked of it."""


@dataclass
class Decision:
    deployment_id: str
    status: str = ""  # the new status, or "" to leave it as it is
    description: str = ""
    healthy: int = 0
    eval: Evaluation | None = None  # continue the rollout, or place the rollback
    rollback: Job | None = None  # the stable version to register again
    promote: list[str] | None = None  # promote these groups' canaries ([]: every group waiting)
    decided_on: str = ""  # the status the decision was made on; "" to apply whatever the status now

    def entry(self) -> m.DeploymentPromote | m.DeploymentStatusUpdate:
        """The raft entry that carries the decision out (its eval in the same entry)."""
        if self.promote is not None:
            return m.DeploymentPromote(deployment_id=self.deployment_id, groups=self.promote, eval=self.eval)
        return m.DeploymentStatusUpdate(
            deployment_id=self.deployment_id, status=self.status, status_description=self.description,
            eval=self.eval, job=self.rollback, expect_status=self.decided_on,
        )


def decide(reader: StateReader, dep: Deployment, now: int, seen_healthy: int | None, skew: int = 0) -> Decision:
    """What to do with one active deployment at ``now`` (the state's time, ns; ``skew`` ahead of the wall clock)."""
    out = Decision(dep.id, decided_on=dep.status)
    job = reader.job(dep.job_id)
    if job is None or job.stop:
        out.status, out.description = DEPLOYMENT_CANCELLED, DESC_STOPPED
        return out
    waiting = reader.workload(job.id) if job.queue else None
    if waiting is not None and waiting.state == WL_PENDING:
        out.status, out.description = DEPLOYMENT_CANCELLED, DESC_EVICTED  # readmission starts a new one
        return out
    if job.version != dep.job_version or job.job_modify_index != dep.job_modify_index:
        out.status, out.description = DEPLOYMENT_CANCELLED, DESC_NEWER
        return out
    states = dep.task_groups
    out.healthy = sum(s.healthy_allocs for s in states.values())
    if dep.status == DEPLOYMENT_PAUSED:
        return out  # frozen until resumed: no verdict, no next batch
    if failing := _failing_early(reader, dep, job, skew):
        return _fail(reader, dep, job, out, DESC_UNHEALTHY, failing)
    waiting = {g: s for g, s in states.items() if s.awaits_promotion()}
    ready = {g for g, s in waiting.items() if healthy_canaries(reader, dep, g) >= s.desired_canaries}
    if waiting and ready == set(waiting):
        if all(s.auto_promote for s in waiting.values()):
            out.promote, out.eval = [], _next_batch(job, dep)
            return out
        if dep.status_description != DESC_NEEDS_PROMOTION:
            out.status, out.description = DEPLOYMENT_RUNNING, DESC_NEEDS_PROMOTION
            return out
    if not waiting and all(s.healthy_allocs >= s.desired_total for s in states.values()) and _all_replaced(reader, dep):
        out.status, out.description = DEPLOYMENT_SUCCESSFUL, DESC_SUCCESSFUL
        return out
    for name, state in states.items():
        # The FSM moves require_progress_by on with each healthy alloc and on resume;
        # healthy canaries waiting for an operator's promotion are not stuck.
        deadline = state.require_progress_by or dep.create_time + state.progress_deadline
        if state.progress_deadline and state.healthy_allocs < state.desired_total and now > deadline and name not in ready:
            # As Nomad's shouldFail: every group not done yet may ask for the rollback.
            undone = {g for g, s in states.items() if g not in ready and s.healthy_allocs < s.desired_total}
            return _fail(reader, dep, job, out, DESC_DEADLINE, undone)
    if seen_healthy is None or out.healthy > seen_healthy:
        out.eval = _next_batch(job, dep)
    return out


def _all_replaced(reader: StateReader, dep: Deployment) -> bool:
    """Whether no live alloc of an older version is left in the rollout's groups.

    Health counts alone can reach the total early: a healthy alloc that was
    lost afterwards still counts (as in Nomad). Nomad's reconciler also
    requires that nothing is left to update before it calls a rollout complete.
    """
    return not any(
        a.job_version != dep.job_version and a.task_group in dep.task_groups
        for a in reader.allocs_by_job(dep.job_id)
        if not a.terminal()
    )


def _failing_early(reader: StateReader, dep: Deployment, job: Job, skew: int) -> set[str]:
    """The groups whose unhealthy allocs fail the rollout now, not at its deadline (Nomad's shouldFailEarly).

    Without a progress deadline the first unhealthy alloc decides. With one,
    only an alloc that can no longer be rescheduled does: waiting for the
    deadline could not bring another healthy alloc in its place.
    """
    groups = {name for name, s in dep.task_groups.items() if s.unhealthy_allocs > 0}
    if not groups:
        return set()
    failing = {name for name in groups if not dep.task_groups[name].progress_deadline}
    specs = {g.name: g for g in job.task_groups}
    for alloc in reader.allocs_by_deployment(dep.id):
        health, group = alloc.deployment_status, specs.get(alloc.task_group)
        if group is None or group.name not in groups or group.name in failing or health is None or health.healthy is not False:
            continue
        if alloc.next_allocation or alloc.server_terminal():
            continue  # replaced already, or stopped by the scheduler
        if not reschedule.eligible(reschedule.policy_for(job, group), alloc, reschedule.fail_time(alloc, skew)):
            failing.add(group.name)
    return failing


def _next_batch(job: Job, dep: Deployment) -> Evaluation:
    """An eval for the scheduler to place the rollout's next batch."""
    return new_eval(job, TRIGGER_DEPLOYMENT, deployment_id=dep.id)


def _fail(reader: StateReader, dep: Deployment, job: Job, out: Decision, why: str,
          groups: set[str] | None = None) -> Decision:
    """Fail the rollout, rolling back to the newest stable version if a failing group asks for it.

    ``groups`` are the groups whose failure it is (None: the operator failed
    it, and any group's ``auto_revert`` counts), as in Nomad's watcher: a
    group that rolled out fine does not revert the job for another's failure.

    Nomad goes back to the newest stable version even if it is the failed
    version's spec (it then only says so): that stops a rollback that fails
    too from rolling back to itself again and again.
    """
    out.status, out.description = DEPLOYMENT_FAILED, why
    if not any(s.auto_revert for g, s in dep.task_groups.items() if groups is None or g in groups):
        return out
    stable = next((v for v in reader.job_versions(job.id) if v.stable), None)
    if stable is None:
        out.description = f"{why} - no stable job version to auto revert to"
    elif same_spec(stable, job):
        # Going back would deploy the same spec again (and fail again).
        out.description = f"{why} - not rolling back to stable job version {stable.version} as current job has same specification"
    else:
        out.description = f"{why} - rolling back to job version {stable.version}"
        out.rollback = stable
        out.eval = new_eval(stable, TRIGGER_DEPLOYMENT)
    return out


def fail_by_user(reader: StateReader, dep: Deployment) -> Decision:
    """``nomad deployment fail``: fail an active rollout now, with the auto-revert a failure brings."""
    if not dep.active():
        raise DeploymentError(f"deployment {dep.id} is {dep.status}: only a running deployment can be failed")
    job = reader.job(dep.job_id)
    if job is None:
        raise DeploymentError(f"deployment {dep.id}: job {dep.job_id} no longer exists")
    return _fail(reader, dep, job, Decision(dep.id), DESC_FAILED_BY_USER)


def look(reader: StateReader, ids: list[str], seen: dict[str, int]) -> list[Decision]:
    """Decisions for the active deployments among ``ids``."""
    wall = time.time_ns()
    now = reader.time_from(wall)
    out = []
    for dep_id in ids:
        dep = reader.deployment(dep_id)
        if dep is not None and dep.active():
            out.append(decide(reader, dep, now, seen.get(dep_id), now - wall))
    return out


def pause_or_resume(reader: StateReader, dep: Deployment, pause: bool) -> Decision:
    """``nomad deployment pause|resume``: hold a rolling update where it is, or go on with it.

    A paused rollout places nothing more and gets no verdict (its progress
    deadline stops); only a stopped or replaced job still cancels it. Resuming
    restarts the deadline and asks the scheduler for the next batch.
    """
    if not dep.active():
        verb = "paused" if pause else "resumed"
        raise DeploymentError(f"deployment {dep.id} is {dep.status}: only a running deployment can be {verb}")
    if pause:
        if dep.status == DEPLOYMENT_PAUSED:
            raise DeploymentError(f"deployment {dep.id} is already paused")
        return Decision(dep.id, DEPLOYMENT_PAUSED, DESC_PAUSED, decided_on=dep.status)
    if dep.status != DEPLOYMENT_PAUSED:
        raise DeploymentError(f"deployment {dep.id} is not paused: nothing to resume")
    out = Decision(dep.id, DEPLOYMENT_RUNNING, DESC_RUNNING, decided_on=dep.status)
    job = reader.job(dep.job_id)
    if job is not None and not job.stop:
        out.eval = _next_batch(job, dep)
    return out


def promote_by_user(reader: StateReader, dep: Deployment, groups: list[str]) -> Decision:
    """``nomad deployment promote``: the canaries are good; the FSM checks they are all healthy."""
    out = Decision(dep.id, promote=sorted(set(groups)))
    job = reader.job(dep.job_id)
    if job is not None and not job.stop:
        out.eval = _next_batch(job, dep)
    return out










class DeploymentWatcher:
    def __init__(
        self,
        state: StateReads,
        raft: RaftApplier,
        active: Set[str],
        broker: EvalBroker,
        writer: EvalWriter,
        *,
        log: Any,
    ) -> None:
        self.state = state
        self.raft = raft
        self.active = active  # the lifecycle's set of running deployments, kept current from the journal
        self.broker = broker
        self.writer = writer
        self.poke = asyncio.Event()
        self.seen: dict[str, int] = {}  # deployment id -> healthy allocs when last looked at
        self.log = log.bind(component="deployments")

    async def run(self) -> None:
        while True:
            await wait_event(self.poke, WATCH_INTERVAL)
            self.poke.clear()
            ids = sorted(self.active)
            if not ids:
                continue
            seen = dict(self.seen)
            for decision in await self.state.local(lambda r, ids=ids, seen=seen: look(r, ids, seen)):
                await self._act(decision)

    async def _act(self, d: Decision) -> None:
        try:
            if d.status or d.promote is not None:
                await self.raft.propose(d.entry())
                self.seen.pop(d.deployment_id, None)
                said = "canaries promoted" if d.promote is not None else "deployment status changed"
                self.log.info(said, deployment=d.deployment_id, status=d.status, why=d.description)
                return
            if d.eval is not None and not self.broker.has_queued(d.eval.namespace, d.eval.job_id):
                await self.writer.create([d.eval])
            self.seen[d.deployment_id] = d.healthy
        except RPCError as exc:
            if exc.code == CONFLICT:  # finished by `deployment fail`, or a newer version came: decide again
                self.seen.pop(d.deployment_id, None)
                self.log.info("deployment changed meanwhile", deployment=d.deployment_id, error=str(exc))
                return
            self.log.warning("deployment update failed; retrying", deployment=d.deployment_id, error=str(exc))
