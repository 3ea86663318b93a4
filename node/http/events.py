"""``GET /v1/event/stream``: the change journal as Nomad's event stream (chunked NDJSON).

One line per journal batch, ``{}`` heartbeats between them; the stream
never ends on its own. Errors found before the first byte (bad topic, ACL,
an index older than the journal keeps: 410) are answered with their
status; without an index the stream starts at the oldest batch kept.
Later, a subscriber that fell behind is resubscribed from where it stopped
(no gap, no duplicate); anything else cuts the connection, so the client
reconnects and gets the error with its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import web

from fsm import codec
from fsm.scheduler_config import SchedulerConfig
from node.core.metrics import METRICS
from node.http.bridge import HTTPAPI, HTTPError, api_of, next_item
from node.http.shapes import BY_TOPIC
from node.http.translate import query_int
from node.spec.nomadjson import to_nomad
from node.wire.errors import RESET_REQUIRED, UNAVAILABLE, RPCError
from scheduler.policy_json import config_json

# Times an index=0 event stream re-reads the oldest retained index before giving up.
MAX_OLDEST_RETRIES = 5
# Event payloads are keyed by topic, as Nomad's are.
PAYLOAD_KEY = {
    "Job": "Job",
    "Evaluation": "Evaluation",
    "Allocation": "Allocation",
    "Deployment": "Deployment",
    "Node": "Node",
    "ACLToken": "ACLToken",
    "Operator": "SchedulerConfig",
}
# Topics whose objects live in a namespace (the others' events have Namespace "").
NAMESPACED = ("Job", "Evaluation", "Allocation", "Deployment")


def _payload_body(topic: str, key: str, obj: Any) -> dict[str, Any]:
    """An event's object in Nomad's shape; for a deletion (no body kept) just its id."""
    if obj is None:  # a deletion: the journal keeps no body, Nomad clients still get the id
        return {"AccessorID": key} if topic == "ACLToken" else {"ID": key}
    if topic == "Operator":  # the scheduler configuration, in the shape its GET answers
        return config_json(codec.from_wire(SchedulerConfig, obj))
    shape = BY_TOPIC.get(topic)
    body = to_nomad(obj)
    # The shape a read of the object answers: field-complete, and without a node's secret hash.
    return shape(body) if shape is not None else body


def event_json(index: int, record: list[Any]) -> dict[str, Any]:
    """One journal record as a Nomad event (Payload keyed by topic)."""
    topic, kind, key, obj = record[0], record[1], record[2], record[3]
    body = _payload_body(topic, key, obj)
    namespace = body.get("Namespace", "") if topic in NAMESPACED else ""
    return {
        "Topic": topic,
        "Type": kind,
        "Key": key,
        "Namespace": namespace or ("default" if topic in NAMESPACED else ""),
        "FilterKeys": None,
        "Index": index,
        "Payload": {PAYLOAD_KEY.get(topic, topic): body},
    }


def _event_args(request: web.Request, heartbeat: float) -> dict[str, Any]:
    index = query_int(request, "index", 0) or 0
    topics = [t for t in request.query.getall("topic", []) if t != ""]
    # Nomad starts *at* the given index; the journal's index is exclusive.
    return {"index": max(index - 1, 0), "topics": topics or None, "heartbeat": heartbeat}


async def _subscribe(api: HTTPAPI, request: web.Request, args: dict[str, Any]) -> tuple[Any, Any]:
    """(items, first item) of a new subscription, before any byte of the answer is sent.

    An index older than the journal keeps is a 410, unless no index was
    asked for: then the stream starts at the oldest batch kept (Nomad's
    index=0), moving ``args["index"]`` there; under a busy, tiny journal the
    oldest may move again before we read it, so that is retried a few times.
    """
    from_oldest = args["index"] == 0
    for attempt in range(MAX_OLDEST_RETRIES + 1):
        items = api.stream(request, "event.stream", args)
        try:
            return items, await next_item(items)  # raises before the response starts
        except RPCError as exc:
            if exc.code != RESET_REQUIRED:
                raise
            oldest = int(exc.details.get("oldest_index") or 1)
            if not from_oldest or attempt == MAX_OLDEST_RETRIES:
                raise HTTPError(
                    410,
                    f"index {args['index'] + 1} is older than the oldest retained index {oldest}: "
                    f"reload the state you follow (e.g. GET /v1/jobs) and stream again with index = its X-Nomad-Index + 1",
                    {"X-Caravan-Oldest-Index": str(oldest)},
                ) from None
            args["index"] = max(oldest - 1, 0)
    raise AssertionError("unreachable: the last attempt returns or raises")


class _EventPump:
    """Writes one subscription to its HTTP answer, following it across resubscriptions."""

    def __init__(
        self,
        api: HTTPAPI,
        request: web.Request,
        resp: web.StreamResponse,
        args: dict[str, Any],
        items: Any,
    ) -> None:
        self.api = api
        self.request = request
        self.resp = resp
        self.args = args
        self.items = items
        self.heartbeat: float = args["heartbeat"]
        self.position: int = args["index"]
        self.last_write = time.monotonic()

    def _resubscribe(self) -> None:
        self.items = self.api.stream(
            self.request, "event.stream", {**self.args, "index": self.position}
        )

    async def run(self, first: Any) -> None:
        """Heartbeat at once (the client knows the stream is up), then every item, forever."""
        await self.resp.write(b"{}\n")
        item = first
        while True:
            if item is None:  # the RPC stream ended (it never does on its own): resume
                self._resubscribe()
            else:
                await self._write(item)
            item = await self._next()

    async def _write(self, item: dict[str, Any]) -> None:
        """A batch as one NDJSON line; a progress mark as a heartbeat when one is due."""
        if "progress" in item:
            self.position = max(self.position, int(item["progress"]))
            if time.monotonic() - self.last_write >= self.heartbeat * 0.5:
                await self.resp.write(b"{}\n")
                self.last_write = time.monotonic()
            return
        index = int(item["index"])
        line = {"Index": index, "Events": [event_json(index, r) for r in item["events"]]}
        await self.resp.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        self.last_write = time.monotonic()
        self.position = index

    async def _next(self) -> Any:
        """The next item; a subscriber dropped as too slow resumes where it stopped."""
        try:
            return await next_item(self.items)
        except RPCError as exc:
            if exc.code == UNAVAILABLE and exc.details.get("reason") == "slow_subscriber":
                self.position = int(exc.details.get("resume_index", self.position))
                self._resubscribe()
                return await next_item(self.items)
            raise


async def _prepared(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    return resp


async def event_stream(request: web.Request) -> web.StreamResponse:
    """Chunked NDJSON until the client goes, the server stops, or a later error cuts it."""
    api = api_of(request)
    heartbeat = max(0.05, min(api.heartbeat, 300.0))
    args = _event_args(request, heartbeat)
    items, first = await _subscribe(api, request, args)
    resp = await _prepared(request)
    task = asyncio.current_task()
    if task is not None:
        api.streams.add(task)
    METRICS.http_streams.inc()
    pump = _EventPump(api, request, resp, args, items)
    try:
        await pump.run(first)
    except RPCError as exc:
        quiet = exc.code in (RESET_REQUIRED, "permission_denied")
        level = api.log.info if quiet else api.log.warning
        level("event stream cut", code=exc.code, error=exc.message, position=pump.position)
        if request.transport is not None:
            request.transport.abort()
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        METRICS.http_streams.dec()
        if task is not None:
            api.streams.discard(task)
        with contextlib.suppress(Exception):
            await pump.items.aclose()
    return resp
