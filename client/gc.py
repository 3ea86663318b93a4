"""What a client's alloc GC evicts: the decision, kept pure so it can be checked against a model.

Nomad's client keeps a terminal alloc (its directory and record) for logs
and inspection until pressure or the servers remove it. A pass of its
collector (``AllocGarbageCollector.keepUsageBelowThreshold``) evicts
terminal allocs **oldest-finished first**, re-checking after each one, in
this order of reasons:

1. disk usage above ``gc_disk_usage_threshold`` percent of the node's disk;
2. inode usage above ``gc_inode_usage_threshold`` percent of its inodes;
3. more allocs (live and kept) than ``gc_max_allocs``.

It stops as soon as the node is under every limit, or when no terminal
alloc is left; a live alloc is never evicted, and with no pressure nothing
is. Before a new alloc starts (``MakeRoomFor``) only the count is checked,
counting the new alloc. The I/O (measuring, removing directories, at most
``gc_parallel_destroys`` at once) is in ``client.collector``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Reasons an alloc is evicted, as the client's log lines name them.
DISK, INODES, COUNT, FORCED, SERVER_GC = "disk", "inodes", "count", "forced", "server-gc"
PRESSURE_REASONS = (DISK, INODES, COUNT)


class GCConfigError(ValueError):
    """A GC setting out of range; the message names the setting."""


@dataclass(frozen=True)
class GCConfig:
    """Nomad's client GC settings, with Nomad's defaults."""

    interval: float = 60.0  # gc_interval, seconds
    max_allocs: int = 50  # gc_max_allocs
    disk_usage_threshold: float = 80.0  # gc_disk_usage_threshold, percent
    inode_usage_threshold: float = 70.0  # gc_inode_usage_threshold, percent
    parallel_destroys: int = 2  # gc_parallel_destroys

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise GCConfigError("gc_interval must be more than 0s")
        if self.max_allocs < 1:
            raise GCConfigError("gc_max_allocs must be at least 1")
        for name, value in (
            ("gc_disk_usage_threshold", self.disk_usage_threshold),
            ("gc_inode_usage_threshold", self.inode_usage_threshold),
        ):
            if not 0 <= value <= 100:
                raise GCConfigError(f"{name} must be a percentage from 0 to 100")
        if self.parallel_destroys < 1:
            raise GCConfigError("gc_parallel_destroys must be at least 1")


@dataclass(frozen=True)
class Held:
    """A terminal alloc a node keeps: when it finished and what its directory holds."""

    alloc_id: str
    finished: float  # wall-clock seconds
    bytes: int = 0
    inodes: int = 0


@dataclass(frozen=True)
class NodeUsage:
    """One node at the start of a pass: its evictable kept allocs, what it cannot free, and its capacity.

    ``fixed_*`` is what no pass may evict: the live allocs (and kept ones
    whose cleanup failed, whose directories still use the disk).
    """

    held: tuple[Held, ...]
    fixed_count: int = 0
    fixed_bytes: int = 0
    fixed_inodes: int = 0
    disk_bytes: int = 1  # the node's configured disk size
    inodes: int = 1  # the node's configured inode count


def percent(used: int, capacity: int) -> float:
    """``used`` as a percentage of ``capacity`` (a node without capacity is full once used)."""
    if capacity <= 0:
        return 100.0 if used > 0 else 0.0
    return 100.0 * used / capacity


def eviction_order(held: Iterable[Held]) -> list[Held]:
    """Oldest-finished first; the alloc id breaks ties, so the order never depends on arrival."""
    return sorted(held, key=lambda h: (h.finished, h.alloc_id))


def pressure(
    used_bytes: int, used_inodes: int, count: int, node: NodeUsage, cfg: GCConfig
) -> str | None:
    """The first limit the node is over, in Nomad's order (disk, inodes, count), or None."""
    if percent(used_bytes, node.disk_bytes) > cfg.disk_usage_threshold:
        return DISK
    if percent(used_inodes, node.inodes) > cfg.inode_usage_threshold:
        return INODES
    if count > cfg.max_allocs:
        return COUNT
    return None


def plan_evictions(
    node: NodeUsage, cfg: GCConfig, *, count_only: bool = False
) -> list[tuple[Held, str]]:
    """The terminal allocs one pass evicts, in order, each with the reason it went.

    Re-checks the limits after each eviction, as if its directory were gone;
    ``count_only`` is the check before a placement (Nomad's ``MakeRoomFor``),
    where the new alloc is already in ``fixed_count``.
    """
    queue = eviction_order(node.held)
    used_bytes = node.fixed_bytes + sum(h.bytes for h in queue)
    used_inodes = node.fixed_inodes + sum(h.inodes for h in queue)
    count = node.fixed_count + len(queue)
    out: list[tuple[Held, str]] = []
    for victim in queue:
        if count_only:
            reason = COUNT if count > cfg.max_allocs else None
        else:
            reason = pressure(used_bytes, used_inodes, count, node, cfg)
        if reason is None:
            break
        out.append((victim, reason))
        used_bytes -= victim.bytes
        used_inodes -= victim.inodes
        count -= 1
    return out


def describe(reason: str, node: NodeUsage, cfg: GCConfig) -> str:
    """Why a pass started evicting, in words for the log line (Nomad's wording, our numbers)."""
    used_bytes = node.fixed_bytes + sum(h.bytes for h in node.held)
    used_inodes = node.fixed_inodes + sum(h.inodes for h in node.held)
    if reason == DISK:
        return f"disk usage of {percent(used_bytes, node.disk_bytes):.0f}% is over gc threshold of {cfg.disk_usage_threshold:g}%"
    if reason == INODES:
        return f"inode usage of {percent(used_inodes, node.inodes):.0f}% is over gc threshold of {cfg.inode_usage_threshold:g}%"
    if reason == COUNT:
        return f"number of allocations ({node.fixed_count + len(node.held)}) is over the limit ({cfg.max_allocs})"
    if reason == SERVER_GC:
        return "the servers garbage-collected the allocation"
    return "forced collection"
