"""The scheduler's view of the state: one consistent snapshot per evaluation.

``load_snapshot`` reads everything one evaluation needs inside a single read
transaction (one raft index). Per-node usage comes from ``node_usage_map``,
the one place that decides where usage comes from: the journal-driven
``fsm.caches.NodeUsageCache`` when the caller has one (the leader keeps one
per process), else a scan of each node's live allocations.

On the leader, ``load_snapshot`` is handed the ``scheduler.index.PlacementIndex``
instead: nodes and usage are then the index's own (decoded once, brought
forward from the journal to exactly the read's index, never copied per
evaluation; the caller holds the index's lock while it schedules), and the
selector takes its trait rankings from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsm.caches import NodeUsageCache
from fsm.store import StateReader
from fsm.structs import Allocation, Deployment, Evaluation, Job, Node, Resources
from scheduler.index import PlacementIndex
from scheduler.policy import DEFAULT_POLICY, Policy
from scheduler.traits import PlacementStats, RankingSource


@dataclass
class Snapshot:
    index: int
    now: int  # the leader's wall clock, ns (never behind the FSM's last time)
    eval: Evaluation
    job: Job | None
    allocs: list[Allocation]  # every alloc of the job, terminal ones too
    nodes: dict[str, Node]  # shared with the placement index when there is one: read only
    usage: dict[str, Resources]  # resources held by live allocs, per node (every job); read only
    deployment: Deployment | None = None  # the job's latest deployment
    versions: dict[int, Job] = field(default_factory=dict)  # kept versions of the job
    # deployment id -> the canaries it placed in groups it never promoted
    unpromoted_canaries: dict[str, set[str]] = field(default_factory=dict)
    # group -> the newest job version a rollout settled it on (promoted, or without canaries)
    settled: dict[str, int] = field(default_factory=dict)
    # How far the state's time runs ahead of the wall clock (after a leader whose clock ran
    # ahead): what a client's wall-clock stamp must be moved by to compare with ``now``.
    skew: int = 0
    # The replicated placement policy in force at ``index`` (scheduler/policy.py).
    policy: Policy = DEFAULT_POLICY
    # Where the selector gets trait rankings (the leader's placement index); None: built per eval.
    rankings: RankingSource | None = None
    # Per node, what plans still committing place there (the leader's plan applier; read only):
    # the selector counts it as used, as the applier will when it checks this plan.
    held: dict[str, Resources] = field(default_factory=dict)
    # False while the job waits in its queue (never admitted, or evicted): nothing of it may run.
    admitted: bool = True
    queue: str = ""  # the job's queue, for the stops' description
    # Filled by the selector: per placement, cache hit or miss and the nodes scored.
    stats: PlacementStats = field(default_factory=PlacementStats)


def scan_usage(reader: StateReader, node_id: str) -> Resources:
    """Resources held by the live allocs on one node, from the allocs_by_node index."""
    return Resources.total(alloc.resources for alloc in reader.allocs_by_node(node_id, terminal=False))


def node_usage_map(reader: StateReader, node_ids: list[str], cache: NodeUsageCache | None = None) -> dict[str, Resources]:
    """Usage of every node in ``node_ids`` at ``reader``'s index."""
    if cache is not None:
        cache.catch_up(reader)
        return {node_id: cache.usage(node_id) for node_id in node_ids}
    return {node_id: scan_usage(reader, node_id) for node_id in node_ids}


def load_snapshot(
    reader: StateReader, ev: Evaluation, now: int, cache: NodeUsageCache | None = None, *, index: PlacementIndex | None = None
) -> Snapshot:
    """Everything scheduling ``ev`` needs, read at one index.

    With ``index`` (whose lock the caller holds for as long as it uses the
    snapshot), nodes and usage are the index's, caught up to ``reader``; an
    index already past ``reader`` cannot go back, and the nodes are read here.
    """
    job = reader.job(ev.job_id)
    if index is not None and not index.catch_up(reader):
        index = None
    if index is not None:
        nodes, usage = index.nodes, index.usage
    else:
        nodes = {n.id: n for n in reader.nodes()}
        usage = node_usage_map(reader, sorted(nodes), cache)
    versions: dict[int, Job] = {}
    if job is not None:
        versions = {v.version: v for v in reader.job_versions(job.id)}
    deployments = reader.deployments_by_job(ev.job_id)  # read once: the latest, and every unpromoted canary
    state_now = reader.time_from(now)
    return Snapshot(
        index=reader.applied_index,
        now=state_now,
        skew=state_now - now,
        eval=ev,
        job=job,
        allocs=reader.allocs_by_job(ev.job_id),
        nodes=nodes,
        usage=usage,
        rankings=index,
        deployment=max(deployments, key=lambda d: d.create_index) if deployments else None,
        versions=versions,
        unpromoted_canaries=_unpromoted_canaries(deployments),
        settled=_settled_versions(deployments),
        policy=Policy.from_config(reader.scheduler_config()),
        admitted=_admitted(reader, job),
        queue=job.queue if job is not None else "",
    )


def _admitted(reader: StateReader, job: Job | None) -> bool:
    """Whether the job may run: it names no queue, or its workload is admitted."""
    if job is None or not job.queue:
        return True
    return reader.workload_admitted(job.id)


def _settled_versions(deployments: list[Deployment]) -> dict[str, int]:
    """Per group, the newest version whose rollout promoted it or had no canaries (Nomad's
    downgradedJobForPlacement): what replaces an old alloc while a newer version's canaries wait."""
    out: dict[str, int] = {}
    for dep in sorted(deployments, key=lambda d: -d.job_version):
        for name, state in dep.task_groups.items():
            if name not in out and (state.promoted or not state.desired_canaries):
                out[name] = dep.job_version
    return out


def _unpromoted_canaries(deployments: list[Deployment]) -> dict[str, set[str]]:
    out = {}
    for dep in deployments:
        ids = {i for s in dep.task_groups.values() if not s.promoted for i in s.placed_canaries}
        if ids:
            out[dep.id] = ids
    return out
