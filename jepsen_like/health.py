"""After each heal: is every server that should be up, up? And if not, whose failure is it?

A server that did not come back after a fault used to surface only at the
final convergence check, tens of seconds later, as "never answered". The
nemesis now asks right after it undid a fault: each server that should run
must be alive and answer RPC with its raft up within a deadline. One that
does not is reported at once, with the cause read from what it printed
since its last start (``caravan agent: cannot start: [Errno 98] ...``).

Each is classified:

* ``harness`` -- the harness could not do what it meant to: the server
  exited and one of its ports is held by another process (the harness could
  not give it its address back), or the harness killed it and never started
  it again. The run is inconclusive, not a product bug.
* ``anomaly`` -- the product's failure: the server exited though its ports
  are free, or runs and does not answer, or answers and never gets its raft
  up (a join that never completes).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from jepsen_like.testbed import Testbed
from node import devcluster as cl

Kind = Literal["harness", "anomaly"]
#: the role a server reports while its raft node is not up yet (``raft.starting``, which the harness may not import)
ROLE_STARTING = "starting"
#: seconds a healed server may take to run and answer with its raft up (imports, log replay, a join)
UP_WAIT = 30.0


@dataclass
class NotUp:
    """One server that should be up and is not, found after healing ``after``."""

    server: str
    kind: Kind
    cause: str
    after: str = ""
    at: float = 0.0  # run clock seconds when it was found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        who = "harness failure" if self.kind == "harness" else "ANOMALY"
        return f"{who}: {self.server} is not up after healing {self.after or 'the faults'}: {self.cause}"


def check_up(testbed: Testbed, names: list[str], timeout: float = UP_WAIT) -> list[NotUp]:
    """The servers of ``names`` not up within ``timeout``: each alive and answering RPC with its raft up.

    A server found dead is diagnosed at once (a dead process does not come
    back by itself); one that runs gets until the deadline.
    """
    deadline = time.monotonic() + timeout
    pending = list(names)
    found: list[NotUp] = []
    while pending:
        for name in list(pending):
            if not testbed.alive(name):
                found.append(diagnose(testbed, name, timeout))
                pending.remove(name)
                continue
            status = cl.status_of(testbed.node(name).rpc_addr, timeout=1.0)
            if status is not None and status.get("Role") != ROLE_STARTING:
                pending.remove(name)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.2)  # polling the servers with a deadline
    return found + [diagnose(testbed, name, timeout) for name in pending]


def diagnose(testbed: Testbed, name: str, waited: float) -> NotUp:
    """Why ``name`` is not up, and whose failure that is (see the module docstring)."""
    node = testbed.node(name)
    said = server_said(testbed, name)
    if not testbed.alive(name) and name in testbed.killed:
        return NotUp(
            name,
            "harness",
            "killed by the harness and not started again (a fault's undo did not restart it)",
        )
    if not testbed.alive(name):
        taken = [a for a in testbed.listen_addresses(name) if not _free(a)]
        if taken:
            return NotUp(
                name,
                "harness",
                f"exited ({said}); its address {', '.join(taken)} is held by another "
                "process, so the harness could not give it its port back",
            )
        return NotUp(name, "anomaly", f"exited though its ports are free ({said})")
    status = cl.status_of(node.rpc_addr, timeout=1.0)
    if status is None:
        return NotUp(
            name,
            "anomaly",
            f"runs (pid {node.pid}) but its RPC at {node.rpc_addr} did not answer "
            f"within {waited:g}s ({said})",
        )
    return NotUp(
        name,
        "anomaly",
        f"answers, but its raft was not up within {waited:g}s (role "
        f"{status.get('Role')!r}; {said})",
    )


def _free(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return cl.port_is_free(host, int(port))


def server_said(testbed: Testbed, name: str) -> str:
    """What the server printed since its last start: its last output line and its last error log event."""
    node = testbed.node(name)
    out_mark, log_mark = testbed.output_marks.get(name, (0, 0))
    out_lines = _lines_since(Path(node.log_file).with_suffix(".out"), out_mark)
    parts = []
    if out_lines:
        parts.append(f"last output: {out_lines[-1][:240]}")
    error = _last_error(_lines_since(Path(node.log_file), log_mark))
    if error:
        parts.append(f"last error logged: {error}")
    return "; ".join(parts) or f"it printed nothing since its start; see {node.log_file}"


def _lines_since(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()]


def _last_error(lines: list[str]) -> str:
    """The last error/critical event of a server's JSON log, as ``event: error`` (300 characters at most)."""
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("level", "")).lower() in (
            "error",
            "critical",
        ):
            error = f": {record['error']}" if record.get("error") else ""
            return f"{record.get('event', '')}{error}"[:300]
    return ""
