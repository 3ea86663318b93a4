"""Jobspecs in Nomad's API JSON shape, turned into ``fsm.structs.Job``.

Accepted with or without the ``{"Job": ...}`` wrapper. Fields Nomad has but
Caravan does not model are dropped with a warning (so real Nomad specs load);
a known field of the wrong type, or a spec that fails validation, is an
error naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import typing
from typing import Any

from fsm import codec
from fsm.errors import ApplyRejected, CodecError
from fsm.structs import HOUR, SECOND, Job, ReschedulePolicy
from fsm.validate import check_job
from node.nomadjson import from_nomad, pascal


class JobSpecError(ValueError):
    """An invalid jobspec; the message names the field and what to change."""


def _nested_class(hint: Any) -> type | None:
    for arg in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(arg):
            return arg
        for inner in typing.get_args(arg):
            if dataclasses.is_dataclass(inner):
                return inner
    return None


@functools.cache
def _fields_of(cls: type) -> tuple[frozenset[str], dict[str, tuple[type, bool]]]:
    """(field names, {field: (nested dataclass, held in a dict?)}) of ``cls``, worked out once.

    Per class, not per type hint: hashing a hint such as
    ``list[TaskGroup] | None`` for a cache lookup on every field of every
    jobspec was most of what pruning cost.
    """
    hints = typing.get_type_hints(cls)
    nested = {}
    for f in dataclasses.fields(cls):
        sub = _nested_class(hints[f.name])
        if sub is not None:
            nested[f.name] = (sub, typing.get_origin(hints[f.name]) is dict)
    return frozenset(f.name for f in dataclasses.fields(cls)), nested


def _prune(cls: type, data: Any, path: str, warnings: list[str]) -> Any:
    """Drop fields ``cls`` does not model, recursively, noting each in ``warnings``."""
    if not isinstance(data, dict):
        return data
    names, nested = _fields_of(cls)
    out = {}
    for key, value in data.items():
        if key not in names:
            warnings.append(f"{path}.{pascal(key)} is not supported by Caravan and was ignored")
            continue
        if value is None:
            continue
        holder = nested.get(key)
        if holder is not None:
            sub, in_dict = holder
            if isinstance(value, list):
                value = [_prune(sub, v, f"{path}.{pascal(key)}[{i}]", warnings) for i, v in enumerate(value)]
            elif isinstance(value, dict) and in_dict:
                value = {k: _prune(sub, v, f"{path}.{pascal(key)}.{k}", warnings) for k, v in value.items()}
            else:
                value = _prune(sub, value, f"{path}.{pascal(key)}", warnings)
        out[key] = value
    return out


def _nomad_path(message: str) -> str:
    """Rewrite 'Job.task_groups[0].count: ...' into Nomad's field names."""
    head, sep, rest = message.partition(": ")
    if not sep:
        return message
    parts = re.split(r"(\.|\[\d+\])", head)
    return "".join(p if p in (".", "") or p.startswith("[") else pascal(p) for p in parts) + ": " + rest


def default_reschedule(job_type: str) -> ReschedulePolicy:
    """Nomad's defaults: batch 1 attempt in 24h, 5s constant; service unlimited, 30s exponential."""
    if job_type == "batch":
        return ReschedulePolicy(
            attempts=1, interval=24 * HOUR, delay=5 * SECOND, delay_function="constant", max_delay=HOUR, unlimited=False
        )
    return ReschedulePolicy()


def _check_reschedule(job: Job) -> None:
    for group in job.task_groups:
        policy = group.reschedule_policy
        if policy is None:
            continue
        where = f"Job.TaskGroups[{group.name}].ReschedulePolicy"
        if policy.attempts > 0 and policy.unlimited:
            raise JobSpecError(f"{where}: Attempts > 0 together with Unlimited is invalid; set one of them")
        if policy.delay_function not in ("constant", "exponential", "fibonacci"):
            raise JobSpecError(f"{where}.DelayFunction: must be constant, exponential or fibonacci")
        if policy.delay < 5 * SECOND:
            raise JobSpecError(f"{where}.Delay: must be at least 5s (5000000000 ns)")
        if policy.attempts > 0 and policy.interval < 15 * SECOND:
            raise JobSpecError(f"{where}.Interval: must be at least 15s (15000000000 ns)")


def parse_job(spec: Any) -> tuple[Job, list[str]]:
    """A Nomad API job (wrapped or bare, dict or JSON text) -> (Job, warnings)."""
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"jobspec is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if isinstance(spec, dict) and set(spec) == {"Job"}:
        spec = spec["Job"]
    if not isinstance(spec, dict):
        raise JobSpecError("jobspec must be a JSON object (a Nomad API job, optionally wrapped as {\"Job\": ...})")
    data = from_nomad(spec)
    periodic, parameterized = data.get("periodic"), data.get("parameterized")
    data["periodic"] = bool(periodic)
    data["parameterized"] = bool(parameterized)
    warnings: list[str] = []
    data = _prune(Job, data, "Job", warnings)
    if "id" not in data:
        raise JobSpecError("Job.ID: missing; every job needs an ID")
    try:
        job = codec.from_wire(Job, data, "Job")
    except CodecError as exc:
        raise JobSpecError(_nomad_path(str(exc))) from None
    job.name = job.name or job.id
    for group in job.task_groups:
        if group.reschedule_policy is None and job.type != "system":
            group.reschedule_policy = default_reschedule(job.type)
    try:
        check_job(job)
    except ApplyRejected as exc:
        raise JobSpecError(exc.message) from None
    _check_reschedule(job)
    # Bookkeeping is the server's: whatever the spec says is replaced.
    job.status, job.version, job.stable = "pending", 0, False
    return job, warnings
