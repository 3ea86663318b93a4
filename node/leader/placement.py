"""The placement index's idle-time upkeep on the leader (Protean's idle agents refresh their caches).

A term's workers share one ``scheduler.index.PlacementIndex``. Left alone,
the first evaluation after a quiet spell pays for everything that changed
meanwhile: the index's catch-up (the first one of a term is a whole rebuild)
and each trait ranking's rescoring. This task does that work while the
broker has nothing ready and nothing in flight, a bounded slice at a time,
so the next evaluation finds its ranking current (a hit that rescores
little). It never waits for the index's lock: a worker holding it comes first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from node.leader.broker import EvalBroker
from node.leader.shims import StateReads
from scheduler.index import PlacementIndex

IDLE_INTERVAL = 0.25  # seconds between looks at the broker
IDLE_BUDGET = 0.02  # seconds of rescoring per slice, so a new eval never waits long for the lock


def idle(broker: EvalBroker) -> bool:
    """Whether the broker has no eval ready and none being worked on."""
    counts = broker.counts()
    return counts["Ready"] == 0 and counts["Unacked"] == 0


async def keep_fresh(
    state: StateReads, index: PlacementIndex, broker: EvalBroker, log: Any, *, interval: float = IDLE_INTERVAL, budget: float = IDLE_BUDGET
) -> None:
    """Leader task: build the index at once, then bring its rankings forward whenever the broker idles."""
    log = log.bind(component="placement")
    if await _refresh(state, index, budget, log) and index.index is not None:
        log.info("placement index built", nodes=len(index.nodes), index=index.index)
    while True:
        await asyncio.sleep(interval)
        if idle(broker):
            await _refresh(state, index, budget, log)


async def _refresh(state: StateReads, index: PlacementIndex, budget: float, log: Any) -> bool:
    """One slice of upkeep; a failed read (a snapshot being restored, say) is logged and skipped:
    the workers catch the index up themselves, so upkeep is never worth ending the term for."""
    try:
        await state.local(lambda r: index.refresh(r, budget))
    except Exception as exc:  # noqa: BLE001 - an optimisation only; the next slice tries again
        log.warning("placement index upkeep failed; the workers catch it up instead", error=str(exc))
        return False
    return True
