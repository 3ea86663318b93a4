"""RPC transport over real loopback sockets.

Synchronization is by events and deadlines, never by sleeping: a handler
that must stay in flight waits on an event the test (or another request)
sets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import structlog
from structlog.testing import CapturingLogger

from node.core.context import RequestContext
from node.core.rpc_server import RPCServer, RPCServerThread
from node.wire.errors import RPCError
from node.wire.framing import DEFAULT_MAX_FRAME, format_address, parse_address
from node.wire.rpc_client import AsyncRPCClient, RPCClient

WAIT = 5.0  # generous deadline for conditions that should hold at once


@dataclass
class Harness:
    """Handlers whose state lives here, so each test gets a fresh server."""

    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    seen: list[dict[str, Any]] = field(default_factory=list)
    crashed: threading.Event = field(default_factory=threading.Event)

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def register(self, server: RPCServer) -> None:
        server.register("echo", self.echo)
        server.register("whoami", self.whoami)
        server.register("wait", self.wait)
        server.register("release", self.release)
        server.register("fail", self.fail)
        server.register("crash", self.crash)
        server.register("big", self.big)
        server.register("drop_first", self.drop_first)
        server.register("not_leader_twice", self.not_leader_twice)
        server.register("no_leader", self.no_leader)
        server.register("from_thread", self.from_thread)
        server.register("future_from_thread", self.future_from_thread)
        server.register("count", self.count, streaming=True)
        server.register("count_then_fail", self.count_then_fail, streaming=True)
        server.register("endless", self.endless, streaming=True)

    async def echo(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        return args

    async def whoami(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        return {
            "request_id": ctx.request_id,
            "token": ctx.token,
            "peer": ctx.peer,
            "method": ctx.method,
        }

    async def wait(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        await self.gate(args["gate"]).wait()
        return {"waited": args["gate"]}

    async def release(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        self.gate(args["gate"]).set()
        return {"released": args["gate"]}

    async def fail(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        raise RPCError("not_found", "job 'web' not found; check the job id", job_id="web")

    async def crash(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        self.crashed.set()
        raise ValueError("the hidden detail s3cr3t")

    async def big(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        return b"x" * args["size"]

    async def drop_first(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        """Applies the write, then loses the answer the first time: a reply lost in the network."""
        self.attempts[ctx.request_id] += 1
        self.seen.append({"request_id": ctx.request_id, "peer": ctx.peer})
        if self.attempts[ctx.request_id] == 1:
            ctx.abort_connection()
            await asyncio.Event().wait()  # cancelled with the connection
        return {"attempts": self.attempts[ctx.request_id]}

    async def not_leader_twice(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        """A follower during an election: not the leader, and no leader to name yet."""
        self.attempts[ctx.request_id] += 1
        if self.attempts[ctx.request_id] <= 2:
            raise RPCError("not_leader", "not the leader and none known yet; retry shortly")
        return {"attempts": self.attempts[ctx.request_id]}

    async def no_leader(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        """A server that already waited out an election that did not happen."""
        self.attempts[ctx.request_id] += 1
        raise RPCError("no_leader", "no cluster leader: start the servers that are down")

    async def from_thread(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        completion = ctx.completion()
        threading.Thread(target=completion.callback, args=(args["value"] * 2, None)).start()
        result, error = await completion.wait(WAIT)
        return {"result": result, "error": error}

    async def future_from_thread(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        threading.Thread(target=future.set_result, args=(args["value"] + 1,)).start()
        return await ctx.wait_future(future, WAIT)

    async def count(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        for i in range(args["n"]):
            yield {"index": i}

    async def count_then_fail(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        for i in range(args["n"]):
            yield i
        raise RPCError.reset_required(requested=1, oldest_index=50)

    async def endless(self, ctx: RequestContext, args: dict[str, Any]) -> Any:
        i = 0
        while True:
            yield i
            i += 1


@pytest.fixture
def harness() -> Harness:
    return Harness()


def quiet_log(captured: CapturingLogger | None = None) -> Any:
    """A logger that records instead of printing (server threads escape pytest's capture)."""
    return structlog.wrap_logger(
        captured if captured is not None else CapturingLogger(),
        processors=[structlog.processors.format_exc_info],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )


def start_server(harness: Harness, **kwargs: Any) -> RPCServerThread:
    kwargs.setdefault("log", quiet_log())
    server = RPCServer("127.0.0.1:0", **kwargs)
    harness.register(server)
    thread = RPCServerThread(server)
    thread.start()
    return thread


@pytest.fixture
def server(harness: Harness) -> Iterator[RPCServerThread]:
    thread = start_server(harness)
    yield thread
    thread.stop()


@pytest.fixture
def client(server: RPCServerThread) -> Iterator[RPCClient]:
    with RPCClient([server.server.address], token="tok", timeout=WAIT) as c:
        yield c


def free_address() -> str:
    """An address nobody listens on: bound to get a free port, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return format_address(*s.getsockname())


# ---- raw wire helpers -------------------------------------------------------


def raw_connect(address: str) -> socket.socket:
    sock = socket.create_connection(parse_address(address), timeout=WAIT)
    return sock


def send_raw(sock: socket.socket, body: bytes) -> None:
    sock.sendall(struct.pack(">I", len(body)) + body)


def send_msg(sock: socket.socket, message: Any) -> None:
    send_raw(sock, msgpack.packb(message, use_bin_type=True))


def recv_msg(sock: socket.socket) -> Any:
    header = recv_exact(sock, 4)
    assert header is not None, "connection closed before an answer"
    body = recv_exact(sock, struct.unpack(">I", header)[0])
    return msgpack.unpackb(body, raw=False)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def assert_still_serving(address: str) -> None:
    with RPCClient([address], timeout=WAIT) as c:
        assert c.call("echo", {"alive": True}) == {"alive": True}


# ---- addresses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:4647", ("127.0.0.1", 4647)),
        ("[::1]:80", ("::1", 80)),
        ("node-1.local:0", ("node-1.local", 0)),
    ],
)
def test_parse_address(text: str, parsed: tuple[str, int]) -> None:
    assert parse_address(text) == parsed
    assert format_address(*parsed) == text


@pytest.mark.parametrize(
    "text", ["", "host", "::1:80", "[::1]80", ":80", "host:", "host:65536", "host:x"]
)
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid address"):
        parse_address(text)


# ---- round trips ----------------------------------------------------------------


def test_round_trip_and_context(client: RPCClient, server: RPCServerThread) -> None:
    assert client.call("echo", {"a": 1, "b": [1, "x", None], "c": b"\x00"}) == {
        "a": 1,
        "b": [1, "x", None],
        "c": b"\x00",
    }
    me = client.call("whoami", request_id="req-1")
    assert me["request_id"] == "req-1"
    assert me["token"] == "tok"
    assert me["method"] == "whoami"
    assert parse_address(me["peer"])[0] == "127.0.0.1"
    assert client.call("whoami", token=None)["token"] is None


def test_error_answer_keeps_code_message_and_details(client: RPCClient) -> None:
    with pytest.raises(RPCError) as info:
        client.call("fail")
    assert info.value.code == "not_found"
    assert info.value.message == "job 'web' not found; check the job id"
    assert info.value.details == {"job_id": "web"}


def test_handler_crash_is_internal_and_hides_the_exception(harness: Harness) -> None:
    captured = CapturingLogger()
    thread = start_server(harness, log=quiet_log(captured))
    try:
        with RPCClient([thread.server.address], timeout=WAIT) as c:
            with pytest.raises(RPCError) as info:
                c.call("crash", request_id="crash-1")
            assert info.value.code == "internal"
            assert "s3cr3t" not in str(info.value) and "ValueError" not in str(info.value)
            assert "crash-1" in info.value.message  # so an operator can find the log line
            assert c.call("echo", {"after": 1}) == {"after": 1}
    finally:
        thread.stop()
    crashes = [call for call in captured.calls if call.kwargs.get("event") == "rpc handler crashed"]
    assert len(crashes) == 1
    assert "ValueError: the hidden detail s3cr3t" in crashes[0].kwargs["exception"]
    assert crashes[0].kwargs["request_id"] == "crash-1"


def test_result_from_another_thread(client: RPCClient) -> None:
    assert client.call("from_thread", {"value": 21}) == {"result": 42, "error": None}
    assert client.call("future_from_thread", {"value": 41}) == 42


def test_completion_filled_after_waiter_gave_up_does_not_raise_in_the_filler() -> None:
    from node.core.context import Completion

    errors: list[BaseException] = []

    async def scenario() -> None:
        completion = Completion(asyncio.get_running_loop())
        with pytest.raises(RPCError) as info:
            await completion.wait(0.01)
        assert info.value.code == "timeout"

        def fill() -> None:
            try:
                completion.set_result(1)
                completion.set_result(2)
                completion.set_exception(RuntimeError("late"))
            except BaseException as exc:  # pragma: no cover - the failure this test exists for
                errors.append(exc)

        filler = threading.Thread(target=fill)
        filler.start()
        await asyncio.get_running_loop().run_in_executor(None, filler.join)

    asyncio.run(scenario())
    assert errors == []


def test_response_too_large_is_an_error_and_the_connection_survives(harness: Harness) -> None:
    thread = start_server(harness, max_frame=64 * 1024)
    try:
        with RPCClient([thread.server.address], timeout=WAIT) as c:
            with pytest.raises(RPCError) as info:
                c.call("big", {"size": 100 * 1024})
            assert info.value.code == "frame_too_large"
            assert len(c.call("big", {"size": 10})) == 10
    finally:
        thread.stop()


def test_answer_over_the_client_limit_drops_the_connection(
    client: RPCClient, server: RPCServerThread
) -> None:
    small = RPCClient([server.server.address], timeout=WAIT, max_frame=1024)
    try:
        with pytest.raises(RPCError) as info:
            small.call("big", {"size": 4096})
        assert info.value.code == "frame_too_large"
        assert small.call("echo", {"next": 1}) == {"next": 1}  # not reading the old body
    finally:
        small.close()


def test_request_too_large_fails_locally(client: RPCClient, server: RPCServerThread) -> None:
    small = RPCClient([server.server.address], timeout=WAIT, max_frame=1024)
    with pytest.raises(RPCError) as info:
        small.call("echo", {"blob": b"x" * 2048})
    assert info.value.code == "frame_too_large"
    assert info.value.details["limit"] == 1024
    small.close()


# ---- pipelining and concurrency ----------------------------------------------------


def test_pipelined_answers_come_back_out_of_order_matched_by_id(server: RPCServerThread) -> None:
    with raw_connect(server.server.address) as sock:
        send_msg(sock, {"id": "slow", "method": "wait", "args": {"gate": "g"}, "token": None})
        send_msg(sock, {"id": "quick", "method": "echo", "args": {"n": 1}, "token": None})
        send_msg(sock, {"id": "opener", "method": "release", "args": {"gate": "g"}, "token": None})
        answers = [recv_msg(sock) for _ in range(3)]
    order = [a["id"] for a in answers]
    assert order.index("slow") > order.index("opener")  # the slow one was overtaken
    by_id = {a["id"]: a for a in answers}
    assert by_id["slow"] == {"id": "slow", "ok": True, "result": {"waited": "g"}}
    assert by_id["quick"]["result"] == {"n": 1}


def test_many_concurrent_connections(server: RPCServerThread) -> None:
    address = server.server.address

    def worker(n: int) -> list[Any]:
        with RPCClient([address], timeout=WAIT) as c:
            return [c.call("echo", {"worker": n, "i": i}) for i in range(20)]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(worker, range(32)))
    for n, answers in enumerate(results):
        assert answers == [{"worker": n, "i": i} for i in range(20)]


def test_async_client_pipelines_on_one_connection(server: RPCServerThread) -> None:
    async def scenario() -> None:
        async with AsyncRPCClient([server.server.address], timeout=WAIT) as c:
            slow = asyncio.create_task(c.call("wait", {"gate": "a"}))
            answers = await asyncio.gather(*(c.call("whoami") for _ in range(200)))
            assert not slow.done()  # 200 answers overtook it on the same connection
            await c.call("release", {"gate": "a"})
            assert await slow == {"waited": "a"}
            assert len({a["peer"] for a in answers}) == 1
            assert len({a["request_id"] for a in answers}) == 200

    asyncio.run(scenario())


def test_async_client_forwards_request_id_and_token(harness: Harness) -> None:
    """The follower-forwarding shape: a handler on one server calls another, keeping id and token."""
    leader = start_server(harness)
    follower_server = RPCServer("127.0.0.1:0", log=quiet_log())
    forwarder = AsyncRPCClient(timeout=WAIT)

    async def forward(ctx: RequestContext, args: dict[str, Any]) -> Any:
        return await forwarder.call(
            "whoami",
            args,
            request_id=ctx.request_id,
            token=ctx.token,
            address=leader.server.address,
        )

    follower_server.register("whoami", forward)
    follower = RPCServerThread(follower_server)
    follower.start()
    try:
        with RPCClient([follower_server.address], token="client-token", timeout=WAIT) as c:
            me = c.call("whoami", request_id="fwd-1")
            assert me["request_id"] == "fwd-1" and me["token"] == "client-token"
    finally:
        follower.run(forwarder.close()).result(WAIT)
        follower.stop()
        leader.stop()


# ---- streaming ----------------------------------------------------------------------------


def test_stream_yields_every_item_then_ends(client: RPCClient) -> None:
    assert list(client.stream("count", {"n": 500})) == [{"index": i} for i in range(500)]
    assert list(client.stream("count", {"n": 0})) == []


def test_stream_error_after_items_raises_with_details(client: RPCClient) -> None:
    got: list[int] = []
    with pytest.raises(RPCError) as info:
        for item in client.stream("count_then_fail", {"n": 3}):
            got.append(item)
    assert got == [0, 1, 2]
    assert info.value.code == "reset_required"
    assert info.value.details["oldest_index"] == 50


def test_stream_closed_early_leaves_server_serving(
    client: RPCClient, server: RPCServerThread
) -> None:
    items = client.stream("endless")
    assert [next(items) for _ in range(10)] == list(range(10))
    items.close()
    assert_still_serving(server.server.address)


def test_call_on_a_streaming_method_says_to_use_stream(client: RPCClient) -> None:
    with pytest.raises(RPCError) as info:
        client.call("count", {"n": 2})
    assert info.value.code == "bad_request" and "stream()" in info.value.message
    assert client.call("echo", {"x": 1}) == {"x": 1}


def test_async_stream(server: RPCServerThread) -> None:
    async def scenario() -> list[Any]:
        async with AsyncRPCClient([server.server.address], timeout=WAIT) as c:
            items = [item async for item in c.stream("count", {"n": 50})]
            endless = c.stream("endless")
            first = [await anext(endless) for _ in range(3)]
            await endless.aclose()
            assert first == [0, 1, 2]
            return items

    assert asyncio.run(scenario()) == [{"index": i} for i in range(50)]


# ---- bad input never takes the server down ----------------------------------------------------


def test_malformed_msgpack_is_answered_and_connection_continues(server: RPCServerThread) -> None:
    with raw_connect(server.server.address) as sock:
        send_raw(sock, b"\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
        answer = recv_msg(sock)
        assert answer["ok"] is False and answer["id"] is None
        assert answer["error"]["code"] == "malformed"
        send_msg(sock, {"id": "next", "method": "echo", "args": {"k": 1}})
        assert recv_msg(sock) == {"id": "next", "ok": True, "result": {"k": 1}}


@pytest.mark.parametrize("message", [[1, 2, 3], "echo", 7, None])
def test_non_map_request_is_malformed(server: RPCServerThread, message: Any) -> None:
    with raw_connect(server.server.address) as sock:
        send_msg(sock, message)
        answer = recv_msg(sock)
        assert answer["error"]["code"] == "malformed"
        assert "msgpack map" in answer["error"]["message"]
        send_msg(sock, {"id": "next", "method": "echo", "args": {}})
        assert recv_msg(sock)["ok"] is True


@pytest.mark.parametrize(
    ("message", "expect_id", "field_name"),
    [
        ({"method": "echo", "args": {}}, None, "'id'"),
        ({"id": 5, "method": "echo", "args": {}}, None, "'id'"),
        ({"id": "x" * 500, "method": "echo"}, None, "'id'"),
        ({"id": "r1", "args": {}}, "r1", "'method'"),
        ({"id": "r2", "method": "echo", "args": [1]}, "r2", "'args'"),
        ({"id": "r3", "method": "echo", "args": {}, "token": 12}, "r3", "'token'"),
    ],
)
def test_request_with_bad_fields_is_bad_request(
    server: RPCServerThread, message: dict[str, Any], expect_id: str | None, field_name: str
) -> None:
    with raw_connect(server.server.address) as sock:
        send_msg(sock, message)
        answer = recv_msg(sock)
        assert answer["ok"] is False
        assert answer["error"]["code"] == "bad_request"
        assert field_name in answer["error"]["message"]
        assert answer["id"] == expect_id
        send_msg(sock, {"id": "next", "method": "echo"})  # args may be omitted
        assert recv_msg(sock) == {"id": "next", "ok": True, "result": {}}


def test_unknown_method(client: RPCClient) -> None:
    with pytest.raises(RPCError) as info:
        client.call("job.explode")
    assert info.value.code == "unknown_method"
    assert "job.explode" in info.value.message
    assert client.call("echo", {"x": 2}) == {"x": 2}


def test_oversized_frame_is_answered_then_closed_without_reading_the_body(
    server: RPCServerThread,
) -> None:
    with raw_connect(server.server.address) as sock:
        # Announce a frame over the limit and send none of its body: the
        # server must answer from the header alone.
        sock.sendall(struct.pack(">I", DEFAULT_MAX_FRAME + 1))
        answer = recv_msg(sock)
        assert answer["error"]["code"] == "frame_too_large"
        assert answer["error"]["size"] == DEFAULT_MAX_FRAME + 1
        assert answer["error"]["limit"] == DEFAULT_MAX_FRAME
        assert recv_exact(sock, 1) is None  # then the server closed the connection
    assert_still_serving(server.server.address)


@pytest.mark.parametrize("partial", [b"\x00\x00", struct.pack(">I", 100) + b"\x81\xa2id"])
def test_truncated_frame_then_close(server: RPCServerThread, partial: bytes) -> None:
    with raw_connect(server.server.address) as sock:
        sock.sendall(partial)
    assert_still_serving(server.server.address)


def test_connection_closed_with_requests_in_flight(
    server: RPCServerThread, harness: Harness
) -> None:
    with raw_connect(server.server.address) as sock:
        send_msg(sock, {"id": "w", "method": "wait", "args": {"gate": "never"}})
        send_msg(sock, {"id": "e", "method": "echo", "args": {}})
        assert recv_msg(sock)["id"] == "e"  # the waiting request is in flight
    assert_still_serving(server.server.address)


# ---- client failover and retries --------------------------------------------------------------


def test_failover_to_the_next_address(server: RPCServerThread) -> None:
    dead = free_address()
    with RPCClient([dead, server.server.address], timeout=WAIT) as c:
        assert c.call("echo", {"v": 1}) == {"v": 1}
        assert c.call("echo", {"v": 2}) == {"v": 2}  # sticks to the live one


def test_no_server_reachable_is_unavailable_naming_each_address() -> None:
    dead = [free_address(), free_address()]
    with RPCClient(dead, timeout=0.3) as c:
        with pytest.raises(RPCError) as info:
            c.call("echo")
    assert info.value.code == "unavailable"
    for address in dead:
        assert address in info.value.message


def test_with_a_refused_grace_nothing_listening_is_reported_before_the_deadline() -> None:
    dead = [free_address(), free_address()]
    with RPCClient(dead, timeout=60, refused_grace=0.2) as c:
        with pytest.raises(RPCError) as info:
            c.call("echo")
    assert info.value.code == "unavailable"
    assert info.value.message.startswith(f"no server is listening at {dead[0]}, {dead[1]} (connection refused)")


def test_the_refused_grace_does_not_cut_short_a_server_that_listens(harness: Harness) -> None:
    """One address refuses, the other accepts but is slow: that is not 'nothing listening'."""
    silent = start_server(harness)
    try:
        with RPCClient([free_address(), silent.server.address], timeout=0.5, refused_grace=0.01) as c:
            with pytest.raises(RPCError) as info:
                c.call("wait", {"gate": "never"})
    finally:
        silent.stop()
    assert info.value.code == "timeout"


def test_retry_after_a_lost_reply_uses_the_same_request_id(
    client: RPCClient, harness: Harness
) -> None:
    assert client.call("drop_first", {}, request_id="write-1") == {"attempts": 2}
    assert [s["request_id"] for s in harness.seen] == ["write-1", "write-1"]
    assert harness.seen[0]["peer"] != harness.seen[1]["peer"]  # it came back on a new connection


def test_retry_without_explicit_request_id_reuses_the_generated_one(
    client: RPCClient, harness: Harness
) -> None:
    assert client.call("drop_first", {}) == {"attempts": 2}
    assert len(harness.attempts) == 1


def test_async_retry_after_a_lost_reply_uses_the_same_request_id(
    server: RPCServerThread, harness: Harness
) -> None:
    async def scenario() -> Any:
        async with AsyncRPCClient([server.server.address], timeout=WAIT) as c:
            return await c.call("drop_first", {}, request_id="write-2")

    assert asyncio.run(scenario()) == {"attempts": 2}
    assert harness.attempts["write-2"] == 2


def test_lost_reply_of_a_non_idempotent_call_is_unknown_outcome(
    client: RPCClient, harness: Harness
) -> None:
    with pytest.raises(RPCError) as info:
        client.call("drop_first", {}, request_id="once-1", idempotent=False)
    assert info.value.code == "unknown_outcome"
    assert info.value.details["request_id"] == "once-1"
    assert harness.attempts["once-1"] == 1


def test_not_executed_answers_are_retried(client: RPCClient, harness: Harness) -> None:
    assert client.call("not_leader_twice", {}, idempotent=False) == {"attempts": 3}


def test_no_leader_from_every_reachable_server_ends_the_call_with_that_answer(
    server: RPCServerThread, harness: Harness
) -> None:
    """The server held the request through an election that never came: asking the
    same servers again until the client's own deadline only turns its clear answer
    into a bare timeout."""
    with RPCClient([free_address(), server.server.address], timeout=WAIT) as c:
        with pytest.raises(RPCError) as info:
            c.call("no_leader", {}, request_id="nl-1")
    assert info.value.code == "no_leader"
    assert "start the servers that are down" in info.value.message
    assert harness.attempts["nl-1"] == 1


def start_refusing(method: str, code: str, message: str) -> RPCServerThread:
    """A server whose ``method`` always answers with the error ``code``."""
    server = RPCServer("127.0.0.1:0", log=quiet_log())

    async def refuse(ctx: RequestContext, args: dict[str, Any]) -> Any:
        raise RPCError(code, message)

    server.register(method, refuse)
    thread = RPCServerThread(server)
    thread.start()
    return thread


def test_no_leader_from_one_server_still_tries_the_next(harness: Harness) -> None:
    isolated = start_refusing("echo", "no_leader", "no cluster leader")
    healthy = start_server(harness)
    try:
        with RPCClient([isolated.server.address, healthy.server.address], timeout=WAIT) as c:
            assert c.call("echo", {"w": 1}) == {"w": 1}
    finally:
        isolated.stop()
        healthy.stop()


def test_a_timeout_names_the_last_answer_a_server_gave(harness: Harness) -> None:
    """not_leader, then silence: the timeout says what the cluster last said."""
    follower = start_refusing("wait", "not_leader", "leadership transfer in progress")
    silent = start_server(harness)
    try:
        with RPCClient([follower.server.address, silent.server.address], timeout=0.5) as c:
            with pytest.raises(RPCError) as info:
                c.call("wait", {"gate": "never"}, request_id="t-1")
    finally:
        follower.stop()
        silent.stop()
    assert info.value.code == "timeout"
    assert "leadership transfer in progress" in info.value.message
    assert "t-1" in info.value.message


def test_not_leader_redirects_to_the_named_leader(harness: Harness) -> None:
    leader = start_server(harness)
    follower_server = RPCServer("127.0.0.1:0", log=quiet_log())

    async def not_me(ctx: RequestContext, args: dict[str, Any]) -> Any:
        raise RPCError.not_leader(leader.server.address)

    follower_server.register("echo", not_me)
    follower = RPCServerThread(follower_server)
    follower.start()
    try:
        with RPCClient([follower_server.address], timeout=WAIT) as c:
            assert c.call("echo", {"w": 1}, idempotent=False) == {"w": 1}
            assert c.call("echo", {"w": 2}) == {"w": 2}  # now sticks to the leader
    finally:
        follower.stop()
        leader.stop()


def test_deadline_without_answer_is_timeout_with_request_id(client: RPCClient) -> None:
    with pytest.raises(RPCError) as info:
        client.call("wait", {"gate": "never"}, timeout=0.2, request_id="slow-1")
    assert info.value.code == "timeout"
    assert info.value.details["request_id"] == "slow-1"
    assert client.call("echo", {"after": True}) == {"after": True}


def test_kept_connection_closed_by_a_restart_is_not_an_unknown_outcome(harness: Harness) -> None:
    first = start_server(harness)
    address = first.server.address
    with RPCClient([address], timeout=WAIT) as c:
        assert c.call("echo", {"n": 1}) == {"n": 1}
        first.stop()
        second = RPCServer(address, log=quiet_log())
        harness.register(second)
        restarted = RPCServerThread(second)
        restarted.start()
        try:
            assert c.call("echo", {"n": 2}, idempotent=False) == {"n": 2}
        finally:
            restarted.stop()


def test_ipv6_loopback(harness: Harness) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    server = RPCServer("[::1]:0", log=quiet_log())
    harness.register(server)
    thread = RPCServerThread(server)
    try:
        address = thread.start()
    except OSError:
        pytest.skip("IPv6 loopback not available")
    try:
        assert address.startswith("[::1]:")
        with RPCClient([address], timeout=WAIT) as c:
            assert c.call("whoami")["peer"].startswith("[::1]:")
    finally:
        thread.stop()


def test_server_rejects_duplicate_registration() -> None:
    server = RPCServer()

    async def handler(ctx: RequestContext, args: dict[str, Any]) -> Any:
        return None

    server.register("m", handler)
    with pytest.raises(ValueError, match="already registered"):
        server.register("m", handler)


def test_client_repr_hides_the_token() -> None:
    c = RPCClient(["127.0.0.1:1"], token="very-secret")
    assert "very-secret" not in repr(c)
    assert "very-secret" not in repr(AsyncRPCClient(["127.0.0.1:1"], token="very-secret"))
