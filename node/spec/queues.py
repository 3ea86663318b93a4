"""Queue and priority class definitions, HCL or JSON, read into ``fsm.queues`` records and checked.

An operator writes a queue once (``caravan queue apply FILE``, ``PUT
/v1/queue/:name``) and lives with its quota for a long time, so a mistake
must be refused before it reaches the log, in one line that names the queue,
the field and what to write instead (``queue "team-a": resource "cpu":
nominal must be an integer >= 0, not -1``). Both forms go through one
reader: the HCL form is first turned into the JSON form (with the same
python-hcl2 reading jobspecs use, ``node.spec.hcl_text``), so the two can
never accept different queues. Unlike a jobspec, a queue file has no
Nomad-only blocks to tolerate: an unknown attribute or block is an error,
since a misspelt ``borowing_limit`` silently dropped would change who may
borrow what.

``validate_queue`` and ``validate_priority_class`` check a record however
it arrived (the server calls them on records sent by RPC); the readers call
them too. Field names in messages follow the form the operator wrote:
``borrowing_limit`` for HCL, ``BorrowingLimit`` for JSON.

The JSON names (``Name``, ``Cohort``, ``Resources`` of ``Name``, ``Nominal``,
``BorrowingLimit``, ``LendingLimit``, ``Preemption`` of
``ReclaimWithinCohort``, ``WithinQueue``, ``QueueingStrategy``,
``StopPolicy``, ``Description``) are the ones the HTTP API answers with
(``queue_to_json``), so a GET's answer can be applied back as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fsm import codec
from fsm.queues import (
    CPU,
    MEMORY,
    QUEUEING_STRATEGIES,
    RECLAIM_POLICIES,
    STOP_POLICIES,
    WITHIN_QUEUE_POLICIES,
    PriorityClass,
    Queue,
    QuotaLimit,
)
from node.spec.errors import HCLError
from node.spec.hcl import looks_like_hcl
from node.spec.hcl_text import BLOCK_MARK, Path, block_list, load_hcl
from node.spec.hcl_values import AttrSpec, BlockHandler, HCLValues

__all__ = [
    "QueueSpecError",
    "read_queues",
    "read_queue",
    "queue_to_json",
    "validate_queue",
    "read_priority_classes",
    "read_priority_class",
    "priority_class_to_json",
    "validate_priority_class",
    "ledger_to_json",
    "queue_row_to_json",
    "queue_status_to_json",
    "priority_class_row_to_json",
    "pending_to_json",
    "NAME_RULE",
]

NAME_RULE = "1-128 letters, digits, '-', '_' or '.'"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# A device as Nomad names it on a node: vendor/type or vendor/type/model.
_DEVICE = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+){1,2}")
#: The largest quota a queue may set: the largest integer every JSON client reads exactly.
MAX_QUANTITY = 2**53 - 1
#: Kueue's WorkloadPriorityClass value is an int32.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
MAX_DESCRIPTION = 1024
MAX_RESOURCES = 64

# HCL (the record's) name -> JSON name, per object.
_QUEUE_JSON = {
    "name": "Name",
    "cohort": "Cohort",
    "queueing_strategy": "QueueingStrategy",
    "stop_policy": "StopPolicy",
    "description": "Description",
}
_RESOURCE_JSON = {
    "name": "Name",
    "nominal": "Nominal",
    "borrowing_limit": "BorrowingLimit",
    "lending_limit": "LendingLimit",
}
_PREEMPTION_JSON = {"reclaim_within_cohort": "ReclaimWithinCohort", "within_queue": "WithinQueue"}
_CLASS_JSON = {"name": "Name", "value": "Value", "description": "Description"}
# What a GET answers that a write ignores (the server keeps them), so an answer can be applied back.
_READ_ONLY = ("CreateIndex", "ModifyIndex", "Ledger", "Admitted", "Pending")
_ALL_JSON = {
    **_QUEUE_JSON,
    **_RESOURCE_JSON,
    **_PREEMPTION_JSON,
    **_CLASS_JSON,
    "resource": "Resources",
    "preemption": "Preemption",
}


class QueueSpecError(ValueError):
    """A queue or priority class that cannot be applied; the message is one line naming what to change.

    ``resource`` and ``field`` (the record's name) say where, so the HCL
    reader can point at the line of the block or attribute at fault.
    """

    def __init__(
        self, message: str, *, resource: str | None = None, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.field = field


def _say(name: str, json_names: bool) -> str:
    """A field's name as the operator wrote it: HCL's snake_case or JSON's CamelCase."""
    return _ALL_JSON.get(name, name) if json_names else name


# -- checks on records ------------------------------------------------------------------
def validate_queue(queue: Queue, *, json_names: bool = False) -> None:
    """Refuse a queue the admission service could not honour, however it arrived; raises QueueSpecError."""
    if not isinstance(queue, Queue):
        raise QueueSpecError("expected a queue definition")
    _check_name(queue.name, "queue", json_names)
    where = f'queue "{queue.name}"'
    if not isinstance(queue.cohort, str) or (queue.cohort and not _NAME.fullmatch(queue.cohort)):
        raise QueueSpecError(
            f"{where}: {_say('cohort', json_names)} {_shown(queue.cohort)} is not a valid name; "
            f'use {NAME_RULE}, or "" for no cohort',
            field="cohort",
        )
    for field, allowed in (
        ("queueing_strategy", QUEUEING_STRATEGIES),
        ("stop_policy", STOP_POLICIES),
        ("reclaim_within_cohort", RECLAIM_POLICIES),
        ("within_queue", WITHIN_QUEUE_POLICIES),
    ):
        _check_choice(where, field, getattr(queue, field), allowed, json_names)
    _check_description(where, queue.description, json_names)
    if not isinstance(queue.resources, list):
        raise QueueSpecError(f"{where}: {_say('resource', json_names)} must be a list of resources")
    if len(queue.resources) > MAX_RESOURCES:
        raise QueueSpecError(
            f"{where}: {len(queue.resources)} resources; a queue limits at most {MAX_RESOURCES}"
        )
    seen: set[str] = set()
    for limit in queue.resources:
        _check_limit(where, limit, json_names)
        if limit.name in seen:
            raise QueueSpecError(
                f'{where}: resource "{limit.name}" is listed twice; list each resource once',
                resource=limit.name,
            )
        seen.add(limit.name)
        if not queue.cohort and (
            limit.borrowing_limit is not None or limit.lending_limit is not None
        ):
            field = "borrowing_limit" if limit.borrowing_limit is not None else "lending_limit"
            raise QueueSpecError(
                f'{where}: resource "{limit.name}" sets {_say(field, json_names)}, but a queue needs a cohort '
                f"to borrow or lend; set {_say('cohort', json_names)} or remove the limit",
                resource=limit.name,
                field=field,
            )


def _check_limit(where: str, limit: QuotaLimit, json_names: bool) -> None:
    """One resource of a queue: a known resource name, whole quantities, lending within nominal."""
    if not isinstance(limit, QuotaLimit):
        raise QueueSpecError(f"{where}: each resource must be a resource definition")
    name = limit.name
    if not isinstance(name, str) or not (name in (CPU, MEMORY) or _DEVICE.fullmatch(name)):
        raise QueueSpecError(
            f"{where}: resource {_shown(name)} is not a resource name; use cpu (MHz), memory (MB) "
            "or a device name vendor/type such as nvidia/gpu",
            resource=name if isinstance(name, str) else None,
        )
    at = f'{where}: resource "{name}"'
    for field in ("nominal", "borrowing_limit", "lending_limit"):
        value = getattr(limit, field)
        if value is None and field != "nominal":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise QueueSpecError(
                f"{at}: {_say(field, json_names)} must be an integer >= 0, not {_shown(value)}",
                resource=name,
                field=field,
            )
        if value > MAX_QUANTITY:
            raise QueueSpecError(
                f"{at}: {_say(field, json_names)} must be at most {MAX_QUANTITY}, not {value}",
                resource=name,
                field=field,
            )
    if limit.lending_limit is not None and limit.lending_limit > limit.nominal:
        raise QueueSpecError(
            f"{at}: {_say('lending_limit', json_names)} ({limit.lending_limit}) must not exceed "
            f"{_say('nominal', json_names)} ({limit.nominal}); a queue lends only its own quota",
            resource=name,
            field="lending_limit",
        )


def validate_priority_class(pc: PriorityClass, *, json_names: bool = False) -> None:
    """Refuse a priority class that cannot order workloads; raises QueueSpecError."""
    if not isinstance(pc, PriorityClass):
        raise QueueSpecError("expected a priority class definition")
    _check_name(pc.name, "priority class", json_names)
    where = f'priority class "{pc.name}"'
    value = pc.value
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_PRIORITY <= value <= MAX_PRIORITY
    ):
        raise QueueSpecError(
            f"{where}: {_say('value', json_names)} must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} "
            f"(higher goes first), not {_shown(value)}",
            field="value",
        )
    _check_description(where, pc.description, json_names)


def _check_name(name: Any, kind: str, json_names: bool) -> None:
    if not isinstance(name, str):
        raise QueueSpecError(
            f"{kind}: {_say('name', json_names)} must be a string ({NAME_RULE}), not {_shown(name)}"
        )
    if not name:
        raise QueueSpecError(
            f"{kind}: {_say('name', json_names)} is missing; every {kind} needs a name ({NAME_RULE})"
        )
    if not _NAME.fullmatch(name):
        raise QueueSpecError(f"{kind} name {_shown(name)} is not valid; use {NAME_RULE}")


def _check_choice(
    where: str, field: str, value: Any, allowed: tuple[str, ...], json_names: bool
) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise QueueSpecError(
            f"{where}: {_say(field, json_names)} must be one of {', '.join(allowed)}, not {_shown(value)}",
            field=field,
        )


def _shown(value: Any) -> str:
    """A bad value as the operator would write it in JSON (null, "x", 2.5)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _check_description(where: str, value: Any, json_names: bool) -> None:
    field = _say("description", json_names)
    if not isinstance(value, str):
        raise QueueSpecError(f"{where}: {field} must be a string", field="description")
    if len(value) > MAX_DESCRIPTION:
        raise QueueSpecError(
            f"{where}: {field} is {len(value)} characters long; keep it to {MAX_DESCRIPTION}",
            field="description",
        )


# -- the JSON form ----------------------------------------------------------------------
def read_queue(data: Any) -> Queue:
    """One queue from its JSON form (a map or JSON text; ``{"Queue": {...}}`` is unwrapped), checked."""
    return _queue(_unwrap(_json_value(data, "queue"), "Queue", "queue"), json_names=True)


def read_priority_class(data: Any) -> PriorityClass:
    """One priority class from its JSON form (a map or JSON text; ``{"PriorityClass": ...}`` unwrapped), checked."""
    body = _unwrap(_json_value(data, "priority class"), "PriorityClass", "priority class")
    return _priority_class(body, json_names=True)


def _json_value(data: Any, kind: str) -> Any:
    if isinstance(data, (str, bytes)):
        try:
            return json.loads(data)
        except json.JSONDecodeError as exc:
            raise QueueSpecError(
                f"{kind} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
    return data


def _unwrap(data: Any, wrapper: str, kind: str) -> dict[str, Any]:
    if isinstance(data, dict) and set(data) == {wrapper}:
        data = data[wrapper]
    if not isinstance(data, dict):
        raise QueueSpecError(
            f'a {kind} must be a JSON object, as {{"Name": "team-a", ...}} or {{"{wrapper}": {{...}}}}'
        )
    return data


def _known(
    data: dict[str, Any], names: dict[str, str], where: str, json_names: bool
) -> dict[str, Any]:
    """``data``'s fields by the record's names; an unknown field is an error listing the known ones."""
    by_json = {v: k for k, v in names.items()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _READ_ONLY:
            continue
        field = by_json.get(key)
        if field is None:
            known = ", ".join(v if json_names else k for k, v in names.items())
            raise QueueSpecError(f"{where}: unknown field {_shown(key)}; use {known}")
        out[field] = _whole(value)
    return out


def _whole(value: Any) -> Any:
    """JSON's 2.0 is 2; anything else is checked as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _queue(data: dict[str, Any], *, json_names: bool) -> Queue:
    """The queue of a JSON-form map, checked; field names in errors as the operator wrote them."""
    names = {**_QUEUE_JSON, "resource": "Resources", "preemption": "Preemption"}
    name = data.get("Name")
    where = f'queue "{name}"' if isinstance(name, str) and name else "queue"
    fields = _known(data, names, where, json_names)
    raw_resources = fields.pop("resource", None) or []
    if not isinstance(raw_resources, list):
        raise QueueSpecError(f"{where}: {_say('resource', json_names)} must be a list of resources")
    resources = [_limit(where, r, json_names) for r in raw_resources]
    preemption = fields.pop("preemption", None) or {}
    if not isinstance(preemption, dict):
        raise QueueSpecError(f"{where}: {_say('preemption', json_names)} must be an object")
    fields.update(
        _known(
            preemption, _PREEMPTION_JSON, f"{where}: {_say('preemption', json_names)}", json_names
        )
    )
    fields = {k: v for k, v in fields.items() if v is not None}
    queue = Queue(**{"name": "", **fields, "resources": resources})
    validate_queue(queue, json_names=json_names)
    return queue


def _limit(where: str, data: Any, json_names: bool) -> QuotaLimit:
    if not isinstance(data, dict):
        raise QueueSpecError(
            f'{where}: each resource must be an object, as {{"Name": "cpu", "Nominal": 1000}}'
        )
    name = data.get("Name")
    at = f'{where}: resource "{name}"' if isinstance(name, str) else f"{where}: resource"
    fields = _known(data, _RESOURCE_JSON, at, json_names)
    if "name" not in fields:
        raise QueueSpecError(
            f"{where}: a resource has no {_say('name', json_names)}; name it cpu, memory or vendor/type"
        )
    if fields.get("nominal") is None:
        raise QueueSpecError(
            f"{at}: {_say('nominal', json_names)} is missing; set the queue's own quota (0 or more)",
            resource=fields["name"] if isinstance(fields["name"], str) else None,
        )
    return QuotaLimit(**fields)


def _priority_class(data: dict[str, Any], *, json_names: bool) -> PriorityClass:
    name = data.get("Name")
    where = f'priority class "{name}"' if isinstance(name, str) and name else "priority class"
    fields = _known(data, _CLASS_JSON, where, json_names)
    if fields.get("value") is None:
        raise QueueSpecError(
            f"{where}: {_say('value', json_names)} is missing; set a whole number (higher goes first)"
        )
    pc = PriorityClass(**{"name": "", **{k: v for k, v in fields.items() if v is not None}})
    validate_priority_class(pc, json_names=json_names)
    return pc


def queue_to_json(queue: Queue) -> dict[str, Any]:
    """A queue in its JSON form (as the HTTP API answers it; ``read_queue`` reads it back)."""
    return {
        "Name": queue.name,
        "Cohort": queue.cohort,
        "Resources": [
            {
                "Name": q.name,
                "Nominal": q.nominal,
                "BorrowingLimit": q.borrowing_limit,
                "LendingLimit": q.lending_limit,
            }
            for q in queue.resources
        ],
        "Preemption": {
            "ReclaimWithinCohort": queue.reclaim_within_cohort,
            "WithinQueue": queue.within_queue,
        },
        "QueueingStrategy": queue.queueing_strategy,
        "StopPolicy": queue.stop_policy,
        "Description": queue.description,
        "CreateIndex": queue.create_index,
        "ModifyIndex": queue.modify_index,
    }


def priority_class_to_json(pc: PriorityClass) -> dict[str, Any]:
    """A priority class in its JSON form (``read_priority_class`` reads it back)."""
    return {
        "Name": pc.name,
        "Value": pc.value,
        "Description": pc.description,
        "CreateIndex": pc.create_index,
        "ModifyIndex": pc.modify_index,
    }


# -- answers of the queue reads, in the same JSON names ------------------------------------------
_LEDGER_JSON = {**_RESOURCE_JSON, "used": "Used", "borrowed": "Borrowed", "lent": "Lent"}
_ROW_JSON = {
    "name": "Name",
    "cohort": "Cohort",
    "stop_policy": "StopPolicy",
    "queueing_strategy": "QueueingStrategy",
    "admitted": "Admitted",
    "pending": "Pending",
}
_PENDING_JSON = {
    "job_id": "JobID",
    "namespace": "Namespace",
    "position": "Position",
    "priority": "Priority",
    "priority_class": "PriorityClass",
    "reason": "Reason",
    "create_index": "CreateIndex",
    "evictions": "Evictions",
}
_EVICTION_JSON = {
    "reason": "Reason",
    "message": "Message",
    "preemptor": "Preemptor",
    "index": "Index",
    "time": "Time",
}


def _renamed(row: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """``row``'s known fields under their JSON names; fields this version does not know keep theirs."""
    return {names.get(k, k): v for k, v in row.items()}


def ledger_to_json(ledger: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """A queue's ledger (resource -> nominal, limits, used, borrowed, lent) in JSON names."""
    return {resource: _renamed(row, _LEDGER_JSON) for resource, row in (ledger or {}).items()}


def queue_row_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """One row of the queue list (settings, counts and ledger) in JSON names."""
    out = _renamed(row, _ROW_JSON)
    if "ledger" in row:
        out.pop("ledger")
        out["Ledger"] = ledger_to_json(row["ledger"])
    return out


def queue_status_to_json(data: dict[str, Any]) -> dict[str, Any]:
    """``queue.get``'s answer (the queue's wire map, ledger, counts) as one JSON object:
    the queue's JSON form plus ``Ledger``, ``Admitted`` and ``Pending``."""
    queue = data.get("queue")
    out = queue_to_json(codec.from_wire(Queue, queue, "queue")) if isinstance(queue, dict) else {}
    out["Ledger"] = ledger_to_json(data.get("ledger"))
    out["Admitted"] = data.get("admitted", 0)
    out["Pending"] = data.get("pending", 0)
    return out


def priority_class_row_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """One row of the priority class list (a wire map) in JSON names."""
    return _renamed(
        row, {**_CLASS_JSON, "create_index": "CreateIndex", "modify_index": "ModifyIndex"}
    )


def pending_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """One pending workload (position, priority, reason, last eviction) in JSON names."""
    out = _renamed(row, _PENDING_JSON)
    if "last_eviction" in row:
        out.pop("last_eviction")
        last = row["last_eviction"]
        out["LastEviction"] = _renamed(last, _EVICTION_JSON) if isinstance(last, dict) else None
    return out


# -- the HCL form -------------------------------------------------------------------------
def read_queues(text: str, source: str = "") -> list[Queue]:
    """Every queue of a file, HCL (``queue "NAME" { ... }`` blocks) or JSON (one queue, or a list), checked.

    Which form it is goes by ``source``'s extension (.hcl, .json), else by
    whether the text starts like JSON. Nothing is returned unless every
    queue is valid, so a bad file changes nothing.
    """
    if not looks_like_hcl(source, text):
        items = _json_list(text, source, "Queue", "queue")
        return _distinct([read_queue(item) for item in items], "queue", source)
    reader = _QueueHCL(text, source)
    blocks = reader.converted("queue", reader.queue)
    out = [
        _located(reader, path, lambda body: _queue(body, json_names=False), body)
        for path, body in blocks
    ]
    return _distinct(out, "queue", source)


def read_priority_classes(text: str, source: str = "") -> list[PriorityClass]:
    """Every priority class of a file, HCL (``priority_class "NAME" { value = N }``) or JSON, checked."""
    if not looks_like_hcl(source, text):
        items = _json_list(text, source, "PriorityClass", "priority class")
        return _distinct([read_priority_class(item) for item in items], "priority class", source)
    reader = _QueueHCL(text, source)
    blocks = reader.converted("priority_class", reader.priority_class)
    out = [
        _located(reader, path, lambda body: _priority_class(body, json_names=False), body)
        for path, body in blocks
    ]
    return _distinct(out, "priority class", source)


def _json_list(text: str, source: str, wrapper: str, kind: str) -> list[Any]:
    """The objects of a JSON file: one object (wrapped or not) or a list of them."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"{source}: " if source else ""
        raise QueueSpecError(
            f"{at}not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise QueueSpecError(f"{source + ': ' if source else ''}the file holds no {kind}")
    return items


def _distinct(items: list[Any], kind: str, source: str) -> list[Any]:
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            at = f"{source}: " if source else ""
            raise QueueSpecError(f'{at}{kind} "{item.name}" is defined twice; define each once')
        seen.add(item.name)
    return items


def _located(
    reader: _QueueHCL, path: Path, read: Callable[[dict[str, Any]], Any], body: dict[str, Any]
) -> Any:
    """``read(body)``, its error prefixed with the block's file and line."""
    try:
        return read(body)
    except QueueSpecError as exc:
        raise QueueSpecError(f"{reader.where(*reader.spot(path, body, exc))}{exc}") from None


class _QueueHCL(HCLValues):
    """A queue file's HCL turned into the JSON form; anything it does not know is an error, with its line."""

    def __init__(self, text: str, source: str) -> None:
        if not isinstance(text, str):
            raise QueueSpecError("the definition must be HCL or JSON text")
        try:
            data, blocks, attrs = load_hcl(text, source)
        except HCLError as exc:
            raise QueueSpecError(str(exc)) from None
        super().__init__(blocks, attrs, {}, source)
        self.data = data
        self.allowed: dict[str, str] = {}

    def converted(
        self, kind: str, convert: Callable[[list[str], dict[str, Any], Path], dict[str, Any]]
    ) -> list[tuple[Path, dict[str, Any]]]:
        """(path, JSON form) of each top-level ``kind`` block; raises QueueSpecError (HCL's errors too)."""
        try:
            return self._top_blocks(kind, convert)
        except HCLError as exc:  # a block's labels or an attribute's type, with its line
            raise QueueSpecError(str(exc)) from None

    def _top_blocks(
        self, kind: str, convert: Callable[[list[str], dict[str, Any], Path], dict[str, Any]]
    ) -> list[tuple[Path, dict[str, Any]]]:
        """(path, JSON form) of each top-level ``kind`` block; any other top-level content is an error."""
        other = "priority_class" if kind == "queue" else "queue"
        out = []
        for name, raw in self.data.items():
            if name == BLOCK_MARK:
                continue
            found = block_list(raw)
            if name != kind or found is None:
                hint = (
                    f"; {other} blocks go to caravan {other.replace('_', '-')} apply"
                    if name == other
                    else ""
                )
                what = "block" if found is not None else "attribute"
                path = ((name, 0),) if found is not None else ()
                at = self.where(path, None if found is not None else name)
                raise QueueSpecError(
                    f'{at}unknown {what} "{name}": this file holds {kind} "NAME" {{ ... }} blocks{hint}'
                )
            out.extend(
                (((kind, n),), convert(labels, body, ((kind, n),)))
                for n, (labels, body) in enumerate(found)
            )
        if not out:
            raise QueueSpecError(
                f'{self.source + ": " if self.source else ""}no {kind} "NAME" {{ ... }} block found'
            )
        return out

    def spot(
        self, path: Path, body: dict[str, Any], exc: QueueSpecError
    ) -> tuple[Path, str | None]:
        """(block path, attribute) of what ``exc`` is about, inside the block at ``path``, as far as known."""
        at = path
        if exc.resource is not None:
            names = [r.get("Name") for r in body.get("Resources") or []]
            if (
                exc.resource in names
            ):  # the last one: a resource listed twice is at fault the second time
                at = path + (("resource", len(names) - 1 - names[::-1].index(exc.resource)),)
        elif exc.field in _PREEMPTION_JSON:
            at = path + (("preemption", 0),)
        if at not in self.blocks:
            at = path
        return at, exc.field if (at, exc.field) in self.attrs else None

    # -- blocks ---------------------------------------------------------------------
    def queue(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """``queue "NAME" { ... }`` as the queue's JSON form (values unchecked: ``_queue`` checks them)."""
        (name,) = self.labels(path, "queue", labels, 1)
        out: dict[str, Any] = {"Name": name}
        resources: list[dict[str, Any]] = []
        seen_preemption: list[Path] = []

        def preemption(lab: list[str], inner: dict[str, Any], sub: Path) -> None:
            self.labels(sub, "preemption", lab, 0)
            if seen_preemption:
                raise QueueSpecError(
                    f'{self.where(sub)}queue "{name}" has more than one preemption block; write one'
                )
            seen_preemption.append(sub)
            out["Preemption"] = self.walk(inner, sub, "preemption", _PREEMPTION_JSON, {})

        def resource(lab: list[str], inner: dict[str, Any], sub: Path) -> None:
            (res,) = self.labels(sub, "resource", lab, 1)
            resources.append(
                {"Name": res, **self.walk(inner, sub, f'resource "{res}"', _RESOURCE_JSON, {})}
            )

        attrs = {k: v for k, v in _QUEUE_JSON.items() if k != "name"}
        out.update(
            self.walk(
                body,
                path,
                f'queue "{name}"',
                attrs,
                {"resource": resource, "preemption": preemption},
            )
        )
        if resources:
            out["Resources"] = resources
        return out

    def priority_class(self, labels: list[str], body: dict[str, Any], path: Path) -> dict[str, Any]:
        """``priority_class "NAME" { value = N }`` as its JSON form."""
        (name,) = self.labels(path, "priority_class", labels, 1)
        attrs = {k: v for k, v in _CLASS_JSON.items() if k != "name"}
        return {"Name": name, **self.walk(body, path, f'priority_class "{name}"', attrs, {})}

    def walk(
        self,
        body: dict[str, Any],
        path: Path,
        context: str,
        attrs: dict[str, str],
        blocks: dict[str, BlockHandler],
    ) -> dict[str, Any]:
        """One block body: ``attrs`` (HCL name -> JSON name) into the answer, ``blocks`` to their handlers."""
        self.allowed[context] = ", ".join(
            [*(a for a in attrs if a != "name"), *(f"{b} blocks" for b in blocks)]
        )
        specs: dict[str, AttrSpec] = {
            a: (j, lambda _p, _n, raw: self.value(raw)) for a, j in attrs.items() if a != "name"
        }
        out: dict[str, Any] = {}
        self.body(body, path, context, specs, blocks, out)
        return out

    def ignore_attr(self, path: Path, name: str, context: str) -> None:
        """Unknown attributes are errors here (a misspelt limit must not vanish)."""
        hint = self.allowed.get(context) or "nothing else"
        raise QueueSpecError(
            f'{self.where(path, name)}{context}: unknown attribute "{name}"; use {hint}'
        )

    def ignore_block(self, path: Path, name: str, labels: list[str], context: str) -> None:
        """Unknown blocks are errors here, as unknown attributes are."""
        hint = self.allowed.get(context) or "nothing else"
        raise QueueSpecError(f'{self.where(path)}{context}: unknown block "{name}"; use {hint}')
