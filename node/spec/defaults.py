"""Nomad's defaults for a jobspec, filled in where Nomad's canonicalisation fills them.

Defaults apply at two moments of a registration, and only here:

* before reading, on the Nomad-shaped map: a job-level ``Update`` or
  ``Migrate`` block is every group's default (a group's own keys win), as
  Nomad's ``Job.Canonicalize`` does;
* after reading, on the ``Job``: a missing name is the ID, a missing
  reschedule policy is Nomad's for the job type, and a service group without
  a migrate block gets Nomad's migrate strategy.

The HCL reader merges job-level blocks and partial reschedule blocks with the
same helpers, so a spec means the same whether it arrived as JSON or HCL.
"""

from __future__ import annotations

from typing import Any

from fsm.record import copy_record
from fsm.structs import HOUR, SECOND, Job, MigrateStrategy, ReschedulePolicy
from node.spec.nomadjson import to_nomad

# The job-level blocks that are defaults for every group, in Nomad's spelling.
JOB_LEVEL_BLOCKS = ("Update", "Migrate")


def default_reschedule(job_type: str) -> ReschedulePolicy:
    """Nomad's defaults: batch 1 attempt in 24h, 5s constant; service unlimited, 30s exponential."""
    if job_type == "batch":
        return ReschedulePolicy(
            attempts=1, interval=24 * HOUR, delay=5 * SECOND, delay_function="constant", max_delay=HOUR, unlimited=False
        )
    return ReschedulePolicy()


def nomad_reschedule_default(job_type: str) -> dict[str, Any]:
    """``default_reschedule`` in Nomad's JSON shape, for filling a partial HCL ``reschedule`` block."""
    return to_nomad(default_reschedule(job_type))


def spread_job_blocks(spec: dict[str, Any]) -> dict[str, Any]:
    """Nomad's ``Job.Update`` and ``Job.Migrate`` are every group's defaults (a group's own keys win).

    Returns a new map; the caller's spec is left as it was.
    """
    for block in JOB_LEVEL_BLOCKS:
        block_defaults = spec.get(block)
        if not isinstance(block_defaults, dict):
            continue
        spec = {k: v for k, v in spec.items() if k != block}
        groups = spec.get("TaskGroups")
        if isinstance(groups, list):
            spec["TaskGroups"] = [with_group_default(g, block, block_defaults) for g in groups]
    return spec


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
