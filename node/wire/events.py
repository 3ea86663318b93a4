"""Following ``event.stream`` from outside a server, across disconnects and restarts.

``follow`` wraps ``RPCClient.stream``: it remembers the last index it has
seen (a batch's index or a progress bookmark) and, when a stream breaks — the
server was stopped or killed, or it cut a slow subscriber off — resubscribes
with that index to the next server in the list, so the caller sees every
batch exactly once and in order, whatever server serves it. What cannot be
resumed is raised: ``reset_required`` (the index fell out of the retention
window), bad arguments, permission errors, or ``unavailable`` once no server
has answered for ``give_up_after`` seconds.

Clients import this module, never the server side (``node.core.stream``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from fsm.topics import full_records
from node.spec.nomadjson import to_nomad
from node.wire.errors import UNAVAILABLE, RPCError
from node.wire.retry import BACKOFF_MAX
from node.wire.sync_client import RPCClient

GROUP = 256  # batches per frame when several are ready (the server's "group")


def unpack(raw: bytes) -> Any:
    """A packed batch (``encoding=msgpack``) as its list of records, as the journal holds them."""
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def decode_batch(raw: bytes) -> list[Any]:
    """A packed batch's records as a ``records`` subscriber gets them: jobs and evals with every field."""
    return full_records(unpack(raw))


def unfold(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """The items in one stream frame: a group (``batches`` or ``packed``) or a single one."""
    if "packed" in frame:
        return unpack(frame["packed"])
    if "batches" in frame:
        return frame["batches"]
    return [frame]


@dataclass
class FollowState:
    """Where a follower is; ``index`` is what to pass on the next subscribe."""

    index: int = 0
    reconnects: int = 0
    errors: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=10))  # the latest


def follow(
    addresses: Sequence[str],
    *,
    index: int = 0,
    topics: Sequence[str] | None = None,
    heartbeat: float = 10.0,
    token: str | None = None,
    buffer: int | None = None,
    give_up_after: float = 60.0,
    state: FollowState | None = None,
    decode: bool = True,
) -> Iterator[dict[str, Any]]:
    """Yield ``event.stream`` items after ``index`` forever, resuming after breaks.

    Batches are fetched packed (``encoding=msgpack``: the server passes the
    journal's bytes through), several per frame when they are ready together
    (``group``), and handed out one by one, decoded here into
    ``{"index", "events"}``;
    ``decode=False`` yields ``{"index", "raw"}`` for consumers that decode
    lazily or not at all.
    """
    st = state if state is not None else FollowState(index=index)  # a given state resumes at its index
    order = list(addresses)
    if not order:
        raise RPCError(UNAVAILABLE, "no server address given; pass at least one host:port")
    args = _subscribe_args(topics, heartbeat, buffer)
    position = 0
    backoff = 0.05
    last_ok = time.monotonic()
    while True:
        address = order[position % len(order)]
        client = RPCClient([address], token=token, timeout=min(10.0, give_up_after))
        try:
            for frame in client.stream("event.stream", {**args, "index": st.index}, idle_timeout=3 * heartbeat + 10):
                last_ok = time.monotonic()
                backoff = 0.05
                yield from _hand_out(frame, st, decode)
        except RPCError as err:
            if err.code != UNAVAILABLE:
                raise
            _note_break(st, address, err)
        finally:
            client.close()
        if time.monotonic() - last_ok > give_up_after:
            raise _gave_up(st, give_up_after)
        st.reconnects += 1
        position += 1
        if position % len(order) == 0:
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)


def _subscribe_args(
    topics: Sequence[str] | None, heartbeat: float, buffer: int | None
) -> dict[str, Any]:
    """The ``event.stream`` arguments every (re)subscription shares; only ``index`` moves."""
    args: dict[str, Any] = {"heartbeat": heartbeat, "encoding": "msgpack", "group": GROUP}
    if topics:
        args["topics"] = list(topics)
    if buffer is not None:
        args["buffer"] = buffer
    return args


def _hand_out(frame: dict[str, Any], st: FollowState, decode: bool) -> Iterator[dict[str, Any]]:
    """The items of one frame, moving ``st.index`` past each before the caller sees it."""
    for item in unfold(frame):
        if "index" in item:
            st.index = item["index"]
            if decode and "raw" in item:
                item = {"index": item["index"], "events": decode_batch(item["raw"])}
        elif "progress" in item:
            st.index = max(st.index, item["progress"])
        yield item


def _note_break(st: FollowState, address: str, err: RPCError) -> None:
    """Record a broken stream; a server that cut us off may say where to resume."""
    st.errors.append(f"{address}: {err.message}")
    resume = err.details.get("resume_index")
    if isinstance(resume, int) and resume > st.index:
        st.index = resume


def _gave_up(st: FollowState, give_up_after: float) -> RPCError:
    """The error once no server has streamed for ``give_up_after`` seconds."""
    return RPCError(
        UNAVAILABLE,
        f"no server streamed events for {give_up_after:g}s (last: {st.errors[-1] if st.errors else 'none'}); "
        f"resume later with index={st.index}",
        resume_index=st.index,
    )


def record_events(index: int, records: Iterable[Any]) -> list[dict[str, Any]]:
    """Records in Nomad's event shape (Topic, Type, Key, Index, Payload{Topic: object})."""
    out = []
    for topic, type_, key, obj in records:
        out.append(
            {
                "Topic": topic,
                "Type": type_,
                "Key": key,
                "Index": index,
                "Payload": None if obj is None else {topic: to_nomad(obj)},
            }
        )
    return out
