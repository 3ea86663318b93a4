"""Append-only recording of a run: client events per workload and nemesis faults.

Events are written and flushed line by line as they happen, so a run that
crashes half way still leaves a history the checkers can read (open invokes
become ``info``). Times are seconds on the monotonic clock since the run
started, shared by clients and nemesis so fault windows line up with
operations.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jepsen_like.history import Event, EventType, event_to_json

FAULTS_FILE = "faults.jsonl"


def history_file(workload: str) -> str:
    return f"history-{workload}.jsonl"


class Clock:
    """Monotonic seconds since the run started (rounded to microseconds)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)


class HistoryRecorder:
    """Thread-safe JSONL writer of one workload's events."""

    def __init__(self, path: str | Path, clock: Clock) -> None:
        self.path = Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self._fp = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.events: list[Event] = []

    def record(
        self, process: int, type: EventType, value: Any = None, key: Hashable | None = None
    ) -> float:
        with self._lock:
            t = self.clock.now()
            event = Event(process=process, type=type, time=t, value=value, key=key)
            self._fp.write(event_to_json(event) + "\n")
            self._fp.flush()
            self.events.append(event)
            return t

    def close(self) -> None:
        with self._lock:
            if not self._fp.closed:
                self._fp.close()


@dataclass
class Fault:
    """One fault window: what the nemesis did, to whom, from ``start`` to ``end``."""

    kind: str
    start: float
    end: float | None = None
    targets: list[str] = field(default_factory=list)
    detail: str = ""
    #: the server that led when the fault began (None: none answered, or not recorded)
    leader: str | None = None
    #: when the injection was done (the partition cut, the kill sent); ``start`` is before it
    injected: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fault:
        return cls(
            kind=data["kind"],
            start=data["start"],
            end=data.get("end"),
            targets=list(data.get("targets") or []),
            detail=data.get("detail", ""),
            leader=data.get("leader"),
            injected=data.get("injected"),
        )


class FaultLog:
    """Fault windows, appended as each one closes (and once more at the end)."""

    def __init__(self, path: str | Path, clock: Clock) -> None:
        self.path = Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self.faults: list[Fault] = []

    def begin(
        self,
        kind: str,
        targets: list[str],
        detail: str = "",
        start: float | None = None,
        leader: str | None = None,
    ) -> Fault:
        with self._lock:
            now = self.clock.now()
            fault = Fault(
                kind=kind,
                start=now if start is None else start,
                targets=list(targets),
                detail=detail,
                leader=leader,
                injected=now,  # begin() follows the injection
            )
            self.faults.append(fault)
            self._save()
            return fault

    def end(self, fault: Fault, detail: str = "") -> None:
        with self._lock:
            fault.end = self.clock.now()
            if detail:
                fault.detail = f"{fault.detail}; {detail}" if fault.detail else detail
            self._save()

    def note(self, fault: Fault, detail: str) -> None:
        """Add to a window's detail after it closed (what a check after the heal found)."""
        with self._lock:
            fault.detail = f"{fault.detail}; {detail}" if fault.detail else detail
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            "".join(json.dumps(f.to_json()) + "\n" for f in self.faults), encoding="utf-8"
        )
        tmp.replace(self.path)


def load_faults(path: str | Path) -> list[Fault]:
    p = Path(path)
    if not p.exists():
        return []
    return [
        Fault.from_json(json.loads(line))
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
