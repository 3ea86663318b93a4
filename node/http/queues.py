"""``/v1/queues``, ``/v1/queue/:name`` (and its ``pending``, ``hold``, ``drain``, ``resume``),
``/v1/priority-classes`` and ``/v1/priority-class/:name``: Kueue's objects over HTTP.

Nomad has no queues, so these answers use the queue definition's own JSON
names (``node.spec.queues``: ``Name``, ``Cohort``, ``Resources``, ...),
the same a ``PUT`` takes, so a ``GET``'s answer can be sent back as it is.
A body is read and checked here with the CLI's reader, so a bad
definition is a 400 naming the field before anything reaches the leader.
``/pending`` is Kueue's visibility API: the pending workloads in admission
order with their 1-based position, paged like every list.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from fsm import codec
from fsm.queues import STOP_HOLD, STOP_HOLD_AND_DRAIN, STOP_NONE
from node.http.bridge import HTTPError, api_of
from node.http.paging import list_reply, read_all
from node.http.translate import bad, json_body, read, reply, write_reply
from node.spec.nomadjson import to_nomad
from node.spec.queues import (
    QueueSpecError,
    pending_to_json,
    priority_class_row_to_json,
    queue_row_to_json,
    queue_status_to_json,
    read_priority_class,
    read_queue,
)


def _named_body(body: Any, name: str, kind: str, wrapper: str) -> dict[str, Any]:
    """The definition in the body (``{wrapper: {...}}`` unwrapped), named as the path is."""
    if isinstance(body, dict) and set(body) == {wrapper}:
        body = body[wrapper]
    if not isinstance(body, dict):
        raise bad(f'request body must be the {kind} as a JSON object, as {{"Name": "{name}", ...}}')
    given = body.get("Name")
    if given not in (None, "", name):
        raise bad(f"{kind} Name {given!r} does not match the path's {name!r}; make them agree")
    return {**body, "Name": name}


async def _write(request: web.Request, method: str, args: dict[str, Any]) -> web.Response:
    """Run write RPC ``method``; answer ``{"Index", "KnownLeader", "LastContact"}``."""
    out = await api_of(request).call(request, method, args)
    return write_reply(request, {"Index": out.get("index", out.get("Index"))})


# -- queues -----------------------------------------------------------------------------
async def queues_list(request: web.Request) -> web.StreamResponse:
    """Every queue with its settings, counts and ledger."""
    return await list_reply(
        request, "queue.list", shape=lambda page: [queue_row_to_json(r) for r in page]
    )


async def queue_get(request: web.Request) -> web.Response:
    """One queue: its definition, ``Ledger`` per resource, ``Admitted`` and ``Pending``."""
    data, index = await read(request, "queue.get", {"name": request.match_info["name"]})
    return reply(request, queue_status_to_json(data), index)


async def _upsert(request: web.Request, kind: str, wrapper: str, reader: Any, method: str, arg: str) -> web.Response:
    """Read the body (its Name, if set, must be the path's) with the spec's reader, then write it."""
    name = request.match_info["name"]
    body = _named_body(await json_body(request), name, kind, wrapper)
    try:
        obj = reader(body)
    except QueueSpecError as exc:
        raise bad(str(exc)) from None
    return await _write(request, method, {arg: codec.to_wire(obj)})


async def queue_upsert(request: web.Request) -> web.Response:
    """Create or replace a queue from its JSON form."""
    return await _upsert(request, "queue", "Queue", read_queue, "queue.upsert", "queue")


async def queue_delete(request: web.Request) -> web.Response:
    return await _write(request, "queue.delete", {"name": request.match_info["name"]})


async def queue_pending(request: web.Request) -> web.StreamResponse:
    """The queue's pending workloads in admission order (Kueue's visibility API), paged."""
    args = {"name": request.match_info["name"]}
    return await list_reply(
        request, "queue.pending", args, shape=lambda page: [pending_to_json(r) for r in page]
    )


async def _stop(request: web.Request, policy: str) -> web.Response:
    return await _write(
        request, "queue.stop", {"name": request.match_info["name"], "policy": policy}
    )


async def queue_hold(request: web.Request) -> web.Response:
    """Stop admitting (Hold): admitted workloads keep running."""
    return await _stop(request, STOP_HOLD)


async def queue_drain(request: web.Request) -> web.Response:
    """Stop admitting and evict what runs (HoldAndDrain): evicted workloads return to pending."""
    return await _stop(request, STOP_HOLD_AND_DRAIN)


async def queue_resume(request: web.Request) -> web.Response:
    """Admit again (stop policy None)."""
    return await _stop(request, STOP_NONE)


# -- priority classes --------------------------------------------------------------------------
async def priority_classes_list(request: web.Request) -> web.StreamResponse:
    shape = lambda page: [priority_class_row_to_json(r) for r in page]  # noqa: E731
    return await list_reply(request, "priority_class.list", shape=shape)


async def priority_class_get(request: web.Request) -> web.Response:
    """One priority class, found in the list (there are few, and the list is their one read)."""
    name = request.match_info["name"]
    items, index = await read_all(request, "priority_class.list", {})
    found = next((r for r in items if r.get("name") == name), None)
    if found is None:
        raise HTTPError(404, f"priority class {name!r} not found")
    return reply(request, priority_class_row_to_json(found), index)


async def priority_class_upsert(request: web.Request) -> web.Response:
    """Create or replace a priority class from ``{"Name", "Value", "Description"}``."""
    return await _upsert(
        request, "priority class", "PriorityClass", read_priority_class, "priority_class.upsert", "priority_class"
    )


async def priority_class_delete(request: web.Request) -> web.Response:
    return await _write(request, "priority_class.delete", {"name": request.match_info["name"]})


# -- a job's workload -----------------------------------------------------------------------
async def job_workload(request: web.Request) -> web.Response:
    """A queued job's workload (a Caravan extension): ``State``, ``Position`` in line, ``Reason``,
    ``Usage``, ``AdmittedTime`` and the ``Evictions`` kept (who, whom, why, in Kueue's words)."""
    data, index = await read(request, "queue.workload", {"job_id": request.match_info["job_id"]})
    return reply(request, to_nomad(data), index)
