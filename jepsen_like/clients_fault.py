"""The ``clients`` nemesis: a share of the simulated client's nodes goes silent, then comes back.

``client-kill`` takes every node at once; a rack losing its uplink takes
some, while the rest keep running and must absorb the replacements. This
fault picks a seeded 20-50% of the simulated client's nodes (at least one,
never all) and cuts them off through the client's silence switch
(``client.silence``: no heartbeats, no alloc updates, no journal for them;
their tasks keep running). It then lists the allocs live on them -- the
ones the checker will demand replacements for --, holds, waits (bounded)
until the servers have marked every silenced node down, brings the nodes
back -- only once the servers have also stopped the allocs on them (marked
lost), since a node back before its down-evaluation runs rightly keeps its
allocs -- and waits (bounded) until they are ready again.

Each window's evidence (nodes, the allocs live on them, whether the nodes
were seen down and ready again) goes to run.json's ``nemesis_stats``, where
``jepsen_like.failover_check`` reads it; the ``failover`` workload
(``jepsen_like.failover``) records the allocs that followed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from jepsen_like.nemesis import Fault
from jepsen_like.testbed import Testbed, TestbedError
from node.wire.errors import RPCError
from node.wire.rpc_client import RPCClient

SHARE = (0.2, 0.5)  # the share of the client's nodes one fault silences (uniform)
ACK_WAIT = 5.0  # seconds for the client to acknowledge a silence change
LIST_WAIT = 15.0  # seconds to list the silenced nodes' allocs (through an election)
DOWN_WAIT = 30.0  # seconds for the servers to mark every silenced node down (TTL 5-10 s + grace)
ACT_WAIT = 30.0  # seconds, once they are down, for the servers to stop (mark lost) the allocs on them
READY_WAIT = 20.0  # seconds for the nodes brought back to be ready again
STATE_WAIT = 15.0  # seconds for a just-started client to write its node ids
LIVE = ("pending", "running")


def _poll(done: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    """Whether ``done()`` held within ``timeout``; RPC errors (elections, a dead server) mean "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if done():
                return True
        except (RPCError, OSError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)  # polling a condition with a deadline


def _statuses(testbed: Testbed, node_ids: list[str]) -> dict[str, str]:
    """The leader's status of each node.

    Not a stale read: a server cut off by a partition held at the same time
    answers stale reads from a state that never sees the nodes go down.
    """
    with RPCClient(testbed.running_addresses(), timeout=2.0) as client:
        nodes = client.list_all("node.list", {})
    wanted = set(node_ids)
    return {n["ID"]: n.get("Status", "") for n in nodes if n["ID"] in wanted}


def _all(testbed: Testbed, node_ids: list[str], status: str) -> Callable[[], bool]:
    """A check that every node shows ``status``; for ``down``, a node no longer listed counts too.

    A forced GC (the lifecycle workload's ``system.gc``, as Nomad's) collects
    a down node once its allocs are terminal, so a node can go from down to
    gone between two looks; it registers again when it is back.
    """
    def check() -> bool:
        seen = _statuses(testbed, node_ids)
        if status == "down":
            return all(seen.get(n, "down") == "down" for n in node_ids)
        return len(seen) == len(node_ids) and all(s == status for s in seen.values())

    return check


def _others_down(testbed: Testbed, nodes: list[str], picked: list[str]) -> list[str] | None:
    """Nodes not silenced that the servers show down now (None: no server answered).

    Should be none: the switch must cut off exactly the nodes it names.
    Kept as evidence, not judged: another fault (a paused leader) may
    legitimately cost a node its heartbeat.
    """
    try:
        seen = _statuses(testbed, nodes)
    except (RPCError, OSError):
        return None
    return sorted(n for n, status in seen.items() if status == "down" and n not in picked)


def _node_allocs(testbed: Testbed, node_ids: list[str]) -> list[dict[str, Any]]:
    """Every alloc on ``node_ids``, read from the leader (the caller retries on RPC errors)."""
    with RPCClient(testbed.running_addresses(), timeout=5.0) as client:
        return [a for node_id in node_ids for a in client.list_all("alloc.list", {"node_id": node_id})]


def _live(alloc: dict[str, Any]) -> bool:
    return alloc.get("DesiredStatus") == "run" and alloc.get("ClientStatus") in LIVE


def live_allocs(testbed: Testbed, node_ids: list[str]) -> list[dict[str, str]] | None:
    """The allocs live (desired run, pending or running) on ``node_ids``; None if no read succeeded."""
    found: list[dict[str, str]] = []

    def read() -> bool:
        found[:] = [{"ID": a["ID"], "JobID": a["JobID"], "TaskGroup": a.get("TaskGroup", ""), "NodeID": a["NodeID"]}
                    for a in _node_allocs(testbed, node_ids) if _live(a)]
        return True

    return found if _poll(read, LIST_WAIT) else None


def await_acted(testbed: Testbed, window: dict[str, Any], timeout: float) -> bool:
    """Whether, within ``timeout``, the servers stopped every alloc the window listed (marked lost, or collected).

    The nodes must stay silent until then: a node back before the servers'
    evaluation of its going down ran is ready again when it runs, and its
    allocs rightly stay where they are (nothing was lost). Records the ids
    seen ``lost`` in ``window["lost"]``.
    """
    wanted = {a["ID"] for a in window["allocs"]}

    def acted() -> bool:
        now = {a["ID"]: a for a in _node_allocs(testbed, window["nodes"]) if a["ID"] in wanted}
        window["lost"] = sorted(i for i, a in now.items() if a.get("ClientStatus") == "lost")
        return not any(_live(a) for a in now.values())

    return _poll(acted, timeout)


class SilenceClients(Fault):
    name = "clients"

    def __init__(self) -> None:
        self.windows: list[dict[str, Any]] = []

    def stats(self) -> dict[str, Any]:
        return {"faults": len(self.windows), "windows": self.windows} if self.windows else {}

    def unavailable(self, testbed: Testbed) -> str | None:
        if testbed.client_sim is None:
            return "no simulated client in this run (the failover or lifecycle workload starts one)"
        # The client writes its node ids at start-up, moments after the runner launched it.
        if not _poll(lambda: len(testbed.client_sim_node_ids()) >= 2, STATE_WAIT, interval=0.1):
            return "the simulated client has fewer than two nodes: silencing a share needs some left to take the replacements"
        return None

    def inject(self, testbed: Testbed, rng: random.Random) -> tuple[Callable[[], str], list[str], str]:
        nodes = testbed.client_sim_node_ids()
        share = rng.uniform(*SHARE)
        picked = sorted(rng.sample(nodes, min(len(nodes) - 1, max(1, round(share * len(nodes))))))
        # A client killed by client-kill cannot acknowledge; it reads the file when it starts again.
        if not testbed.silence_client_nodes(picked, ACK_WAIT) and testbed.client_sim_running():
            testbed.silence_client_nodes([], ACK_WAIT)
            raise TestbedError(f"the simulated client did not acknowledge silencing {len(picked)} node(s) within {ACK_WAIT:g}s")
        allocs = live_allocs(testbed, picked)
        window: dict[str, Any] = {"nodes": picked, "of": len(nodes), "allocs": allocs or [], "listed": allocs is not None}
        self.windows.append(window)
        started = time.monotonic()

        def undo() -> str:
            return self._undo(testbed, window, nodes, started)

        listed = f"{len(allocs)} live allocs on them" if allocs is not None else f"their allocs could not be listed within {LIST_WAIT:g}s"
        what = f"silence {len(picked)} of {len(nodes)} client nodes ({share:.0%}); {listed}"
        return undo, [f"node {n[:8]}" for n in picked], what

    @staticmethod
    def _undo(testbed: Testbed, window: dict[str, Any], nodes: list[str], started: float) -> str:
        """Hold until the servers marked the nodes down and acted on it (bounded), then bring them back."""
        picked = window["nodes"]
        window["down"] = _poll(_all(testbed, picked, "down"), DOWN_WAIT)
        window["down_after"] = round(time.monotonic() - started, 1)
        window["others_down"] = _others_down(testbed, nodes, picked)
        window["acted"] = window["down"] and window["listed"] and await_acted(testbed, window, ACT_WAIT)
        window["acted_after"] = round(time.monotonic() - started, 1)
        window["restored"] = testbed.silence_client_nodes([], ACK_WAIT)
        window["ready"] = _poll(_all(testbed, picked, "ready"), READY_WAIT)
        said = [f"all down after {window['down_after']:g}s" if window["down"] else f"NOT all down within {DOWN_WAIT:g}s"]
        if window["down"]:
            said.append(f"allocs stopped after {window['acted_after']:g}s ({len(window.get('lost') or [])} seen lost)"
                        if window["acted"] else f"allocs NOT all stopped within {ACT_WAIT:g}s")
        said.append("brought back" + ("" if window["restored"] else " (the client did not acknowledge: not running?)"))
        said.append("ready again" if window["ready"] else f"NOT all ready within {READY_WAIT:g}s")
        return "; ".join(said)
