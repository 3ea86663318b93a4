"""Nomad's ``/v1/deployments`` and ``/v1/deployment/...`` routes: reads, fail, pause, promote.

The bodies are checked here only as far as Nomad's HTTP layer checks them
(their shape, the path's id); the ``deployment.*`` RPCs decide the rest.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from node.http.paging import and_filter, list_reply
from node.http.shapes import alloc_stubs
from node.http.translate import (
    bad,
    by_path,
    call_write,
    json_body,
    read,
    read_reply,
)


async def deployments_list(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "deployment.list")


async def deployment_get(request: web.Request) -> web.Response:
    return await read_reply(request, "deployment.get", by_path(request, "deployment_id"))


async def deployment_fail(request: web.Request) -> web.Response:
    args = by_path(request, "deployment_id")
    return await call_write(request, "deployment.fail", args)


def _check_deployment_id(body: dict[str, Any], dep_id: str) -> None:
    if body.get("DeploymentID", dep_id) != dep_id:
        raise bad(
            f"DeploymentID {body.get('DeploymentID')!r} in the body does not match the path's {dep_id!r}"
        )


async def deployment_pause(request: web.Request) -> web.Response:
    """Nomad's ``/v1/deployment/pause/:id``: ``{"Pause": true}`` pauses, ``false`` resumes."""
    dep_id = request.match_info["deployment_id"]
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("Pause"), bool):
        raise bad(
            'the body must be a JSON object with a boolean Pause: {"DeploymentID": ..., "Pause": true}'
        )
    _check_deployment_id(body, dep_id)
    args = {"deployment_id": dep_id, "pause": body["Pause"]}
    return await call_write(request, "deployment.pause", args)


async def deployment_promote(request: web.Request) -> web.Response:
    """Nomad's ``/v1/deployment/promote/:id``: ``{"All": true}`` or ``{"Groups": [...]}``."""
    dep_id = request.match_info["deployment_id"]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad(
            'the body must be a JSON object: {"DeploymentID": ..., "All": true} or {"Groups": ["web"]}'
        )
    _check_deployment_id(body, dep_id)
    groups = body.get("Groups") or []
    if body.get("All") and groups:
        raise bad("give All or Groups, not both")
    if not body.get("All") and not groups:
        raise bad('say what to promote: "All": true, or "Groups": [names]')
    args = {"deployment_id": dep_id, "groups": groups}
    return await call_write(request, "deployment.promote", args)


async def deployment_allocations(request: web.Request) -> web.StreamResponse:
    """The allocations one deployment made: its job's allocations with its DeploymentID (filtered server side)."""
    dep, _ = await read(request, "deployment.get", by_path(request, "deployment_id"))
    only = and_filter(request.query.get("filter"), f"DeploymentID == {json.dumps(dep['ID'])}")
    return await list_reply(request, "alloc.list", {"job_id": dep["JobID"], "filter": only}, alloc_stubs)
