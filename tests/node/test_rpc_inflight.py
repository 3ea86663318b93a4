"""The per-connection limit of requests in flight: past it the server stops reading that connection."""

from __future__ import annotations

from tests.node.test_rpc import (
    Harness,
    assert_still_serving,
    raw_connect,
    recv_msg,
    send_msg,
    start_server,
)


def test_a_request_past_the_limit_starts_only_when_one_in_flight_finishes() -> None:
    harness = Harness()
    server = start_server(harness, max_inflight_per_connection=2)
    try:
        address = server.server.address
        with raw_connect(address) as sock, raw_connect(address) as other:
            send_msg(sock, {"id": "w1", "method": "wait", "args": {"gate": "g1"}})
            send_msg(sock, {"id": "w2", "method": "wait", "args": {"gate": "g2"}})
            send_msg(sock, {"id": "e", "method": "echo", "args": {}})  # third: not read yet
            send_msg(other, {"id": "r1", "method": "release", "args": {"gate": "g1"}})
            assert recv_msg(other)["id"] == "r1"  # another connection is not held up
            # Within the limit the echo would have been answered before g1 was released.
            assert [recv_msg(sock)["id"], recv_msg(sock)["id"]] == ["w1", "e"]
            send_msg(other, {"id": "r2", "method": "release", "args": {"gate": "g2"}})
            assert recv_msg(sock)["id"] == "w2"
        assert_still_serving(address)
    finally:
        server.stop()
