"""Nomad's ``/v1/operator/scheduler/configuration``: read and replace the scheduler configuration.

GET answers Nomad's SchedulerConfigurationResponse (``SchedulerConfig``,
``Index``, ``KnownLeader``, ``LastContact``) and takes ``?stale`` and
blocking queries. PUT/POST takes a whole ``SchedulerConfiguration`` as the
body (Caravan's policy under ``PlacementPolicy``; see
``scheduler.policy_json``) and ``?cas=N`` as Nomad's: replace it only if
its ModifyIndex is still N; the answer is ``{"Updated", "Index"}``, and a
stale N is ``Updated: false``, not an error.
"""

from __future__ import annotations

from aiohttp import web

from node.http.bridge import api_of
from node.http.translate import bad, call_write, json_body, query_int, read, reply

GET_CONFIG, SET_CONFIG = "operator.scheduler.get_config", "operator.scheduler.set_config"


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
