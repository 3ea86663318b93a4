"""Forwarding: a request that must run on the leader follows leadership until one serves it.

A handler on a follower raises ``node.core.api.Forward``; the server's
dispatcher hands the request here. Each attempt is short, so a leader that
just died does not hold the client for the whole write timeout, and
re-sending is safe because the request id travels along and the FSM applies
each id once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from node.core.api import Forward
from node.core.context import RequestContext
from node.core.writes import WRITE_TIMEOUT
from node.wire.errors import (
    NO_LEADER,
    NOT_EXECUTED,
    NOT_LEADER,
    TIMEOUT,
    UNAVAILABLE,
    UNKNOWN_OUTCOME,
    RPCError,
)

READ_WAIT_MAX = 300.0
FORWARD_ATTEMPT = 1.0  # seconds one forwarding attempt may take before leadership is looked up again
# How long a request waits for a leader to be elected before it fails with
# no_leader (Nomad's RPCHoldTimeout): long enough to ride through an election,
# short enough that the answer comes before the client's own timeout.
NO_LEADER_HOLD = 5.0
RETRY_FORWARD = frozenset({NOT_LEADER, NO_LEADER, UNAVAILABLE, TIMEOUT, UNKNOWN_OUTCOME})
FORWARDED = "forwarded"  # a request's marker that a follower already forwarded it


def blocking_wait(args: dict[str, Any]) -> float:
    """Seconds a blocking query (``min_index`` + ``wait``) may wait on the leader; 0 for other calls."""
    wait = args.get("wait")
    if not args.get("min_index") or isinstance(wait, bool) or not isinstance(wait, int | float) or wait <= 0:
        return 0.0
    return min(float(wait), READ_WAIT_MAX)


class Forwarding(Protocol):
    """What forwarding uses of the server it runs in."""

    raft: Any
    rpc: Any
    forwarder: Any
    config: Any
    members: list[Any]

    def leader_rpc(self) -> str | None: ...


async def forward_request(
    server: Forwarding, name: str, fn: Callable[..., Any], ctx: RequestContext, args: dict[str, Any], leader: str | None
) -> Any:
    """Send the request to the leader, following leadership changes until the deadline.

    Each attempt is short: a leader that just died must not hold the
    client for the whole write timeout. Re-sending is safe because the
    request id travels along and the FSM applies each id once.
    """
    if args.get(FORWARDED):
        raise RPCError.not_leader(leader)
    blocking = blocking_wait(args)  # a blocking query may rightly take that much longer
    started = time.monotonic()
    deadline = started + WRITE_TIMEOUT + blocking
    maybe_ran = False  # an attempt whose outcome is unknown: giving up must not say "not executed"
    while True:
        if server.raft.is_leader:
            try:
                return await fn(server, ctx, args)
            except Forward as again:
                # Leadership moved on while it ran (a barrier found this
                # server deposed): it did nothing, so send it on as well.
                leader = again.leader
        remaining = deadline - time.monotonic()
        if leader is not None and leader != server.rpc.address:
            try:
                return await server.forwarder.call(
                    name,
                    {**args, FORWARDED: True},
                    request_id=ctx.request_id,
                    token=ctx.token,
                    address=leader,
                    timeout=max(0.05, min(FORWARD_ATTEMPT + blocking, remaining)),
                    one_pass=True,  # a refused leader: look leadership up again at once
                )
            except RPCError as exc:
                if exc.code not in RETRY_FORWARD or remaining <= 0:
                    raise
                maybe_ran = maybe_ran or exc.code not in NOT_EXECUTED
        elif (
            remaining <= 0
            or time.monotonic() - started >= NO_LEADER_HOLD
            # Cut off from a quorum, this server will hear of no leader: holding
            # the request only keeps its client from trying another server.
            or server.raft.quorum_contact_lost
        ):
            if maybe_ran:
                raise RPCError(
                    UNKNOWN_OUTCOME,
                    "the leader stopped answering before this request was acknowledged and no new "
                    "leader was elected since; it may or may not have been applied: check, or retry "
                    f"with request id {ctx.request_id}",
                )
            raise no_leader_error(server.config.node_id, len(server.members), time.monotonic() - started)
        await asyncio.sleep(0.05)
        leader = server.leader_rpc()


def no_leader_error(node_id: str, servers: int, waited: float) -> RPCError:
    """The error for a request that found no leader for ``waited`` seconds, with what to do."""
    return RPCError(
        NO_LEADER,
        f"no cluster leader: server {node_id} has had no leader for the last {waited:.0f}s; "
        f"a leader needs {servers // 2 + 1} of the {servers} servers running and able to reach each "
        f"other: start the ones that are down ('caravan cluster status' shows them) or check the "
        f"server logs",
    )
