"""Nemeses: faults injected into the running cluster on a seeded schedule.

One ``random.Random`` (seeded from the run's seed) decides everything the
schedule can decide: the quiet time before each fault, which enabled fault
comes next, whom it hits (the leader or a random server), and how long it
lasts. Which server *is* the leader at that moment is up to the cluster, so
two runs with one seed inject the same sequence of fault kinds and
durations, not necessarily on the same servers.

Faults (``--nemesis`` names):

* ``kill`` -- kill -9 one server (the leader half of the time), restart it.
* ``kill-all`` -- kill -9 every server at once, restart them all.
* ``pause`` -- SIGSTOP one server (the leader half of the time), SIGCONT.
* ``partition`` -- cut raft links through the harness's proxies: isolate one
  server (the leader half of the time), or, with five servers, split them
  into a random majority and minority; then heal.
* ``snapshot-lag`` -- isolate a follower while the others write past the
  log-compaction threshold, so it must catch up by snapshot install. Needs
  compaction to be wired into the servers; skipped with the reason until
  then (see ``SnapshotLag.unavailable``).

Every fault is recorded as a window (start, end, targets) in faults.jsonl;
the nemesis always undoes its own fault, waits (bounded) for a leader before
its next quiet period, and the runner heals everything at the end regardless.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jepsen_like.recorder import FaultLog
from jepsen_like.testbed import Testbed, TestbedError


@dataclass
class Timing:
    """Seconds: quiet time between faults and how long a fault lasts (uniform ranges)."""

    quiet: tuple[float, float] = (2.0, 5.0)
    hold: tuple[float, float] = (2.0, 6.0)
    kill_all_hold: tuple[float, float] = (0.5, 2.0)
    settle: float = 30.0  # longest wait for a leader after a fault is undone


class Fault:
    """One kind of fault: ``inject`` returns an undo function and the affected servers."""

    name = "fault"

    def unavailable(self, testbed: Testbed) -> str | None:
        """A reason this fault cannot run on this cluster, or None."""
        return None

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:
        raise NotImplementedError


def _pick_target(testbed: Testbed, rng: random.Random) -> tuple[str, str]:
    """(server, why): the leader half of the time, else a random server."""
    if rng.random() < 0.5:
        leader = testbed.leader()
        if leader is not None:
            return leader, "leader"
    return rng.choice(testbed.names), "random"


class Kill(Fault):
    name = "kill"

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:
        target, why = _pick_target(testbed, rng)
        testbed.kill(target)

        def undo() -> str:
            testbed.start(target)
            return f"restarted {target}"

        return undo, [target], f"kill -9 {target} ({why})"


class KillAll(Fault):
    name = "kill-all"

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:
        for name in testbed.names:
            testbed.kill(name)

        def undo() -> str:
            for name in testbed.names:
                testbed.start(name)
            return "restarted all"

        return undo, list(testbed.names), "kill -9 all servers"


class Pause(Fault):
    name = "pause"

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:
        target, why = _pick_target(testbed, rng)
        if not testbed.alive(target):
            testbed.start(target)
        testbed.pause(target)

        def undo() -> str:
            testbed.resume(target)
            return f"SIGCONT {target}"

        return undo, [target], f"SIGSTOP {target} ({why})"


class Partition(Fault):
    name = "partition"

    def unavailable(self, testbed: Testbed) -> str | None:
        if testbed.proxies is None or len(testbed.names) < 3:
            return "partitions need at least three servers behind the harness's proxies"
        return None

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:
        names = list(testbed.names)
        if len(names) >= 5 and rng.random() < 0.5:
            rng.shuffle(names)
            minority = sorted(names[: len(names) // 2])
            majority = sorted(names[len(names) // 2 :])
            testbed.partition([minority, majority])
            what = f"split {'+'.join(minority)} | {'+'.join(majority)}"
            targets = minority
        else:
            target, why = _pick_target(testbed, rng)
            rest = [n for n in names if n != target]
            testbed.partition([[target], rest])
            what = f"isolate {target} ({why})"
            targets = [target]

        def undo() -> str:
            testbed.heal_network()
            return "healed"

        return undo, targets, what


class SnapshotLag(Fault):
    name = "snapshot-lag"

    def unavailable(self, testbed: Testbed) -> str | None:
        status = testbed.status(testbed.names[0], timeout=2.0) or {}
        if not status.get("SnapshotIndex") and "LogCompaction" not in status:
            return (
                "log compaction / snapshot install is not wired into the servers yet (no serializer is "
                "installed and no compaction threshold can be configured), so a lagging follower never "
                "needs a snapshot"
            )
        return "snapshot-lag is not implemented in this harness version yet"

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:  # pragma: no cover
        raise TestbedError("snapshot-lag is unavailable")


FAULTS: dict[str, Callable[[], Fault]] = {
    "kill": Kill,
    "kill-all": KillAll,
    "pause": Pause,
    "partition": Partition,
    "snapshot-lag": SnapshotLag,
}


class Nemesis:
    """Runs the enabled faults on a seeded schedule, in its own thread.

    One fault at a time, or with ``overlap`` sometimes two different kinds at
    once (a partition while a server is killed, a pause during a partition):
    compound faults are where recovery paths meet.
    """

    def __init__(
        self,
        testbed: Testbed,
        faults: list[Fault],
        rng: random.Random,
        log: FaultLog,
        stop: threading.Event,
        timing: Timing | None = None,
        overlap: bool = False,
    ) -> None:
        self.testbed = testbed
        self.overlap = overlap
        self.faults = faults
        self.rng = rng
        self.log = log
        self.stop = stop
        self.timing = timing or Timing()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        if self.faults:
            self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _pick(self) -> list[Fault]:
        """One fault, or with ``overlap`` half of the time two different ones held together."""
        first = self.rng.choice(self.faults)
        if not self.overlap or first.name == "kill-all" or self.rng.random() < 0.5:
            return [first]
        others = [f for f in self.faults if f.name not in (first.name, "kill-all")]
        return [first, self.rng.choice(others)] if others else [first]

    def _run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.timing.quiet)):
            picked = self._pick()
            hold_range = self.timing.kill_all_hold if picked[0].name == "kill-all" else self.timing.hold
            hold = self.rng.uniform(*hold_range)
            active: list[tuple[Fault, Callable[[], str], Any]] = []
            for fault in picked:
                start = self.log.clock.now()
                try:
                    undo, targets, what = fault.inject(self.testbed, self.rng)
                except Exception as exc:  # noqa: BLE001 - a failed injection is reported, not fatal
                    self.errors.append(f"{fault.name}: could not inject: {exc}")
                    continue
                active.append((fault, undo, self.log.begin(fault.name, targets, what, start=start)))
            if not active:
                continue
            self.stop.wait(hold)  # hold the fault(s) (ends early when the run stops)
            for fault, undo, window in reversed(active):
                try:
                    done = undo()
                except Exception as exc:  # noqa: BLE001
                    done = f"undo failed: {exc}"
                    self.errors.append(f"{fault.name}: {done}")
                self.log.end(window, done)
            self._settle()

    def _settle(self) -> None:
        """Wait (bounded) until some server leads again, so the quiet time is time the cluster can serve.

        Without this a whole-cluster restart (seconds: imports, log replay,
        election) eats most of the quiet period and the next fault hits a
        cluster that never came back, which tests little.
        """
        deadline = time.monotonic() + self.timing.settle
        while not self.stop.is_set() and time.monotonic() < deadline:
            if self.testbed.leader() is not None:
                return
            self.stop.wait(0.2)
