"""Adding and removing servers on the leader (Nomad's ``server join`` and ``operator raft remove-peer``).

Each change is one committed raft entry carrying the member's id and
addresses (raft/members.py), one at a time (the pysyncobj guard in
raft/commands.py). Before an add the leader checks that the new server
answers on its RPC address as the server it claims to be: pysyncobj counts
a new voter in the quorum as soon as the entry is appended, so adding a
server that is not running would make every later commit need one more of
the old servers. The raft port itself cannot be checked first (the new
server starts raft only once it is a member, see node/core/joining.py); the
join proof shows it holds the raft password.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from node.core.acl import Need
from node.core.context import RequestContext
from node.core.writes import WRITE_TIMEOUT
from node.wire.async_client import AsyncRPCClient
from node.wire.errors import BAD_REQUEST, PERMISSION_DENIED, UNAVAILABLE, RPCError
from raft import errors as raft_errors
from raft.members import Member, join_proof, proof_ok

if TYPE_CHECKING:
    from node.core.api import ServerAPI

PRECHECK_TIMEOUT = 5.0
#: The notice goes to the removed server as a remove-peer carrying the leader's signature.
REMOVED = "operator.raft.remove_peer"


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise RPCError(BAD_REQUEST, f"argument {key!r} is required (a non-empty string)")
    return value


def refresh_views(raft: Any, seen: int, members: list[Any], rpc_of_raft: dict[str, str]) -> int:
    """Rebuild a server's ``members`` and ``rpc_of_raft`` from the raft configuration if it changed
    since version ``seen``; returns the version they now reflect.

    In place: the write queue holds ``rpc_of_raft``. An RPC address the log never carried (a
    member from before member tables) is kept from the views built so far (the config's).
    """
    version = getattr(raft, "members_version", None)  # None: raft is still starting
    if version is None or version == seen:
        return seen
    known = {m.raft_addr: m.rpc_addr for m in members}
    fresh = [Member(m.node_id, m.raft_addr, m.rpc_addr or known.get(m.raft_addr, "")) for m in raft.members()]
    members[:] = fresh
    rpc_of_raft.update({m.raft_addr: m.rpc_addr for m in fresh})
    for gone in set(rpc_of_raft) - {m.raft_addr for m in fresh}:
        rpc_of_raft.pop(gone, None)
    return int(version)


def members_wire(server: ServerAPI) -> list[dict[str, str]]:
    return [m.to_wire() for m in server.raft.members()]


def join_answer(server: ServerAPI) -> dict[str, Any]:
    """What a joining server needs: the voters, the cluster's fixed id, its bootstrap size."""
    return {
        "Members": members_wire(server),
        "ClusterID": server.cluster_id,
        "BootstrapSize": server.raft.member_state.bootstrap_size,
    }


async def add_peer(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> dict[str, Any]:
    """Add the server ``id``/``raft_addr``/``rpc_addr`` as a voter; answers :func:`join_answer`."""
    server.ensure_leader()
    await server.authorize(ctx, Need.MANAGEMENT)
    member = Member(node_id=_text(args, "id"), raft_addr=_text(args, "raft_addr"), rpc_addr=_text(args, "rpc_addr"))
    if not proof_ok(server.config.raft_password, member, str(args.get("proof", ""))):
        raise RPCError(
            PERMISSION_DENIED,
            "the joining server does not hold this cluster's raft password; give it the same raft_password_file",
        )
    for m in server.raft.members():
        if m.node_id == member.node_id and m.raft_addr == member.raft_addr:
            return join_answer(server)  # already a member: a retried join
        if m.node_id == member.node_id or m.raft_addr == member.raft_addr:
            raise RPCError(
                BAD_REQUEST,
                f"{m.node_id} ({m.raft_addr}) is already a member; remove it first "
                f"(caravan operator raft remove-peer --id {m.node_id}) or give the new server its own id and address",
            )
    await _precheck(member)
    await _change(server, server.raft.add_member, member, "add")
    server.log.info("server added to the raft configuration", member=member.to_wire())
    return join_answer(server)


async def _precheck(member: Member) -> None:
    client = AsyncRPCClient([member.rpc_addr], timeout=PRECHECK_TIMEOUT)
    try:
        status = await client.call("status", {}, address=member.rpc_addr, one_pass=True)
    except (RPCError, OSError) as exc:
        raise RPCError(
            UNAVAILABLE,
            f"the new server does not answer at {member.rpc_addr} ({exc}); start it first, then join",
        ) from None
    finally:
        await client.close()
    if status.get("NodeID") != member.node_id:
        raise RPCError(BAD_REQUEST, f"{member.rpc_addr} answers as {status.get('NodeID')!r}, not {member.node_id!r}")


async def _change(server: ServerAPI, fn: Any, member: Member, what: str) -> None:
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(server.executor, fn, member, WRITE_TIMEOUT)
    except raft_errors.NotLeaderError:
        raise RPCError.not_leader(server.leader_rpc()) from None
    except raft_errors.RaftError as exc:
        raise RPCError(UNAVAILABLE, f"could not {what} {member.node_id}: {exc}") from None


def find_member(server: ServerAPI, args: dict[str, Any]) -> Member:
    """The member ``id`` or ``address`` (raft or RPC) names."""
    wanted = args.get("id") or args.get("address")
    if not isinstance(wanted, str) or not wanted:
        raise RPCError(BAD_REQUEST, "name the server to remove with id or address; see 'caravan operator raft list-peers'")
    for m in server.raft.members():
        if wanted in (m.node_id, m.raft_addr, m.rpc_addr):
            return m
    raise RPCError(BAD_REQUEST, f"no member {wanted!r} in the raft configuration; see 'caravan operator raft list-peers'")


async def remove_peer(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> dict[str, Any]:
    """Remove the voter ``id`` or ``address`` as one committed entry."""
    server.ensure_leader()
    await server.authorize(ctx, Need.MANAGEMENT)
    member = find_member(server, args)
    await _change(server, server.raft.remove_member, member, "remove")
    server.log.info("server removed from the raft configuration", member=member.to_wire())
    await notify_removed(server, member)
    return {"Removed": member.to_wire(), "Members": members_wire(server)}


async def notify_removed(server: ServerAPI, member: Member, timeout: float = 2.0) -> bool:
    """Tell a removed server, if it still runs, that it was removed (best effort).

    pysyncobj's leader stops sending to a node as it appends the node's
    removal, so the removed server never sees the entry; without this it
    would keep its old configuration (harmlessly: members ignore its vote
    requests, raft/membership.py) but report itself a member.
    """
    if not member.rpc_addr:
        return False
    args = {**member.to_wire(), "notice": join_proof(server.config.raft_password, member, "removed")}
    client = AsyncRPCClient([member.rpc_addr], timeout=timeout)
    try:
        await client.call(REMOVED, args, address=member.rpc_addr, one_pass=True)
        return True
    except (RPCError, OSError):
        return False  # dead or unreachable: the usual case when replacing a failed server
    finally:
        await client.close()


async def removed(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> dict[str, Any]:
    """On the removed server: the leader's signed notice; stop campaigning and following."""
    me = Member(node_id=server.config.node_id, raft_addr=server.config.raft_addr, rpc_addr=server.config.rpc_addr)
    if args.get("raft") != me.raft_addr or not proof_ok(server.config.raft_password, me, str(args.get("notice", "")), "removed"):
        raise RPCError(PERMISSION_DENIED, "removal notice not signed with this cluster's raft password for this server")
    mark = getattr(server.raft, "mark_removed", None)
    if mark is not None:
        mark()
    server.log.warning("removed from the raft configuration by the leader; this server no longer votes")
    return {"Removed": True}
