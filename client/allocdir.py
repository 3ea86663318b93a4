"""Alloc directories on a simulated node's disk: made, written, measured, destroyed.

Layout, after Nomad's client: ``<data_dir>/<node id>/alloc/<alloc id>/<task>/local``.
Each function blocks (file I/O); the collector runs them in threads.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from client.driver import TaskSpec

CHUNK = 1 << 20  # bytes written per call
MB = 1 << 20


class CleanupError(Exception):
    """The driver could not clean an alloc up; its directory stays (the message says why)."""


def alloc_path(data_dir: str, node_id: str, alloc_id: str) -> str:
    """Where one alloc of one node lives."""
    return os.path.join(data_dir, node_id, "alloc", alloc_id)


def build(path: str, tasks: Sequence[TaskSpec]) -> None:
    """Make the alloc's directory and each task's, and write what each task writes (``write_mb`` over ``files``)."""
    os.makedirs(path, exist_ok=True)
    for task in tasks:
        local = os.path.join(path, _safe(task.name), "local")
        os.makedirs(local, exist_ok=True)
        total = int(task.write_mb * MB)
        for i in range(task.files):
            size = total // task.files + (1 if i < total % task.files else 0)
            _write(os.path.join(local, f"data-{i}"), size)


def _safe(name: str) -> str:
    """A task name as one path component (a task cannot write outside its alloc's directory)."""
    cleaned = name.replace(os.sep, "_").replace("\0", "_")
    return cleaned if cleaned not in ("", ".", "..") else "_task"


def _write(path: str, size: int) -> None:
    block = b"\0" * min(CHUNK, size)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, CHUNK)
            f.write(block[:n] if n < len(block) else block)
            left -= n


def measure(path: str) -> tuple[int, int]:
    """(bytes, inodes) under ``path``: the sizes of its files, and its files and directories counted."""
    total, inodes = 0, 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        inodes += 1
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
                continue
            inodes += 1
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                inodes -= 1
    return total, inodes


def destroy(path: str, tasks: Sequence[TaskSpec]) -> None:
    """The driver's cleanup, then the directory's removal; raises ``CleanupError`` if either fails."""
    failing = [t.name for t in tasks if t.fail_cleanup]
    if failing:
        raise CleanupError(
            f"sim driver cleanup of task {failing[0]} failed (simulated: fail_cleanup = true)"
        )
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CleanupError(f"removing {path}: {exc.strerror or exc}") from None
