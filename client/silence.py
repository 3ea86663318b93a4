"""Silencing some of a simulated client's nodes: a network cut between them and the servers.

The fault harness's ``clients`` nemesis takes a share of the nodes of one
running ``caravan client sim`` off the network while the rest carry on, as
a rack losing its uplink would. Killing the process (``client-kill``)
takes every node at once; this takes only some, and the tasks on them keep
running, as a partitioned Nomad client's do.

For a silenced node the client sends nothing and hears nothing: no
heartbeats (the leader marks it down after its TTL and grace, its allocs
become lost and are replaced elsewhere), no ``alloc.update`` (its status
changes are held, as a disconnected Nomad client queues them), and it
ignores the journal's records for it. When the node is brought back it
heartbeats again (the leader marks it ready), reloads its allocs from the
servers (stopping those the servers marked lost) and sends what it held:
late reports of an alloc the servers already gave up on are refused by the
FSM (a terminal client status is final).

Control is a test-only switch: with ``CARAVAN_SIM_SILENCE_FILE`` set, the
client polls that file (JSON ``{"generation": N, "silenced": [node ids]}``)
and, once it has applied generation N, writes ``{"generation": N}`` to the
file's ``.ack`` sibling, so the harness waits on a condition, not a sleep.
Without the variable nothing changes and nothing is polled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

SILENCE_FILE_ENV = "CARAVAN_SIM_SILENCE_FILE"
POLL_INTERVAL = 0.1  # seconds between looks at the control file (one stat each)


def ack_path(path: str) -> str:
    """Where the client acknowledges the generation it applied."""
    return f"{path}.ack"


def write_json_atomically(path: str, data: object) -> None:
    """Replace ``path`` in one step, so the reader never sees half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_control(path: str) -> tuple[int, frozenset[str]] | None:
    """(generation, silenced ids) from the control file; None if absent or not (yet) readable."""
    try:
        with open(path) as f:
            data = json.load(f)
        return int(data["generation"]), frozenset(str(i) for i in data["silenced"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_ack(path: str) -> int | None:
    """The generation the client acknowledged, or None."""
    try:
        with open(ack_path(path)) as f:
            return int(json.load(f)["generation"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class Silence:
    """Which of this client's nodes are cut off; ``poll`` picks up the harness's changes."""

    path: str = ""
    ids: frozenset[str] = field(default_factory=frozenset)
    generation: int = -1
    _seen: tuple[int, int] = (-1, -1)  # (mtime_ns, size) of the file last read

    @classmethod
    def from_env(cls) -> Silence:
        return cls(path=os.environ.get(SILENCE_FILE_ENV, ""))

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.ids

    def poll(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """(newly silenced, newly restored) if the control file changed, else None.

        The caller applies the change, then calls ``acknowledge``.
        """
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if (st.st_mtime_ns, st.st_size) == self._seen:
            return None
        control = read_control(self.path)
        if control is None:
            return None  # being replaced: look again next time
        self._seen = (st.st_mtime_ns, st.st_size)
        generation, ids = control
        if generation == self.generation:
            return None
        old, self.ids, self.generation = self.ids, ids, generation
        return ids - old, old - ids

    def acknowledge(self) -> None:
        if self.path and self.generation >= 0:
            write_json_atomically(ack_path(self.path), {"generation": self.generation})
