"""Operator snapshots: save from a live cluster over RPC.

Save: ``operator.snapshot.save`` streams the leader's state in the snapshot
format, taken after a barrier so it holds every write acknowledged before
the call. The CLI writes ``FILE.partial``, verifies it, then renames it.

Restore is not an RPC: servers are seeded from the file while they are
stopped (``node.devcluster_restore`` says why and how).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from node.core.acl import Need
from node.core.context import RequestContext
from node.endpoints.registry import stream_method
from node.wire.errors import NOT_LEADER, RPCError
from snapshot import SnapshotError
from snapshot.writer import write_stream

if TYPE_CHECKING:
    from node.core.api import ServerAPI

CHUNK = 1 << 20  # bytes per streamed frame (well under the RPC frame limit)
QUEUE_CHUNKS = 8  # chunks buffered between the writer thread and the socket


class _QueueWriter:
    """A binary file-like object that hands fixed-size chunks to a bounded queue."""

    def __init__(self, out: queue.Queue, cancel: threading.Event) -> None:
        self.out = out
        self.cancel = cancel
        self.buffer = bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        while len(self.buffer) >= CHUNK:
            self._put(bytes(self.buffer[:CHUNK]))
            del self.buffer[:CHUNK]
        return len(data)

    def flush(self) -> None:
        if self.buffer:
            self._put(bytes(self.buffer))
            self.buffer.clear()

    def _put(self, chunk: bytes) -> None:
        while not self.cancel.is_set():
            try:
                self.out.put(chunk, timeout=0.2)
                return
            except queue.Full:
                continue
        raise SnapshotError("snapshot save cancelled: the client went away")


@stream_method("operator.snapshot.save")
async def snapshot_save(server: ServerAPI, ctx: RequestContext, args: dict[str, Any]) -> AsyncIterator[Any]:
    """Stream a consistent snapshot: {"chunk": bytes}... then {"done": info}.

    The leader writes it after a barrier; a follower relays the leader's
    stream, so any server (and the HTTP API on any server) can serve a save.
    """
    if not server.raft.is_leader:
        leader = server.leader_rpc()
        if leader is None or args.get("forwarded"):
            raise RPCError(NOT_LEADER, f"snapshot save is served by the leader; send it to {leader}", leader=leader)
        async for item in server.forwarder.stream(
            "operator.snapshot.save", {**args, "forwarded": True}, token=ctx.token, address=leader
        ):
            yield item
        return
    await server.linearize(ctx)
    await server.authorize(ctx, Need.MANAGEMENT)
    term = server.raft.status().get("term")
    chunks: queue.Queue = queue.Queue(maxsize=QUEUE_CHUNKS)
    cancel = threading.Event()
    result: dict[str, Any] = {}

    def produce() -> None:
        out = _QueueWriter(chunks, cancel)
        try:
            with server.fsm.read() as reader:
                info = write_stream(reader, out, term=term, cluster_id=server.cluster_id)  # type: ignore[arg-type]
            out.flush()
            result["info"] = info.to_json()
        except Exception as exc:  # noqa: BLE001 - reported to the client below
            result["error"] = str(exc)
        finally:
            chunks.put(None)

    thread = threading.Thread(target=produce, name="caravan-snapshot-save", daemon=True)
    thread.start()
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    try:
        while True:
            chunk = await loop.run_in_executor(server.executor, chunks.get)
            if chunk is None:
                break
            yield {"chunk": chunk}
    finally:
        cancel.set()
    if "error" in result:
        raise RPCError("internal", f"snapshot save failed: {result['error']}")
    server.log.info("snapshot saved over rpc", index=result["info"].get("Index"), seconds=round(time.monotonic() - started, 3))
    yield {"done": result["info"]}
