"""Nomad API job JSON read into ``fsm.structs.Job``: the reference reading, and which path reads a spec.

A spec comes with or without the ``{"Job": ...}`` wrapper, as a map or as
JSON text. Fields Nomad has but Caravan does not model are dropped with a
warning (so real Nomad specs load); a known field of the wrong type is an
error naming the field in Nomad's spelling.

``read_general`` defines what a spec means: snake-case everything, prune the
fields Caravan does not model, strictly decode. ``node.spec.onepass`` gives
the same answer in one pass for the specs it can vouch for; ``read_job``
tries it first and hands every other spec to the general path.
"""

from __future__ import annotations

import functools
import json
import re
import typing
from typing import Any

from fsm import codec
from fsm.errors import CodecError
from fsm.record import fields, is_record
from fsm.structs import Job
from node.spec.errors import JobSpecError
from node.spec.nomadjson import from_nomad, pascal
from node.spec.onepass import Fallback, read_fast


def decode_spec(spec: Any) -> dict[str, Any]:
    """The bare Nomad job map from JSON text or a map, wrapped as ``{"Job": ...}`` or not."""
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"jobspec is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if isinstance(spec, dict) and set(spec) == {"Job"}:
        spec = spec["Job"]
    if not isinstance(spec, dict):
        raise JobSpecError("jobspec must be a JSON object (a Nomad API job, optionally wrapped as {\"Job\": ...})")
    return spec


def read_job(spec: dict[str, Any]) -> tuple[Job, list[str]]:
    """(Job, warnings) from a bare Nomad job map: in one pass when it can vouch for the spec, else the general path."""
    try:
        return read_fast(spec)
    except (Fallback, RecursionError):
        return read_general(spec)


def read_general(spec: dict[str, Any]) -> tuple[Job, list[str]]:
    """The reference path: snake-case everything, prune, strictly decode (names any bad field)."""
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
    return job, warnings


def _nested_class(hint: Any) -> type | None:
    for arg in (hint, *typing.get_args(hint)):
        if is_record(arg):
            return arg
        for inner in typing.get_args(arg):
            if is_record(inner):
                return inner
    return None


@functools.cache
def _fields_of(cls: type) -> tuple[frozenset[str], dict[str, tuple[type, bool]]]:
    """(field names, {field: (nested record class, held in a dict?)}) of ``cls``, worked out once.

    Per class, not per type hint: hashing a hint such as
    ``list[TaskGroup] | None`` for a cache lookup on every field of every
    jobspec was most of what pruning cost.
    """
    hints = typing.get_type_hints(cls)
    nested = {}
    for f in fields(cls):
        sub = _nested_class(hints[f.name])
        if sub is not None:
            nested[f.name] = (sub, typing.get_origin(hints[f.name]) is dict)
    return frozenset(f.name for f in fields(cls)), nested


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
