"""AsyncRPCClient against scripted servers: framing, deadlines and backpressure on one connection.

The client parses answers straight from the socket's chunks, batches the
requests of a loop iteration into one write and keeps deadlines with one
timer per connection; these tests pin what that must still guarantee.
A scripted asyncio server in the test's own loop decides exactly which
bytes arrive when. Synchronization is by events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest

from node.wire.errors import RPCError
from node.wire.framing import ConnectionLost, format_address, read_frame
from node.wire.rpc_client import AsyncRPCClient

WAIT = 5.0

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def frame(message: Any) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def answer(request: dict[str, Any], result: Any) -> bytes:
    return frame({"id": request["id"], "ok": True, "result": result})


async def read_request(reader: asyncio.StreamReader) -> dict[str, Any]:
    body = await read_frame(reader, 1 << 30)
    assert body is not None, "client closed the connection"
    message: dict[str, Any] = msgpack.unpackb(body, raw=False)
    return message


async def scripted_server(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    return server, format_address(host, port)


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), WAIT * 2))


# ---- answers however the bytes arrive -----------------------------------------------------------


@pytest.mark.parametrize("piece", [1, 3, 7, 4096])
def test_answers_split_and_coalesced_across_reads_are_all_matched(piece: int) -> None:
    """Answers are written back to back in pieces cutting through headers and bodies."""
    count = 20
    big = "x" * 300_000  # larger than a socket read: buffered over many chunks

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests = [await read_request(reader) for _ in range(count)]
        data = b"".join(
            answer(r, big if r["args"]["n"] == 5 else r["args"]["n"]) for r in reversed(requests)
        )
        # ``piece`` bytes at a time through the first frames, then the rest in 64 KiB writes.
        cut = min(piece * 600, len(data))
        pieces = [data[i : i + piece] for i in range(0, cut, piece)]
        pieces += [data[i : i + 65536] for i in range(cut, len(data), 65536)]
        for part in pieces:
            writer.write(part)
            await writer.drain()
        await reader.read()  # until the client closes

    async def scenario() -> list[Any]:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT) as client:
            return await asyncio.gather(*(client.call("echo", {"n": n}) for n in range(count)))

    results = run(scenario)
    assert results == [big if n == 5 else n for n in range(count)]


def test_requests_of_one_iteration_arrive_in_order_on_one_connection() -> None:
    seen: list[dict[str, Any]] = []
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            body = await read_frame(reader, 1 << 30)
            if body is None:
                return
            request = msgpack.unpackb(body, raw=False)
            seen.append(request)
            writer.write(answer(request, request["args"]["n"]))

    async def scenario() -> list[Any]:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], token="t", timeout=WAIT) as client:
            first = await client.call("echo", {"n": -1})
            return [first, *await asyncio.gather(*(client.call("echo", {"n": n}) for n in range(500)))]

    assert run(scenario) == [-1, *range(500)]
    assert connections == 1
    assert [r["args"]["n"] for r in seen] == [-1, *range(500)]
    assert len({r["id"] for r in seen}) == 501
    assert all(r["method"] == "echo" and r["token"] == "t" for r in seen)


def test_a_stream_frame_or_an_answer_without_id_is_skipped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        writer.write(frame({"id": request["id"], "stream": 1}))
        writer.write(frame({"id": None, "ok": False, "error": {"code": "malformed", "message": "m"}}))
        writer.write(answer(request, "done"))
        await reader.read()

    async def scenario() -> Any:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT) as client:
            return await client.call("echo")

    assert run(scenario) == "done"


# ---- broken streams -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        (b"\x00\x00", "inside a frame header"),
        (struct.pack(">I", 10) + b"abc", "inside a frame body"),
        (b"", "server closed the connection"),
        (struct.pack(">I", 2048), "exceeds the frame limit"),
        (frame([1, 2]), "not a map with an id"),
        (struct.pack(">I", 1) + b"\xc1", "not valid msgpack"),
    ],
)
def test_a_broken_answer_stream_fails_every_call_in_flight(tail: bytes, why: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(tail)
        await writer.drain()
        if why.startswith(("inside", "server closed")):
            writer.close()
        else:
            await reader.read()

    async def scenario() -> None:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT, max_frame=1024) as client:
            conn = await client._connection(address, WAIT)
            calls = [
                conn.request(request_id, frame({"id": request_id, "method": "m"}), WAIT)
                for request_id in ("a", "b")
            ]
            for outcome in await asyncio.gather(*calls, return_exceptions=True):
                assert isinstance(outcome, ConnectionLost) and why in str(outcome)
            assert conn.closed and conn.pending == {}
            with pytest.raises(RPCError) as info:  # a non-idempotent call gets unknown_outcome
                await client.call("write", {}, idempotent=False, request_id="w-1")
            assert info.value.code == "unknown_outcome"
            assert info.value.details["request_id"] == "w-1"

    run(scenario)


def test_after_a_broken_stream_an_idempotent_call_is_resent_on_a_new_connection() -> None:
    attempts: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        attempts.append(request["id"])
        if len(attempts) == 1:
            writer.write(b"\x00\x00\x00")
            writer.close()
            return
        writer.write(answer(request, len(attempts)))
        await reader.read()

    async def scenario() -> Any:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT) as client:
            return await client.call("read", {}, request_id="r-1")

    assert run(scenario) == 2
    assert attempts == ["r-1", "r-1"]


# ---- deadlines ----------------------------------------------------------------------------------


def test_each_call_keeps_its_own_deadline_on_a_shared_connection() -> None:
    """A short call times out while a longer one in flight still gets its answer."""
    release = asyncio.Event()
    held: dict[str, Any] = {}

    async def answer_held(writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(b"".join(answer(r, "late") for r in held.values()))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        later = asyncio.create_task(answer_held(writer))
        while True:
            body = await read_frame(reader, 1 << 30)
            if body is None:
                later.cancel()
                return
            request = msgpack.unpackb(body, raw=False)
            if request["method"] == "hold":
                held[request["id"]] = request
            else:
                writer.write(answer(request, "quick"))

    async def scenario() -> None:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT) as client:
            long = asyncio.create_task(client.call("hold", {}, request_id="long"))
            with pytest.raises(RPCError) as info:
                await client.call("hold", {}, timeout=0.1, request_id="short")
            assert info.value.code == "timeout"
            assert info.value.details["request_id"] == "short"
            with pytest.raises(RPCError) as info:
                await client.call("hold", {}, timeout=0.1, request_id="once", idempotent=False)
            assert info.value.code == "unknown_outcome"
            assert not long.done()
            assert await client.call("echo") == "quick"  # the connection is still in use
            release.set()
            assert await long == "late"
            assert len(client._pool) == 1
            conn = next(iter(client._pool.values()))
            assert conn.pending == {}

    run(scenario)


def test_a_cancelled_call_leaves_nothing_pending() -> None:
    got_request = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        got_request.set()
        await reader.read()

    async def scenario() -> None:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT) as client:
            call = asyncio.create_task(client.call("hold"))
            await got_request.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            conn = next(iter(client._pool.values()))
            assert conn.pending == {}

    run(scenario)


# ---- backpressure -------------------------------------------------------------------------------


def test_calls_wait_for_a_slow_reader_and_all_get_answers() -> None:
    """Requests larger than the socket buffers: calls block on drain until the server reads."""
    reading = asyncio.Event()
    size = 512 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reading.wait()
        while True:
            body = await read_frame(reader, 1 << 30)
            if body is None:
                return
            request = msgpack.unpackb(body, raw=False)
            writer.write(answer(request, len(request["args"]["blob"])))

    async def scenario() -> None:
        server, address = await scripted_server(handler)
        async with server, AsyncRPCClient([address], timeout=WAIT, max_frame=4 * size) as client:
            await client._connection(address, WAIT)
            calls = [asyncio.create_task(client.call("put", {"blob": b"x" * size})) for _ in range(16)]
            for _ in range(100):  # yield until the requests fill the transport's buffer
                conn = next(iter(client._pool.values()), None)
                if conn is not None and conn._paused:
                    break
                await asyncio.sleep(0)
            assert conn is not None and conn._paused
            late = [asyncio.create_task(client.call("put", {"blob": b"y"})) for _ in range(2)]
            await asyncio.sleep(0)
            assert len(conn._drain_waiters) == 2
            late[1].cancel()  # a caller giving up while it waits for the buffer to drain
            calls[-1].cancel()  # and one whose request is already out
            reading.set()
            assert await asyncio.gather(*calls[:-1]) == [size] * 15
            assert await late[0] == 1
            assert conn.pending == {}
            assert late[1].cancelled() and calls[-1].cancelled()

    run(scenario)


# ---- one pass (a follower forwarding to a leader that may have died) ------------------------------


@pytest.mark.parametrize("one_pass, at_least, at_most", [(True, 1, 1), (False, 2, 1000)])
def test_one_pass_gives_up_after_one_try_instead_of_retrying_until_the_deadline(
    one_pass: bool, at_least: int, at_most: int
) -> None:
    """A server that drops every request: one pass tries once; otherwise tries go on until the timeout."""
    accepted = [0]

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        await read_request(reader)
        writer.close()

    async def scenario() -> None:
        server, address = await scripted_server(drop)
        client = AsyncRPCClient([address], timeout=WAIT)
        try:
            with pytest.raises(RPCError) as err:
                await client.call("status", {}, address=address, timeout=1.0, one_pass=one_pass)
            assert err.value.code == "timeout"  # the request went out: it may have run
        finally:
            await client.close()
            server.close()

    run(scenario)
    assert at_least <= accepted[0] <= at_most
