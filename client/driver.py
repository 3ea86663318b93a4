"""The ``sim`` task driver: what a simulated task does, from its ``Config``.

``{"run_for": "2s", "exit_code": 0, "fail_rate": 0.0, "healthy": true, "unhealthy_rate": 0.0}``:

- ``run_for`` (Go duration string, or nanoseconds as an integer): the task
  exits after that long. Without it the task runs until it is stopped.
- ``exit_code``: the exit code when it exits; non-zero means failed.
- ``fail_rate`` (0..1): the chance that the task fails anyway (for load
  tests). A task without ``run_for`` that draws a failure fails after
  ``fail_after`` (default a random 0.5-5 s).
- ``healthy`` (default true): false means the task runs but its health
  checks never pass, so an alloc of a deployment is reported unhealthy once
  the group's ``healthy_deadline`` has passed, as Nomad's client reports it.
- ``unhealthy_rate`` (0..1): the chance that a task's checks never pass.
- ``write_mb`` (MB, default 0) and ``files`` (default 1 if ``write_mb``, else
  0): what the task writes when it starts, in its directory under the
  node's data dir (``<data_dir>/<node>/alloc/<alloc>/<task>/local``):
  ``write_mb`` MB spread over ``files`` files, so an alloc's disk and inode
  use are real, and the client's GC measures and frees them.
- ``fail_cleanup`` (default false): removing the alloc's directory fails (the
  driver's cleanup errs), so the GC logs it with the alloc's id and goes on.

An allocation runs all its group's tasks: it completes when every task has
exited successfully, fails as soon as one fails, and runs until stopped if
any task has no ``run_for``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

_DURATION = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class DriverError(ValueError):
    """A task config the sim driver cannot run; the message names the field."""


def parse_duration(value: Any, field: str) -> float:
    """Seconds from a Go duration string ("1m30s") or integer nanoseconds."""
    if isinstance(value, bool):
        raise DriverError(f"{field}: expected a duration like \"2s\", got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise DriverError(f"{field}: must not be negative")
        return float(value) / 1e9
    if not isinstance(value, str) or not value:
        raise DriverError(f"{field}: expected a duration like \"2s\", got {value!r}")
    if value == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(value):
        match = _DURATION.match(value, pos)
        if match is None:
            raise DriverError(f"{field}: invalid duration {value!r} (use e.g. \"500ms\", \"2s\", \"1m\")")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return total


@dataclass(frozen=True)
class TaskSpec:
    name: str
    run_for: float | None  # seconds; None: until stopped
    exit_code: int = 0
    fail_rate: float = 0.0
    fail_after: float | None = None
    healthy: bool = True
    unhealthy_rate: float = 0.0
    write_mb: float = 0.0
    files: int = 0
    fail_cleanup: bool = False


MAX_WRITE_MB = 1 << 20  # a simulated task writes at most 1 TB (a typo guard, not a quota)
MAX_FILES = 1_000_000


def task_spec(task: dict[str, Any]) -> TaskSpec:
    """A Nomad-JSON task (Name, Driver, Config) as the sim driver reads it."""
    name = str(task.get("Name", "task"))
    driver = task.get("Driver", "sim")
    if driver != "sim":
        raise DriverError(f"task {name}: driver {driver!r} is not available on simulated nodes (use \"sim\")")
    config = task.get("Config") or {}
    if not isinstance(config, dict):
        raise DriverError(f"task {name}: Config must be a map")
    run_for = parse_duration(config["run_for"], f"task {name}: run_for") if "run_for" in config else None
    exit_code = config.get("exit_code", 0)
    if not isinstance(exit_code, int) or isinstance(exit_code, bool):
        raise DriverError(f"task {name}: exit_code must be an integer")
    fail_rate = _rate(config, "fail_rate", name)
    fail_after = parse_duration(config["fail_after"], f"task {name}: fail_after") if "fail_after" in config else None
    healthy = config.get("healthy", True)
    if not isinstance(healthy, bool):
        raise DriverError(f"task {name}: healthy must be true or false")
    write_mb, files, fail_cleanup = _disk_options(config, name)
    return TaskSpec(name, run_for, exit_code, fail_rate, fail_after, healthy, _rate(config, "unhealthy_rate", name),
                    write_mb, files, fail_cleanup)


def _disk_options(config: dict[str, Any], task: str) -> tuple[float, int, bool]:
    """(write_mb, files, fail_cleanup) of a task's config, checked."""
    write_mb = config.get("write_mb", 0)
    if not isinstance(write_mb, int | float) or isinstance(write_mb, bool) or not 0 <= write_mb <= MAX_WRITE_MB:
        raise DriverError(f"task {task}: write_mb must be a number of MB from 0 to {MAX_WRITE_MB}")
    files = config.get("files", 1 if write_mb else 0)
    if not isinstance(files, int) or isinstance(files, bool) or not 0 <= files <= MAX_FILES:
        raise DriverError(f"task {task}: files must be an integer from 0 to {MAX_FILES}")
    if write_mb and not files:
        raise DriverError(f"task {task}: write_mb needs at least one file to write to (files >= 1)")
    fail_cleanup = config.get("fail_cleanup", False)
    if not isinstance(fail_cleanup, bool):
        raise DriverError(f"task {task}: fail_cleanup must be true or false")
    return float(write_mb), files, fail_cleanup


def _rate(config: dict[str, Any], key: str, task: str) -> float:
    value = config.get(key, 0.0)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        raise DriverError(f"task {task}: {key} must be a number between 0 and 1")
    return float(value)


@dataclass(frozen=True)
class Outcome:
    """How an allocation's run ends: after ``after`` seconds (None: never), failed or not.

    ``healthy`` is false when some task's health checks never pass.
    """

    after: float | None
    failed: bool
    description: str
    healthy: bool = True


def plan_run(tasks: list[TaskSpec], rng: random.Random) -> Outcome:
    """Decide up front when and how a simulated allocation ends, and whether its checks pass."""
    healthy = all(t.healthy and not (t.unhealthy_rate and rng.random() < t.unhealthy_rate) for t in tasks)
    ends: list[tuple[float | None, bool, str]] = []
    for t in tasks:
        if t.fail_rate and rng.random() < t.fail_rate:
            after = t.run_for if t.run_for is not None else (t.fail_after if t.fail_after is not None else rng.uniform(0.5, 5.0))
            ends.append((after, True, f"task {t.name} failed (simulated, fail_rate {t.fail_rate:g})"))
        elif t.run_for is None:
            ends.append((None, False, ""))
        else:
            failed = t.exit_code != 0
            ends.append((t.run_for, failed, f"task {t.name} exited with code {t.exit_code}" if failed else ""))
    failures = [e for e in ends if e[1]]
    if failures:
        after, _, why = min(failures, key=lambda e: e[0] if e[0] is not None else float("inf"))
        return Outcome(after, True, why, healthy)
    if any(e[0] is None for e in ends) or not ends:
        return Outcome(None, False, "", healthy)
    return Outcome(max(e[0] for e in ends if e[0] is not None), False, "all tasks exited successfully", healthy)
