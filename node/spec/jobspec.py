"""Jobspecs in Nomad's API JSON shape, turned into ``fsm.structs.Job``.

Accepted with or without the ``{"Job": ...}`` wrapper. Fields Nomad has but
Caravan does not model are dropped with a warning (so real Nomad specs load);
a known field of the wrong type, or a spec that fails validation, is an
error naming the field.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import types
import typing
from typing import Any

from fsm import codec
from fsm.errors import ApplyRejected, CodecError
from fsm.record import copy_record, fields, is_record
from fsm.structs import HOUR, SECOND, Job, MigrateStrategy, ReschedulePolicy, UpdateStrategy
from fsm.validate import check_job
from node.spec.nomadjson import DATA_MAPS, from_nomad, pascal, snake


class JobSpecError(ValueError):
    """An invalid jobspec; the message names the field and what to change."""


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


def default_reschedule(job_type: str) -> ReschedulePolicy:
    """Nomad's defaults: batch 1 attempt in 24h, 5s constant; service unlimited, 30s exponential."""
    if job_type == "batch":
        return ReschedulePolicy(
            attempts=1, interval=24 * HOUR, delay=5 * SECOND, delay_function="constant", max_delay=HOUR, unlimited=False
        )
    return ReschedulePolicy()


def _check_groups(job: Job) -> None:
    """Nomad's rules for each group's count (system jobs), reschedule policy and update strategy.

    Each is a one-line error naming the field.
    """
    for group in job.task_groups:
        where = f"Job.TaskGroups[{group.name}]"
        if job.type == "system" and group.count > 1:
            raise JobSpecError(f"{where}.Count: cannot exceed 1 with the system scheduler (0 switches the group off)")
        if group.reschedule_policy is not None:
            _check_reschedule(group.reschedule_policy, f"{where}.ReschedulePolicy")
        if group.update is not None:
            _check_update(group.update, f"{where}.Update")
        if group.migrate is not None:
            if job.type != "service":  # Nomad's Job.Validate
                raise JobSpecError(f"{where}.Migrate: job type {job.type!r} does not allow a migrate block "
                                   "(only service jobs are migrated in steps)")
            _check_migrate(group.migrate, f"{where}.Migrate")


def _check_reschedule(policy: ReschedulePolicy, where: str) -> None:
    if policy.attempts > 0 and policy.unlimited:
        raise JobSpecError(f"{where}: Attempts > 0 together with Unlimited is invalid; set one of them")
    if policy.delay_function not in ("constant", "exponential", "fibonacci"):
        raise JobSpecError(f"{where}.DelayFunction: must be constant, exponential or fibonacci")
    if policy.delay < 5 * SECOND:
        raise JobSpecError(f"{where}.Delay: must be at least 5s (5000000000 ns)")
    if policy.attempts > 0 and policy.interval < 15 * SECOND:
        raise JobSpecError(f"{where}.Interval: must be at least 15s (15000000000 ns)")


def _check_update(update: UpdateStrategy, where: str) -> None:
    """Deadlines that can be met in order, and canaries for AutoPromote."""
    if update.max_parallel < 0:
        raise JobSpecError(f"{where}.MaxParallel: must not be negative (0 replaces every alloc at once)")
    if update.min_healthy_time < 0:
        raise JobSpecError(f"{where}.MinHealthyTime: must not be negative")
    if update.healthy_deadline <= 0:
        raise JobSpecError(f"{where}.HealthyDeadline: must be greater than zero")
    if update.progress_deadline < 0:
        raise JobSpecError(f"{where}.ProgressDeadline: must not be negative (0: the first unhealthy alloc fails the rollout)")
    if update.min_healthy_time >= update.healthy_deadline:
        raise JobSpecError(f"{where}.MinHealthyTime: must be less than HealthyDeadline "
                           f"({update.min_healthy_time} >= {update.healthy_deadline} ns)")
    if update.progress_deadline and update.healthy_deadline >= update.progress_deadline:
        raise JobSpecError(f"{where}.HealthyDeadline: must be less than ProgressDeadline "
                           f"({update.healthy_deadline} >= {update.progress_deadline} ns), or set ProgressDeadline to 0")
    if update.auto_promote and update.canary == 0:
        raise JobSpecError(f"{where}.AutoPromote: needs a Canary count greater than zero")


def _check_migrate(migrate: MigrateStrategy, where: str) -> None:
    """Nomad's MigrateStrategy.Validate."""
    if migrate.max_parallel < 0:
        raise JobSpecError(f"{where}.MaxParallel: must not be negative")
    if migrate.health_check not in ("checks", "task_states"):
        raise JobSpecError(f"{where}.HealthCheck: must be checks or task_states, not {migrate.health_check!r}")
    if migrate.min_healthy_time < 0:
        raise JobSpecError(f"{where}.MinHealthyTime: must not be negative")
    if migrate.healthy_deadline < 0:
        raise JobSpecError(f"{where}.HealthyDeadline: must not be negative")
    if migrate.min_healthy_time > migrate.healthy_deadline:
        raise JobSpecError(f"{where}.MinHealthyTime: must be less than HealthyDeadline "
                           f"({migrate.min_healthy_time} > {migrate.healthy_deadline} ns)")


def _general_parse(spec: dict[str, Any]) -> tuple[Job, list[str]]:
    """The reference path: snake-case everything, prune, strictly decode (names any bad field).

    It defines what a spec means; ``_fast_job`` gives the same answer in one
    pass for the specs it can vouch for and hands every other spec here.
    """
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


# -- one pass --------------------------------------------------------------------------
# The general path walks a spec three times (from_nomad, _prune, the codec)
# and the codec's general builder binds ``__init__`` arguments per record:
# most of a registration's parse cost on the leader. ``_fast_job`` reads the
# Nomad-shaped spec once, with a per-class table from Nomad key to field, and
# builds each record from the values it read. It accepts only what the general
# path accepts unchanged (each value of the exact class msgpack/JSON yields,
# no two keys naming one field, every key a string) and raises ``_Fallback``
# on anything else, so every invalid or unusual spec gets the general path's
# result and its error text.


class _Fallback(Exception):
    """The spec is not one ``_fast_job`` can vouch for: run the general path."""


_MISSING = object()
# How a field's value is read (the ``kind`` of a ``_Field``).
_EXACT = 0  # a scalar of one of ``arg``'s classes, taken as is
_RECORD = 1  # a nested record (``arg`` is its ``_Shape``)
_RECORDS = 2  # a list of nested records
_SCALARS = 3  # a list of scalars of ``arg``'s classes
_MAP = 4  # a data map (keys kept) of scalars of ``arg``'s classes
_ANY_MAP = 5  # a data map of any values (task config), snake-cased below the top as from_nomad does
_TRUTH = 6  # Job.Periodic / Job.ParameterizedJob: the block's presence, as a bool
_OTHER = 7  # a type this pass does not handle: the general path does

# The classes the codec takes unchanged for a scalar hint (bool is no int here).
_SCALAR_CLASSES = codec.SCALAR_CLASSES
_PLAIN_VALUES = (str, int, float, bool)  # what from_nomad returns as it is


class _Field(typing.NamedTuple):
    name: str
    nomad: str  # the Nomad spelling, for warning paths
    kind: int
    arg: Any


class _Shape:
    """One record class's table: its fields by every spelling met, and which are required."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.by_name: dict[str, _Field] = {}
        # Nomad spelling (and the snake name itself) -> field; other spellings
        # are looked up through ``snake`` and not remembered (they are user input).
        self.by_key: dict[str, _Field] = {}
        self.required = tuple(f.name for f in fields(cls) if f.required)

    def fill(self) -> None:
        """Work out each field's kind (after registering, so a class may hold itself)."""
        hints = typing.get_type_hints(self.cls)
        for f in fields(self.cls):
            kind, arg = _kind_of(f.name, hints[f.name])
            if self.cls is Job and f.name in ("periodic", "parameterized"):
                kind, arg = _TRUTH, None
            entry = _Field(f.name, pascal(f.name), kind, arg)
            self.by_name[f.name] = entry
            self.by_key[entry.nomad] = entry
            self.by_key[f.name] = entry


_SHAPES: dict[type, _Shape] = {}
_SHAPES_LOCK = threading.RLock()  # RPC threads may parse at once; filling a shape nests


def _shape(cls: type) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        with _SHAPES_LOCK:
            shape = _SHAPES.get(cls)
            if shape is None:
                shape = _Shape(cls)
                _SHAPES[cls] = shape  # before filling: a nested reference to cls finds it
                try:
                    shape.fill()
                except BaseException:
                    del _SHAPES[cls]
                    raise
    return shape


def _kind_of(name: str, hint: Any) -> tuple[int, Any]:
    """How ``_fast_job`` reads a field of this hint (None values never get here: they mean the default)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            return _OTHER, None
        hint, origin = args[0], typing.get_origin(args[0])
    if hint in _SCALAR_CLASSES:
        return _EXACT, _SCALAR_CLASSES[hint]
    if is_record(hint):
        return _RECORD, _shape(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if is_record(item):
            return _RECORDS, _shape(item)
        if item in _SCALAR_CLASSES:
            return _SCALARS, _SCALAR_CLASSES[item]
    # Only data maps keep their keys in from_nomad; any other map is the general path's.
    if origin is dict and name in DATA_MAPS:
        value = typing.get_args(hint)[1]
        if value is Any:
            return _ANY_MAP, None
        if value in _SCALAR_CLASSES:
            return _MAP, _SCALAR_CLASSES[value]
    return _OTHER, None


def _keys_plain(value: Any, data_map: bool) -> bool:
    """Whether from_nomad takes ``value`` without raising: every key it snake-cases is a string.

    Values of fields Caravan ignores are not converted here, but the general
    path converts them before pruning, and a non-string key there raises.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            if data_map:
                if isinstance(v, (dict, list)) and not _keys_plain(v, False):
                    return False
                continue
            if k.__class__ is not str:
                return False
            if isinstance(v, dict):
                if not _keys_plain(v, snake(k) in DATA_MAPS):
                    return False
            elif isinstance(v, list) and not _keys_plain(v, False):
                return False
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, (dict, list)) and not _keys_plain(v, False):
                return False
    return True


def _where(path: Any) -> str:
    """A lazily built warning path: ``path`` is "Job" or (parent, Nomad name, index or None)."""
    if isinstance(path, str):
        return path
    parent, nomad, index = path
    return f"{_where(parent)}.{nomad}" + ("" if index is None else f"[{index}]")


def _read(shape: _Shape, data: Any, path: Any, warnings: list[str]) -> Any:
    """One record from its Nomad map, exactly as the general path would build it, or ``_Fallback``."""
    if data.__class__ is not dict:
        raise _Fallback
    by_key = shape.by_key
    values: dict[str, Any] = {}
    seen: set[str] | None = None  # fields given as None, and unknown names: for duplicate spellings
    for key, value in data.items():
        entry = by_key.get(key)
        if entry is None:
            if key.__class__ is not str:
                raise _Fallback
            name = snake(key)
            entry = shape.by_name.get(name)
            if entry is None:  # a field Caravan does not model
                if seen is None:
                    seen = set()
                elif name in seen:
                    raise _Fallback
                seen.add(name)
                if value is not None and not _keys_plain(value, name in DATA_MAPS):
                    raise _Fallback
                warnings.append(f"{_where(path)}.{pascal(name)} is not supported by Caravan and was ignored")
                continue
        name = entry.name
        if name in values or (seen is not None and name in seen):
            raise _Fallback  # two spellings of one field: the general path keeps the last
        kind = entry.kind
        if value is None and kind != _TRUTH:
            if seen is None:
                seen = set()
            seen.add(name)
            continue
        if kind == _EXACT:
            if value.__class__ not in entry.arg:
                raise _Fallback
        elif kind == _RECORDS:
            if value.__class__ is not list:
                raise _Fallback
            sub = entry.arg
            value = [_read(sub, v, (path, entry.nomad, i), warnings) for i, v in enumerate(value)]
        elif kind == _RECORD:
            value = _read(entry.arg, value, (path, entry.nomad, None), warnings)
        elif kind == _MAP:
            if value.__class__ is not dict:
                raise _Fallback
            classes = entry.arg
            for k, v in value.items():
                if k.__class__ is not str or v.__class__ not in classes:
                    raise _Fallback
            value = dict(value)
        elif kind == _ANY_MAP:
            value = _any_map(value)
        elif kind == _SCALARS:
            if value.__class__ is not list:
                raise _Fallback
            classes = entry.arg
            for v in value:
                if v.__class__ not in classes:
                    raise _Fallback
            value = list(value)
        elif kind == _TRUTH:
            if not _keys_plain(value, False):
                raise _Fallback
            value = bool(value)
        else:
            raise _Fallback
        values[name] = value
    for name in shape.required:
        if name not in values:
            raise _Fallback
    return shape.cls(**values)


def _any_map(value: Any) -> dict[str, Any]:
    """A task config: its keys kept, values snake-cased below as from_nomad does (then taken as is)."""
    if value.__class__ is not dict:
        raise _Fallback
    out = {}
    for k, v in value.items():
        if k.__class__ is not str:
            raise _Fallback
        if v.__class__ in _PLAIN_VALUES or v is None:
            out[k] = v
            continue
        try:
            out[k] = from_nomad(v)
        except Exception:  # whatever from_nomad raises, the general path raises it too
            raise _Fallback from None
    return out


def _fast_job(spec: dict[str, Any]) -> tuple[Job, list[str]]:
    warnings: list[str] = []
    return _read(_shape(Job), spec, "Job", warnings), warnings


_RESCHEDULE_DEFAULTS: dict[str, ReschedulePolicy] = {}


def _default_reschedule_copy(job_type: str) -> ReschedulePolicy:
    """``default_reschedule(job_type)``, copied from one kept per job type (its fields are scalars)."""
    policy = _RESCHEDULE_DEFAULTS.get(job_type)
    if policy is None:
        policy = _RESCHEDULE_DEFAULTS[job_type] = default_reschedule(job_type)
    return copy_record(policy)


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
    spec = _job_update_to_groups(spec)
    try:
        job, warnings = _fast_job(spec)
    except (_Fallback, RecursionError):
        job, warnings = _general_parse(spec)
    return _finish(job), warnings


def _job_update_to_groups(spec: dict[str, Any]) -> dict[str, Any]:
    """Nomad's ``Job.Update`` and ``Job.Migrate`` are every group's defaults (a group's own keys win)."""
    for block in ("Update", "Migrate"):
        defaults = spec.get(block)
        if not isinstance(defaults, dict):
            continue
        spec = {k: v for k, v in spec.items() if k != block}
        groups = spec.get("TaskGroups")
        if isinstance(groups, list):
            spec["TaskGroups"] = [_with_default(g, block, defaults) for g in groups]
    return spec


def _with_default(group: Any, block: str, defaults: dict[str, Any]) -> Any:
    """The group with the job's ``block`` keys it lacks; a malformed group is left for the parser to name."""
    if not isinstance(group, dict):
        return group
    own = group.get(block)
    if own is None:
        return {**group, block: dict(defaults)}
    if isinstance(own, dict):
        return {**group, block: {**defaults, **own}}
    return group


def _finish(job: Job) -> Job:
    """Defaults, validation and the server's bookkeeping, on a freshly built job."""
    job.name = job.name or job.id
    if job.type != "system":
        for group in job.task_groups:
            if group.reschedule_policy is None:
                group.reschedule_policy = _default_reschedule_copy(job.type)
            if group.migrate is None and job.type == "service":  # as Nomad's TaskGroup.Canonicalize
                group.migrate = MigrateStrategy()
    try:
        check_job(job)
    except ApplyRejected as exc:
        raise JobSpecError(exc.message) from None
    _check_groups(job)
    # Bookkeeping is the server's: whatever the spec says is replaced.
    job.status, job.version, job.stable = "pending", 0, False
    return job
