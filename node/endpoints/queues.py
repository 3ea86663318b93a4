"""RPC methods for queues (Kueue's ClusterQueues) and priority classes.

Writes are checked here (``node.spec.queues``) before the log, and again
by apply; reads answer the ledger (``fsm.quota``) and the line with each
pending workload's position and reason (``scheduler.queueing``), which is
Kueue's visibility API: "which place is my job in?".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fsm import codec
from fsm import messages as m
from fsm.errors import CodecError
from fsm.queues import STOP_POLICIES, WL_PENDING, PriorityClass, Queue
from fsm.quota import Ledger
from fsm.store import StateReader
from node.core.acl import Need
from node.core.context import RequestContext
from node.core.paging import PageRequest, Row, table_rows
from node.endpoints.listing import list_page
from node.endpoints.registry import arg, bad, method
from node.spec.queues import QueueSpecError, validate_priority_class, validate_queue
from node.wire.errors import NOT_FOUND, RPCError
from scheduler.queueing import Waiting, load_ledger, reason

if TYPE_CHECKING:
    from node.core.api import ServerAPI

QUEUE_TABLES = ("queues", "queue_usage", "workloads")


def _record(cls: type, args: dict[str, Any], name: str) -> Any:
    data = args.get(name)
    if not isinstance(data, dict):
        raise bad(f"argument {name!r} must be a map (the {cls.__name__} definition)")
    try:
        return codec.from_wire(cls, data)
    except CodecError as exc:
        raise bad(f"{name}: {exc}") from None


def ledger_view(ledger: Ledger, queue: Queue) -> dict[str, dict[str, Any]]:
    """Per resource: the quota as set, and what is used, borrowed and lent now."""
    lent = ledger.lent(queue.name)
    return {
        q.name: {
            "nominal": q.nominal,
            "borrowing_limit": q.borrowing_limit,
            "lending_limit": q.lending_limit,
            "used": ledger.usage(queue.name, q.name),
            "borrowed": ledger.borrowed(queue.name, q.name),
            "lent": lent.get(q.name, 0),
        }
        for q in queue.resources
    }


def _cohort_ledger(r: StateReader, queue: Queue) -> Ledger:
    members = [q for q in r.queues() if q.cohort == queue.cohort] if queue.cohort else [queue]
    return Ledger.build(members, ((q.name, r.queue_usage(q.name)) for q in members))


def _summary(r: StateReader, queue: Queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        "cohort": queue.cohort,
        "stop_policy": queue.stop_policy,
        "queueing_strategy": queue.queueing_strategy,
        "admitted": r.admitted_count(queue.name),
        "pending": r.pending_count(queue.name),
        "ledger": ledger_view(_cohort_ledger(r, queue), queue),
    }


async def _upsert(
    server: ServerAPI, ctx: RequestContext, obj: Any, check: Any, body: Any
) -> dict[str, Any]:
    """Check a queue or priority class with the spec's validator, then commit ``body``; management token."""
    try:
        check(obj)
    except QueueSpecError as exc:
        raise bad(str(exc)) from None
    result = await server.write(ctx, Need.MANAGEMENT, body)
    return {"index": result["index"], "name": obj.name}


@method("queue.upsert")
async def queue_upsert(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Create or replace a queue (Kueue's ClusterQueue)."""
    queue = _record(Queue, args, "queue")
    return await _upsert(server, ctx, queue, validate_queue, m.QueueUpsert(queues=[queue]))


@method("queue.get")
async def queue_get(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A queue, its ledger, and how many workloads it has admitted and holds pending."""
    name = arg(args, "name")

    def get(r: StateReader) -> Any:
        queue = r.queue(name)
        if queue is None:
            raise RPCError(
                NOT_FOUND, f"queue {name!r} not found; `caravan queue list` shows the queues"
            )
        return {"queue": codec.to_wire(queue), **_summary(r, queue)}

    return await server.read(ctx, args, QUEUE_TABLES, get, point=True)


@method("queue.list")
async def queue_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A page of queues in name order, each with its ledger and counts."""

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        for token, load in table_rows(r, "queues", req):
            yield token, lambda load=load: _summary(r, load())

    return await list_page(server, ctx, args, QUEUE_TABLES, rows, view=lambda row: row)


@method("queue.delete")
async def queue_delete(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Delete a queue that holds no workload; management token."""
    name = arg(args, "name")
    result = await server.write(ctx, Need.MANAGEMENT, m.QueueDelete(names=[name]))
    return {"index": result["index"], "deleted": result["value"]["deleted"]}


@method("queue.stop")
async def queue_stop(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """Set a queue's stop policy: Hold, HoldAndDrain, or None (resume); management token."""
    name = arg(args, "name")
    policy = arg(args, "policy")
    if policy not in STOP_POLICIES:
        raise bad(f"argument 'policy' must be one of {', '.join(STOP_POLICIES)}")
    queue = await server.local(lambda r: r.queue(name))
    if queue is None:
        raise RPCError(
            NOT_FOUND, f"queue {name!r} not found; `caravan queue list` shows the queues"
        )
    queue.stop_policy = policy
    result = await server.write(ctx, Need.MANAGEMENT, m.QueueUpsert(queues=[queue]))
    return {"index": result["index"], "name": name, "stop_policy": policy}


@method("queue.pending")
async def queue_pending(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """The queue's pending workloads in line order, each with its position and why it waits."""
    name = arg(args, "name")

    def rows(r: StateReader, req: PageRequest) -> Iterator[Row]:
        if r.queue(name) is None:
            raise RPCError(
                NOT_FOUND, f"queue {name!r} not found; `caravan queue list` shows the queues"
            )
        ids = r.pending_ids(name)
        ledger = load_ledger(r)
        start = int(req.next_token) if req.next_token.isdigit() else 1
        for position in range(max(1, start), len(ids) + 1):
            yield (
                str(position),
                lambda position=position: _pending_row(r, ledger, name, ids, position),
            )

    return await list_page(server, ctx, args, QUEUE_TABLES, rows, view=lambda row: row)


def _pending_row(
    r: StateReader, ledger: Ledger, name: str, ids: list[str], position: int
) -> dict[str, Any] | None:
    wl = r.workload(ids[position - 1])
    if wl is None:
        return None
    last = wl.last_eviction()
    return {
        "job_id": wl.job_id,
        "namespace": wl.namespace,
        "position": position,
        "priority": wl.priority,
        "priority_class": wl.priority_class,
        "reason": reason(ledger, name, Waiting.of(wl), ids[0]),
        "create_index": wl.create_index,
        "evictions": len(wl.evictions),
        "last_eviction": codec.to_wire(last) if last is not None else None,
    }


@method("priority_class.upsert")
async def priority_class_upsert(
    server: ServerAPI, ctx: RequestContext, args: dict[str, Any]
) -> Any:
    """Create or replace a priority class."""
    pc = _record(PriorityClass, args, "priority_class")
    return await _upsert(
        server, ctx, pc, validate_priority_class, m.PriorityClassUpsert(classes=[pc])
    )


@method("priority_class.list")
async def priority_class_list(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    rows = lambda r, req: table_rows(r, "priority_classes", req)  # noqa: E731
    return await list_page(server, ctx, args, ("priority_classes",), rows, view=codec.to_wire)


@method("priority_class.delete")
async def priority_class_delete(
    server: ServerAPI, ctx: RequestContext, args: dict[str, Any]
) -> Any:
    name = arg(args, "name")
    result = await server.write(ctx, Need.MANAGEMENT, m.PriorityClassDelete(names=[name]))
    return {"index": result["index"], "deleted": result["value"]["deleted"]}


@method("queue.workload")
async def queue_workload(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> Any:
    """A queued job's workload: where it stands, its place in line, and every eviction kept (who, whom, why)."""
    job_id = arg(args, "job_id")

    def get(r: StateReader) -> Any:
        wl = r.workload(job_id)
        if wl is None:
            raise RPCError(
                NOT_FOUND, f"job {job_id!r} has no workload: it names no queue (or does not exist)"
            )
        view = codec.to_wire(wl)
        ids = r.pending_ids(wl.queue) if wl.state == WL_PENDING else []
        view["position"] = ids.index(job_id) + 1 if job_id in ids else 0
        if ids:
            view["reason"] = reason(load_ledger(r), wl.queue, Waiting.of(wl), ids[0])
        return view

    return await server.read(ctx, args, QUEUE_TABLES, get, point=True)
