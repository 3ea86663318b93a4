"""Server._forward: a request follows leadership until some server serves it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from node.core.api import Forward
from node.core.forward import FORWARDED
from node.server import Server


class _ForwardingServer:
    """The parts of Server that ``_forward`` uses: this is server A; B leads next."""

    def __init__(self) -> None:
        self.raft = SimpleNamespace(is_leader=True)
        self.rpc = SimpleNamespace(address="A")
        self.forwarder = self
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def call(self, name: str, args: dict[str, Any], **kw: Any) -> Any:
        self.sent.append((name, kw["address"], args))
        return {"served_by": kw["address"]}

    def leader_rpc(self) -> str:
        return "B"


def test_a_request_run_here_that_finds_this_server_deposed_goes_on_to_the_leader() -> None:
    """Seen in a fault run: a read waiting to be forwarded found this server leader and ran
    here, its barrier found it deposed again, and the second ``Forward`` escaped as an
    internal error ("rpc handler crashed") instead of going to the new leader."""
    server = _ForwardingServer()
    runs: list[str] = []

    async def read(srv: Any, ctx: Any, args: dict[str, Any]) -> Any:
        runs.append(srv.rpc.address)
        srv.raft.is_leader = False  # the barrier found leadership gone
        raise Forward("B")

    ctx = SimpleNamespace(request_id="r1", token="t")
    result = asyncio.run(Server._forward(server, "job.get", read, ctx, {"job_id": "j"}, None))  # type: ignore[arg-type]
    assert result == {"served_by": "B"} and runs == ["A"]
    assert server.sent == [("job.get", "B", {"job_id": "j", FORWARDED: True})]
