"""Part 1: packing density of a packing trace replayed through the real Selector.

Every arrival is placed by ``scheduler.ranking.Selector`` with the
feasibility rules of ``scheduler.feasibility`` and the preference rules a
``scheduler.policy.Policy`` builds: BestFit quantized into 1, 3, 5 or
"unlimited" (``policy.MAX_BUCKETS``) buckets, in strict priority, then the
selector's random tie-break. Every departure frees what the VM held.

Two ways to drive the selector (``--density-mode``):

- ``eval`` (the cluster's way): a fresh Selector over all machines for each
  arrival, seeded per request, as a one-request evaluation builds one; ties
  are broken at random anew for every request. Costs O(machines) per
  placement, so it runs at hundreds of machines.
- ``incremental``: one Selector for the whole trace, VM types as its task
  groups, arrivals through ``select``/``claim`` and departures through
  ``release`` (the incremental path a many-alloc evaluation uses). Cheap per
  placement, so it runs at thousands of machines, but the tie-break order is
  drawn once for the whole trace: ties then go to the same machines every
  time, which is first-fit in one random order, not a fresh random choice.

Packing density is Protean's: cores allocated over the cores of non-empty
machines, averaged over time from the end of the warm-up to the end of the
trace. Beside it: utilization (cores allocated over all cores) — at a high
fill it bounds density from below whatever the policy, so the cluster size
matters as much as the policy — and the arrivals that found no machine.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from fsm.structs import NODE_READY, Node, Resources
from scheduler.feasibility import Ask, PlacementContext
from scheduler.policy import MAX_BUCKETS, Policy, Preference
from scheduler.ranking import Request, Selector
from tests.bench.placement import anchors
from tests.bench.placement import trace as tr
from tests.bench.placement.table import pct, render, verdict

CPU_PER_CORE = 1000  # Resources.cpu units per core
MIB_PER_MACHINE = tr.MACHINE_CORES * tr.MACHINE_GIB_PER_CORE * 1024
BUCKETS = (("1", 1), ("3", 3), ("5", 5), ("unlimited", MAX_BUCKETS))


@dataclass
class DensityResult:
    label: str
    buckets: int
    mode: str
    machines: int
    density: float = 0.0  # time-averaged after warm-up
    utilization: float = 0.0
    nonempty: float = 0.0  # time-averaged share of machines running something
    peak_fill: float = 0.0
    placed: int = 0
    failed: Counter[int] = field(default_factory=Counter)  # priority -> arrivals that found no machine
    seconds: float = 0.0

    @property
    def per_placement_us(self) -> float:
        return 1e6 * self.seconds / max(1, self.placed + sum(self.failed.values()))


def machines_for(trace: tr.Trace, fill: float) -> int:
    """Enough machines that the trace's peak demand fills ``fill`` of their cores."""
    return max(1, math.ceil(trace.peak() / fill))


def make_nodes(machines: int) -> list[Node]:
    cap = Resources(cpu=tr.MACHINE_CORES * CPU_PER_CORE, memory_mb=MIB_PER_MACHINE, disk_mb=0)
    return [Node(id=f"m{i:06d}", name=f"machine-{i}", status=NODE_READY, resources=cap.copy()) for i in range(machines)]


def ask_of(vm_type: tr.VMType) -> Ask:
    res = Resources(cpu=max(1, round(vm_type.core * tr.MACHINE_CORES * CPU_PER_CORE)),
                    memory_mb=max(1, round(vm_type.memory * MIB_PER_MACHINE)), disk_mb=0)
    return Ask(job_id=f"vmtype-{vm_type.vm_type_id}", group="vm", resources=res, drivers=(), constraints=(),
               datacenters=("dc1",))


def policy_for(buckets: int, then: tuple[str, ...]) -> Policy:
    policy = Policy(preference=(Preference("best-fit", buckets),) + tuple(Preference(n) for n in then))
    policy.check()
    return policy


def replay(trace: tr.Trace, machines: int, label: str, buckets: int, *, mode: str = "eval", seed: int = 1,
           warmup: float = 0.25, then: tuple[str, ...] = ()) -> DensityResult:
    """Replay ``trace`` on ``machines`` machines; density averaged from ``warmup`` (a fraction of the trace) on."""
    rules = policy_for(buckets, then).preference_rules()
    nodes = make_nodes(machines)
    asks = {k: ask_of(t) for k, t in trace.types.items()}
    usage: dict[str, Resources] = {}
    shared = Selector(nodes, PlacementContext(usage=usage), rng=random.Random(seed), rules=rules) if mode == "incremental" else None
    vms = [vm for vm in trace.vms if vm.end is None or vm.end > vm.start]  # a VM of no duration never runs
    events = [(vm.start, 1, vm.vm_id, vm) for vm in vms]
    events += [(vm.end, 0, vm.vm_id, vm) for vm in vms if vm.end is not None]
    events.sort(key=lambda e: e[:3])  # departures before arrivals at the same time

    res = DensityResult(label, buckets, mode, machines)
    where: dict[int, Node] = {}
    count: Counter[str] = Counter()  # VMs per machine
    cores = 0.0  # machine fractions allocated
    nonempty = 0
    start_avg = warmup * trace.days
    last_t = start_avg
    area_density = area_util = area_nonempty = 0.0
    t0 = time.perf_counter()
    for t, arrival, vm_id, vm in events:
        if t > last_t:  # integrate the state since the last event
            dt = t - last_t
            if nonempty:
                area_density += dt * cores / nonempty
            area_util += dt * cores / machines
            area_nonempty += dt * nonempty / machines
            last_t = t
        ask = asks[vm.vm_type_id]
        core = trace.types[vm.vm_type_id].core
        if not arrival:
            node = where.pop(vm_id, None)
            if node is None:
                continue  # it was never placed
            if shared is not None:
                shared.release(node.id, ask.resources, same_job=True)
            else:
                usage[node.id].subtract(ask.resources)
            count[node.id] -= 1
            nonempty -= count[node.id] == 0
            cores -= core
            continue
        if shared is not None:
            sel = shared
        else:  # a one-request evaluation: its own selector and tie-break
            sel = Selector(nodes, PlacementContext(usage=usage), rng=random.Random(seed * 1_000_003 + vm_id), rules=rules)
        node = sel.select(Request(ask))
        if node is None:
            res.failed[vm.priority] += 1
            continue
        sel.claim(node, ask)
        where[vm_id] = node
        nonempty += count[node.id] == 0
        count[node.id] += 1
        cores += core
        res.placed += 1
        res.peak_fill = max(res.peak_fill, cores / machines)
    res.seconds = time.perf_counter() - t0
    span = trace.days - start_avg
    if trace.days > last_t:  # the last stretch, up to the end of the trace
        dt = trace.days - last_t
        area_density += dt * cores / nonempty if nonempty else 0.0
        area_util += dt * cores / machines
        area_nonempty += dt * nonempty / machines
    if span > 0:
        res.density, res.utilization, res.nonempty = area_density / span, area_util / span, area_nonempty / span
    return res


def ordering_matches(results: list[DensityResult]) -> bool:
    """Protean's ordering: density grows with the number of buckets (1 < 3 < 5 < unlimited)."""
    return all(a.density < b.density for a, b in zip(results, results[1:], strict=False))


def report(results: list[DensityResult], trace: tr.Trace, header: str) -> str:
    rows = []
    for r in results:
        paper = anchors.PROTEAN_DENSITY.get(r.label)
        fails = f"{r.failed[0]:,} / {r.failed[1]:,}"
        rows.append([r.label, pct(r.density), pct(paper), verdict(None if paper is None else r.density >= paper),
                     pct(r.utilization), pct(r.nonempty), pct(r.peak_fill), fails, f"{r.per_placement_us:,.0f}"])
    table = render(["BestFit buckets", "density", "Protean", "vs paper", "utilization", "non-empty", "peak fill",
                    "no room (hi/lo)", "us/placement"], rows)
    ours = " < ".join(f"{r.label} {100 * r.density:.1f}%" for r in results)
    same = ordering_matches(results)
    each = all(r.density >= anchors.PROTEAN_DENSITY.get(r.label, 0.0) for r in results)
    lines = [
        header,
        table,
        f"ordering: ours {ours.replace(' < ', ', ')}; Protean increases with the buckets: {'same ordering' if same else 'NOT the same ordering'}",
        f"target (same ordering, each at or above the paper's): {verdict(same and each)}",
    ]
    return "\n".join(lines)


def run(trace: tr.Trace, machines: int, mode: str, seed: int, warmup: float, then: tuple[str, ...],
        labels: tuple[str, ...] = tuple(label for label, _b in BUCKETS), progress: bool = True) -> list[DensityResult]:
    out = []
    for label, buckets in BUCKETS:
        if label not in labels:
            continue
        if progress:
            print(f"  ... density: {mode}, {label} bucket(s), {machines:,} machines", file=sys.stderr, flush=True)
        out.append(replay(trace, machines, label, buckets, mode=mode, seed=seed, warmup=warmup, then=then))
    return out
