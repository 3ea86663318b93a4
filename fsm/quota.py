"""Quota arithmetic of queues and cohorts (Kueue's, with one resource flavor): the one place it lives.

The FSM checks every admission against it as it applies one; the leader's
admission cycle and preemption (``scheduler.queueing``) plan with it; the
queue status reads the ledger through it. Everything here is a function of
its arguments: no clock, no randomness.

Per queue ``q`` and resource ``r`` (only the resources a queue lists are
limited): nominal ``N``, borrowing limit ``B`` (None: none), lending limit
``L`` (None: all of ``N``), admitted usage ``U``. The part of ``N`` that is
not lendable, ``G = N - L``, is ``q``'s alone. Kueue's condition for a
cohort, ``sum over q of max(0, U - G) <= sum over q of L``, is the same as
"what the cohort's queues borrow above their nominal fits in what the
others leave unused of their lendable quota", which is how ``lent`` shares
it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fsm.queues import Queue
from fsm.structs import count_sum

Usage = dict[str, int]


@dataclass
class Ledger:
    """What each queue has admitted, per resource; the queues by name and cohort."""

    queues: dict[str, Queue]
    used: dict[str, Usage] = field(default_factory=dict)
    _cohorts: dict[str, list[Queue]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for q in sorted(self.queues.values(), key=lambda q: q.name):
            if q.cohort:
                self._cohorts.setdefault(q.cohort, []).append(q)

    @classmethod
    def build(
        cls, queues: Iterable[Queue], admitted: Iterable[tuple[str, Mapping[str, int]]]
    ) -> Ledger:
        """A ledger of ``queues`` holding every (queue, usage) of ``admitted``."""
        ledger = cls({q.name: q for q in queues})
        for name, usage in admitted:
            ledger.add(name, usage)
        return ledger

    def copy(self) -> Ledger:
        out = Ledger(self.queues)
        out.used = {name: dict(u) for name, u in self.used.items()}
        return out

    def add(self, queue: str, ask: Mapping[str, int]) -> None:
        self.used[queue] = count_sum(self.used.get(queue, {}), ask)

    def remove(self, queue: str, ask: Mapping[str, int]) -> None:
        self.used[queue] = count_sum(self.used.get(queue, {}), ask, -1)

    def usage(self, queue: str, resource: str) -> int:
        return self.used.get(queue, {}).get(resource, 0)

    def members(self, queue: Queue) -> list[Queue]:
        """The queues of ``queue``'s cohort (itself alone without one), by name."""
        return self._cohorts.get(queue.cohort, []) if queue.cohort else [queue]

    # -- fitting --------------------------------------------------------------
    def shortfall(
        self, queue_name: str, ask: Mapping[str, int], *, borrow: bool = True
    ) -> str | None:
        """Why ``ask`` does not fit in the queue now (one line), or None if it fits.

        ``borrow`` False: it must fit in the queue's own nominal quota.
        """
        queue = self.queues.get(queue_name)
        if queue is None:
            return f"queue {queue_name!r} does not exist"
        for resource in sorted(ask):
            amount = ask[resource]
            limit = queue.limit(resource)
            if amount <= 0 or limit is None:
                continue
            need = self.usage(queue.name, resource) + amount
            if (not queue.cohort or not borrow) and need > limit.nominal:
                return f"insufficient unused quota for {resource} in queue {queue.name}, {need - limit.nominal} more needed"
            if not queue.cohort:
                continue
            if limit.borrowing_limit is not None and need > limit.nominal + limit.borrowing_limit:
                over = need - limit.nominal - limit.borrowing_limit
                return f"borrowing limit for {resource} in queue {queue.name} exceeded, {over} more needed"
            over = self._cohort_over(queue, resource, need)
            if over > 0:
                return f"insufficient unused quota for {resource} in cohort {queue.cohort}, {over} more needed"
        return None

    def fits(self, queue_name: str, ask: Mapping[str, int], *, borrow: bool = True) -> bool:
        return self.shortfall(queue_name, ask, borrow=borrow) is None

    def _cohort_over(self, queue: Queue, resource: str, need: int) -> int:
        """By how much the cohort would exceed its lendable total if ``queue`` used ``need``."""
        demand = capacity = 0
        for member in self.members(queue):
            limit = member.limit(resource)
            if limit is None:
                continue
            lendable = _lendable(limit.nominal, limit.lending_limit)
            guaranteed = limit.nominal - lendable
            used = need if member.name == queue.name else self.usage(member.name, resource)
            demand += max(0, used - guaranteed)
            capacity += lendable
        return demand - capacity

    # -- the ledger's view ------------------------------------------------------
    def borrowed(self, queue: str, resource: str) -> int:
        """How far the queue is above its nominal quota of ``resource``."""
        limit = self.queues[queue].limit(resource)
        return max(0, self.usage(queue, resource) - limit.nominal) if limit is not None else 0

    def borrowing(self, queue: str) -> bool:
        """Whether the queue uses more than its nominal quota of any resource."""
        return any(self.borrowed(queue, q.name) > 0 for q in self.queues[queue].resources)

    def lent(self, queue_name: str) -> Usage:
        """What of the queue's unused lendable quota the cohort's borrowers use now.

        Borrowed totals are shared out over the lenders in name order, each
        up to what it leaves unused of its lendable quota, so no queue is
        shown lending more than its lending limit.
        """
        queue = self.queues[queue_name]
        out: Usage = {}
        for limit in queue.resources:
            owed = sum(self.borrowed(m.name, limit.name) for m in self.members(queue))
            for member in self.members(queue):
                share = min(owed, self.unused_lendable(member.name, limit.name))
                owed -= share
                if member.name == queue_name and share:
                    out[limit.name] = share
        return out

    def unused_lendable(self, queue: str, resource: str) -> int:
        """What the queue leaves unused of its nominal quota that it may lend."""
        limit = self.queues[queue].limit(resource)
        if limit is None:
            return 0
        lendable = _lendable(limit.nominal, limit.lending_limit)
        return max(0, min(lendable, limit.nominal - self.usage(queue, resource)))

    def violations(self) -> list[str]:
        """Every way the ledger breaks a quota invariant (empty when it holds)."""
        out = []
        for queue in sorted(self.queues.values(), key=lambda q: q.name):
            for limit in queue.resources:
                used = self.usage(queue.name, limit.name)
                cap = limit.nominal + (
                    limit.borrowing_limit if limit.borrowing_limit is not None else used
                )
                if not queue.cohort:
                    cap = limit.nominal
                if used > cap:
                    out.append(f"queue {queue.name} uses {used} {limit.name}, above {cap}")
                if (
                    queue.cohort
                    and queue is self.members(queue)[0]
                    and self._cohort_over(queue, limit.name, used) > 0
                ):
                    out.append(
                        f"cohort {queue.cohort} uses more {limit.name} than its queues may lend"
                    )
        return out


def _lendable(nominal: int, lending_limit: int | None) -> int:
    return nominal if lending_limit is None else min(nominal, lending_limit)
