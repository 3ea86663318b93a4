"""The membership settings of a server's config: ``join`` and ``[autopilot]``.

Kept beside ``node.core.config`` (which reads them) so the autopilot loop can
import its settings without importing the whole config module.

``join = ["10.0.0.1:4647", ...]``: this server does not form a cluster from
its ``[[server]]`` list; at its first start it asks the cluster reachable at
one of these RPC addresses to add it as a voter. ``join = []`` waits for
``caravan server join ADDR``. Once a server holds raft state, ``join`` and
the ``[[server]]`` list are no longer read (raft/members.py).

``[autopilot]`` (after Nomad's autopilot ``CleanupDeadServers``)::

    cleanup_dead_servers = true   # the leader removes servers dead for longer than dead_server_time
    dead_server_time = "5m"       # unreachable from the leader this long: dead
    min_quorum = 0                # never fewer voters than this; 0: a quorum of the bootstrap size
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AutopilotConfig:
    """Dead-server cleanup on the leader (see node/core/autopilot.py for the rule)."""

    cleanup_dead_servers: bool = True
    dead_server_time: float = 300.0
    min_quorum: int = 0


def parse_autopilot(
    table: Any, duration: Callable[[Any, str], float], fail: Callable[[str], Exception]
) -> AutopilotConfig:
    """Validate ``[autopilot]``; ``duration`` and ``fail`` are the config parser's own helpers."""
    if not isinstance(table, dict):
        raise fail("[autopilot] must be a table")
    known = ("cleanup_dead_servers", "dead_server_time", "min_quorum")
    for key in table:
        if key not in known:
            raise fail(f"unknown key {key!r} in [autopilot]; known keys: {', '.join(known)}")
    cleanup = table.get("cleanup_dead_servers", True)
    if not isinstance(cleanup, bool):
        raise fail(f"autopilot.cleanup_dead_servers must be true or false, not {cleanup!r}")
    min_quorum = table.get("min_quorum", 0)
    if isinstance(min_quorum, bool) or not isinstance(min_quorum, int) or min_quorum < 0:
        raise fail(f"autopilot.min_quorum must be 0 or a positive integer, not {min_quorum!r}")
    dead = duration(table["dead_server_time"], "autopilot.dead_server_time") if "dead_server_time" in table else 300.0
    return AutopilotConfig(cleanup_dead_servers=cleanup, dead_server_time=dead, min_quorum=min_quorum)


def parse_join(value: Any, address: Callable[[Any, str], str], fail: Callable[[str], Exception]) -> tuple[str, ...] | None:
    """``join``: None when absent (bootstrap from ``[[server]]``), else the RPC addresses to ask."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise fail('join must be a list of RPC addresses, like join = ["10.0.0.1:4647"] (or [] to wait for `caravan server join`)')
    return tuple(address(v, "join") for v in value)
