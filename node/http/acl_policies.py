"""Nomad's ``/v1/acl/policies`` and ``/v1/acl/policy/:name`` routes: list, read, create or replace, delete.

Policies are answered in Nomad's shape (``Name``, ``Description``, ``Rules``
as written, ``CreateIndex``, ``ModifyIndex``; lists leave out ``Rules``). A
write answers an empty body, as Nomad's does; the rules are parsed by the
leader, so a bad rule is a 400 naming what to fix.
"""

from __future__ import annotations

from aiohttp import web

from node.http.bridge import api_of
from node.http.paging import list_reply
from node.http.translate import answer, bad, json_body, read, reply


async def acl_policies(request: web.Request) -> web.StreamResponse:
    return await list_reply(request, "acl.policy.list")


async def acl_policy_get(request: web.Request) -> web.Response:
    data, index = await read(request, "acl.policy.get", {"name": request.match_info["name"]})
    return reply(request, data, index)


async def acl_policy_upsert(request: web.Request) -> web.Response:
    """Nomad's ACLPolicy body; its Name, if set, must be the path's."""
    name = request.match_info["name"]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad('request body must be a JSON object {"Name": ..., "Description": ..., "Rules": "..."}')
    if body.get("Name") not in (None, "", name):
        raise bad(f"policy Name {body.get('Name')!r} does not match the path's {name!r}; make them agree")
    rules = body.get("Rules")
    if not isinstance(rules, str) or not rules.strip():
        raise bad("Rules must be the policy's rules, HCL or JSON, as a string")
    description = body.get("Description") or ""
    if not isinstance(description, str):
        raise bad("Description must be a string")
    args = {"name": name, "description": description, "rules": rules}
    out = await api_of(request).call(request, "acl.policy.upsert", args)
    return answer(None, index=out.get("Index"), request=request)


async def acl_policy_delete(request: web.Request) -> web.Response:
    out = await api_of(request).call(request, "acl.policy.delete", {"name": request.match_info["name"]})
    return answer(None, index=out.get("Index"), request=request)
