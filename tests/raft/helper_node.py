"""A raft node process for the tests: RaftNode + a small LMDB log FSM + a control socket.

Run as ``python -m tests.raft.helper_node --self ... --peers ... --dir ...``.
The FSM stores every applied entry under its raft index (so tests can check
that an acknowledged entry sits at its index on every replica) and keeps
``applied_index`` in the same LMDB transaction, as fsm/ does. The control
channel is a ``multiprocessing.connection`` listener on a Unix socket in the
node's directory; ``tests/raft/cluster.py`` is its client.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import struct
import sys
import threading
import time
from multiprocessing.connection import Connection, Listener
from typing import Any

import lmdb
import structlog

from raft import RaftConfig, RaftError, RaftNode

AUTHKEY = b"caravan-raft-tests"
SLOW_APPLY = 0.06  # seconds a SLOW entry's apply takes
_BE = struct.Struct(">Q")


class LogFSM:
    """Apply target: entry bytes stored at their raft index in LMDB.

    Entries starting with ``BOOM`` raise when ``boom`` is set (defect 5
    test: a non-deterministic failure on one node only). Entries starting
    with ``SLOW`` hold the tick thread for ``SLOW_APPLY`` seconds each, as a
    large entry's apply does (a mass node-down, a big plan); ``FSLOW`` ones
    do so on followers only (a leader that finished applying waits on
    followers still busy: its lease must not run out on them).
    """

    def __init__(self, path: str, fsync: bool, boom: bool) -> None:
        os.makedirs(path, exist_ok=True)
        self.env = lmdb.open(path, map_size=1 << 30, max_dbs=4, sync=fsync, metasync=fsync)
        self.log_db = self.env.open_db(b"log")
        self.meta_db = self.env.open_db(b"meta")
        self.boom = boom
        self._txn: lmdb.Transaction | None = None
        with self.env.begin() as txn:
            raw = txn.get(b"applied", db=self.meta_db)
        self._applied = _BE.unpack(raw)[0] if raw else 0
        self.committed = self._applied  # what readers of LMDB can see
        self.barriers = 0
        self.commits = 0
        self.is_leader = lambda: False  # set once the node exists

    @property
    def applied_index(self) -> int:
        return self._applied

    def apply(self, index: int, entry: bytes) -> object:
        if index <= self._applied:
            return None  # journal replay after restart: already applied
        if self.boom and entry.startswith(b"BOOM"):
            raise OSError("simulated disk failure while applying")
        if entry.startswith(b"SLOW") or (entry.startswith(b"FSLOW") and not self.is_leader()):
            time.sleep(SLOW_APPLY)
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        self._txn.put(_BE.pack(index), entry, db=self.log_db)
        self._txn.put(b"applied", _BE.pack(index), db=self.meta_db)
        self._applied = index
        if entry[:1] == b"\x13":
            self.barriers += 1
            return "barrier"
        return index

    def commit(self) -> None:
        if self._txn is not None:
            self._txn.commit()
            self._txn = None
            self.commits += 1
            self.committed = self._applied

    def entries(self, start: int, prefix_len: int) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        with self.env.begin(db=self.log_db) as txn:
            cur = txn.cursor()
            if cur.set_range(_BE.pack(start)):
                for k, v in cur:
                    out[_BE.unpack(k)[0]] = bytes(v[:prefix_len])
        return out

    def digest(self, upto: int) -> str:
        h = hashlib.sha256()
        with self.env.begin(db=self.log_db) as txn:
            for k, v in txn.cursor():
                if _BE.unpack(k)[0] > upto:
                    break
                h.update(k)
                h.update(v)
        return h.hexdigest()


def _err(e: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "error": type(e).__name__,
        "message": str(e),
        "leader": getattr(e, "leader_address", None),
    }


class Control:
    def __init__(self, node: RaftNode, fsm: LogFSM, path: str) -> None:
        self.node, self.fsm = node, fsm
        if os.path.exists(path):
            os.unlink(path)  # left behind by a kill -9
        self.listener = Listener(path, family="AF_UNIX", authkey=AUTHKEY)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn = self.listener.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            while True:
                req = conn.recv()
                op = req.pop("op")
                if op == "load":
                    self._load(conn, **req)
                    continue
                try:
                    res = getattr(self, "op_" + op)(**req)
                except RaftError as e:
                    res = _err(e)
                conn.send(res)
        except (EOFError, OSError):
            return

    def op_status(self) -> dict[str, Any]:
        st = self.node.status()
        st["fsm_applied"] = self.fsm.committed
        st["fsm_barriers"] = self.fsm.barriers
        st["pid"] = os.getpid()
        return {"ok": True, **st}

    def op_submit(self, entry: bytes, timeout: float = 5.0) -> dict[str, Any]:
        result, index = self.node.submit_sync(entry, timeout)
        return {"ok": True, "result": result, "index": index}

    def op_barrier(self, timeout: float = 5.0) -> dict[str, Any]:
        return {"ok": True, "index": self.node.barrier(timeout)}

    def op_barriers(self, n: int, timeout: float = 10.0) -> dict[str, Any]:
        """n concurrent barrier() callers; returns their indexes."""
        out: list[Any] = [None] * n
        go = threading.Event()

        def run(i: int) -> None:
            go.wait()
            try:
                out[i] = self.node.barrier(timeout)
            except RaftError as e:
                out[i] = type(e).__name__

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        before = self.fsm.barriers
        go.set()
        for t in threads:
            t.join()
        return {"ok": True, "indexes": out, "entries_used": self.fsm.barriers - before}

    def op_barriers_async(self, n: int, timeout: float = 10.0) -> dict[str, Any]:
        """n concurrent barrier_async() callers on one asyncio loop; returns their indexes."""

        async def one() -> Any:
            try:
                return await self.node.barrier_async(timeout)
            except RaftError as e:
                return type(e).__name__

        async def run() -> list[Any]:
            return await asyncio.gather(*(one() for _ in range(n)))

        before = self.fsm.barriers
        out = asyncio.run(run())
        return {"ok": True, "indexes": out, "entries_used": self.fsm.barriers - before}

    def op_transfer(self, target: str, timeout: float = 5.0) -> dict[str, Any]:
        self.node.transfer_leadership(target, timeout)
        return {"ok": True}

    def op_isolate(self, on: bool) -> dict[str, Any]:
        """Drop every raft message to and from this node (a symmetric
        partition that keeps the TCP connections up, so the other side's
        leader goes on pipelining into the void, as it does to a paused
        process). Check-quorum (raft/quorum.py) is off meanwhile: a leader cut
        off keeps appending the long uncommitted tail these tests need, as a
        paused leader does, instead of stepping down after an election timeout."""
        obj = self.node._obj
        if on:
            obj.caravan_on_message = lambda node, message, deliver: None
            obj.caravan_on_send = lambda node, message, send: True
            obj.check_quorum = lambda: None
        else:
            obj.__dict__.pop("caravan_on_message", None)
            obj.__dict__.pop("caravan_on_send", None)
            obj.__dict__.pop("check_quorum", None)
        return {"ok": True}

    def op_entries(self, start: int = 0, prefix_len: int = 64) -> dict[str, Any]:
        return {
            "ok": True,
            "entries": self.fsm.entries(start, prefix_len),
            "applied": self.fsm.applied_index,
        }

    def op_digest(self, upto: int) -> dict[str, Any]:
        return {"ok": True, "digest": self.fsm.digest(upto), "applied": self.fsm.applied_index}

    def _load(self, conn: Connection, n: int, window: int, size: int, tag: str) -> None:
        """Pipeline n entries (at most `window` in flight); stream acks back.

        Acks go out in batches of (seq, index) pairs; the test counts an
        entry as acknowledged only once it has received its pair.
        """
        sem = threading.Semaphore(window)
        lock = threading.Lock()
        acks: list[tuple[int, int]] = []
        errors: list[str] = []
        done = threading.Event()
        remaining = [n]

        def make_cb(seq: int) -> Any:
            def cb(result: Any, index: int | None, error: RaftError | None) -> None:
                with lock:
                    if error is None:
                        acks.append((seq, index))
                    elif len(errors) < 20:
                        errors.append(type(error).__name__)
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()
                sem.release()

            return cb

        def flusher() -> None:
            while True:
                finished = done.wait(0.02)
                with lock:
                    batch = acks[:]
                    del acks[:]
                if batch:
                    conn.send({"acks": batch})
                if finished:
                    return

        t0 = time.perf_counter()
        ft = threading.Thread(target=flusher, daemon=True)
        ft.start()
        pad = b"." * size
        submitted = 0
        for seq in range(n):
            if not sem.acquire(timeout=30):
                errors.append("window_stalled")
                break
            entry = (f"{tag}:{seq}:".encode() + pad)[:size]
            try:
                self.node.submit(entry, make_cb(seq))
                submitted += 1
            except RaftError as e:
                errors.append(type(e).__name__)
                sem.release()
                break
        with lock:
            remaining[0] -= n - submitted
            if remaining[0] == 0:
                done.set()
        done.wait(120)
        ft.join()
        conn.send(
            {
                "done": True,
                "elapsed": time.perf_counter() - t0,
                "errors": errors,
                "submitted": submitted,
            }
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--self", dest="self_addr", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--password", default="test-cluster-secret")
    ap.add_argument("--profile", default="low-latency")
    ap.add_argument("--fsync", action="store_true")
    ap.add_argument("--boom", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    fsm = LogFSM(os.path.join(a.dir, "fsm"), a.fsync, a.boom)
    cfg = RaftConfig(
        self_address=a.self_addr,
        peers=a.peers.split(","),
        data_dir=os.path.join(a.dir, "raft"),
        password=a.password,
        profile=a.profile,
        fsync=a.fsync,
    )
    node = RaftNode(cfg, fsm)
    fsm.is_leader = lambda: node.is_leader
    Control(node, fsm, os.path.join(a.dir, "ctl.sock"))
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
