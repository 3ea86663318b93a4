"""Progress of long CLI operations, on stderr: a rich bar on a terminal, plain periodic lines otherwise.

A snapshot save of a million objects, a forced GC of a large backlog or a
restore runs for tens of seconds; silence for that long reads as a hang.
On a terminal the operator gets a bar with counts and a rate (rich); in a
pipe, a log or CI, one plain line every few seconds, which a log keeps
and a test can read. Progress always goes to stderr, so stdout (and
``--json`` output) carries only the answer.

``CARAVAN_PROGRESS_INTERVAL`` sets the seconds between plain lines
(default 2); ``CARAVAN_PROGRESS=0`` turns progress off.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.text import Text

DEFAULT_INTERVAL = 2.0  # seconds between plain progress lines


def interval() -> float:
    """Seconds between plain lines (``CARAVAN_PROGRESS_INTERVAL``; tests set it low)."""
    try:
        return max(0.05, float(os.environ.get("CARAVAN_PROGRESS_INTERVAL", DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def enabled() -> bool:
    return os.environ.get("CARAVAN_PROGRESS", "1") not in ("0", "false", "no", "off")


def on_terminal() -> bool:
    """A bar only when both the answer (stdout) and the bar (stderr) go to a terminal."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class _CountSpeed(ProgressColumn):
    """Items per second (rich's TransferSpeedColumn speaks bytes only)."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:,.0f}/s" if task.speed else "", style="progress.data.speed")


class Reporter:
    """One long operation's progress: ``update(done, total)``; a bar or plain lines on stderr.

    ``unit`` is "bytes" (sizes and MiB/s) or a noun for counted items
    ("objects"). Thread-safe: a watcher thread may update while the main
    thread waits on an RPC.
    """

    def __init__(self, label: str, *, unit: str = "items", total: int | None = None,
                 stream: TextIO | None = None, terminal: bool | None = None) -> None:
        self.label, self.unit, self.total = label, unit, total
        self.done = 0
        self.stream = stream or sys.stderr
        self.active = enabled()
        self.terminal = on_terminal() if terminal is None else terminal
        self.started = time.monotonic()
        self.last_line = self.started
        self.lines = 0  # plain progress lines printed so far
        self.lock = threading.Lock()
        self.bar: Progress | None = None
        self.task_id = None
        if self.active and self.terminal:
            self.bar = Progress(*self._columns(), console=Console(file=self.stream), transient=False)
            self.task_id = self.bar.add_task(label, total=total)
            self.bar.start()

    def _columns(self) -> list[ProgressColumn]:
        head: list[ProgressColumn] = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
        if self.unit == "bytes":
            return [*head, DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeElapsedColumn()]
        return [*head, TaskProgressColumn(), MofNCompleteColumn(), _CountSpeed(), TimeElapsedColumn()]

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        """The operation has done ``done`` units (of ``total``, when known)."""
        with self.lock:
            self.done = done
            if total is not None:
                self.total = total
            if not self.active:
                return
            if self.bar is not None and self.task_id is not None:
                label = f"{self.label} {note}".strip()
                self.bar.update(self.task_id, completed=done, total=self.total, description=label)
                return
            now = time.monotonic()
            if now - self.last_line >= interval():
                self.last_line = now
                self._line(note)

    def advance(self, n: int, note: str = "") -> None:
        self.update(self.done + n, note=note)

    def _counts(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        if self.unit == "bytes":
            of = f" of {human_bytes(self.total)}" if self.total else ""
            return f"{human_bytes(self.done)}{of}, {human_bytes(rate)}/s"
        of = f" of {self.total:,}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return f"{self.done:,}{of} {self.unit}{pct}, {rate:,.0f}/s"

    def _line(self, note: str = "", final: str = "") -> None:
        elapsed = time.monotonic() - self.started
        tail = f" ({note})" if note else ""
        text = f"{self.label}: {final or ''}{self._counts()}, {elapsed:.1f}s elapsed{tail}"
        print(text, file=self.stream, flush=True)
        self.lines += 1

    def say(self, message: str) -> None:
        """A phase change ("verifying the file"): a line of its own in either mode."""
        if not self.active:
            return
        with self.lock:
            if self.bar is not None:
                self.bar.console.print(f"{self.label}: {message}")
            else:
                print(f"{self.label}: {message}", file=self.stream, flush=True)

    def close(self, ok: bool = True) -> None:
        """Stop the bar, or print the closing plain line (totals and the overall rate).

        A failure closes with a line only when progress lines came before
        it: a command that fails at once says just its one error line.
        """
        with self.lock:
            if not self.active:
                return
            self.active = False
            if self.bar is not None:
                self.bar.stop()
            elif ok or self.lines:
                self._line(final="done, " if ok else "stopped at ")

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(ok=kind is None)


@contextmanager
def watching(poll: Callable[[], None], every: float) -> Iterator[None]:
    """Run ``poll`` every ``every`` seconds in a daemon thread while the block runs.

    For operations whose call answers only at the end: the watcher observes
    what it can from outside (a file's read position, a remaining count).
    A failing poll is skipped: progress must never break the operation.
    """
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            try:
                poll()
            except Exception:  # noqa: BLE001 - an observation failed; the operation goes on
                continue

    thread = threading.Thread(target=run, name="caravan-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5.0)


class FileReads:
    """How far this process has read a file, seen from outside the code reading it.

    Restoring a snapshot reads the file in passes (verify, then load, per
    server) inside code that reports nothing while it runs. The kernel
    knows each open descriptor's offset (``/proc/self/fdinfo``, Linux), so
    a watcher can count bytes read without touching that code; elsewhere
    this sees nothing and the progress shows elapsed time only.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)
        self.size = os.path.getsize(path)
        self.passes = 0  # whole passes finished
        self.last = 0

    def position(self) -> int | None:
        """The largest offset of a descriptor open on the file now (None when none is)."""
        best = None
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != self.path:
                    continue
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    pos = int(next(line for line in info if line.startswith("pos:")).split()[1])
            except (OSError, StopIteration, ValueError):
                continue
            best = pos if best is None else max(best, pos)
        return best

    def total_read(self) -> int:
        """Bytes read over every pass so far (a pass ends when the offset goes back)."""
        pos = self.position()
        if pos is None:
            return self.passes * self.size + self.last
        if pos < self.last:
            self.passes += 1
        self.last = pos
        return self.passes * self.size + pos
