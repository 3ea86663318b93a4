"""Scrape-time gauges of the journal hub and the leader's eval broker.

The metrics module (``node.core.metrics``) sits below the hub's and the
leader's rooms and must not reach into them; the server, which wires both,
registers these gauges through the metrics module's own API instead. Each
reads the server through a weak reference, so a stopped server is not kept
alive by the process-wide registry, and reports zeros on a follower or
before the lifecycle starts.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from node.core import metrics
from node.core.hub import existing_hub
from node.leader.lifecycle import current

if TYPE_CHECKING:
    from node.core.api import ServerAPI

BROKER_STATES = ("Ready", "Unacked", "Waiting", "Delayed", "NackWait")


def register(server: ServerAPI) -> None:
    """Register the journal and broker gauges for ``server``."""
    ref = weakref.ref(server)

    def live_subscribers() -> list[Any]:
        s = ref()
        hub = existing_hub(s) if s is not None else None
        return list(hub.live) if hub is not None else []

    def subscribers() -> float:
        s = ref()
        hub = existing_hub(s) if s is not None else None
        return float(hub.subscribers) if hub is not None else 0.0

    def lag() -> float:
        s = ref()
        applied = s.fsm.applied_index if s is not None else 0
        return float(max(0, max((applied - sub.position for sub in live_subscribers()), default=0)))

    def queued() -> float:
        return float(max((len(sub.queue) for sub in live_subscribers()), default=0))

    def broker_depth() -> dict[str, float]:
        s = ref()
        lc = current(s) if s is not None else None
        counts = lc.broker.counts() if lc is not None else {}
        return {state.lower(): float(counts.get(state, 0)) for state in BROKER_STATES}

    def blocked() -> float:
        s = ref()
        lc = current(s) if s is not None else None
        return float(len(lc.blocked)) if lc is not None else 0.0

    metrics.register_gauge(
        "caravan_journal_subscribers", "Open event.stream subscriptions on this server (RPC and HTTP)", subscribers
    )
    metrics.register_gauge(
        "caravan_journal_subscriber_lag",
        "Largest distance in raft indexes between the applied index and a live subscriber",
        lag,
    )
    metrics.register_gauge(
        "caravan_journal_subscriber_queue", "Most journal batches queued for one live subscriber", queued
    )
    metrics.register_gauge(
        "caravan_eval_broker_depth", "Evaluations in the leader's eval broker, by state", broker_depth, label="state"
    )
    metrics.register_gauge("caravan_eval_blocked", "Blocked evaluations tracked by the leader", blocked)
