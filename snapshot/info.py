"""What a snapshot holds, as ``inspect`` shows it (after ``nomad operator snapshot inspect``).

``SnapshotInfo`` is what ``verify``, ``inspect`` and the writers return, so a
caller that just saved a snapshot can print the same summary an operator gets
from inspecting the file later.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from snapshot.format import SnapshotMeta, TypeStat


@dataclass
class SnapshotInfo:
    """A verified snapshot's identity and contents."""

    path: str
    id: str
    size: int  # bytes of the file
    index: int  # FSM applied index the state reflects
    term: int | None
    raft_index: int | None  # pysyncobj's last applied log index (raft dumps only)
    version: str  # format version "major.minor"
    caravan_version: str
    created: int  # ns since the epoch
    cluster_id: str
    sha256: str
    types: list[TypeStat] = field(default_factory=list)  # sorted by size, largest first
    meta: SnapshotMeta | None = None
    # Record types this build does not know; verify and restore refuse those without the ignore flag.
    unknown_types: list[int] = field(default_factory=list)

    @property
    def total_count(self) -> int:
        return sum(t.count for t in self.types)

    @property
    def total_size(self) -> int:
        return sum(t.size for t in self.types)

    @property
    def is_raft_dump(self) -> bool:
        return self.raft_index is not None

    def created_iso(self) -> str:
        when = _dt.datetime.fromtimestamp(self.created / 1e9, tz=_dt.UTC)
        return when.isoformat(timespec="seconds").replace("+00:00", "Z")

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: the same fields as the text, sizes in bytes."""
        return {
            "ID": self.id,
            "Size": self.size,
            "Index": self.index,
            "Term": self.term,
            "Version": self.version,
            "Created": self.created_iso(),
            "CaravanVersion": self.caravan_version,
            "ClusterID": self.cluster_id,
            "RaftIndex": self.raft_index,
            "SHA256": self.sha256,
            "Types": [
                {"Name": t.name, "Code": t.code, "Count": t.count, "Size": t.size}
                for t in self.types
            ],
            "TotalCount": self.total_count,
            "TotalSize": self.total_size,
        }


def human_bytes(n: int) -> str:
    """IEC units with one decimal, as Nomad's inspect prints sizes."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def format_info(info: SnapshotInfo) -> str:
    """The text form of ``inspect``: key = value lines, then Type | Count | Size with a Total row."""
    rows = [
        ("ID", info.id),
        ("Size", human_bytes(info.size)),
        ("Index", str(info.index)),
        ("Term", "-" if info.term is None else str(info.term)),
        ("Version", info.version),
        ("Created", info.created_iso()),
        ("Caravan Version", info.caravan_version or "-"),
        ("Cluster ID", info.cluster_id or "-"),
    ]
    if info.raft_index is not None:
        rows.append(("Raft Index", str(info.raft_index)))
    rows.append(("SHA-256", info.sha256))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)} = {v}" for k, v in rows]
    table = [("Type", "Count", "Size")]
    table += [(t.name, str(t.count), human_bytes(t.size)) for t in info.types if t.count]
    table.append(("Total", str(info.total_count), human_bytes(info.total_size)))
    widths = [max(len(r[i]) for r in table) for i in range(3)]
    lines.append("")
    for name, count, size in table:
        lines.append(f" {name.ljust(widths[0])}  {count.rjust(widths[1])}  {size.rjust(widths[2])}")
    return "\n".join(lines)
