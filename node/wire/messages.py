"""The client's side of one RPC message: the request map, the answer map, stream frames.

Both clients (and the asyncio client's connection protocol) read answers
through these helpers, so a garbled answer or a broken stream reads the same
to every caller.
"""

from __future__ import annotations

from typing import Any

from node.wire.errors import INTERNAL, UNAVAILABLE, RPCError
from node.wire.framing import ConnectionLost, unpack_body
from node.wire.retry import describe

#: Node IDs one ``node.heartbeat`` call may carry: the server refuses more, clients chunk to it.
MAX_HEARTBEAT_IDS = 10_000
STREAM_END: Any = object()  # what ``stream_item`` returns for a stream's final answer


def request_message(
    request_id: str, method: str, args: dict[str, Any] | None, token: str | None
) -> dict[str, Any]:
    """The request map a server expects."""
    return {"id": request_id, "method": method, "args": args or {}, "token": token}


def decode_response(body: bytes | bytearray) -> dict[str, Any]:
    """An answer frame's body as a map with an id; ``internal`` if it is anything else."""
    try:
        message = unpack_body(body)
    except RPCError:
        raise RPCError(
            INTERNAL,
            "server sent a frame that is not valid msgpack; check server and client versions",
        ) from None
    if not isinstance(message, dict) or "id" not in message:
        raise RPCError(
            INTERNAL,
            "server sent a response that is not a map with an id; check server and client versions",
        )
    return message


def outcome(message: dict[str, Any]) -> Any:
    """The result of a final response, or its error raised."""
    if message.get("ok") is True:
        return message.get("result")
    raise RPCError.from_wire(message.get("error"))


def stream_item(body: bytes | None) -> Any:
    """The item a stream frame carries, or ``STREAM_END`` after a final answer (its error raised).

    ``body`` None (the server closed the connection) raises ``ConnectionLost``.
    """
    if body is None:
        raise ConnectionLost("server closed the connection")
    message = decode_response(body)
    if "stream" in message:
        return message["stream"]
    outcome(message)
    return STREAM_END


def stream_broken(method: str, address: str, exc: BaseException) -> RPCError:
    """The error for a stream whose connection broke after it started (it is not resumed)."""
    return RPCError(
        UNAVAILABLE,
        f"stream {method} from {address} broke ({describe(exc)}); resubscribe from the last item received",
    )
