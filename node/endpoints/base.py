"""RPC methods of a server: one small function per method, one table.

Writes go through ``Server.write`` (forwarded to the leader, stamped, put on
the log, answered with the apply result). Reads go through ``Server.read``
(linearizable by default: leader + barrier; ``stale`` on any server; blocking
with ``min_index``/``wait``). Objects come back in Nomad's JSON shape.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fsm import codec
from fsm import messages as m
from fsm.errors import CodecError
from fsm.ids import new_uuid
from fsm.store import StateReader
from fsm.structs import (
    EVAL_PENDING,
    NODE_DOWN,
    NODE_ELIGIBLE,
    NODE_INELIGIBLE,
    NODE_READY,
    NODE_STATUSES,
    SECOND,
    TOKEN_CLIENT,
    TOKEN_MANAGEMENT,
    ACLToken,
    Evaluation,
    Job,
    Node,
)
from node.core.acl import POLICIES, Need, hash_secret, new_secret
from node.core.rpc_server import RequestContext
from node.spec.jobspec import JobSpecError, parse_job
from node.spec.nomadjson import from_nomad, to_nomad
from node.wire.errors import BAD_REQUEST, CONFLICT, NOT_FOUND, TOKEN_HINT, RPCError

if TYPE_CHECKING:
    from node.server import Server

Method = Callable[["Server", RequestContext, dict[str, Any]], Awaitable[Any]]
METHODS: dict[str, Method] = {}


def method(name: str) -> Callable[[Method], Method]:
    def register(fn: Method) -> Method:
        METHODS[name] = fn
        return fn

    return register


StreamMethod = Callable[["Server", RequestContext, dict[str, Any]], AsyncIterator[Any]]
STREAMS: dict[str, StreamMethod] = {}


def stream_method(name: str) -> Callable[[StreamMethod], StreamMethod]:
    """Register a streaming method: an async generator, served locally by every server (never forwarded)."""

    def register(fn: StreamMethod) -> StreamMethod:
        STREAMS[name] = fn
        return fn

    return register


def _bad(message: str) -> RPCError:
    return RPCError(BAD_REQUEST, message)


def _arg(args: dict[str, Any], name: str, kind: type = str, *, required: bool = True, default: Any = None) -> Any:
    value = args.get(name, default)
    if value is None:
        if required:
            raise _bad(f"missing argument {name!r}")
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _bad(f"argument {name!r} must be a {kind.__name__}")
    return value


def id_arg(args: dict[str, Any], name: str) -> str:
    """A required id: an empty one would be a prefix of every id, so it is refused."""
    value = _arg(args, name)
    if not value.strip():
        raise _bad(f"argument {name!r} must not be empty")
    return value


def _found(obj: Any, what: str) -> Any:
    if obj is None:
        raise RPCError(NOT_FOUND, f"{what} not found")
    return to_nomad(obj)


def _new_eval(job: Job, triggered_by: str) -> Evaluation:
    return Evaluation(
        id=new_uuid(),
        job_id=job.id,
        namespace=job.namespace,
        priority=job.priority,
        type=job.type,
        triggered_by=triggered_by,
        status=EVAL_PENDING,
    )


# -- status and operator --------------------------------------------------------
@method("status")
async def status(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    return server.status()


@method("operator.raft.peers")
async def raft_peers(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    await server.authorize(ctx, Need.READ)
    return server.status()["servers"]


@method("operator.raft.transfer")
async def raft_transfer(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    await server.authorize(ctx, Need.MANAGEMENT)
    target = _arg(args, "to", required=False)
    return await server.transfer_leadership(ctx, target)


@method("system.reconcile_summaries")
async def reconcile_summaries(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Recount every job summary from its allocs (management token)."""
    result = await server.write(ctx, Need.MANAGEMENT, m.ReconcileSummaries())
    return {"Index": result["index"], "Reconciled": result["value"]["reconciled"]}


@method("debug.digest")
async def debug_digest(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    await server.authorize(ctx, Need.READ)
    if not args.get("stale"):
        await server.linearize(ctx)
    digest, index = await ctx.run_blocking(server.fsm_digest)
    return {"digest": digest, "index": index, "node_id": server.config.node_id}


# -- jobs ---------------------------------------------------------------------------
@method("job.register")
async def job_register(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    try:
        job, warnings = parse_job(args.get("job"))
    except JobSpecError as exc:
        raise _bad(f"invalid jobspec: {exc}") from None
    enforce = _arg(args, "enforce_index", int, required=False)
    return await _register(server, ctx, job, enforce, warnings)


async def _register(server: Server, ctx: RequestContext, job: Job, enforce: int | None, warnings: list[str]) -> Any:
    """Put a registration on the log, with the eval that places it; Nomad's JobRegisterResponse."""
    ev = None if job.periodic or job.parameterized else _new_eval(job, "job-register")
    result = await server.write(ctx, Need.WRITE, m.JobRegister(job=job, eval=ev, enforce_index=enforce))
    value = result["value"]
    return {
        "EvalID": value.get("eval_id", ""),
        "EvalCreateIndex": value.get("eval_create_index", 0),
        "JobModifyIndex": value["job_modify_index"],
        "Index": result["index"],
        "Warnings": "\n".join(warnings),
    }


@method("job.stop")
async def job_stop(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")
    purge = bool(args.get("purge", False))
    server.ensure_leader()  # the job is read from state: read the leader's
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists
    job = await server.local(lambda r: r.job(job_id))
    if job is None:
        raise RPCError(NOT_FOUND, f"job {job_id} not found")
    body = m.JobDeregister(job_id=job_id, purge=purge, eval=_new_eval(job, "job-deregister"))
    result = await server.write(ctx, Need.WRITE, body)
    return {"EvalID": result["value"].get("eval_id", ""), "JobModifyIndex": result["value"]["job_modify_index"], "Index": result["index"]}


@method("job.revert")
async def job_revert(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Register a kept version's spec again as the job's newest version, as ``nomad job revert``."""
    job_id = id_arg(args, "job_id")
    version = _arg(args, "job_version", int)
    prior = _arg(args, "enforce_prior_version", int, required=False)
    server.ensure_leader()  # the versions are read from state: read the leader's
    await server.authorize(ctx, Need.WRITE)  # before the lookup: no token, no word on what exists

    def target(r: StateReader) -> tuple[Job, Job]:
        current = r.job(job_id)
        if current is None:
            raise RPCError(NOT_FOUND, f"job {job_id} not found")
        if version == current.version:
            raise _bad(f"job {job_id} is at version {version} already; can't revert to the current version")
        if prior is not None and prior != current.version:
            raise RPCError(CONFLICT, f"job {job_id} is at version {current.version}, not {prior}; read it again and retry")
        kept = r.job_version(job_id, version)
        if kept is None:
            raise RPCError(NOT_FOUND, f"job {job_id} has no version {version} (job history lists the kept versions)")
        return current, kept

    current, kept = await server.local(target)
    # Over the version just read only: a registration in between wins, as with --check-index.
    return await _register(server, ctx, kept, current.job_modify_index, [])


@method("job.get")
async def job_get(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")
    return await server.read(ctx, args, ("jobs",), lambda r: _found(r.job(job_id), f"job {job_id}"), point=True)


@method("job.list")
async def job_list(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    prefix = _arg(args, "prefix", required=False, default="")
    return await server.read(ctx, args, ("jobs",), lambda r: [to_nomad(j) for j in r.jobs(prefix)])


@method("job.versions")
async def job_versions(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")

    def versions(r: StateReader) -> Any:
        rows = r.job_versions(job_id)
        if not rows:
            raise RPCError(NOT_FOUND, f"job {job_id} not found")
        return {"Versions": [to_nomad(j) for j in rows]}

    return await server.read(ctx, args, ("job_versions",), versions)


@method("job.summary")
async def job_summary(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = id_arg(args, "job_id")
    return await server.read(ctx, args, ("job_summary",), lambda r: _found(r.job_summary(job_id), f"job {job_id}"), point=True)


# -- evals ----------------------------------------------------------------------------
@method("eval.get")
async def eval_get(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    eval_id = id_arg(args, "eval_id")
    return await server.read(
        ctx, args, ("evals",), lambda r: _found(by_prefix(r.eval, r.evals, eval_id), f"evaluation {eval_id}"), point=True
    )


@method("eval.list")
async def eval_list(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = _arg(args, "job_id", required=False)

    def evals(r: StateReader) -> Any:
        rows = r.evals_by_job(job_id) if job_id else r.evals(_arg(args, "prefix", required=False, default=""))
        return [to_nomad(e) for e in rows]

    return await server.read(ctx, args, ("evals",), evals)


# A prefix lookup reads at most this many objects, so that it stays a point
# read (served on the loop, see Server.read) however short the prefix.
PREFIX_MATCH_LIMIT = 20


def by_prefix(get: Callable[[str], Any], scan: Callable[[str, int], list], ident: str) -> Any:
    """Exact id, or a unique prefix of one (as Nomad's CLI accepts short ids)."""
    obj = get(ident)
    if obj is not None:
        return obj
    rows = scan(ident, PREFIX_MATCH_LIMIT + 1)
    if len(rows) > PREFIX_MATCH_LIMIT:
        raise _bad(f"prefix {ident!r} matches more than {PREFIX_MATCH_LIMIT} objects; give more characters")
    if len(rows) > 1:
        ids = ", ".join(row.id for row in rows)
        raise _bad(f"prefix {ident!r} matches {len(rows)} objects ({ids}); give more characters")
    return rows[0] if rows else None


# -- allocs ----------------------------------------------------------------------------
@method("alloc.get")
async def alloc_get(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    alloc_id = id_arg(args, "alloc_id")
    return await server.read(
        ctx, args, ("allocs",), lambda r: _found(by_prefix(r.alloc, r.allocs, alloc_id), f"allocation {alloc_id}"), point=True
    )


@method("alloc.list")
async def alloc_list(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = _arg(args, "job_id", required=False)
    node_id = _arg(args, "node_id", required=False)

    def allocs(r: StateReader) -> Any:
        if job_id:
            rows = r.allocs_by_job(job_id)
        elif node_id:
            rows = r.allocs_by_node(node_id)
        else:
            rows = r.allocs(_arg(args, "prefix", required=False, default=""))
        return [to_nomad(a) for a in rows]

    return await server.read(ctx, args, ("allocs",), allocs)


@method("alloc.update")
async def alloc_update(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Client status updates (what Nomad's Node.UpdateAlloc carries)."""
    raw = args.get("allocs")
    if not isinstance(raw, list) or not raw:
        raise _bad("argument 'allocs' must be a non-empty list of {ID, ClientStatus, ...}")
    try:
        states = [codec.from_wire(m.AllocClientState, from_nomad(a), f"allocs[{i}]") for i, a in enumerate(raw)]
    except CodecError as exc:
        raise _bad(str(exc)) from None
    result = await server.write(ctx, Need.WRITE, m.AllocClientUpdate(allocs=states))
    return {"Index": result["index"], "Updated": result["value"]["updated"], "Ignored": result["value"]["ignored"]}


# -- deployments -------------------------------------------------------------------
@method("deployment.get")
async def deployment_get(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    dep_id = id_arg(args, "deployment_id")
    return await server.read(
        ctx,
        args,
        ("deployments",),
        lambda r: _found(by_prefix(r.deployment, r.deployments, dep_id), f"deployment {dep_id}"),
        point=True,
    )


@method("deployment.list")
async def deployment_list(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    job_id = _arg(args, "job_id", required=False)

    def deployments(r: StateReader) -> Any:
        rows = r.deployments_by_job(job_id) if job_id else r.deployments()
        return [to_nomad(d) for d in rows]

    return await server.read(ctx, args, ("deployments",), deployments)


# -- nodes ---------------------------------------------------------------------------
@method("node.register")
async def node_register(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    try:
        node = codec.from_wire(Node, from_nomad(args.get("node")), "Node")
    except CodecError as exc:
        raise _bad(f"invalid node: {exc}") from None
    node.status = node.status if node.status in NODE_STATUSES else NODE_READY
    result = await server.write(ctx, Need.WRITE, m.NodeRegister(node=node))
    return {"Index": result["index"], "NodeID": node.id}


@method("node.status")
async def node_status(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A heartbeat (status ready) or an operator marking a node down.

    Served by the leader (a follower forwards it): heartbeat TTLs live only
    on the leader, and the leader's state already has a just-registered node.
    """
    node_id = id_arg(args, "node_id")
    new = _arg(args, "status", required=False, default=NODE_READY)
    if new not in (NODE_READY, NODE_DOWN):
        raise _bad("argument 'status' must be ready or down")
    server.ensure_leader()
    await server.authorize(ctx, Need.WRITE)
    node = await server.local(lambda r: r.node(node_id))
    if node is None:
        raise RPCError(NOT_FOUND, f"node {node_id} not found; register it first")
    if node.status == new:
        server.heartbeat(node_id)
        return {"Index": node.modify_index, "NodeID": node_id}
    result = await server.write(ctx, Need.WRITE, m.NodeUpdateStatus(node_id=node_id, status=new))
    server.heartbeat(node_id)
    return {"Index": result["index"], "NodeID": node_id}


@method("node.eligibility")
async def node_eligibility(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    node_id = id_arg(args, "node_id")
    value = _arg(args, "eligibility")
    if value not in (NODE_ELIGIBLE, NODE_INELIGIBLE):
        raise _bad("argument 'eligibility' must be eligible or ineligible")
    result = await server.write(ctx, Need.WRITE, m.NodeUpdateEligibility(node_id=node_id, eligibility=value))
    return {"Index": result["index"], "NodeID": node_id}


@method("node.get")
async def node_get(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    node_id = id_arg(args, "node_id")
    return await server.read(
        ctx, args, ("nodes",), lambda r: _found(by_prefix(r.node, r.nodes, node_id), f"node {node_id}"), point=True
    )


@method("node.list")
async def node_list(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    return await server.read(ctx, args, ("nodes",), lambda r: [to_nomad(n) for n in r.nodes()])


# -- ACL --------------------------------------------------------------------------------
def _token_view(token: ACLToken, secret: str | None = None) -> dict[str, Any]:
    view = to_nomad(token)
    view.pop("SecretHash", None)
    if secret is not None:
        view["SecretID"] = secret
    return view


@method("acl.bootstrap")
async def acl_bootstrap(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
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
async def acl_token_create(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    kind = _arg(args, "type", required=False, default=TOKEN_CLIENT)
    if kind not in (TOKEN_CLIENT, TOKEN_MANAGEMENT):
        raise _bad("argument 'type' must be client or management")
    policies = args.get("policies") or []
    if not isinstance(policies, list) or any(p not in POLICIES for p in policies):
        raise _bad(f"argument 'policies' must be a list of {', '.join(POLICIES)}")
    if kind == TOKEN_CLIENT and not policies:
        raise _bad("a client token needs at least one policy (read or write)")
    ttl = _arg(args, "ttl_seconds", int, required=False, default=0)
    if ttl < 0:
        raise _bad("argument 'ttl_seconds' must be >= 0")
    secret = new_secret()
    token = ACLToken(
        accessor_id=str(uuid.uuid4()),
        secret_hash=hash_secret(secret),
        name=_arg(args, "name", required=False, default=""),
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


async def _created_token_view(server: Server, token: ACLToken, secret: str) -> dict[str, Any]:
    """The token as stored (with the leader's create time and index), and its secret this once."""
    stored = await server.local(lambda r: r.token(token.accessor_id))
    return _token_view(stored if stored is not None else token, secret)


@method("acl.token.list")
async def acl_token_list(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    return await server.read(ctx, args, ("acl_tokens",), lambda r: [_token_view(t) for t in r.tokens()], need=Need.MANAGEMENT)


@method("acl.token.get")
async def acl_token_get(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    accessor = id_arg(args, "accessor_id")

    def get(r: StateReader) -> Any:
        token = r.token(accessor)
        if token is None:
            raise RPCError(NOT_FOUND, f"token {accessor} not found")
        return _token_view(token)

    return await server.read(ctx, args, ("acl_tokens",), get, need=Need.MANAGEMENT, point=True)


@method("acl.token.self")
async def acl_token_self(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    if not ctx.token:
        raise RPCError(BAD_REQUEST, "pass the token to look up", **{TOKEN_HINT: True})

    def get(r: StateReader) -> Any:
        token = r.token_by_secret_hash(hash_secret(ctx.token or ""))
        if token is None:
            raise RPCError(NOT_FOUND, "token not found")
        return _token_view(token)

    return await server.read(ctx, args, ("acl_tokens",), get, need=Need.NONE, point=True)


@method("acl.token.delete")
async def acl_token_delete(server: Server, ctx: RequestContext, args: dict[str, Any]) -> Any:
    accessor = id_arg(args, "accessor_id")
    result = await server.write(ctx, Need.MANAGEMENT, m.ACLTokenDelete(accessor_ids=[accessor]))
    return {"Index": result["index"], "Deleted": result["value"]["deleted"]}
