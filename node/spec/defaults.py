"""Nomad's defaults for a jobspec, filled in where Nomad's canonicalisation fills them.

Defaults apply at two moments of a registration, and only here:

* before reading, on the Nomad-shaped map: a job-level ``Update`` or
  ``Migrate`` block is every group's default (a group's own keys win), as
  Nomad's ``Job.Canonicalize`` does; each group's reschedule policy is its
  own fields over the job-level ``Reschedule`` block over the job type's
  defaults (``node.spec.reschedule.merge_policy``);
* after reading, on the ``Job``: a missing name is the ID, a missing
  reschedule policy is Nomad's for the job type (a group the merge could not
  reach), and a service group without a migrate block gets Nomad's migrate
  strategy.

The HCL reader merges job-level blocks and partial reschedule blocks with the
same helpers, so a spec means the same whether it arrived as JSON or HCL.
"""

from __future__ import annotations

from typing import Any

from fsm.record import copy_record
from fsm.structs import Job, MigrateStrategy, ReschedulePolicy
from node.spec.errors import JobSpecError
from node.spec.reschedule import default_policy, merge_policy

# The job-level blocks that are defaults for every group, in Nomad's spelling.
JOB_LEVEL_BLOCKS = ("Update", "Migrate")
# The job-level reschedule block (Nomad's ``Job.Reschedule``) and a group's own (``TaskGroup.ReschedulePolicy``).
JOB_RESCHEDULE, GROUP_RESCHEDULE = "Reschedule", "ReschedulePolicy"


def default_reschedule(job_type: str) -> ReschedulePolicy:
    """Nomad's defaults: batch 1 attempt in 24h, 5s constant; service unlimited, 30s exponential."""
    return default_policy(job_type)


def spread_job_blocks(spec: dict[str, Any]) -> dict[str, Any]:
    """Nomad's ``Job.Update`` and ``Job.Migrate`` are every group's defaults (a group's own keys win),
    and each group's reschedule policy is merged over ``Job.Reschedule`` and the type's defaults.

    Returns a new map; the caller's spec is left as it was.
    """
    spec = spread_reschedule(spec)
    for block in JOB_LEVEL_BLOCKS:
        block_defaults = spec.get(block)
        if not isinstance(block_defaults, dict):
            continue
        spec = {k: v for k, v in spec.items() if k != block}
        groups = spec.get("TaskGroups")
        if isinstance(groups, list):
            spec["TaskGroups"] = [with_group_default(g, block, block_defaults) for g in groups]
    return spec


def spread_reschedule(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec without ``Reschedule``, each group with its merged ``ReschedulePolicy`` (Nomad's canonicalisation)."""
    job_level = spec.get(JOB_RESCHEDULE)
    if job_level is not None and not isinstance(job_level, dict):
        raise JobSpecError(f"Job.{JOB_RESCHEDULE}: expected map, got {type(job_level).__name__}")
    groups = spec.get("TaskGroups")
    spec = {k: v for k, v in spec.items() if k != JOB_RESCHEDULE}
    if isinstance(groups, list):
        job_type = spec.get("Type", "service")
        job_type = job_type if isinstance(job_type, str) else "service"  # a bad type: the reader names it
        spec["TaskGroups"] = [_with_reschedule(g, job_type, job_level) for g in groups]
    return spec


def _with_reschedule(group: Any, job_type: str, job_level: dict[str, Any] | None) -> Any:
    """One group with its merged policy; a malformed group is left for the reader to name."""
    if not isinstance(group, dict):
        return group
    merged = merge_policy(job_type, job_level, group.get(GROUP_RESCHEDULE))
    return group if merged is None else {**group, GROUP_RESCHEDULE: merged}


def with_group_default(group: Any, block: str, block_defaults: dict[str, Any]) -> Any:
    """The group with the ``block`` keys it lacks; a malformed group is left for the reader to name."""
    if not isinstance(group, dict):
        return group
    own = group.get(block)
    if own is None:
        return {**group, block: dict(block_defaults)}
    if isinstance(own, dict):
        return {**group, block: {**block_defaults, **own}}
    return group


_RESCHEDULE_DEFAULTS: dict[str, ReschedulePolicy] = {}


def _default_reschedule_copy(job_type: str) -> ReschedulePolicy:
    """``default_reschedule(job_type)``, copied from one kept per job type (its fields are scalars)."""
    policy = _RESCHEDULE_DEFAULTS.get(job_type)
    if policy is None:
        policy = _RESCHEDULE_DEFAULTS[job_type] = default_reschedule(job_type)
    return copy_record(policy)


def fill_defaults(job: Job) -> None:
    """A freshly read job's name, reschedule policies and migrate strategies, where the spec left them out."""
    job.name = job.name or job.id
    if job.type == "system":
        return
    for group in job.task_groups:
        if group.reschedule_policy is None:
            group.reschedule_policy = _default_reschedule_copy(job.type)
        if group.migrate is None and job.type == "service":  # as Nomad's TaskGroup.Canonicalize
            group.migrate = MigrateStrategy()
