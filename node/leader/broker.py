"""The eval broker and the blocked-evals tracker (leader-only, in memory), after Nomad's.

Both live only while this server leads: they are rebuilt from the pending
and blocked evaluations in state when it becomes leader and dropped when it
steps down, so state stays the one source of truth and nothing here needs
replicating.

``EvalBroker``
  - at-least-once delivery: ``dequeue`` hands out (eval, token); the worker
    ``ack``s after its plan committed or ``nack``s on failure. An eval not
    acked within ``nack_timeout`` is nacked for it. A nacked eval is
    redelivered after a delay (``nack_delay`` the first time,
    ``nack_delay_later`` after that); after ``delivery_limit`` deliveries it
    goes to the failed list, which the leader writes as status ``failed``
    (with a delayed follow-up eval, as Nomad does).
  - priority order: highest priority first, then oldest (create index).
  - one in-flight eval per job: further evals of a job wait behind it; when
    it is acked the newest waiting one goes on and the older ones are
    returned by ``take_cancelable`` to be written as ``canceled`` (they would
    only repeat its work).
  - ``wait_until``: an eval is held until that time. It is in the state's
    time (``state_clock``: the wall clock, never before the newest time the
    log recorded), and the hold is measured on the monotonic clock from
    enqueue: after a leader whose clock ran ahead has pinned the state's
    time forward, a 5 s reschedule delay still takes 5 s, not the skew.
  - an eval enqueued again while it is out for delivery (a blocked eval
    unblocked while its worker still finishes) is requeued after the ack.
  - ``hold``: while nodes are being marked down, nothing is handed out
    (for at most ``HOLD_MAX_S`` in a row). In a mass expiry the workers'
    plans would otherwise fill the log ahead of the mark-downs, and place
    replacements on nodes of the same dying fleet that are about to go
    down (each then lost a second time). Nomad gets the same order from
    one small raft apply per node; here the leader's CPU and its log are
    shared, so the scheduler waits for the mark-downs instead.

``BlockedEvals``
  - holds evals that could not place everything (status ``blocked``), one
    per job (a newer one replaces the older, which is canceled);
  - ``unblock(index)`` on any capacity change (a node ready or eligible,
    resources freed) hands them back to the broker;
  - a blocked eval whose scheduler snapshot predates the latest capacity
    change is unblocked at once (the change it missed might have let it
    place): the worker registers its snapshot index with ``expect`` before
    submitting the plan that blocks the eval.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fsm.ids import new_request_id
from fsm.structs import EVAL_BLOCKED, Evaluation
from node.core.wakeup import wait_event

MAX_EXPECTED = 10_000
HOLD_MAX_S = 10.0  # longest a hold stops deliveries in a row: a flapping fleet cannot starve the scheduler
Clock = Callable[[], float]  # monotonic seconds
StateClock = Callable[[], int]  # ns, in the time the state's records (and wait_until) use


class BrokerError(Exception):
    """An ack or nack that does not match an outstanding delivery."""


@dataclass
class BrokerStats:
    enqueued: int = 0
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    failed: int = 0
    canceled: int = 0
    timeouts: int = 0
    holds: int = 0  # holds begun (deliveries stopped for mark-downs)


@dataclass
class _Unacked:
    ev: Evaluation
    token: str
    deadline: float


def _job_key(ev: Evaluation) -> tuple[str, str]:
    return (ev.namespace, ev.job_id)


@dataclass
class EvalBroker:
    delivery_limit: int = 3
    nack_timeout: float = 60.0
    nack_delay: float = 1.0
    nack_delay_later: float = 20.0
    clock: Clock = time.monotonic
    state_clock: StateClock = time.time_ns
    stats: BrokerStats = field(default_factory=BrokerStats)

    def __post_init__(self) -> None:
        self._seq = itertools.count()
        self._ready: list[tuple[int, int, int, str]] = []  # (-priority, create_index, seq, eval id)
        self._evals: dict[str, Evaluation] = {}  # every eval the broker holds, by id
        self._where: dict[str, str] = {}  # eval id -> ready | waiting | delayed | nack-wait | unacked
        self._job_active: dict[tuple[str, str], str] = {}  # job -> its eval that is ready or unacked
        self._job_waiting: dict[tuple[str, str], list[str]] = {}  # job -> evals waiting behind it
        self._delayed: list[tuple[float, int, str]] = []  # (monotonic due, seq, eval id)
        self._nack_wait: list[tuple[float, int, str]] = []  # (monotonic due, seq, eval id)
        self._unacked: dict[str, _Unacked] = {}
        self._requeue: dict[str, Evaluation] = {}
        self._deliveries: dict[str, int] = {}
        self._enqueued_at: dict[str, float] = {}  # monotonic time each eval became ready (latency)
        self._failed: list[Evaluation] = []
        self._cancelable: list[Evaluation] = []
        self._wake = asyncio.Event()
        self._holds: dict[str, float] = {}  # holder -> monotonic time its hold began
        self.enabled = True

    # -- intake -------------------------------------------------------------------
    def enqueue(self, ev: Evaluation) -> None:
        """Take a pending (or unblocked) eval; duplicates of held evals are ignored."""
        if not self.enabled:
            return
        if ev.id in self._unacked:
            self._requeue[ev.id] = ev
            return
        if ev.id in self._where:
            return
        self.stats.enqueued += 1
        self._evals[ev.id] = ev
        hold = (ev.wait_until - self.state_clock()) / 1e9 if ev.wait_until else 0.0
        if hold > 0:
            self._where[ev.id] = "delayed"
            heapq.heappush(self._delayed, (self.clock() + hold, next(self._seq), ev.id))
            self._wake.set()
            return
        self._admit(ev)

    def _admit(self, ev: Evaluation) -> None:
        """Ready the eval, unless its job already has one ready or out."""
        key = _job_key(ev)
        if key in self._job_active:
            self._where[ev.id] = "waiting"
            self._job_waiting.setdefault(key, []).append(ev.id)
            return
        self._job_active[key] = ev.id
        self._push_ready(ev)

    def _push_ready(self, ev: Evaluation) -> None:
        self._where[ev.id] = "ready"
        self._enqueued_at.setdefault(ev.id, self.clock())
        heapq.heappush(self._ready, (-ev.priority, ev.create_index, next(self._seq), ev.id))
        self._wake.set()

    # -- delivery -----------------------------------------------------------------
    def tick(self) -> float | None:
        """Move due delayed evals to ready and nack timed-out deliveries; seconds until the next due item."""
        now = self.clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, eval_id = heapq.heappop(self._delayed)
            ev = self._evals.get(eval_id)
            if ev is not None and self._where.get(eval_id) == "delayed":
                self._admit(ev)
        while self._nack_wait and self._nack_wait[0][0] <= now:
            _, _, eval_id = heapq.heappop(self._nack_wait)
            ev = self._evals.get(eval_id)
            if ev is not None and self._where.get(eval_id) == "nack-wait":
                self._push_ready(ev)
        for eval_id, out in list(self._unacked.items()):
            if out.deadline <= now:
                self.stats.timeouts += 1
                self.nack(eval_id, out.token)
        waits = []
        if self._delayed:
            waits.append(self._delayed[0][0] - now)
        if self._nack_wait:
            waits.append(self._nack_wait[0][0] - now)
        if self._unacked:
            waits.append(min(o.deadline for o in self._unacked.values()) - now)
        return max(0.0, min(waits)) if waits else None

    # -- holds --------------------------------------------------------------------
    def hold(self, holder: str) -> None:
        """Hand out nothing while ``holder`` holds (at most ``HOLD_MAX_S`` in a row); idempotent."""
        if self.enabled and holder not in self._holds:
            self._holds[holder] = self.clock()
            self.stats.holds += 1

    def release(self, holder: str) -> None:
        """End ``holder``'s hold; deliveries resume once no other holds."""
        if self._holds.pop(holder, None) is not None:
            self._wake.set()

    def holding(self, holder: str) -> bool:
        """Whether ``holder``'s hold has stopped every delivery since it began (it has not lapsed)."""
        since = self._holds.get(holder)
        return since is not None and self.clock() - since < HOLD_MAX_S

    def held_for(self) -> float | None:
        """Seconds the holds still stop deliveries; None when none does.

        A hold older than ``HOLD_MAX_S`` no longer stops anything, but stays
        until released: holding again does not restart its time.
        """
        if not self._holds:
            return None
        left = HOLD_MAX_S - (self.clock() - min(self._holds.values()))
        return left if left > 0 else None

    def try_dequeue(self) -> tuple[Evaluation, str] | None:
        self.tick()
        if self.held_for() is not None:
            return None
        while self._ready:
            _, _, _, eval_id = heapq.heappop(self._ready)
            if self._where.get(eval_id) != "ready":
                continue
            ev = self._evals[eval_id]
            token = new_request_id()  # unique, not secret: no system call per dequeue, as uuid4's os.urandom
            self._where[eval_id] = "unacked"
            self._unacked[eval_id] = _Unacked(ev, token, self.clock() + self.nack_timeout)
            self._deliveries[eval_id] = self._deliveries.get(eval_id, 0) + 1
            self.stats.delivered += 1
            return ev, token
        return None

    async def dequeue(self, timeout: float | None = None) -> tuple[Evaluation, str] | None:
        """Wait for the next eval (highest priority, oldest first); None after ``timeout``."""
        deadline = None if timeout is None else self.clock() + timeout
        while True:
            got = self.try_dequeue()
            if got is not None:
                return got
            self._wake.clear()
            wait = self.tick()
            held = self.held_for()
            if held is not None:
                wait = held if wait is None else min(wait, held)
            if deadline is not None:
                left = deadline - self.clock()
                if left <= 0:
                    return None
                wait = left if wait is None else min(wait, left)
            await wait_event(self._wake, wait)

    def ack(self, eval_id: str, token: str) -> None:
        """The eval's plan committed: forget it and let the job's next eval go."""
        out = self._check(eval_id, token)
        del self._unacked[eval_id]
        self.stats.acked += 1
        self._forget(out.ev)
        self._release_job(out.ev)
        again = self._requeue.pop(eval_id, None)
        if again is not None:
            self.enqueue(again)

    def nack(self, eval_id: str, token: str) -> None:
        """The worker failed: redeliver after a delay, or fail the eval at the delivery limit."""
        out = self._check(eval_id, token)
        del self._unacked[eval_id]
        self._requeue.pop(eval_id, None)
        self.stats.nacked += 1
        ev = out.ev
        deliveries = self._deliveries.get(eval_id, 0)
        if deliveries >= self.delivery_limit:
            self.stats.failed += 1
            self._failed.append(ev)
            self._forget(ev)
            self._release_job(ev)
            return
        delay = self.nack_delay if deliveries <= 1 else self.nack_delay_later
        self._where[eval_id] = "nack-wait"
        heapq.heappush(self._nack_wait, (self.clock() + delay, next(self._seq), eval_id))
        self._wake.set()

    def outstanding(self, eval_id: str) -> str | None:
        out = self._unacked.get(eval_id)
        return out.token if out is not None else None

    def delivery_count(self, eval_id: str) -> int:
        return self._deliveries.get(eval_id, 0)

    def enqueued_at(self, eval_id: str) -> float | None:
        return self._enqueued_at.get(eval_id)

    def _check(self, eval_id: str, token: str) -> _Unacked:
        out = self._unacked.get(eval_id)
        if out is None:
            raise BrokerError(f"evaluation {eval_id} is not outstanding")
        if out.token != token:
            raise BrokerError(f"evaluation {eval_id}: token does not match the current delivery")
        return out

    def _forget(self, ev: Evaluation) -> None:
        self._evals.pop(ev.id, None)
        self._where.pop(ev.id, None)
        self._deliveries.pop(ev.id, None)
        self._enqueued_at.pop(ev.id, None)

    def _release_job(self, ev: Evaluation) -> None:
        """The job's active eval is done: promote the newest waiting eval, cancel the older ones."""
        key = _job_key(ev)
        if self._job_active.get(key) == ev.id:
            del self._job_active[key]
        waiting = [w for w in self._job_waiting.pop(key, []) if self._where.get(w) == "waiting"]
        if not waiting:
            return
        evs = sorted((self._evals[w] for w in waiting), key=lambda e: (e.priority, e.create_index, e.modify_index))
        newest = evs[-1]
        for old in evs[:-1]:
            self.stats.canceled += 1
            self._cancelable.append(old)
            self._forget(old)
        self._job_active[key] = newest.id
        self._push_ready(newest)

    # -- leader bookkeeping -------------------------------------------------------
    def take_failed(self) -> list[Evaluation]:
        out, self._failed = self._failed, []
        return out

    def take_cancelable(self) -> list[Evaluation]:
        out, self._cancelable = self._cancelable, []
        return out

    def has_queued(self, namespace: str, job_id: str) -> bool:
        """Whether the job has an eval that has not started yet (it will see newer state)."""
        key = (namespace, job_id)
        active = self._job_active.get(key)
        if active is not None and self._where.get(active) == "ready":
            return True
        return any(self._where.get(w) == "waiting" for w in self._job_waiting.get(key, []))

    def counts(self) -> dict[str, int]:
        where = list(self._where.values())
        return {
            "Ready": where.count("ready"),
            "Unacked": len(self._unacked),
            "Waiting": where.count("waiting"),
            "Delayed": where.count("delayed"),
            "NackWait": where.count("nack-wait"),
        }

    def disable(self) -> None:
        """Drop everything (leadership lost); later enqueues are ignored."""
        self.enabled = False
        self._ready.clear()
        self._evals.clear()
        self._where.clear()
        self._job_active.clear()
        self._job_waiting.clear()
        self._delayed.clear()
        self._nack_wait.clear()
        self._unacked.clear()
        self._requeue.clear()
        self._holds.clear()
        self._wake.set()


@dataclass
class BlockedEvals:
    """Evals waiting for capacity, one per job, released on capacity changes."""

    def __post_init__(self) -> None:
        self._by_job: dict[tuple[str, str], Evaluation] = {}
        # Eval id -> its key in _by_job: ``forget`` runs for every terminal eval the tail
        # sees (thousands of cancellations after a storm); a scan of every blocked job
        # each time held the event loop for seconds.
        self._key_of: dict[str, tuple[str, str]] = {}
        self._expect: dict[str, int] = {}  # eval id -> the snapshot index its plan was made on
        self._capacity_index = 0
        self._duplicates: list[Evaluation] = []
        self.unblocks = 0

    def expect(self, eval_id: str, snapshot_index: int) -> None:
        """A worker is about to block ``eval_id`` with a plan made at ``snapshot_index``."""
        self._expect[eval_id] = snapshot_index
        while len(self._expect) > MAX_EXPECTED:  # plans that never committed leave theirs behind
            del self._expect[next(iter(self._expect))]

    def block(self, ev: Evaluation) -> list[Evaluation]:
        """Track a blocked eval; returns evals to enqueue at once (it missed a capacity change)."""
        if ev.status != EVAL_BLOCKED:
            return []
        key = _job_key(ev)
        existing = self._by_job.get(key)
        if existing is not None and existing.id != ev.id:
            if existing.create_index > ev.create_index:
                self._duplicates.append(ev)
                return []
            self._duplicates.append(existing)
        snapshot = self._expect.pop(ev.id, None)
        if snapshot is not None and self._capacity_index > snapshot:
            self._drop(key)
            self.unblocks += 1
            return [ev]
        self._track(key, ev)
        return []

    def _track(self, key: tuple[str, str], ev: Evaluation) -> None:
        old = self._by_job.get(key)
        if old is not None:
            self._key_of.pop(old.id, None)
        self._by_job[key] = ev
        self._key_of[ev.id] = key

    def _drop(self, key: tuple[str, str]) -> Evaluation | None:
        ev = self._by_job.pop(key, None)
        if ev is not None:
            self._key_of.pop(ev.id, None)
        return ev

    def capacity_changed(self, index: int) -> list[Evaluation]:
        """Capacity changed at ``index``: every blocked eval goes back to the broker."""
        self._capacity_index = max(self._capacity_index, index)
        out = list(self._by_job.values())
        self._by_job.clear()
        self._key_of.clear()
        self.unblocks += len(out)
        return out

    def untrack(self, namespace: str, job_id: str, keep: str = "") -> Evaluation | None:
        """The job needs no blocked eval any more (it placed everything, or it is gone)."""
        ev = self._by_job.get((namespace, job_id))
        if ev is None or ev.id == keep:
            return None
        return self._drop((namespace, job_id))

    def forget(self, eval_id: str) -> None:
        """Stop tracking ``eval_id`` if it is tracked (it ended or was deleted)."""
        key = self._key_of.get(eval_id)
        if key is not None:
            self._drop(key)

    def take_duplicates(self) -> list[Evaluation]:
        out, self._duplicates = self._duplicates, []
        return out

    def __len__(self) -> int:
        return len(self._by_job)

    def job_ids(self) -> list[str]:
        return sorted(job_id for _, job_id in self._by_job)
