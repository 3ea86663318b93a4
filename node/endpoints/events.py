"""``event.stream``: the change journal, streamed to subscribers of any server.

Every replica writes the identical journal (it is written by the
deterministic FSM), so a subscriber may follow any server — leader or
follower — and move to another one (or to the same one after a restart) by
resubscribing with the last index it received.

Protocol (streaming RPC ``event.stream``)
-----------------------------------------

Arguments:

``index`` (int, default 0)
    **Exclusive**: the stream delivers the batches whose raft index is
    *greater than* ``index``. Pass the last index you received (from a batch
    or a progress notification) to resume exactly where you stopped; 0 means
    "from the beginning of the retained journal".
``topics`` (list of str, default all)
    ``"Topic"``, ``"Topic:Key"`` or ``"*"``. Topics: Job, Evaluation,
    Allocation, Deployment, Node, ACLToken, Operator (the scheduler
    configuration), ClientGC (forced client GC requests, keyed by node id,
    "" for every node; what ``caravan client sim`` follows). A key matches the record's key
    exactly (the object's id). With ACLs on, each topic needs its capability
    (``TOPIC_NEEDS``: ACLToken a management token); the default/``*``
    subscription leaves out the topics the caller may not see. A client
    node's secret reads the job topics.
``heartbeat`` (seconds, default 10)
    After this long without sending anything, the server sends a progress
    notification.
``buffer`` (batches, default and maximum ``MAX_BUFFER``)
    How many batches may wait for this subscriber before it is cut off.
``group`` (batches, default 1, at most ``MAX_GROUP``)
    Up to this many consecutive batches per item when several are ready
    (catching up, or a burst of commits): one frame instead of many, which
    is what makes a busy stream cheap for the server and the subscriber.
``encoding`` (``"records"``, default, or ``"msgpack"``)
    ``msgpack`` sends each batch's records as one msgpack byte string
    (``raw``) instead of decoded lists. For an unfiltered subscription these
    are the journal's own bytes, passed through without decoding: the cheap
    way for a cache or an exporter to catch up on millions of records. The
    records are as the journal stores them (jobs and evals without their
    fields at the default), filtered or not; ``node.wire.events.decode_batch``
    fills them in.

Items:

``{"index": N, "events": [[topic, type, key, object-or-None], ...]}``
(or ``{"index": N, "raw": msgpack-of-that-list}`` with ``encoding=msgpack``)
    The records of batch N that match the filter, in apply order; a batch is
    never split across items, and batches come in increasing index order,
    each once. Objects are in the store's wire shape (``codec.to_wire``);
    ACL tokens never carry their secret.
``{"batches": [batch-item, batch-item, ...]}`` (only with ``group`` > 1)
    Several whole consecutive batches, each shaped as above, in order.
``{"packed": msgpack-of-[batch-item, ...]}`` (``encoding=msgpack``, ``group`` > 1)
    The same, packed once by the server for every subscriber that gets
    exactly that run of batches (the usual case at the live tail): fan-out
    then costs one shared byte string per subscriber, not one encoding.
``{"progress": N}``
    Everything up to index N that matches the filter has been delivered
    (a bookmark: resubscribing with ``index=N`` loses nothing). Sent once when
    the subscriber has caught up with the live tail, and whenever the stream
    was idle for ``heartbeat``.

Endings (the stream never ends on its own):

``reset_required`` (details ``requested_index``, ``oldest_index``)
    ``index`` is older than the retention window (batches after it were
    trimmed). Reload the full state with reads, and resubscribe with the
    ``applied_index`` they reported (the lowest, if several). Never a silent
    jump to the oldest batch.
``unavailable`` with ``reason="slow_subscriber"`` and ``resume_index``
    The subscriber fell more than ``buffer`` batches behind; resubscribe with
    ``index=resume_index``. A slow subscriber never slows apply: the FSM
    only posts "committed up to N" to the event loop; this module reads the
    journal from LMDB (read transactions, off the loop) and buffers at most
    ``buffer`` batches per subscriber.
A lost connection (server stopped or killed)
    Resubscribe (to any server) with the last index received.

The journal's batches, filters and subscriptions are in ``node.core.stream``;
the hub that feeds them in ``node.core.hub``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsm.topics import (
    TOPIC_ALLOC,
    TOPIC_CLIENT_GC,
    TOPIC_DEPLOYMENT,
    TOPIC_EVAL,
    TOPIC_JOB,
    TOPIC_NODE,
    TOPIC_OPERATOR,
    TOPIC_PRIORITY_CLASS,
    TOPIC_QUEUE,
    TOPIC_TOKEN,
    TOPIC_WORKLOAD,
)
from node.core.acl import Need
from node.core.context import RequestContext
from node.core.hub import hub_of
from node.core.stream import (
    DEFAULT_HEARTBEAT,
    ENCODINGS,
    MAX_BUFFER,
    MAX_GROUP,
    MAX_HEARTBEAT,
    MIN_HEARTBEAT,
    OVERFLOW_GRACE,
    Filter,
    Item,
    parse_topics,
)
from node.endpoints.registry import stream_method
from node.wire.errors import BAD_REQUEST, PERMISSION_DENIED, RPCError

if TYPE_CHECKING:
    from node.core.api import ServerAPI


def _number(args: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RPCError(BAD_REQUEST, f"argument {name!r} must be a number from {low:g} to {high:g}")
    return float(value)


@dataclass(frozen=True)
class StreamArgs:
    index: int
    filter: Filter
    explicit: bool  # topics named (not the default / wildcard)
    heartbeat: float
    buffer: int
    encoding: str
    group: int


def parse_args(args: dict[str, Any]) -> StreamArgs:
    """The checked ``event.stream`` arguments; raises bad_request."""
    index = args.get("index", 0)
    if index is None:
        index = 0
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise RPCError(BAD_REQUEST, "argument 'index' must be an integer >= 0 (the last index you received)")
    flt, explicit = parse_topics(args.get("topics"))
    heartbeat = _number(args, "heartbeat", DEFAULT_HEARTBEAT, MIN_HEARTBEAT, MAX_HEARTBEAT)
    buffer = int(_number(args, "buffer", MAX_BUFFER, 1, MAX_BUFFER))
    encoding = args.get("encoding") or "records"
    if encoding not in ENCODINGS:
        raise RPCError(BAD_REQUEST, f"argument 'encoding' must be one of {', '.join(ENCODINGS)}")
    group = int(_number(args, "group", 1, 1, MAX_GROUP))
    return StreamArgs(index, flt, explicit, heartbeat, buffer, encoding, group)


#: What each topic needs, as in Nomad: the job topics read-job, Node node:read, the
#: scheduler configuration operator:read, ACL objects management. A default or
#: wildcard subscription quietly leaves out the topics the caller may not see.
TOPIC_NEEDS = (
    (TOPIC_JOB, Need.READ_JOB), (TOPIC_EVAL, Need.READ_JOB), (TOPIC_ALLOC, Need.READ_JOB),
    (TOPIC_DEPLOYMENT, Need.READ_JOB), (TOPIC_NODE, Need.NODE_READ), (TOPIC_OPERATOR, Need.OPERATOR_READ),
    (TOPIC_TOKEN, Need.MANAGEMENT),
    # Client GC requests name only node and alloc ids, which node:read already shows;
    # a node secret passes node:read, so the simulated client can follow them.
    (TOPIC_CLIENT_GC, Need.NODE_READ),
    # Queues are cluster-wide and their lines name jobs: what a job reader sees (queue.get/pending).
    (TOPIC_QUEUE, Need.READ_JOB), (TOPIC_WORKLOAD, Need.READ_JOB), (TOPIC_PRIORITY_CLASS, Need.READ_JOB),
)


async def _allowed_filter(server: ServerAPI, ctx: RequestContext, flt: Filter, explicit: bool) -> tuple[Filter, list[Need]]:
    """The filter this caller may have, and the needs to recheck while it streams.

    A caller allowed none of the topics it asked for is refused with the first denial.
    """
    needs: list[Need] = []
    first: RPCError | None = None
    for topic, need in TOPIC_NEEDS:
        if not flt.wants(topic):
            continue
        try:
            if need not in needs:
                await server.authorize(ctx, need)
                needs.append(need)
        except RPCError as err:
            if err.code != PERMISSION_DENIED or explicit:
                raise
            first = first or err
            flt = flt.without(topic)
    if not needs and first is not None:
        raise first
    return flt, needs


@stream_method("event.stream")
async def event_stream(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> AsyncIterator[Item]:
    """Stream journal batches after ``index`` (exclusive); see the module docstring."""
    a = parse_args(args)
    flt, needs = await _allowed_filter(server, ctx, a.filter, a.explicit)

    async def recheck() -> None:  # a revoked or expired token ends the stream
        for need in needs:
            await server.authorize(ctx, need)

    items = hub_of(server).subscribe(
        a.index, flt, heartbeat=a.heartbeat, buffer=a.buffer, encoding=a.encoding, group=a.group, recheck=recheck
    )
    try:
        async for item in items:
            yield item
    except RPCError as err:
        if err.details.get("reason") == "slow_subscriber":
            # The final answer goes out only once the client reads what is
            # already buffered; a client that never reads is dropped.
            ctx.loop.call_later(OVERFLOW_GRACE, _drop_if_stuck, ctx)
        raise
    finally:
        await items.aclose()


def _drop_if_stuck(ctx: RequestContext) -> None:
    transport = getattr(ctx, "_transport", None)
    if transport is not None and not transport.is_closing() and transport.get_write_buffer_size() > 0:
        ctx.abort_connection()
