"""Autopilot's dead-server cleanup, a leader-only loop (after Nomad autopilot's ``CleanupDeadServers``).

A server the leader has not heard from for ``dead_server_time`` is dead. The
leader removes dead servers one at a time, as committed membership entries,
and only when all of these hold:

1. the servers it hears from (itself included) are a majority of the current
   voters -- otherwise it could not commit the removal, and a partition
   rather than a death is the likelier story;
2. after the removal at least ``floor`` voters remain, where ``floor`` is
   ``autopilot.min_quorum`` or else a quorum of the bootstrap membership
   (2 of an original 3, 3 of an original 5). Shrinking further would leave
   a cluster smaller than the majority the operator sized it for; below
   that, replacing the server is the operator's call, not the leader's.

Removing a dead voter never lowers fault tolerance (a 3-voter cluster with
one dead tolerates no further failure, and neither does the 2-voter cluster
after it), and with two dead of five it restores one. The dead time restarts
at each election (a new leader has heard from no one yet). Failures back off
exponentially; every removal and every refusal is one log line.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from node.core.membership import notify_removed
from node.core.membership_settings import AutopilotConfig
from node.core.writes import WRITE_TIMEOUT
from raft import errors as raft_errors
from raft.members import Member

if TYPE_CHECKING:
    from node.core.api import ServerAPI

CHECK_EVERY = 1.0
MAX_BACKOFF = 60.0


def quorum(voters: int) -> int:
    return voters // 2 + 1


def floor(settings: AutopilotConfig, bootstrap_size: int) -> int:
    """The fewest voters autopilot may leave behind."""
    return settings.min_quorum or quorum(max(1, bootstrap_size))


def dead_members(status: dict[str, Any], members: list[Member], dead_after: float) -> list[Member]:
    """Members the leader has not heard from for ``dead_after`` seconds, longest silent first."""
    silent = {p["address"]: p.get("last_contact") for p in status.get("peers", [])}
    dead = [
        m for m in members
        if m.raft_addr != status.get("self") and (silent.get(m.raft_addr) or 0.0) >= dead_after
    ]
    return sorted(dead, key=lambda m: -(silent.get(m.raft_addr) or 0.0))


def choose(status: dict[str, Any], members: list[Member], settings: AutopilotConfig, bootstrap_size: int) -> tuple[Member | None, str]:
    """(the dead server to remove now, or None; why not, when there is one but it stays)."""
    dead = dead_members(status, members, settings.dead_server_time)
    if not dead:
        return None, ""
    voters = len(members)
    if voters - len(dead) < quorum(voters):
        return None, f"only {voters - len(dead)} of {voters} voters are healthy, not a majority"
    least = floor(settings, bootstrap_size)
    if voters - 1 < least:
        return None, f"removing one would leave {voters - 1} voters, fewer than the floor of {least} (autopilot.min_quorum)"
    return dead[0], ""


async def run(server: ServerAPI) -> None:
    """The leader loop: look every second, remove at most one dead server per look."""
    settings = server.config.autopilot
    if not settings.cleanup_dead_servers:
        return
    loop = asyncio.get_running_loop()
    delay = CHECK_EVERY
    refused: str = ""
    while True:
        await asyncio.sleep(delay)
        status = server.raft.status()
        if status.get("role") != "leader":
            continue
        victim, why = choose(status, server.raft.members(), settings, server.raft.member_state.bootstrap_size)
        if victim is None:
            if why and why != refused:
                server.log.warning("autopilot keeps a dead server", reason=why)
            refused = why
            delay = CHECK_EVERY
            continue
        try:
            await loop.run_in_executor(server.executor, server.raft.remove_member, victim, WRITE_TIMEOUT)
        except raft_errors.RaftError as exc:
            delay = min(MAX_BACKOFF, delay * 2)
            server.log.warning("autopilot could not remove a dead server", member=victim.to_wire(), error=str(exc), retry_in_s=delay)
            continue
        server.log.warning(
            "autopilot removed a dead server",
            member=victim.to_wire(),
            dead_after_s=settings.dead_server_time,
            voters=len(server.raft.members()),
        )
        await notify_removed(server, victim, timeout=1.0)  # in case it was only unreachable
        delay = CHECK_EVERY
