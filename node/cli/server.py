"""``caravan server``: Nomad's ``server join``, run against the new server's agent.

``caravan server join ADDR --address NEW`` tells the server at NEW (started
with ``join = []`` or an unreachable ``join`` list, so it waits) to ask the
cluster reachable at ADDR to add it as a voter. The cluster checks the
management token (``--token``) and that the new server holds its raft
password, then commits the change; the new server then starts raft and
catches up from the leader. See README "Replacing a failed server".
"""

from __future__ import annotations

import click

from node.cli.common import client_options, emit, make_ctx


@click.group("server")
def server_group() -> None:
    """Cluster membership of this server."""


@server_group.command("join")
@click.argument("cluster_address")
@client_options
def server_join(cluster_address: str, address: str, token: str | None, as_json: bool, stale: bool) -> None:
    """Make the server at --address join the cluster reachable at CLUSTER_ADDRESS (an RPC address)."""
    c = make_ctx(address, token, as_json)
    out = c.call("agent.join", {"address": cluster_address}, timeout=60.0)
    emit(c, out, lambda d: f"Joined {d['num_joined']} cluster; voters now: "
         + ", ".join(m["id"] for m in d.get("Members", [])))
