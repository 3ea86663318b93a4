"""A registration's jobspec, from the Nomad API JSON an operator sent to the ``Job`` the leader logs.

The one entry for jobspecs: the CLI, ``/v1/jobs``, ``/v1/jobs/parse`` and the
Job.Register endpoint all call ``parse_job`` (HCL arrives here already turned
into API JSON by ``node.spec.hcl``). ``parse_job`` is the whole path, each
step in its own module:

1. ``reader.decode_spec``: JSON text or a map, wrapped or bare -> the job map;
2. ``defaults.spread_job_blocks``: job-level Update/Migrate -> each group's, and each
   group's reschedule policy merged over Job.Reschedule and the type's defaults;
   ``devices.devices_as_maps``: each task's RequestedDevice list -> a name -> count map;
3. ``reader.read_job``: the map -> a ``Job`` and the warnings for fields
   Caravan ignores (in one pass when it can, by ``onepass``);
4. ``defaults.fill_defaults``: name, reschedule policy, migrate strategy;
5. ``validate.check_job_spec``: the FSM's replay checks, then Nomad's rules;
6. the server's bookkeeping fields, whatever the spec said.
"""

from __future__ import annotations

from typing import Any

from fsm.structs import Job
from node.spec import defaults, devices, reader, validate
from node.spec.defaults import default_reschedule
from node.spec.errors import JobSpecError

__all__ = ["JobSpecError", "default_reschedule", "finish", "parse_job"]


def parse_job(spec: Any) -> tuple[Job, list[str]]:
    """A Nomad API job (wrapped or bare, dict or JSON text) -> (Job, warnings); raises ``JobSpecError``."""
    spec = reader.decode_spec(spec)
    spec = defaults.spread_job_blocks(spec)
    spec, device_warnings = devices.devices_as_maps(spec)
    job, warnings = reader.read_job(spec)
    return finish(job), device_warnings + warnings


def finish(job: Job) -> Job:
    """Defaults, validation and the server's bookkeeping, on a freshly read job."""
    defaults.fill_defaults(job)
    validate.check_job_spec(job)
    # Bookkeeping is the server's: whatever the spec says is replaced.
    job.status, job.version, job.stable = "pending", 0, False
    return job
