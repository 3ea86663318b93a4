"""Real multi-process raft clusters on loopback for the tests.

Each node is ``python -m tests.raft.helper_node`` on a free port, with its
own directory (raft journal, LMDB, control socket, log file). Nothing here
sleeps to synchronise: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from tests.raft.helper_node import AUTHKEY

REPO = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            val = cond()
            if val:
                return val
        except (OSError, EOFError, ConnectionError) as e:  # node restarting / socket not there yet
            last_exc = e
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what} (last error: {last_exc!r})"
            )
        time.sleep(interval)


class Cluster:
    def __init__(
        self,
        root: Path,
        n: int = 3,
        *,
        profile: str = "low-latency",
        fsync: bool = False,
        env: dict[str, str] | None = None,
        boom: set[int] | None = None,
    ) -> None:
        self.root = root
        self.n = n
        self.ports = free_ports(n)
        self.addrs = [f"127.0.0.1:{p}" for p in self.ports]
        self.profile = profile
        self.fsync = fsync
        self.env = env or {}
        self.boom = boom or set()
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self._conns: dict[int, Connection] = {}
        self._lock = threading.Lock()

    # -- processes -------------------------------------------------------------

    def dir(self, i: int) -> Path:
        return self.root / f"n{i}"

    def start(self, i: int, boom: bool | None = None) -> None:
        d = self.dir(i)
        d.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "tests.raft.helper_node",
            "--self",
            self.addrs[i],
            "--peers",
            ",".join(self.addrs),
            "--dir",
            str(d),
            "--profile",
            self.profile,
        ]
        if self.fsync:
            args.append("--fsync")
        if (i in self.boom) if boom is None else boom:
            args.append("--boom")
        env = dict(os.environ, **self.env)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(d / "node.log", "ab")
        self.procs[i] = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=log)
        log.close()

    def start_all(self) -> Cluster:
        for i in range(self.n):
            self.start(i)
        return self

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        self._drop_conn(i)

    def wait_exit(self, i: int, timeout: float) -> int:
        p = self.procs[i]
        assert p is not None
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {i} still running after {timeout:g}s") from None

    def alive(self, i: int) -> bool:
        p = self.procs[i]
        return p is not None and p.poll() is None

    def stop(self) -> None:
        for i in range(self.n):
            self.kill(i)

    def log_text(self, i: int) -> str:
        return (self.dir(i) / "node.log").read_text(errors="replace")

    # -- control channel ---------------------------------------------------------

    def connect(self, i: int, timeout: float = 15.0) -> Connection:
        """A fresh control connection (for streaming ops like ``load``)."""
        path = str(self.dir(i) / "ctl.sock")

        def attempt() -> Connection | None:
            if not self.alive(i):
                raise AssertionError(f"node {i} exited:\n{self.log_text(i)[-3000:]}")
            if not os.path.exists(path):
                return None
            return Client(path, family="AF_UNIX", authkey=AUTHKEY)

        return wait_for(attempt, timeout, f"control socket of node {i}")

    def _drop_conn(self, i: int) -> None:
        with self._lock:
            c = self._conns.pop(i, None)
        if c is not None:
            c.close()

    def call(self, i: int, op: str, **kw: Any) -> dict[str, Any]:
        with self._lock:
            c = self._conns.get(i)
        if c is None:
            c = self.connect(i)
            with self._lock:
                self._conns[i] = c
        try:
            c.send({"op": op, **kw})
            return c.recv()
        except (EOFError, OSError):
            self._drop_conn(i)
            raise

    def status(self, i: int) -> dict[str, Any]:
        return self.call(i, "status")

    def leader(self, among: list[int] | None = None) -> int | None:
        """Index of the node that is leader (and has announced readiness)."""
        for i in among if among is not None else range(self.n):
            if not self.alive(i):
                continue
            st = self.status(i)
            if st["role"] == "leader" and st["leader_ready"]:
                return i
        return None

    def wait_leader(self, timeout: float = 15.0, among: list[int] | None = None) -> int:
        try:
            # wrap in a tuple: node 0 is a valid (but falsy) answer
            found = wait_for(
                lambda: (lambda i: (i,) if i is not None else None)(self.leader(among)),
                timeout,
                "a ready leader",
                interval=0.05,
            )
            return found[0]
        except AssertionError as e:
            states = []
            for i in among if among is not None else range(self.n):
                try:
                    st = self.status(i) if self.alive(i) else {"dead": True}
                except (OSError, EOFError) as exc:
                    st = {"error": repr(exc)}
                states.append(
                    {
                        k: st.get(k)
                        for k in (
                            "role",
                            "term",
                            "leader",
                            "leader_ready",
                            "applied_index",
                            "commit_index",
                            "last_log_index",
                            "peers",
                            "error",
                            "dead",
                        )
                    }
                )
            raise AssertionError(f"{e}; node states: {states}") from None

    def wait_raft_applied(self, i: int, index: int, timeout: float = 15.0) -> None:
        wait_for(
            lambda: self.status(i)["applied_index"] >= index,
            timeout,
            f"node {i} raft to apply {index}",
        )

    def wait_applied(self, i: int, index: int, timeout: float = 15.0) -> None:
        """Until node i's FSM has *committed* everything up to index."""
        wait_for(
            lambda: self.status(i)["fsm_applied"] >= index, timeout, f"node {i} to apply {index}"
        )

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoadStream:
    """Runs ``load`` on a node in the background and records acknowledged (seq, index)."""

    def __init__(self, cluster: Cluster, i: int, n: int, window: int, size: int, tag: str) -> None:
        self.acks: dict[int, int] = {}
        self.done: dict[str, Any] | None = None
        self.broken = False
        self._conn = cluster.connect(i)
        self._conn.send({"op": "load", "n": n, "window": window, "size": size, "tag": tag})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                if "acks" in msg:
                    for seq, index in msg["acks"]:
                        self.acks[seq] = index
                else:
                    self.done = msg
                    return
        except (EOFError, OSError):
            self.broken = True

    def finished(self) -> bool:
        return self.done is not None or self.broken

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "load stream did not finish"
        self._conn.close()
