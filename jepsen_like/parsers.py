"""Readers for the recorded test vectors in ``shared/testdata/linearizability``.

Both formats are event logs; they are turned into ``Event``s and paired by
``operations_from_events`` like our own JSONL histories, so the checker is
validated on exactly the code path our harness will use. Timestamps are line
numbers: the logs are already in real-time order and carry no clock.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jepsen_like.history import Event, Operation, operations_from_events

# Fields are separated by tabs in most etcd logs and by spaces in a few.
_ETCD_LINE = re.compile(r"^INFO\s+jepsen\.util\s+-\s+(\d+)\s+:(\w+)\s+:(\w+)\s*(.*?)\s*$")
_ETCD_CAS = re.compile(r"^\[(\S+)\s+(\S+)\]$")
_KV_LINE = re.compile(
    r'^\{:process (\d+), :type :(\w+), :f :(\w+), :key "((?:[^"\\]|\\.)*)", '
    r':value (nil|"((?:[^"\\]|\\.)*)")\}$'
)


def _etcd_value(text: str) -> int | None:
    return None if text == "nil" else int(text)


def parse_etcd_log(path: str | Path) -> list[Operation]:
    """Parse a Jepsen etcd register log (``N :TYPE :F VALUE`` lines).

    Two Jepsen conventions need translating into our statuses:

    * ``:fail :cas`` means etcd answered "compare failed". That is a definite
      result (the value was not the expected one when the CAS took effect), so
      it becomes an ``ok`` operation with output ``False`` rather than a
      dropped ``fail`` -- dropping it would throw away evidence.
    * ``:fail :read :timed-out`` and ``:info ... :timed-out`` are unknown
      outcomes and become ``info``; so does an invoke never completed.

    Lines that are not process events (nemesis, other loggers) are skipped.
    """
    events: list[Event] = []
    with open(path, encoding="utf-8") as fp:
        for lineno, line in enumerate(fp):
            match = _ETCD_LINE.match(line)
            if match is None:
                continue
            process, kind, f, raw = int(match[1]), match[2], match[3], match[4]
            if kind == "invoke":
                events.append(Event(process, "invoke", lineno, _etcd_input(f, raw)))
            elif kind == "info" or raw == ":timed-out":
                events.append(Event(process, "info", lineno))
            elif kind in ("ok", "fail"):
                events.append(Event(process, "ok", lineno, _etcd_output(f, kind, raw)))
            else:
                raise ValueError(f"{path}:{lineno + 1}: unexpected event type {kind!r}")
    return operations_from_events(events)


def _etcd_input(f: str, raw: str) -> dict[str, Any]:
    if f == "read":
        return {"f": "read"}
    if f == "write":
        return {"f": "write", "value": _etcd_value(raw)}
    if f == "cas":
        match = _ETCD_CAS.match(raw)
        if match is None:
            raise ValueError(f"malformed cas argument {raw!r}")
        return {"f": "cas", "from": _etcd_value(match[1]), "to": _etcd_value(match[2])}
    raise ValueError(f"unknown etcd operation {f!r}")


def _etcd_output(f: str, kind: str, raw: str) -> Any:
    if f == "read":
        if kind == "fail":
            raise ValueError(f"failed read without :timed-out: {raw!r}")
        return _etcd_value(raw)
    if f == "cas":
        return kind == "ok"
    if f == "write" and kind == "ok":
        return None
    raise ValueError(f"unexpected completion :{kind} :{f} {raw}")


def parse_kv_log(path: str | Path) -> list[Operation]:
    """Parse an EDN key-value history (``{:process P, :type ..., :f ..., :key K, :value V}``)."""
    events: list[Event] = []
    with open(path, encoding="utf-8") as fp:
        for lineno, line in enumerate(fp):
            line = line.strip()
            if not line:
                continue
            match = _KV_LINE.match(line)
            if match is None:
                raise ValueError(f"{path}:{lineno + 1}: unrecognized line {line!r}")
            process, kind, f, key = int(match[1]), match[2], match[3], _unescape(match[4])
            value = None if match[5] == "nil" else _unescape(match[6])
            if f not in ("get", "put", "append"):
                raise ValueError(f"{path}:{lineno + 1}: unknown operation {f!r}")
            if kind == "invoke":
                op_input = {"f": f, "key": key}
                if f != "get":
                    op_input["value"] = value
                events.append(Event(process, "invoke", lineno, op_input, key))
            elif kind == "ok":
                events.append(Event(process, "ok", lineno, value if f == "get" else None, key))
            elif kind in ("fail", "info"):
                events.append(Event(process, kind, lineno, None, key))
            else:
                raise ValueError(f"{path}:{lineno + 1}: unexpected event type {kind!r}")
    return operations_from_events(events)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def load_verdicts(path: str | Path) -> dict[str, str]:
    """Read ``VERDICTS.tsv`` (file name, tab, expected verdict) into a dict."""
    verdicts: dict[str, str] = {}
    with open(path, encoding="utf-8") as fp:
        for line in fp:
            if not line.strip() or line.startswith("#"):
                continue
            name, verdict = line.rstrip("\n").split("\t")[:2]
            verdicts[name.strip()] = verdict.strip()
    return verdicts
