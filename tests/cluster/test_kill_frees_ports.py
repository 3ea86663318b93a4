"""A server the launcher killed has let go of its ports, so a restart right after never finds them taken.

A multi-threaded server's main thread turns zombie before its other threads
have exited and closed their sockets; the launcher used to call it dead at
that point, and a restart straight after a kill failed, about one time in
four, with "address already in use" (issue #31's lost restarts).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node import devcluster as cl


@pytest.mark.cluster
def test_every_port_is_free_the_moment_kill_returns(tmp_path: Path) -> None:
    c = cl.plan(str(tmp_path), 1)
    node = c.nodes[0]
    try:
        for attempt in range(8):
            cl.start_node(node)
            c.save()
            cl.wait_serving([node])
            cl.kill(c, node.id)
            for address in (node.rpc_addr, node.raft_addr):
                host, port = address.rsplit(":", 1)
                assert cl.port_is_free(host, int(port)), f"kill {attempt}: {address} still bound after kill returned"
    finally:
        if cl.alive(node.pid):
            cl.kill(c, node.id)
