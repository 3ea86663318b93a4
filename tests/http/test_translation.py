"""The HTTP room without a cluster: its translation rules, its route table, its imports.

A stub server stands in for ``ServerAPI`` (an RPC table of plain
coroutines), so these run in milliseconds and pin what the cluster tests
cannot reach cheaply: a missing RPC is a 501, an RPC error keeps its
status and recovery headers, a crash is a 500 that names only a request id,
and node/http imports no room above it and no module of its own in a circle.
"""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import structlog
from aiohttp.test_utils import TestClient, TestServer

from node.http.service import HTTPService
from node.http.table import ROUTES
from node.wire.errors import NOT_LEADER, PERMISSION_DENIED, TOKEN_HINT, RPCError

HTTP_ROOM = Path(__file__).resolve().parents[2] / "node" / "http"


def stub_server(methods: dict[str, Callable[..., Awaitable[Any]]]) -> Any:
    """Just what the HTTP room reads of a server: log, config, RPC lookup, raft's leader."""
    config = SimpleNamespace(rpc_max_frame=1 << 20, http_event_heartbeat=1.0)
    rpc = SimpleNamespace(lookup=lambda m: (methods[m], False) if m in methods else None)
    raft = SimpleNamespace(leader_address="127.0.0.1:1")
    return SimpleNamespace(log=structlog.get_logger(), config=config, rpc=rpc, raft=raft)


def fetch(
    methods: dict[str, Callable[..., Awaitable[Any]]], verb: str, path: str
) -> tuple[int, str, dict[str, str]]:
    """(status, text, headers) of one request to an app over ``methods``."""

    async def go() -> tuple[int, str, dict[str, str]]:
        app = HTTPService(stub_server(methods)).build_app()
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(verb, path)
            return resp.status, await resp.text(), dict(resp.headers)

    return asyncio.run(go())


def test_a_route_whose_rpc_is_missing_answers_501() -> None:
    status, text, _ = fetch({}, "GET", "/v1/jobs")
    assert status == 501
    assert "job.list is not available on this server" in text


def test_a_read_carries_nomads_headers() -> None:
    async def job_list(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        assert args == {"prefix": "we", "stale": True}
        return {"data": [{"ID": "web", "Periodic": False, "Meta": {"a": "b"}}], "index": 7}

    status, text, headers = fetch({"job.list": job_list}, "GET", "/v1/jobs?prefix=we&stale")
    assert status == 200
    (listed,) = json.loads(text)  # Nomad's JobListStub: Periodic is a flag; Meta only with ?meta
    assert listed["ID"] == "web" and listed["Periodic"] is False and "Meta" not in listed
    assert headers["X-Nomad-Index"] == "7"
    assert headers["X-Nomad-KnownLeader"] == "true"


def test_bad_query_unknown_path_and_head_are_refused() -> None:
    status, text, _ = fetch({}, "GET", "/v1/jobs?stale=maybe")
    assert (status, text) == (
        400,
        "invalid value 'maybe' for query parameter 'stale': use true or false",
    )
    status, text, _ = fetch({}, "GET", "/v1/nope")
    assert (status, text) == (404, "Invalid URL path: /v1/nope")
    assert fetch({}, "HEAD", "/v1/jobs")[0] == 405


def test_rpc_errors_keep_their_status_hint_and_recovery_headers() -> None:
    async def denied(ctx: Any, args: dict[str, Any]) -> Any:
        raise RPCError(PERMISSION_DENIED, "Permission denied", **{TOKEN_HINT: True})

    async def follower(ctx: Any, args: dict[str, Any]) -> Any:
        raise RPCError(NOT_LEADER, "not the leader", leader="10.0.0.1:4647")

    status, text, _ = fetch({"node.list": denied}, "GET", "/v1/nodes")
    assert (status, text) == (403, "Permission denied (X-Nomad-Token header)")
    status, _, headers = fetch({"node.list": follower}, "GET", "/v1/nodes")
    assert status == 503
    assert headers["X-Caravan-Leader"] == "10.0.0.1:4647"


def test_a_crash_is_a_500_with_only_a_request_id() -> None:
    async def broken(ctx: Any, args: dict[str, Any]) -> Any:
        raise ValueError("secret detail")

    status, text, _ = fetch({"node.list": broken}, "GET", "/v1/nodes")
    assert status == 500
    assert text.startswith("internal error; the server logged the details under request id ")
    assert "secret" not in text


def test_the_route_table_lists_each_verb_and_path_once() -> None:
    pairs = [(verb, path) for verbs, path, _ in ROUTES for verb in verbs]
    assert len(pairs) == len(set(pairs))
    assert ("PUT", "/v1/jobs") in pairs and ("POST", "/v1/jobs") in pairs


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_http_room_imports_only_rooms_below_it_and_no_circle() -> None:
    modules = {f"node.http.{p.stem}": _imports(p) for p in HTTP_ROOM.glob("*.py")}
    above = ("node.server", "node.cli", "node.devcluster")
    for name, imported in modules.items():
        assert not [i for i in imported if i.startswith(above)], name
    graph = {name: {i for i in imported if i in modules} for name, imported in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start] - seen:
            if nxt == goal or reaches(nxt, goal, seen | {nxt}):
                return True
        return False

    assert [name for name in graph if reaches(name, name, set())] == []
