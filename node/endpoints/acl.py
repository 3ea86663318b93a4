"""RPC methods for ACL tokens (bootstrap, create, list, read, delete) and ACL policies (upsert, list, read, delete)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from fsm import messages as m
from fsm.store import StateReader
from fsm.structs import SECOND, TOKEN_CLIENT, TOKEN_MANAGEMENT, ACLPolicy, ACLToken
from node.core.acl import POLICIES, Need, hash_secret, new_secret
from node.core.acl_rules import PolicyRulesError, parse_rules
from node.core.context import RequestContext
from node.core.paging import table_rows
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, bad, id_arg, method
from node.spec.nomadjson import to_nomad
from node.wire.errors import BAD_REQUEST, NOT_FOUND, TOKEN_HINT, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


# -- ACL --------------------------------------------------------------------------------
def _token_view(token: ACLToken, secret: str | None = None) -> dict[str, Any]:
    view = to_nomad(token)
    view.pop("SecretHash", None)
    if secret is not None:
        view["SecretID"] = secret
    return view


@method("acl.bootstrap")
async def acl_bootstrap(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    secret = new_secret()
    token = ACLToken(
        accessor_id=str(uuid.uuid4()),
        secret_hash=hash_secret(secret),
        name="Bootstrap Token",
        type=TOKEN_MANAGEMENT,
        global_=True,
    )
    result = await server.write(ctx, Need.NONE, m.ACLTokenBootstrap(token=token))
    if result.get("duplicate"):
        raise RPCError("conflict", "ACL bootstrap already done by an earlier attempt of this request")
    return await _created_token_view(server, token, secret)


@method("acl.token.create")
async def acl_token_create(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    kind = arg(args, "type", required=False, default=TOKEN_CLIENT)
    if kind not in (TOKEN_CLIENT, TOKEN_MANAGEMENT):
        raise bad("argument 'type' must be client or management")
    policies = args.get("policies") or []
    if not isinstance(policies, list) or not all(isinstance(p, str) and p for p in policies):
        raise bad("argument 'policies' must be a list of ACL policy names")
    if kind == TOKEN_CLIENT and not policies:
        raise bad("a client token needs at least one policy: create one (caravan acl policy apply) and name it")
    server.ensure_leader()
    await server.authorize(ctx, Need.MANAGEMENT)  # before the lookup: no token, no word on what exists
    missing = await server.local(lambda r: [p for p in policies if p not in POLICIES and r.acl_policy(p) is None])
    if missing:
        raise bad(f"ACL policy {missing[0]!r} does not exist; create it first (caravan acl policy apply)")
    ttl = arg(args, "ttl_seconds", int, required=False, default=0)
    if ttl < 0:
        raise bad("argument 'ttl_seconds' must be >= 0")
    secret = new_secret()
    token = ACLToken(
        accessor_id=str(uuid.uuid4()),
        secret_hash=hash_secret(secret),
        name=arg(args, "name", required=False, default=""),
        type=kind,
        policies=sorted(set(policies)),
        expiration_time=time.time_ns() + ttl * SECOND if ttl else 0,
    )
    result = await server.write(ctx, Need.MANAGEMENT, m.ACLTokenUpsert(tokens=[token]))
    if result.get("duplicate"):
        # A resend of a request that already committed: this attempt's secret
        # was never stored, and the first one's is known only to its hash.
        first = ((result.get("value") or {}).get("accessor_ids") or ["?"])[0]
        raise RPCError(
            "conflict",
            f"token {first} was created by an earlier attempt of this request and its secret is shown only once; "
            f"delete it (caravan acl token delete {first}) and create another",
        )
    return await _created_token_view(server, token, secret)


async def _created_token_view(server: ServerAPI, token: ACLToken, secret: str) -> dict[str, Any]:
    """The token as stored (with the leader's create time and index), and its secret this once."""
    stored = await server.local(lambda r: r.token(token.accessor_id))
    return _token_view(stored if stored is not None else token, secret)


@method("acl.token.list")
async def acl_token_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of tokens in accessor id order; the filter sees what the list shows (no secret hash)."""
    rows = lambda r, req: table_rows(r, "acl_tokens", req)  # noqa: E731
    return await list_page(server, ctx, args, ("acl_tokens",), rows, view=_token_view, need=Need.MANAGEMENT)


@method("acl.token.get")
async def acl_token_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    accessor = id_arg(args, "accessor_id")

    def get(r: StateReader) -> Any:
        token = r.token(accessor)
        if token is None:
            raise RPCError(NOT_FOUND, f"token {accessor} not found")
        return _token_view(token)

    return await server.read(ctx, args, ("acl_tokens",), get, need=Need.MANAGEMENT, point=True)


@method("acl.token.self")
async def acl_token_self(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    if not ctx.token:
        raise RPCError(BAD_REQUEST, "pass the token to look up", **{TOKEN_HINT: True})

    def get(r: StateReader) -> Any:
        token = r.token_by_secret_hash(hash_secret(ctx.token or ""))
        if token is None:
            raise RPCError(NOT_FOUND, "token not found")
        return _token_view(token)

    return await server.read(ctx, args, ("acl_tokens",), get, need=Need.NONE, point=True)


@method("acl.token.delete")
async def acl_token_delete(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    accessor = id_arg(args, "accessor_id")
    result = await server.write(ctx, Need.MANAGEMENT, m.ACLTokenDelete(accessor_ids=[accessor]))
    return {"Index": result["index"], "Deleted": result["value"]["deleted"]}


# -- ACL policies -------------------------------------------------------------------------
def _policy_view(policy: ACLPolicy) -> dict[str, Any]:
    """Nomad's ACLPolicy: name, description, the rules as written, indexes."""
    return {"Name": policy.name, "Description": policy.description, "Rules": policy.rules,
            "CreateIndex": policy.create_index, "ModifyIndex": policy.modify_index}


def _policy_stub(policy: ACLPolicy) -> dict[str, Any]:
    """Nomad's ACLPolicyListStub: the rules are left out of lists."""
    view = _policy_view(policy)
    view.pop("Rules")
    return view


@method("acl.policy.upsert")
async def acl_policy_upsert(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Create or replace a policy from its rules (HCL or JSON), parsed here, before the log."""
    name = arg(args, "name")
    description = arg(args, "description", required=False, default="")
    rules = arg(args, "rules")
    try:
        policy = parse_rules(name, description, rules)
    except PolicyRulesError as exc:
        raise bad(f"ACL policy {name}: {exc}") from None
    result = await server.write(ctx, Need.MANAGEMENT, m.ACLPolicyUpsert(policies=[policy]))
    return {"Index": result["index"], "Name": name}


@method("acl.policy.list")
async def acl_policy_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of policies in name order (stubs, without rules)."""
    rows = lambda r, req: table_rows(r, "acl_policies", req)  # noqa: E731
    return await list_page(server, ctx, args, ("acl_policies",), rows, view=_policy_stub, need=Need.MANAGEMENT)


@method("acl.policy.get")
async def acl_policy_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    name = arg(args, "name")

    def get(r: StateReader) -> Any:
        policy = r.acl_policy(name)
        if policy is None:
            raise RPCError(NOT_FOUND, f"ACL policy {name!r} not found")
        return _policy_view(policy)

    return await server.read(ctx, args, ("acl_policies",), get, need=Need.MANAGEMENT, point=True)


@method("acl.policy.delete")
async def acl_policy_delete(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Delete a policy; tokens naming it keep the name and lose its rules (as Nomad)."""
    name = arg(args, "name")
    result = await server.write(ctx, Need.MANAGEMENT, m.ACLPolicyDelete(names=[name]))
    return {"Index": result["index"], "Deleted": result["value"]["deleted"]}
