"""Operator snapshots: save from a live cluster over RPC, and seed servers from a file.

Save: ``operator.snapshot.save`` streams the leader's state in the snapshot
format, taken after a barrier so it holds every write acknowledged before
the call. The CLI writes ``FILE.partial``, verifies it, then renames it.

Restore (the mechanism, and why): pysyncobj has no way to replace a running
cluster's state through its log, and a raft index must never go backwards
under the FSM's exactly-once rule. So a restore *seeds* servers while they
are stopped: each server's store is rebuilt from the file (verified first,
swapped in with one rename) and its raft directory gets a compaction dump
at the snapshot's index, so pysyncobj's log resumes at index + 1 on every
server. ``caravan operator snapshot restore FILE --dir DIR`` does this for a
local cluster: stop the servers, keep their old data aside, seed, start,
and put the old data back if anything fails. Across hosts, stop every
server and run ``caravan operator snapshot restore FILE --config CONF`` on
each, then start them.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsm.store import StateStore
from node.core.acl import Need
from node.core.rpc_server import RequestContext
from node.endpoints.base import stream_method
from node.wire.errors import NOT_LEADER, RPCError
from snapshot import SnapshotError, inspect, restore
from snapshot.format import RaftData
from snapshot.writer import write_file, write_stream

if TYPE_CHECKING:
    from node.server import Server

CHUNK = 1 << 20  # bytes per streamed frame (well under the RPC frame limit)
QUEUE_CHUNKS = 8  # chunks buffered between the writer thread and the socket
SEED_COMMAND = b"caravan-snapshot-restore"  # log entry payload standing for the snapshot's index


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
async def snapshot_save(server: Server, ctx: RequestContext, args: dict[str, Any]) -> AsyncIterator[Any]:
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


# -- seeding stopped servers ------------------------------------------------------
def seed_server(snapshot_path: str, data_dir: str, raft_members: list[str], term: int | None = None) -> dict[str, Any]:
    """Make ``data_dir`` (of a stopped server) start from the snapshot's state.

    The store is restored (verified first; swapped in atomically), and the
    raft directory is replaced by one compaction dump at the snapshot's
    index, so raft resumes numbering after it. Returns the snapshot's info.
    """
    info = inspect(snapshot_path)
    state_dir = os.path.join(data_dir, "state")
    raft_dir = os.path.join(data_dir, "raft")
    os.makedirs(state_dir, exist_ok=True)
    restore(snapshot_path, state_dir, verified=info)
    index = info.index
    term = term or info.term or 1
    shutil.rmtree(raft_dir, ignore_errors=True)
    os.makedirs(raft_dir)
    raft = RaftData(
        last=(SEED_COMMAND, index, term),
        prev=(SEED_COMMAND, max(index - 1, 0), term),
        cluster=sorted(("TCPNode", member) for member in raft_members),
    )
    store = StateStore(state_dir)
    try:
        with store.read() as reader:
            write_file(reader, os.path.join(raft_dir, "raft.dump"), raft=raft, term=term)
    finally:
        store.close()
    return info.to_json()


def restore_local_cluster(snapshot_path: str, directory: str, timeout: float = 60.0) -> dict[str, Any]:
    """Restore a local cluster (``caravan cluster`` layout) from a snapshot file.

    Old data is moved aside first and moved back if seeding or start-up fails,
    so a failed restore leaves the previous state in place.
    """
    from node import devcluster as cl

    info = inspect(snapshot_path)  # refuse a bad file before touching anything
    c = cl.Cluster.load(directory)
    cl.down(c)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved: list[tuple[str, str]] = []
    try:
        for node in c.nodes:
            backup = f"{node.data_dir}.before-restore-{stamp}"
            if os.path.exists(node.data_dir):
                os.replace(node.data_dir, backup)
                moved.append((node.data_dir, backup))
            seed_server(snapshot_path, node.data_dir, [n.raft_addr for n in c.nodes], info.term)
        for node in c.nodes:
            cl.start_node(node)
        c.save()
        cl.wait_for_leader(c.rpc_addresses, timeout)
    except BaseException:
        cl.down(c)
        for data_dir, backup in moved:
            shutil.rmtree(data_dir, ignore_errors=True)
            os.replace(backup, data_dir)
        raise
    return {"index": info.index, "backups": [b for _, b in moved], "info": info.to_json()}


def clean_backups(paths: list[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def partial_path(path: str) -> str:
    return str(Path(path)) + ".partial"
