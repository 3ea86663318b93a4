"""The server's own state over HTTP: status, regions, raft configuration, system jobs, metrics.

``/v1/status/*`` and ``/v1/operator/raft/configuration`` answer from the
``status`` and ``operator.raft.peers`` RPCs in Nomad's shapes;
``/v1/system/*`` runs the garbage collection and summary reconciliation
RPCs when this server has them (501 otherwise); ``/v1/metrics`` serves
this process's metrics as Nomad's JSON or as Prometheus text.
"""

from __future__ import annotations

from aiohttp import web

from node.core.metrics import METRICS, PROMETHEUS_CONTENT_TYPE
from node.http.bridge import HTTPError, api_of
from node.http.shapes import raft_server
from node.http.translate import answer, bad

# RPC methods that other engineers add; tried in order (the first registered wins).
RECONCILE_METHODS = (
    "system.reconcile_summaries",
    "system.reconcile.summaries",
    "job.reconcile_summaries",
)


async def status_leader(request: web.Request) -> web.Response:
    """The leader's address, as ``/v1/status/peers`` and the raft configuration list it ("" if none)."""
    out = await api_of(request).call(request, "status", {})
    return answer(out.get("Leader") or "")


async def status_peers(request: web.Request) -> web.Response:
    """Every server's address: the RPC one, the Address of each RaftServer (Nomad's peers)."""
    out = await api_of(request).call(request, "status", {})
    return answer([raft_server(s)["Address"] for s in out.get("servers", [])])


async def regions(request: web.Request) -> web.Response:
    """One region, always: Caravan does not federate."""
    return answer(["global"])


async def raft_configuration(request: web.Request) -> web.Response:
    """Nomad's RaftConfiguration; each server's Address agrees with the status routes'."""
    api = api_of(request)
    peers = await api.call(request, "operator.raft.peers", {})
    status = await api.call(request, "status", {})
    servers = []
    for peer in peers:
        server = raft_server(peer)
        server["RPCAddress"] = peer["RPCAddress"]  # ours, kept for scripts that read it
        servers.append(server)
    return answer({"Index": status.get("CommitIndex", 0), "Servers": servers}, request=request)


async def system_gc(request: web.Request) -> web.Response:
    out = await api_of(request).call(request, "system.gc", {})
    return answer(out, index=out.get("Index") if isinstance(out, dict) else None, request=request)


async def system_reconcile(request: web.Request) -> web.Response:
    api = api_of(request)
    for method in RECONCILE_METHODS:
        if api.has(method):
            out = await api.call(request, method, {})
            return answer(
                out, index=out.get("Index") if isinstance(out, dict) else None, request=request
            )
    raise HTTPError(
        501,
        "job summary reconciliation is not available on this server (not implemented in this version)",
    )


async def metrics(request: web.Request) -> web.Response:
    """``/v1/metrics``: Nomad's JSON, or ``?format=prometheus`` for a scraper."""
    fmt = request.query.get("format", "")
    if fmt == "prometheus":
        return web.Response(
            body=METRICS.prometheus(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE}
        )
    if fmt not in ("", "json"):
        raise bad(f"unknown metrics format {fmt!r}: use format=prometheus, or no format for JSON")
    return answer(METRICS.nomad_json())
