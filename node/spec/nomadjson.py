"""Nomad's API JSON shapes (PascalCase field names) for our records.

Users bring jobspecs in the shape of Nomad's ``/v1/jobs`` API and scripts read
``--json`` output with Nomad's field names (ID, Status, ClientStatus,
ModifyIndex, ...). Conversion is by field name with a table of Nomad's
irregular spellings, so a new struct field needs no code here.
"""

from __future__ import annotations

import functools
from typing import Any

from fsm import codec, structs
from fsm.record import fields, is_record

# snake_case names whose Nomad spelling is not plain PascalCase.
_SPECIAL = {
    "id": "ID",
    "job_id": "JobID",
    "eval_id": "EvalID",
    "node_id": "NodeID",
    "deployment_id": "DeploymentID",
    "accessor_id": "AccessorID",
    "secret_id": "SecretID",
    "cpu": "CPU",
    "memory_mb": "MemoryMB",
    "disk_mb": "DiskMB",
    "l_target": "LTarget",
    "r_target": "RTarget",
    "prev_alloc_id": "PrevAllocID",
    "prev_node_id": "PrevNodeID",
    "followup_eval_id": "FollowupEvalID",
    "global_": "Global",
    "parameterized": "ParameterizedJob",
    "failed_tg_allocs": "FailedTGAllocs",
    "reschedule_policy": "ReschedulePolicy",
    "node_class": "NodeClass",
}
_REVERSE = {v: k for k, v in _SPECIAL.items()}

# Maps whose keys are user data (group names, meta keys), not field names.
DATA_MAPS = {
    "meta",
    "config",
    "attributes",
    "task_states",
    "summary",
    "queued_allocations",
    "failed_tg_allocs",
    "task_groups_deployment",
    "devices",  # device name ("nvidia/gpu") -> count
}


@functools.lru_cache(maxsize=4096)  # our field names, and the odd unknown key in a warning
def pascal(name: str) -> str:
    special = _SPECIAL.get(name)
    if special is not None:
        return special
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


@functools.lru_cache(maxsize=4096)  # field names repeat; keys are user input, so it is bounded
def snake(name: str) -> str:
    """Nomad's PascalCase field name in our snake_case (memoised: every request converts the same few)."""
    special = _REVERSE.get(name)
    if special is not None:
        return special
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and (not name[i - 1].isupper() or (i + 1 < len(name) and name[i + 1].islower())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def to_nomad(obj: Any) -> Any:
    """A record (a Record or its wire map) in Nomad's JSON shape."""
    return _renamed(codec.to_wire(obj), False)


def _renamed(obj: Any, data_map: bool) -> Any:
    """A wire map's field names in Nomad's spelling, all the way down.

    Takes plain data only: ``to_wire`` converted the whole tree once (calling
    it again at every level walked each subtree once per level above it,
    most of a ``job.get``'s cost).
    """
    if isinstance(obj, list):
        return [_renamed(v, False) if isinstance(v, _CONTAINERS) else v for v in obj]
    if not isinstance(obj, dict):
        return obj
    if data_map:
        return {k: _renamed(v, False) if isinstance(v, _CONTAINERS) else v for k, v in obj.items()}
    out = {}
    names = _PASCAL
    for k, v in obj.items():
        name = names.get(k)
        if name is None:
            name = pascal(k)
        if isinstance(v, _CONTAINERS):
            v = _renamed(v, k in DATA_MAPS or k == "task_groups" and isinstance(v, dict))
        out[name] = v
    return out


_CONTAINERS = (list, dict)
# Our records' field names in Nomad's spelling (any other key goes through
# ``pascal``): a dict lookup per key is a third of a call through its lru_cache.
_PASCAL: dict[str, str] = {
    f.name: pascal(f.name)
    for record in vars(structs).values()
    if is_record(record)
    for f in fields(record)
}


def from_nomad(obj: Any, _data_map: bool = False) -> Any:
    """Nomad JSON back to our wire shape (strict decoding happens afterwards)."""
    if isinstance(obj, list):
        return [from_nomad(v) for v in obj]
    if isinstance(obj, dict):
        if _data_map:
            return {k: from_nomad(v) for k, v in obj.items()}
        out = {}
        for k, v in obj.items():
            name = snake(k)
            out[name] = from_nomad(v, name in DATA_MAPS)
        return out
    return obj
