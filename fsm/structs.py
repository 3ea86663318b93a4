"""Records of the replicated state, after Nomad's structs.

Times are integer nanoseconds since the epoch, stamped by the leader (never by
the FSM). Durations are integer nanoseconds, as in Nomad's API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from fsm.record import CompactRecord, Record, field

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

JOB_TYPES = ("service", "batch", "system")
JOB_PENDING, JOB_RUNNING, JOB_DEAD = "pending", "running", "dead"

EVAL_PENDING, EVAL_BLOCKED = "pending", "blocked"
EVAL_COMPLETE, EVAL_FAILED, EVAL_CANCELED = "complete", "failed", "canceled"
EVAL_STATUSES = (EVAL_PENDING, EVAL_BLOCKED, EVAL_COMPLETE, EVAL_FAILED, EVAL_CANCELED)
EVAL_TERMINAL = frozenset((EVAL_COMPLETE, EVAL_FAILED, EVAL_CANCELED))

DESIRED_RUN, DESIRED_STOP, DESIRED_EVICT = "run", "stop", "evict"
DESIRED_STATUSES = (DESIRED_RUN, DESIRED_STOP, DESIRED_EVICT)
SERVER_TERMINAL = frozenset((DESIRED_STOP, DESIRED_EVICT))
CLIENT_PENDING, CLIENT_RUNNING = "pending", "running"
CLIENT_COMPLETE, CLIENT_FAILED, CLIENT_LOST = "complete", "failed", "lost"
CLIENT_STATUSES = (CLIENT_PENDING, CLIENT_RUNNING, CLIENT_COMPLETE, CLIENT_FAILED, CLIENT_LOST)
CLIENT_TERMINAL = frozenset((CLIENT_COMPLETE, CLIENT_FAILED, CLIENT_LOST))

DEPLOYMENT_RUNNING, DEPLOYMENT_PAUSED = "running", "paused"
DEPLOYMENT_SUCCESSFUL, DEPLOYMENT_FAILED, DEPLOYMENT_CANCELLED = "successful", "failed", "cancelled"
DEPLOYMENT_STATUSES = (
    DEPLOYMENT_RUNNING,
    DEPLOYMENT_PAUSED,
    DEPLOYMENT_SUCCESSFUL,
    DEPLOYMENT_FAILED,
    DEPLOYMENT_CANCELLED,
)
DEPLOYMENT_ACTIVE = frozenset((DEPLOYMENT_RUNNING, DEPLOYMENT_PAUSED))
DEPLOYMENT_DESC_RUNNING = "Deployment is running"
DEPLOYMENT_DESC_NEEDS_PROMOTION = "Deployment is running but requires manual promotion"
DEPLOYMENT_DESC_AUTO_PROMOTION = "Deployment is running pending automatic promotion"

NODE_INIT, NODE_READY, NODE_DOWN = "initializing", "ready", "down"
NODE_STATUSES = (NODE_INIT, NODE_READY, NODE_DOWN)
NODE_ELIGIBLE, NODE_INELIGIBLE = "eligible", "ineligible"

TOKEN_MANAGEMENT, TOKEN_CLIENT = "management", "client"


class Resources(Record, gc=False):
    """CPU (MHz), memory and disk (MB) and device counts: what an alloc claims, a node has, or a node has in use.

    Left out of the cyclic collector (``gc=False``): it holds only numbers
    and a map of names to counts, so it can never be part of a cycle, and
    the leader's placement index keeps one per live alloc. Tracked, the
    index's claims at 1M allocs were two million objects that every full
    pass of the collector walked: 0.4 s on a quiet machine, 0.6-1.1 s
    under a node-loss storm, with every thread stopped, raft's tick
    thread included, which cost leaders their leadership (issue #34). A
    claim's ``(node, Resources)`` tuple then leaves the collector too.

    The one place their arithmetic lives (the scheduler's placements, the
    usage cache, the plan applier's check): a new dimension is then one edit
    here rather than one in every copy. ``add`` and ``subtract`` work in place
    and return nothing, because the callers keep running totals on the
    placement path and a new record per step would be an allocation per node.

    ``devices`` maps a device name to a count, after Nomad's devices. Its keys
    mean different things on the two sides (see ``device_matches``):

    - a node's capacity and usage, and a placed alloc's claim, are keyed by
      the node's device names, ``vendor/type`` or ``vendor/type/model``
      (``nvidia/gpu``, ``nvidia/gpu/a100``); a node never has both a
      ``vendor/type`` and a ``vendor/type/model`` of the same vendor and type
      (``fsm.validate.check_node``), so every name is one pool of devices;
    - a task's ask uses Nomad's request names: ``type`` (any vendor's),
      ``vendor/type`` or ``vendor/type/model``; ``bound`` turns an ask into
      the node names it takes once the scheduler picked the node.

    Records without devices (nearly all) skip every device step: the
    arithmetic checks the dict's truth once and nothing more.
    """

    cpu: int = 100
    memory_mb: int = 300
    disk_mb: int = 0
    devices: dict[str, int] = field(default_factory=dict)

    @classmethod
    def zero(cls) -> Resources:
        """Nothing at all (the field defaults are a task's default ask, not zero)."""
        return cls(0, 0, 0, {})  # by position: a keyword call costs more, and zero() is on the placement path

    @classmethod
    def total(cls, parts: Iterable[Resources]) -> Resources:
        """A new record holding the sum of ``parts`` (zero if there are none)."""
        out = cls.zero()
        for r in parts:
            out.add(r)
        return out

    def copy(self) -> Resources:
        """An independent copy, so a running total can change without touching the original
        (its devices too: the copy gets a dict of its own)."""
        return Resources(self.cpu, self.memory_mb, self.disk_mb, dict(self.devices) if self.devices else {})

    def add(self, other: Resources) -> None:
        """Add ``other`` to this record, in place (a devices map is replaced, never changed in place:
        one that a shallow copy, ``record.replace`` or a decoded map shares stays as it was)."""
        self.cpu += other.cpu
        self.memory_mb += other.memory_mb
        self.disk_mb += other.disk_mb
        if other.devices:
            self.devices = count_sum(self.devices, other.devices, 1)

    def subtract(self, other: Resources) -> None:
        """Take ``other`` from this record, in place (nothing clamps it at zero; a device count
        that reaches zero is dropped, so subtracting what was added gives the record back)."""
        self.cpu -= other.cpu
        self.memory_mb -= other.memory_mb
        self.disk_mb -= other.disk_mb
        if other.devices:
            self.devices = count_sum(self.devices, other.devices, -1)

    def exhausted(self, capacity: Resources, used: Resources | None = None) -> str | None:
        """The first dimension ("cpu", "memory", "disk", "device NAME") in which this ask does not fit, or None.

        It fits when ``used`` plus this ask stays within ``capacity`` in each
        dimension. Disk counts only when the ask asks for some: nodes that
        do not report disk (capacity 0) still take disk-less allocs, as before.
        Devices count only when the ask names some (``device_shortfall``).
        ``used`` None is nothing in use (without building a zero record per call).
        """
        if used is None:
            used = _NOTHING
        if used.cpu + self.cpu > capacity.cpu:
            return "cpu"
        if used.memory_mb + self.memory_mb > capacity.memory_mb:
            return "memory"
        if used.disk_mb + self.disk_mb > capacity.disk_mb and self.disk_mb > 0:
            return "disk"
        if self.devices:
            name = device_shortfall(self.devices, capacity.devices, used.devices)
            if name is not None:
                return DEVICE_DIMENSION + name
        return None

    def fits(self, capacity: Resources, used: Resources | None = None) -> bool:
        """Whether this ask fits in ``capacity`` on top of ``used`` (see ``exhausted``)."""
        return self.exhausted(capacity, used) is None

    def bound(self, capacity: Resources, used: Resources | None = None) -> Resources:
        """A copy of this ask with its devices named as the node names them (``capacity``'s keys).

        What a placed alloc claims: the node's usage is kept per node device
        name, so an ask for ``gpu`` or ``nvidia/gpu`` must say which of the
        node's devices it holds. Call it on a node the ask fits (``exhausted``
        None); a device-less ask is just copied.
        """
        out = self.copy()
        if self.devices:
            taken = assign_devices(self.devices, capacity.devices, (used or _NOTHING).devices)
            out.devices = taken if isinstance(taken, dict) else {}
        return out

    def utilization(self, capacity: Resources, used: Resources | None = None) -> float:
        """Mean of the cpu and memory fractions of ``capacity`` in use once this ask is placed (0..1).

        Disk is left out, as in Nomad's bin-packing score; a dimension the
        node has none of does not count (no division by zero).
        """
        if used is None:
            used = _NOTHING
        parts = []
        if capacity.cpu > 0:
            parts.append((used.cpu + self.cpu) / capacity.cpu)
        if capacity.memory_mb > 0:
            parts.append((used.memory_mb + self.memory_mb) / capacity.memory_mb)
        return min(1.0, sum(parts) / len(parts)) if parts else 0.0


#: What ``exhausted`` puts before a device's name ("device nvidia/gpu").
DEVICE_DIMENSION = "device "


def device_matches(ask: str, name: str) -> bool:
    """Whether a node's device ``name`` (``vendor/type[/model]``) serves a request for ``ask``.

    Nomad's request names: ``type`` matches that type of any vendor,
    ``vendor/type`` every model of that vendor's type, ``vendor/type/model``
    only that model (a node that does not name its model has none to match).
    """
    want = ask.split("/")
    have = name.split("/")
    if len(want) == 1:
        return len(have) >= 2 and have[1] == want[0]
    if len(want) == 2:
        return have[:2] == want
    return have == want


def assign_devices(asks: dict[str, int], capacity: dict[str, int], used: dict[str, int]) -> dict[str, int] | str:
    """Which of the node's free devices ``asks`` take (node name -> count), or the first ask that finds too few.

    The most specific asks go first (model, then vendor/type, then type):
    what one request name matches either contains or is apart from what
    another matches, so a less specific ask can use whatever the more
    specific ones leave, and this greedy order finds a fit whenever one exists.
    """
    taken: dict[str, int] = {}
    for ask in sorted(asks, key=lambda a: (-a.count("/"), a)):
        need = asks[ask]
        for name in sorted(capacity):
            if need <= 0:
                break
            if not device_matches(ask, name):
                continue
            free = capacity[name] - used.get(name, 0) - taken.get(name, 0)
            if free > 0:
                take = min(free, need)
                taken[name] = taken.get(name, 0) + take
                need -= take
        if need > 0:
            return ask
    return taken


def device_shortfall(asks: dict[str, int], capacity: dict[str, int], used: dict[str, int]) -> str | None:
    """The first device ask that ``capacity`` minus ``used`` cannot serve, or None if all fit."""
    found = assign_devices(asks, capacity, used)
    return found if isinstance(found, str) else None


def count_sum(mine: Mapping[str, int], other: Mapping[str, int], sign: int = 1) -> dict[str, int]:
    """``mine`` plus ``sign`` times ``other``, as a new dict without zero counts (``mine`` may be shared).

    Counts by name: a record's devices, and a queue's usage (``fsm.quota``)."""
    out = dict(mine)
    for name, n in other.items():
        total = out.get(name, 0) + sign * n
        if total:
            out[name] = total
        else:
            out.pop(name, None)
    return out


# What ``used=None`` stands for. Only ever read: ``zero()`` hands out records to change.
_NOTHING = Resources.zero()


class Constraint(CompactRecord):
    l_target: str = ""
    r_target: str = ""
    operand: str = "="


class ReschedulePolicy(CompactRecord):
    attempts: int = 0
    interval: int = 0
    delay: int = 30 * SECOND
    delay_function: str = "exponential"
    max_delay: int = HOUR
    unlimited: bool = True


class UpdateStrategy(CompactRecord):
    max_parallel: int = 1
    min_healthy_time: int = 10 * SECOND
    healthy_deadline: int = 5 * MINUTE
    progress_deadline: int = 10 * MINUTE
    auto_revert: bool = False
    # Canaries: a new version first places this many allocs beside the old
    # ones and replaces nothing until the rollout is promoted.
    canary: int = 0
    auto_promote: bool = False


class MigrateStrategy(CompactRecord):
    """Nomad's migrate block: how a node drain moves a service group's allocs.

    At most ``max_parallel`` of the group's allocs are moving at once: the
    drainer marks the next ones only as replacements turn healthy (after
    ``min_healthy_time``; unhealthy once ``healthy_deadline`` passes).
    """

    max_parallel: int = 1
    health_check: str = "checks"
    min_healthy_time: int = 10 * SECOND
    healthy_deadline: int = 5 * MINUTE


class Task(CompactRecord):
    name: str
    driver: str = "sim"
    config: dict[str, Any] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    meta: dict[str, str] = field(default_factory=dict)


class TaskGroup(CompactRecord):
    name: str
    count: int = 1
    tasks: list[Task] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    reschedule_policy: ReschedulePolicy | None = None
    update: UpdateStrategy | None = None
    meta: dict[str, str] = field(default_factory=dict)
    migrate: MigrateStrategy | None = None  # None: Nomad's defaults (service jobs; others are not migrated in steps)


class Job(CompactRecord):
    id: str
    name: str = ""
    namespace: str = "default"
    type: str = "service"
    priority: int = 50
    # The Kueue-style queue the job is a workload of, and its priority class, by name
    # ("": none, admitted as every job is). Caravan's, not Nomad's; read, kept and shown only.
    queue: str = ""
    priority_class: str = ""
    datacenters: list[str] = field(default_factory=lambda: ["dc1"])
    task_groups: list[TaskGroup] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    periodic: bool = False
    parameterized: bool = False
    stop: bool = False
    stable: bool = False
    status: str = JOB_PENDING
    status_description: str = ""
    version: int = 0
    submit_time: int = 0
    create_index: int = 0
    modify_index: int = 0
    job_modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0


class TaskGroupSummary(Record):
    queued: int = 0
    complete: int = 0
    failed: int = 0
    running: int = 0
    starting: int = 0
    lost: int = 0
    unknown: int = 0


class JobSummary(Record):
    job_id: str
    namespace: str = "default"
    summary: dict[str, TaskGroupSummary] = field(default_factory=dict)
    create_index: int = 0
    modify_index: int = 0


class Evaluation(CompactRecord):
    id: str
    job_id: str
    namespace: str = "default"
    priority: int = 50
    type: str = "service"
    triggered_by: str = "job-register"
    job_modify_index: int = 0
    node_id: str = ""
    deployment_id: str = ""
    status: str = EVAL_PENDING
    status_description: str = ""
    wait_until: int = 0
    next_eval: str = ""
    previous_eval: str = ""
    blocked_eval: str = ""
    failed_tg_allocs: dict[str, str] = field(default_factory=dict)
    queued_allocations: dict[str, int] = field(default_factory=dict)
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0


class TaskState(Record):
    state: str = "pending"
    failed: bool = False
    restarts: int = 0
    started_at: int = 0
    finished_at: int = 0


class RescheduleEvent(Record):
    reschedule_time: int
    prev_alloc_id: str
    prev_node_id: str
    delay: int


class RescheduleTracker(Record):
    events: list[RescheduleEvent] = field(default_factory=list)


class DesiredTransition(Record):
    migrate: bool = False
    reschedule: bool = False
    force_reschedule: bool = False


class DeploymentStatus(Record):
    healthy: bool | None = None
    timestamp: int = 0
    canary: bool = False


class Allocation(Record):
    id: str
    eval_id: str
    job_id: str
    node_id: str
    task_group: str
    name: str = ""
    namespace: str = "default"
    job_version: int = 0
    resources: Resources = field(default_factory=Resources)
    desired_status: str = DESIRED_RUN
    desired_description: str = ""
    client_status: str = CLIENT_PENDING
    client_description: str = ""
    task_states: dict[str, TaskState] = field(default_factory=dict)
    reschedule_tracker: RescheduleTracker | None = None
    desired_transition: DesiredTransition = field(default_factory=DesiredTransition)
    followup_eval_id: str = ""
    previous_allocation: str = ""
    next_allocation: str = ""
    deployment_id: str = ""
    deployment_status: DeploymentStatus | None = None
    create_index: int = 0
    modify_index: int = 0
    alloc_modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    def server_terminal(self) -> bool:
        return self.desired_status in (DESIRED_STOP, DESIRED_EVICT)

    def client_terminal(self) -> bool:
        return self.client_status in CLIENT_TERMINAL

    def terminal(self) -> bool:
        """Nomad's TerminalStatus: desired stop/evict, or a terminal client status."""
        return self.server_terminal() or self.client_terminal()


def alloc_map_terminal(data: Mapping[str, Any]) -> bool:
    """``Allocation.terminal`` of an alloc's stored map (the paths that skip building the alloc)."""
    return data["desired_status"] in SERVER_TERMINAL or data["client_status"] in CLIENT_TERMINAL



class AllocStatus(msgspec.Struct):
    """The few fields of a stored ``Allocation`` that a scan over every alloc reads.

    Decoding only these from an alloc's map takes about a third of the time
    of the whole map (2.8 against 7.7 us): a new leader reading a million
    allocs for the jobs a failover left without an eval starts seconds
    sooner. Read-only, from our own store (``StateReader.alloc_statuses``).
    """

    job_id: str
    node_id: str
    desired_status: str = DESIRED_RUN
    client_status: str = CLIENT_PENDING
    followup_eval_id: str = ""
    next_allocation: str = ""

class DeploymentState(Record):
    desired_total: int = 0
    placed_allocs: int = 0
    healthy_allocs: int = 0
    unhealthy_allocs: int = 0
    auto_revert: bool = False
    progress_deadline: int = 0
    require_progress_by: int = 0
    desired_canaries: int = 0
    placed_canaries: list[str] = field(default_factory=list)
    promoted: bool = False
    auto_promote: bool = False

    def awaits_promotion(self) -> bool:
        return self.desired_canaries > 0 and not self.promoted


class Deployment(Record):
    id: str
    job_id: str
    namespace: str = "default"
    job_version: int = 0
    job_modify_index: int = 0
    job_create_index: int = 0
    status: str = DEPLOYMENT_RUNNING
    status_description: str = ""
    task_groups: dict[str, DeploymentState] = field(default_factory=dict)
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0

    def active(self) -> bool:
        return self.status in DEPLOYMENT_ACTIVE


class DrainStrategy(Record):
    """Nomad's DrainStrategy: a node is being emptied so it can be taken out of service.

    ``deadline`` > 0: what has not moved by then is moved at once
    (``force_deadline``, the state's time the FSM stamps from the drain's
    start); 0: no deadline; < 0: everything at once (``-force``).
    """

    deadline: int = 0
    ignore_system_jobs: bool = False
    force_deadline: int = 0
    started_at: int = 0

    def forced(self, now: int) -> bool:
        """Whether everything left on the node is to move now."""
        return self.deadline < 0 or (self.force_deadline > 0 and now >= self.force_deadline)


#: Node attributes that place a node in the topology, as Nomad clients set ``meta``: clients
#: set them at registration, constraints read them as ``${meta.cluster}`` / ``${meta.rack}``,
#: and the scheduler's cluster rules group nodes by the first ("" when a node names none).
CLUSTER_ATTRIBUTE = "meta.cluster"
RACK_ATTRIBUTE = "meta.rack"


class Node(Record):
    id: str
    name: str = ""
    datacenter: str = "dc1"
    node_class: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=lambda: Resources(cpu=4000, memory_mb=8192, disk_mb=0))
    status: str = NODE_INIT
    status_description: str = ""
    status_updated_at: int = 0
    drain: bool = False
    scheduling_eligibility: str = NODE_ELIGIBLE
    drain_strategy: DrainStrategy | None = None  # set while draining (``drain`` is true)
    create_index: int = 0
    modify_index: int = 0
    create_time: int = 0
    modify_time: int = 0
    # SHA-256 of the SecretID the client chose at registration (as Nomad's node
    # secret); never the secret itself. Empty: registered without one (older callers).
    secret_hash: str = ""


class ACLToken(Record):
    """An ACL token. Only a SHA-256 of the secret is ever stored or replicated."""

    accessor_id: str
    secret_hash: str
    name: str = ""
    type: str = TOKEN_CLIENT
    policies: list[str] = field(default_factory=list)
    global_: bool = False
    expiration_time: int = 0
    create_time: int = 0
    create_index: int = 0
    modify_index: int = 0

    def expired(self, now: int) -> bool:
        return self.expiration_time != 0 and self.expiration_time <= now


ACL_POLICY_WORDS = ("deny", "read", "write", "scale")  # a namespace's ``policy``
ACL_LEVELS = ("deny", "read", "write")  # node, agent and operator ``policy``


class ACLNamespaceRule(Record):
    """One ``namespace "name" { policy = ..., capabilities = [...] }`` block; ``name`` may hold ``*`` globs."""

    name: str
    policy: str = ""
    capabilities: list[str] = field(default_factory=list)


class ACLPolicy(Record):
    """A named ACL policy (Nomad's ACLPolicy): its rules as written, and as parsed by the leader.

    The leader parses the HCL/JSON once, before the log; every server then
    authorizes from the parsed fields, so no server parses on a request path.
    """

    name: str
    description: str = ""
    rules: str = ""
    namespaces: list[ACLNamespaceRule] = field(default_factory=list)
    node: str = ""  # "" (no rule), deny, read or write
    agent: str = ""
    operator: str = ""
    create_index: int = 0
    modify_index: int = 0
