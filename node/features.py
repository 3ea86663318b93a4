"""Where optional server features plug in.

Each feature module registers its RPC methods with ``node.endpoints.method``
when imported, and may offer leader loops: coroutines ``loop(server)`` that
run only while this server is the raft leader (started when it wins,
cancelled when it loses leadership), and services: coroutines
``start(server)`` awaited once the server's RPC listener is up, on every
server whatever its role, each returning an async ``stop()`` that the server
awaits when it shuts down (the HTTP API is one). A service that cannot start
(its port is taken) raises, and the server exits with that error. Adding a
feature is one line here, so features do not edit the server's core.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.server import Server

LeaderLoop = Callable[["Server"], Awaitable[Any]]
ServiceStop = Callable[[], Awaitable[None]]
Service = Callable[["Server"], Awaitable[ServiceStop]]

# Modules imported for their endpoint registrations and LEADER_LOOPS.
FEATURE_MODULES: tuple[str, ...] = (
    "node.core.stream",
    "node.leader.gc",
    "node.endpoints.workers",
    "node.leader.heartbeat",  # node.heartbeat RPC (batched client heartbeats)
    "node.leader.deployments",  # deployment.fail and deployment.pause RPCs (the watcher runs in node.leader.lifecycle)
    "node.leader.lifecycle",  # eval broker, workers, plan applier, heartbeat TTLs, deployments; scheduler.stats
    "node.http.service",  # the Nomad-compatible /v1 HTTP API and /v1/metrics (a service on every server)
    "node.endpoints.snapshot",  # operator.snapshot.save (streamed from the leader after a barrier)
)


def load() -> list[LeaderLoop]:
    """Import every feature module; return their leader loops."""
    loops: list[LeaderLoop] = []
    for name in FEATURE_MODULES:
        module = importlib.import_module(name)
        loops.extend(getattr(module, "LEADER_LOOPS", ()))
    return loops


def services() -> list[Service]:
    """Every feature module's SERVICES (started with the server, on every server)."""
    found: list[Service] = []
    for name in FEATURE_MODULES:
        found.extend(getattr(importlib.import_module(name), "SERVICES", ()))
    return found
