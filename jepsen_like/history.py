"""Concurrent histories: what a client saw, recorded as invoke/complete events.

A test harness cannot know when an operation took effect on the cluster, only
when the client sent it (invoke) and when, if ever, it heard back (ok / fail /
info). The checker therefore works on *operations* with a call time and a
return time; this module turns a stream of events into such operations and
stores histories as JSON Lines, one event per line, so a run that crashes half
way still leaves a readable history (its open invokes simply become ``info``).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "fail", "info"]
EventType = Literal["invoke", "ok", "fail", "info"]


class _Unknown(enum.Enum):
    """Sentinel type for "the client never learned the result".

    ``None`` cannot play this role: it is a real answer (a read of an unset
    register returns nil).
    """

    UNKNOWN = "unknown"

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown.UNKNOWN


@dataclass(frozen=True)
class Operation:
    """One client operation with the interval in which it must have taken effect.

    ``status`` says what the checker may assume:

    * ``ok``: it took effect exactly once, between ``call_time`` and
      ``return_time``, and produced ``output``.
    * ``fail``: it definitely did not take effect; the checker drops it.
    * ``info``: unknown outcome (timeout, crash). It may have taken effect at
      any time after ``call_time`` -- even after the client gave up -- or never,
      so its ``return_time`` is ``None`` (read: +infinity) and its ``output``
      is ``UNKNOWN``.
    """

    process: int
    call_time: int | float
    return_time: int | float | None
    input: Any
    output: Any
    key: Hashable | None = None
    status: Status = "ok"

    def __post_init__(self) -> None:
        if self.status not in ("ok", "fail", "info"):
            raise ValueError(f"unknown status {self.status!r}")
        if self.status == "ok" and self.return_time is None:
            raise ValueError(f"an ok operation needs a return time: {self}")
        if self.return_time is not None and self.return_time < self.call_time:
            raise ValueError(f"operation returns before it is called: {self}")

    @property
    def effective_return_time(self) -> float:
        """Return time for ordering; an info operation is never "over"."""
        if self.status == "info" or self.return_time is None:
            return math.inf
        return self.return_time


@dataclass(frozen=True)
class Event:
    """One line of a recorded history: an invoke or a completion.

    For ``invoke`` the ``value`` is the operation's input, for ``ok`` and
    ``fail`` its output; an ``info`` completion carries no usable value.
    """

    process: int
    type: EventType
    time: int | float
    value: Any = None
    key: Hashable | None = None


def operations_from_events(events: Iterable[Event]) -> list[Operation]:
    """Pair each invoke with its process's next completion.

    Jepsen-style clients are sequential per process, so a second invoke while
    one is outstanding means the recording is broken; failing loudly beats
    checking a history that does not describe what happened. An invoke still
    open at the end becomes ``info``: the client crashed or the run stopped,
    and the operation may yet have been applied.
    """
    pending: dict[int, tuple[Event, int]] = {}
    slots: list[Operation | None] = []
    for event in events:
        if event.type == "invoke":
            if event.process in pending:
                raise ValueError(f"process {event.process} invoked twice without completing")
            pending[event.process] = (event, len(slots))
            slots.append(None)
            continue
        if event.type not in ("ok", "fail", "info"):
            raise ValueError(f"unknown event type {event.type!r}")
        if event.process not in pending:
            raise ValueError(f"process {event.process} completed without an invoke: {event}")
        invoke, slot = pending.pop(event.process)
        if event.type == "info":
            slots[slot] = _info_operation(invoke)
        else:
            slots[slot] = Operation(
                process=invoke.process,
                call_time=invoke.time,
                return_time=event.time,
                input=invoke.value,
                output=event.value,
                key=invoke.key,
                status=event.type,
            )
    for invoke, slot in pending.values():
        slots[slot] = _info_operation(invoke)
    return [op for op in slots if op is not None]


def _info_operation(invoke: Event) -> Operation:
    return Operation(
        process=invoke.process,
        call_time=invoke.time,
        return_time=None,
        input=invoke.value,
        output=UNKNOWN,
        key=invoke.key,
        status="info",
    )


def events_from_operations(operations: Iterable[Operation]) -> list[Event]:
    """Flatten operations back into time-ordered events (inverse of pairing).

    Info operations get no completion event: an open invoke already means
    "unknown outcome", and it keeps save/load a lossless round trip.
    """
    events: list[tuple[float, int, int, Event]] = []
    for index, op in enumerate(operations):
        events.append(
            (op.call_time, 0, index, Event(op.process, "invoke", op.call_time, op.input, op.key))
        )
        if op.status != "info" and op.return_time is not None:
            completion = Event(op.process, op.status, op.return_time, op.output, op.key)
            events.append((op.return_time, 1, index, completion))
    events.sort(key=lambda item: item[:3])
    return [event for *_, event in events]


def event_to_json(event: Event) -> str:
    """One compact JSON object per event, so a recorder can append and flush line by line."""
    record: dict[str, Any] = {
        "process": event.process,
        "type": event.type,
        "time": event.time,
        "value": _to_json_value(event.value),
    }
    if event.key is not None:
        record["key"] = event.key
    return json.dumps(record, separators=(",", ":"))


def event_from_json(line: str) -> Event:
    record = json.loads(line)
    return Event(
        process=record["process"],
        type=record["type"],
        time=record["time"],
        value=record.get("value"),
        key=record.get("key"),
    )


def _to_json_value(value: Any) -> Any:
    return None if value is UNKNOWN else value


def save_history(path: str | Path, operations: Sequence[Operation]) -> None:
    """Write a history as JSONL events (the format the harness appends to)."""
    with open(path, "w", encoding="utf-8") as fp:
        for event in events_from_operations(operations):
            fp.write(event_to_json(event) + "\n")


def load_events(path: str | Path) -> list[Event]:
    with open(path, encoding="utf-8") as fp:
        return [event_from_json(line) for line in fp if line.strip()]


def load_history(path: str | Path) -> list[Operation]:
    """Read a JSONL event log and pair it into operations."""
    return operations_from_events(load_events(path))
