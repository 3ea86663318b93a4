"""Nomad's task device requests (``Resources.Devices``) read into the map ``fsm.structs.Resources`` keeps.

Nomad's API spells a task's devices as a list of RequestedDevice,
``[{"Name": "nvidia/gpu", "Count": 2, "Constraints": [...], "Affinities": [...]}]``
(what the HCL reader makes of ``device "nvidia/gpu" { count = 2 }`` too), with
``Count`` 1 when left out. Caravan keeps one map, name -> count: the
placement arithmetic adds and compares maps, and a request's constraints and
affinities are not modelled (dropped with a warning, as any other field
Caravan ignores). Two requests of one name add up. A map given as ``Devices``
(what a Caravan job read back without Nomad's shape holds) is taken as it is.

Shapes only: what a name may be and that a count is at least 1 are
``fsm.validate.check_device_asks``'s rules (apply checks them again).
"""

from __future__ import annotations

from typing import Any

from node.spec.errors import JobSpecError
from node.spec.nomadjson import pascal, snake

_MODELLED = ("name", "count")


def devices_as_maps(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``spec`` with every task's ``Resources.Devices`` list turned into a name -> count map, and the
    warnings for what was dropped. Returns a new map when it changes one; the caller's is left alone."""
    groups = _get(spec, "TaskGroups")
    warnings: list[str] = []
    if not isinstance(groups, list) or not any(_has_device_list(g) for g in groups):
        return spec, warnings
    new_groups = []
    for gi, group in enumerate(groups):
        if not _has_device_list(group):
            new_groups.append(group)
            continue
        tasks = []
        for ti, task in enumerate(_get(group, "Tasks")):
            where = f"Job.TaskGroups[{gi}].Tasks[{ti}].Resources.Devices"
            tasks.append(_task_with_map(task, where, warnings))
        new_groups.append({**group, _key(group, "Tasks"): tasks})
    return {**spec, _key(spec, "TaskGroups"): new_groups}, warnings


def _task_with_map(task: Any, where: str, warnings: list[str]) -> Any:
    """One task with its device list as a map (any other task as it is)."""
    resources = _get(task, "Resources") if isinstance(task, dict) else None
    devices = _get(resources, "Devices") if isinstance(resources, dict) else None
    if not isinstance(devices, list):
        return task
    asks: dict[str, int] = {}
    for i, item in enumerate(devices):
        name, count = _request(item, f"{where}[{i}]", warnings)
        asks[name] = asks.get(name, 0) + count
    return {**task, _key(task, "Resources"): {**resources, _key(resources, "Devices"): asks}}


def _request(item: Any, where: str, warnings: list[str]) -> tuple[str, int]:
    """(name, count) of one RequestedDevice; a one-line error naming the field if it is malformed."""
    if not isinstance(item, dict):
        raise JobSpecError(
            f'{where}: expected an object such as {{"Name": "nvidia/gpu", "Count": 1}}, got {_kind(item)}'
        )
    values: dict[str, Any] = {}
    for key, value in item.items():
        name = snake(key) if isinstance(key, str) else key
        if name in _MODELLED:
            values[name] = value
        elif value not in (None, [], {}):  # an empty list constrains nothing: no warning
            warnings.append(
                f"{where}.{pascal(str(name))} is not supported by Caravan and was ignored"
            )
    name = values.get("name")
    if not isinstance(name, str):
        raise JobSpecError(
            f"{where}.Name: missing; name the device as type, vendor/type or vendor/type/model"
            if name is None
            else f"{where}.Name: expected string, got {_kind(name)}"
        )
    count = values.get("count")
    if count is None:
        return name, 1  # Nomad's default
    if isinstance(count, bool) or not isinstance(count, int):
        raise JobSpecError(f"{where}.Count: expected integer, got {_kind(count)}")
    return name, count


def _has_device_list(group: Any) -> bool:
    tasks = _get(group, "Tasks") if isinstance(group, dict) else None
    if not isinstance(tasks, list):
        return False
    for task in tasks:
        resources = _get(task, "Resources") if isinstance(task, dict) else None
        if isinstance(resources, dict) and isinstance(_get(resources, "Devices"), list):
            return True
    return False


def _key(obj: dict[str, Any], nomad: str) -> str:
    """The spelling ``obj`` uses for the field (Nomad's, or our snake case), Nomad's if neither."""
    if nomad in obj:
        return nomad
    lower = snake(nomad)
    return lower if lower in obj else nomad


def _get(obj: Any, nomad: str) -> Any:
    return obj.get(_key(obj, nomad)) if isinstance(obj, dict) else None


def _kind(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "object",
    }.get(type(value), type(value).__name__)
