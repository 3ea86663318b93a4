"""A synthetic packing trace in the AzurePackingTraceV1 schema, and a reader for that schema.

The public trace (AzurePublicDataset, one SQLite file per zone) cannot be
downloaded here, so ``generate`` draws one from a seeded distribution, the
one ``describe`` prints beside the results:

- **VM types** as fractions of one 48-core machine: sizes of 1, 2, 4, 8, 16,
  24, 32 and 48 cores with popularity 28, 28, 20, 13, 6, 3, 1.5 and 0.5%
  (mostly small, a tail of large: 5.1 cores on average), each in three
  memory families of 2, 4 and 8 GiB per core (30, 50, 20%) on a machine of
  8 GiB per core;
- **arrivals**: a Poisson process whose rate follows a day's cycle,
  ``rate * (1 + 0.3 sin(2 pi t))`` (t in days), drawn by thinning;
- **lifetimes**: heavy-tailed, Lomax (Pareto II) with shape 1.5 and a
  scale giving the mean lifetime asked (median 0.29 of the mean); a VM still
  running at the end of the trace has no end time, as in the real trace;
- **priorities**: 0 (high) for 85% of VMs, 1 (low) for 15%; **tenants**:
  1,000, uniformly.

``write`` stores a trace as the real file does (tables ``vm`` and
``vmType``, times in fractional days), and ``read`` reads such a file —
ours or, if you have it, the real one (``--trace``): for a real file it
keeps the machine generation (``machineId``) with the most VM types.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections import Counter
from dataclasses import dataclass

MACHINE_CORES = 48
MACHINE_GIB_PER_CORE = 8
SIZES = ((1, 0.28), (2, 0.28), (4, 0.20), (8, 0.13), (16, 0.06), (24, 0.03), (32, 0.015), (48, 0.005))
FAMILIES = ((2, 0.30), (4, 0.50), (8, 0.20))  # GiB per core
DIURNAL = 0.3
LOMAX_SHAPE = 1.5
HIGH_PRIORITY = 0.85
TENANTS = 1000


@dataclass(frozen=True)
class VMType:
    vm_type_id: int
    core: float  # fraction of one machine
    memory: float


@dataclass(frozen=True)
class VM:
    vm_id: int
    tenant_id: int
    vm_type_id: int
    priority: int  # 0 high, 1 low
    start: float  # fractional days
    end: float | None  # None: still running when the trace ends


@dataclass
class Trace:
    types: dict[int, VMType]
    vms: list[VM]
    days: float
    source: str

    def demand(self) -> list[tuple[float, float]]:
        """(time, cores in use as machine fractions) after each event, if every VM were placed."""
        events = []
        for vm in self.vms:
            core = self.types[vm.vm_type_id].core
            events.append((vm.start, 1, core))
            if vm.end is not None:
                events.append((vm.end, 0, -core))
        events.sort()
        out, total = [], 0.0
        for t, _kind, delta in events:
            total += delta
            out.append((t, total))
        return out

    def peak(self, after: float = 0.0) -> float:
        """The most machine-fractions of cores ever in use (from ``after`` on)."""
        return max((c for t, c in self.demand() if t >= after), default=0.0)


def vm_types() -> dict[int, VMType]:
    types, n = {}, 0
    for cores, _w in SIZES:
        for gib, _f in FAMILIES:
            n += 1
            types[n] = VMType(n, cores / MACHINE_CORES, min(1.0, cores * gib / (MACHINE_CORES * MACHINE_GIB_PER_CORE)))
    return types


def generate(vms: int, days: float, mean_life: float, seed: int) -> Trace:
    """About ``vms`` arrivals (a Poisson count) over ``days``, lifetimes of ``mean_life`` days on average."""
    rng = random.Random(seed)
    types = vm_types()
    weights = [ws * wf for _c, ws in SIZES for _g, wf in FAMILIES]
    ids = list(types)
    rate = vms / days
    peak_rate = rate * (1 + DIURNAL)
    scale = mean_life * (LOMAX_SHAPE - 1)  # Lomax mean = scale / (shape - 1)
    out: list[VM] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak_rate)
        if t >= days:
            break
        if rng.random() > (1 + DIURNAL * math.sin(2 * math.pi * t)) / (1 + DIURNAL):
            continue  # thinning: the day's cycle
        life = scale * ((1.0 - rng.random()) ** (-1 / LOMAX_SHAPE) - 1)  # inverse CDF of Lomax
        end = t + life
        out.append(VM(
            vm_id=len(out) + 1,
            tenant_id=rng.randrange(TENANTS),
            vm_type_id=rng.choices(ids, weights)[0],
            priority=0 if rng.random() < HIGH_PRIORITY else 1,
            start=t,
            end=end if end < days else None,
        ))
    out.sort(key=lambda v: (v.start, v.vm_id))
    return Trace(types, out, days, f"synthetic, seed {seed}")


def describe(trace: Trace, mean_life: float) -> str:
    if not trace.source.startswith("synthetic"):
        return f"trace {trace.source}: {len(trace.vms):,} VMs over {trace.days:.2f} days, {len(trace.types)} VM types"
    cores = sum(trace.types[v.vm_type_id].core for v in trace.vms) / len(trace.vms) * MACHINE_CORES
    low = sum(1 for v in trace.vms if v.priority == 1) / len(trace.vms)
    return (
        f"trace: AzurePackingTraceV1 schema, {trace.source}: {len(trace.vms):,} VMs over {trace.days:g} days; "
        f"{len(trace.types)} VM types as fractions of a {MACHINE_CORES}-core machine, sizes 1-48 cores weighted "
        f"{'/'.join(f'{100 * w:g}' for _c, w in SIZES)}% (mean {cores:.1f} cores), memory 2/4/8 GiB per core; "
        f"arrivals Poisson with a daily cycle (+-{100 * DIURNAL:.0f}%); lifetimes Lomax(shape {LOMAX_SHAPE}), "
        f"mean {mean_life:g} d; priority low {100 * low:.0f}%"
    )


# -- the AzurePackingTraceV1 schema ---------------------------------------------------
SCHEMA = """
CREATE TABLE vm (vmId INTEGER, tenantId INTEGER, vmTypeId INTEGER, priority INTEGER, starttime REAL, endtime REAL);
CREATE TABLE vmType (id INTEGER, vmTypeId INTEGER, machineId INTEGER, core REAL, memory REAL, hdd REAL, ssd REAL, nic REAL);
"""


def write(trace: Trace, path: str) -> None:
    db = sqlite3.connect(path)
    try:
        db.executescript(SCHEMA)
        db.executemany("INSERT INTO vmType VALUES (?, ?, 0, ?, ?, 0, 0, 0)",
                       [(t.vm_type_id, t.vm_type_id, t.core, t.memory) for t in trace.types.values()])
        db.executemany("INSERT INTO vm VALUES (?, ?, ?, ?, ?, ?)",
                       [(v.vm_id, v.tenant_id, v.vm_type_id, v.priority, v.start, v.end) for v in trace.vms])
        db.commit()
    finally:
        db.close()


def read(path: str, limit: int = 0) -> Trace:
    """A trace file in the AzurePackingTraceV1 schema (VMs that start before 0 start at 0)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT vmTypeId, machineId, core, memory FROM vmType").fetchall()
        per_machine = Counter(r[1] for r in rows)
        machine = per_machine.most_common(1)[0][0]
        types = {int(r[0]): VMType(int(r[0]), float(r[2]), float(r[3])) for r in rows if r[1] == machine and r[2] > 0}
        query = "SELECT vmId, tenantId, vmTypeId, priority, starttime, endtime FROM vm ORDER BY starttime, vmId"
        if limit:
            query += f" LIMIT {int(limit)}"
        vms = [
            VM(int(r[0]), int(r[1] or 0), int(r[2]), int(r[3] or 0), max(0.0, float(r[4])), None if r[5] is None else float(r[5]))
            for r in db.execute(query) if int(r[2]) in types and (r[5] is None or float(r[5]) > 0)
        ]
    finally:
        db.close()
    days = max([v.start for v in vms] + [v.end for v in vms if v.end is not None] + [0.0])
    return Trace(types, vms, days, f"{path} (machineId {machine})")
