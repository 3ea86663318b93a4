"""Nomad's ``/v1/operator/scheduler/configuration``: read and replace the scheduler configuration.

GET answers Nomad's SchedulerConfigurationResponse (``SchedulerConfig``,
``Index``, ``KnownLeader``, ``LastContact``) and takes ``?stale`` and
blocking queries. PUT/POST takes a whole ``SchedulerConfiguration`` as the
body (Caravan's policy under ``PlacementPolicy``; see
``scheduler.policy_json``) and ``?cas=N`` as Nomad's: replace it only if
its ModifyIndex is still N; the answer is ``{"Updated", "Index"}``, and a
stale N is ``Updated: false``, not an error.

Membership, as Nomad's routes: ``PUT /v1/agent/join?address=ADDR`` (sent
to the new server: join the cluster at ADDR) and ``DELETE
/v1/operator/raft/peer?id=ID`` (or ``?address=``), both with a management
token. The HTTP API starts once raft runs, and a new server starts raft only
once it has joined, so a waiting server takes its join over RPC
(``caravan server join``); on a member, ``agent/join`` answers that it
already is one.
"""

from __future__ import annotations

from aiohttp import web

from node.http.bridge import api_of
from node.http.translate import bad, call_write, json_body, query_int, read, reply

GET_CONFIG, SET_CONFIG = "operator.scheduler.get_config", "operator.scheduler.set_config"
JOIN, REMOVE_PEER = "agent.join", "operator.raft.remove_peer"


async def scheduler_configuration(request: web.Request) -> web.Response:
    data, index = await read(request, GET_CONFIG)
    body = {**data, "Index": index, "KnownLeader": api_of(request).known_leader(), "LastContact": 0}
    return reply(request, body, index)


async def scheduler_set_configuration(request: web.Request) -> web.Response:
    args = {"config": await json_body(request)}
    if "cas" in request.query:
        cas = query_int(request, "cas")
        if cas is None:
            raise bad("query parameter 'cas' needs the ModifyIndex to compare with, like ?cas=42")
        args["cas_index"] = cas
    return await call_write(request, SET_CONFIG, args)


async def agent_join(request: web.Request) -> web.Response:
    address = request.query.get("address")
    if not address:
        raise bad("query parameter 'address' needs the RPC address of a cluster member, like ?address=10.0.0.1:4647")
    return await call_write(request, JOIN, {"address": address})


async def raft_remove_peer(request: web.Request) -> web.Response:
    args = {key: request.query[key] for key in ("id", "address") if request.query.get(key)}
    if len(args) != 1:
        raise bad("name the server with exactly one of ?id=ID or ?address=ADDR (see /v1/operator/raft/configuration)")
    return await call_write(request, REMOVE_PEER, args)
