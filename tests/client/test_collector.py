"""The client GC's I/O (``client.collector``, ``client.allocdir``) on real directories, without a cluster."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from client import allocdir
from client.collector import Collector, NodeDisk
from client.driver import DriverError, TaskSpec, task_spec
from client.gc import GCConfig

MB = 1 << 20


def task(
    name: str = "t", write_mb: float = 0.0, files: int = 0, fail_cleanup: bool = False
) -> TaskSpec:
    return TaskSpec(name, None, write_mb=write_mb, files=files, fail_cleanup=fail_cleanup)


def collector(
    tmp_path: Path, cfg: GCConfig, disk_mb: int = 100, inodes: int = 10_000
) -> tuple[Collector, list[str]]:
    lines: list[str] = []
    c = Collector(
        str(tmp_path), cfg, NodeDisk(disk_mb * MB, inodes), log=lines.append, warn=lines.append
    )
    return c, lines


async def run_alloc(
    c: Collector, node: str, alloc: str, tasks: list[TaskSpec], status: str = "complete"
) -> None:
    c.started(node, alloc)
    await c.build(node, alloc, tasks)
    c.finished(node, alloc, status)


async def settle(c: Collector) -> None:
    while c._tasks:
        await asyncio.gather(*list(c._tasks), return_exceptions=True)


def test_a_task_writes_what_its_config_says_and_it_is_measured(tmp_path: Path) -> None:
    spec = task_spec({"Name": "t", "Driver": "sim", "Config": {"write_mb": 1, "files": 3}})
    path = allocdir.alloc_path(str(tmp_path), "n1", "a1")
    allocdir.build(path, [spec])
    assert allocdir.measure(path) == (MB, 6)  # alloc dir, task dir, local, three files
    assert sorted(os.listdir(os.path.join(path, "t", "local"))) == ["data-0", "data-1", "data-2"]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"write_mb": -1}, "write_mb must be a number"),
        ({"write_mb": 1, "files": 0}, "needs at least one file"),
        ({"files": "3"}, "files must be an integer"),
        ({"fail_cleanup": "yes"}, "fail_cleanup must be true or false"),
    ],
)
def test_bad_disk_options_are_one_clear_error(config: dict, message: str) -> None:
    with pytest.raises(DriverError, match=message):
        task_spec({"Name": "t", "Driver": "sim", "Config": config})


def test_disk_pressure_evicts_oldest_first_until_under_the_threshold(tmp_path: Path) -> None:
    async def scenario() -> tuple[Collector, list[str]]:
        c, lines = collector(
            tmp_path, GCConfig(max_allocs=50, disk_usage_threshold=80.0), disk_mb=10
        )
        for i in range(4):  # 3 MB each on a 10 MB node: the 3rd takes it to 90%
            await run_alloc(c, "n1", f"a{i}", [task(write_mb=3, files=1)])
            await settle(c)
            assert c.usage("n1").fixed_bytes + sum(h.bytes for h in c.usage("n1").held) <= 8 * MB
        return c, lines

    c, lines = asyncio.run(scenario())
    assert sorted(c.node("n1").held) == ["a2", "a3"]
    evictions = [ln for ln in lines if "evicted alloc" in ln]
    assert evictions == [
        "gc: node n1: evicted alloc a0 (reason: disk)",
        "gc: node n1: evicted alloc a1 (reason: disk)",
    ]
    assert not os.path.exists(allocdir.alloc_path(str(tmp_path), "n1", "a0"))


def test_a_failing_cleanup_is_logged_and_the_gc_goes_on(tmp_path: Path) -> None:
    async def scenario() -> tuple[Collector, list[str]]:
        c, lines = collector(tmp_path, GCConfig(max_allocs=1))
        await run_alloc(c, "n1", "bad", [task(files=1, fail_cleanup=True)])
        await run_alloc(c, "n1", "good", [task()])
        await run_alloc(c, "n1", "last", [task()])
        await settle(c)
        return c, lines

    c, lines = asyncio.run(scenario())
    assert any("alloc bad: driver cleanup failed" in ln and "skipped" in ln for ln in lines), lines
    assert "gc: node n1: evicted alloc good (reason: count)" in lines
    assert (
        "gc: node n1: evicted alloc last (reason: count)" in lines
    )  # its directory still counts: over the limit
    assert set(c.node("n1").held) == {"bad"} and c.node("n1").held["bad"].cleanup_failed
    assert os.path.isdir(allocdir.alloc_path(str(tmp_path), "n1", "bad"))


def test_destroys_run_at_most_gc_parallel_destroys_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, most, lock = [0], [0], threading.Lock()

    def slow_destroy(path: str, tasks: list[TaskSpec]) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    async def scenario() -> Collector:
        c, _ = collector(tmp_path, GCConfig(max_allocs=50, parallel_destroys=2))
        for i in range(6):
            c.started("n1", f"a{i}")
            c.node("n1").held[f"a{i}"] = c.node("n1").live.pop(f"a{i}")
        monkeypatch.setattr(allocdir, "destroy", slow_destroy)
        assert await c.force("n1") == 6
        return c

    c = asyncio.run(scenario())
    assert most[0] == 2 and c.max_destroying["n1"] == 2 and not c.node("n1").held


def test_a_live_alloc_is_never_collected_even_when_forced(tmp_path: Path) -> None:
    async def scenario() -> tuple[Collector, list[str]]:
        c, lines = collector(tmp_path, GCConfig(max_allocs=1))
        c.started("n1", "live")
        await c.build("n1", "live", [task(write_mb=1, files=1)])
        assert await c.force("n1", "live") == 0
        c.server_deleted("live")  # the servers' GC: it goes once it has ended
        assert os.path.isdir(allocdir.alloc_path(str(tmp_path), "n1", "live"))
        c.finished("n1", "live", "complete")
        await settle(c)
        return c, lines

    c, lines = asyncio.run(scenario())
    assert "gc: node n1: evicted alloc live (reason: server-gc)" in lines
    assert any("alloc live is not terminal; kept" in ln for ln in lines)
    assert not c.node("n1").held and not c.node("n1").live
