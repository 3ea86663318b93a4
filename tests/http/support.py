"""Helpers for the HTTP API tests: clusters with HTTP addresses, a raw chunked reader, waiting."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from node import devcluster as cl
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient
from tests import conditions


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail at the deadline (no fixed sleeps)."""
    return conditions.wait_until(
        predicate, timeout, what, transient=(RPCError, OSError, requests.RequestException, AssertionError)
    )


@dataclass
class HTTPCluster:
    cluster: cl.Cluster

    @property
    def nodes(self) -> list[cl.ClusterNode]:
        return self.cluster.nodes

    def url(self, node: cl.ClusterNode) -> str:
        return f"http://{node.http_address}"

    def rpc(self, token: str | None = None, address: str | None = None) -> RPCClient:
        return RPCClient(
            [address] if address else self.cluster.rpc_addresses, token=token, timeout=15.0
        )

    def leader(self) -> cl.ClusterNode:
        def find() -> cl.ClusterNode | None:
            for node in self.nodes:
                st = cl.status_of(node.rpc_addr, timeout=2.0)
                if st and st.get("Role") == "leader":
                    return node
            return None

        return wait_until(find, 30.0, "a leader")

    def followers(self) -> list[cl.ClusterNode]:
        leader = self.leader()
        return [n for n in self.nodes if n.id != leader.id]

    @property
    def leader_url(self) -> str:
        return self.url(self.leader())

    @property
    def follower_url(self) -> str:
        followers = self.followers()
        return self.url(followers[0]) if followers else self.leader_url


def start_cluster(directory: Path, nodes: int, extra_config: str = "") -> HTTPCluster:
    c = cl.plan(str(directory), nodes, extra_config=extra_config)
    try:
        for node in c.nodes:
            cl.start_node(node)
        c.save()
        cl.wait_for_leader(c.rpc_addresses, 60.0)
        handle = HTTPCluster(c)
        for node in c.nodes:  # every HTTP listener answers before a test starts
            wait_until(
                lambda n=node: requests.get(
                    f"http://{n.http_address}/v1/status/leader", timeout=5
                ).json(),
                30.0,
                f"http on {node.id}",
            )
        return handle
    except BaseException:
        stop_cluster(HTTPCluster(c))
        raise


def stop_cluster(c: HTTPCluster) -> None:
    try:
        cl.down(c.cluster, timeout=10.0)
    except Exception:  # noqa: BLE001 - best effort, then SIGKILL
        for node in c.cluster.nodes:
            if cl.alive(node.pid):
                cl.kill(c.cluster, node.id)


def job(
    job_id: str, count: int = 1, job_type: str = "service", meta: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "ID": job_id,
        "Name": job_id,
        "Type": job_type,
        "Datacenters": ["dc1"],
        "Meta": meta or {},
        "TaskGroups": [
            {"Name": "g", "Count": count, "Tasks": [{"Name": "t", "Driver": "sim", "Config": {}}]}
        ],
    }


# -- a raw HTTP/1.1 chunked reader (to see the framing itself) ---------------------------------
class ChunkedStream:
    """GET ``path`` and read the chunked body chunk by chunk, exactly as sent."""

    def __init__(
        self, address: str, path: str, token: str | None = None, timeout: float = 15.0
    ) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        lines = [f"GET {path} HTTP/1.1", f"Host: {address}", "Accept: application/json"]
        if token:
            lines.append(f"X-Nomad-Token: {token}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.file = self.sock.makefile("rb")
        status_line = self.file.readline().decode()
        self.status = int(status_line.split()[1])
        self.headers: dict[str, str] = {}
        while True:
            line = self.file.readline().decode()
            if line in ("\r\n", "\n", ""):
                break
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        self.ended = False

    def body(self) -> bytes:
        """The whole (non-chunked, error) body."""
        length = int(self.headers.get("content-length", "0"))
        return self.file.read(length)

    def chunk(self) -> bytes | None:
        """The next chunk's bytes; None for the terminating zero-length chunk."""
        size_line = self.file.readline()
        if not size_line:
            raise ConnectionError("connection closed inside the chunked body")
        size = int(size_line.split(b";")[0].strip(), 16)
        data = self.file.read(size) if size else b""
        trailer = self.file.readline()
        assert trailer == b"\r\n", f"chunk not terminated by CRLF: {trailer!r}"
        if size == 0:
            self.ended = True
            return None
        return data

    def lines(self, count: int, deadline: float = 20.0) -> list[bytes]:
        """The next ``count`` chunks, each checked to be exactly one NDJSON line."""
        out = []
        stop = time.monotonic() + deadline
        while len(out) < count:
            assert time.monotonic() < stop, f"only {len(out)} of {count} lines within {deadline:g}s"
            data = self.chunk()
            assert data is not None, "the event stream ended on its own"
            assert data.endswith(b"\n") and data.count(b"\n") == 1, (
                f"chunk is not one line: {data[:200]!r}"
            )
            assert data.strip(), "blank line in the event stream"
            out.append(data)
        return out

    def events(
        self, wanted: Callable[[dict[str, Any]], bool], deadline: float = 20.0
    ) -> list[dict[str, Any]]:
        """Batches (non-heartbeat lines) until ``wanted(batch)`` holds for the last one read."""
        got: list[dict[str, Any]] = []
        stop = time.monotonic() + deadline
        while time.monotonic() < stop:
            (line,) = self.lines(1, deadline=max(0.1, stop - time.monotonic()))
            msg = json.loads(line)
            if msg == {}:
                continue
            got.append(msg)
            if wanted(msg):
                return got
        raise AssertionError(f"no wanted batch within {deadline:g}s; got {len(got)} batches")

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()
