from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raft import RaftConfig, RaftNode
from tests.raft.cluster import Cluster, free_ports, wait_for


class MemTarget:
    """In-memory apply target for in-process tests."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.entries: dict[int, bytes] = {}
        self._applied = 0
        self.commits = 0
        self.fail_on = fail_on

    def apply(self, index: int, entry: bytes) -> object:
        if index <= self._applied:
            return None
        if self.fail_on is not None and entry.startswith(self.fail_on):
            raise OSError("simulated LMDB failure")
        self.entries[index] = entry
        self._applied = index
        return index

    def commit(self) -> None:
        self.commits += 1

    @property
    def applied_index(self) -> int:
        return self._applied


@pytest.fixture
def single_node(tmp_path: Path) -> Iterator[Any]:
    """Factory for one-member clusters in this process (leader of itself)."""
    made: list[RaftNode] = []

    def make(target: Any = None, on_fatal: Any = None, **kw: Any) -> tuple[RaftNode, Any]:
        addr = f"127.0.0.1:{free_ports(1)[0]}"
        target = target if target is not None else MemTarget()
        cfg = RaftConfig(
            self_address=addr,
            peers=[addr],
            data_dir=tmp_path / f"n{len(made)}",
            password="pw",
            **kw,
        )
        node = RaftNode(cfg, target, on_fatal=on_fatal)
        made.append(node)
        wait_for(lambda: node.status()["leader_ready"], 10, "single node to lead")
        return node, target

    yield make
    for n in made:
        n.destroy()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """Factory for multi-process clusters; every process is killed at teardown."""
    made: list[Cluster] = []

    def make(**kw: Any) -> Cluster:
        c = Cluster(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c.start_all()

    yield make
    for c in made:
        c.stop()
