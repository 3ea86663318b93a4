"""Log entry types and their payloads.

Type codes are stable integers and are never reused. A code with
``IGNORE_FLAG`` set that this version does not know is skipped; any other
unknown code stops the node (it must not diverge from newer peers).

Every entry is ``type byte | msgpack({"v", "time", "rid", "body"})``: the
leader stamps ``time`` (wall clock, ns) and a request id ``rid`` that makes
client retries idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgspec

from fsm import codec
from fsm.errors import CodecError
from fsm.queues import Eviction, PriorityClass, Queue
from fsm.record import CompactRecord, field
from fsm.scheduler_config import SchedulerConfig
from fsm.structs import (
    ACLPolicy,
    ACLToken,
    Allocation,
    Deployment,
    DeploymentStatus,
    DesiredTransition,
    DrainStrategy,
    Evaluation,
    Job,
    Node,
    TaskState,
)

IGNORE_FLAG = 128
MAX_RID_LEN = 128  # bytes (UTF-8): the rid is an LMDB key in the request memory


class MessageType(IntEnum):
    JOB_REGISTER = 1
    JOB_DEREGISTER = 2
    JOB_BATCH_DEREGISTER = 3
    EVAL_UPSERT = 4
    EVAL_REAP = 5
    PLAN_APPLY = 6
    ALLOC_CLIENT_UPDATE = 7
    ALLOC_DESIRED_TRANSITION = 8
    DEPLOYMENT_UPSERT = 9
    DEPLOYMENT_STATUS_UPDATE = 10
    DEPLOYMENT_REAP = 11
    NODE_REGISTER = 12
    NODE_UPDATE_STATUS = 13
    NODE_UPDATE_ELIGIBILITY = 14
    NODE_REAP = 15
    ACL_TOKEN_BOOTSTRAP = 16
    ACL_TOKEN_UPSERT = 17
    ACL_TOKEN_DELETE = 18
    BARRIER = 19
    RECONCILE_SUMMARIES = 20
    BATCH = 21
    DEPLOYMENT_PROMOTE = 22
    NODE_UPDATE_DRAIN = 23
    SCHEDULER_CONFIG_SET = 24
    NODE_BATCH_UPDATE_STATUS = 25
    ACL_POLICY_UPSERT = 26
    ACL_POLICY_DELETE = 27
    QUEUE_UPSERT = 28
    QUEUE_DELETE = 29
    PRIORITY_CLASS_UPSERT = 30
    PRIORITY_CLASS_DELETE = 31
    QUEUE_ADMISSION = 32
    # 33 is reserved (queues).
    CLIENT_GC = 34


class Reap(CompactRecord):
    """One object to delete, only if it still has the modify index the leader saw."""

    id: str
    modify_index: int


class JobRegister(CompactRecord):
    job: Job
    eval: Evaluation | None = None
    # Compare-and-set as Nomad's EnforceIndex: the existing job's
    # job_modify_index must equal it; 0 means "must not exist yet".
    enforce_index: int | None = None


class JobDeregister(CompactRecord):
    job_id: str
    purge: bool = False
    eval: Evaluation | None = None


class JobBatchDeregister(CompactRecord):
    jobs: list[Reap] = field(default_factory=list)


class EvalUpsert(CompactRecord):
    evals: list[Evaluation] = field(default_factory=list)


class EvalReap(CompactRecord):
    evals: list[Reap] = field(default_factory=list)
    allocs: list[Reap] = field(default_factory=list)


class AllocStop(CompactRecord):
    id: str
    desired_status: str = "stop"
    desired_description: str = ""
    client_status: str = ""
    followup_eval_id: str = ""


class PlanApply(CompactRecord):
    eval_id: str = ""
    job_id: str = ""
    allocs_to_place: list[Allocation] = field(default_factory=list)
    allocs_to_stop: list[AllocStop] = field(default_factory=list)
    deployment: Deployment | None = None
    evals: list[Evaluation] = field(default_factory=list)


class AllocClientState(CompactRecord):
    id: str
    client_status: str
    client_description: str = ""
    task_states: dict[str, TaskState] | None = None
    deployment_status: DeploymentStatus | None = None


class AllocClientUpdate(CompactRecord):
    allocs: list[AllocClientState] = field(default_factory=list)
    evals: list[Evaluation] = field(default_factory=list)


class AllocDesiredTransition(CompactRecord):
    allocs: dict[str, DesiredTransition] = field(default_factory=dict)
    evals: list[Evaluation] = field(default_factory=list)


class DeploymentUpsert(CompactRecord):
    deployment: Deployment


class DeploymentStatusUpdate(CompactRecord):
    deployment_id: str
    status: str
    status_description: str = ""
    eval: Evaluation | None = None
    # A failed rollout's auto-revert: this stable version's spec registered
    # again as a new version (``eval`` places it), in the same entry.
    job: Job | None = None
    # Compare-and-set: the status the decision was made on ("" for any). A
    # watcher's decision must not, say, resume a rollout paused meanwhile.
    expect_status: str = ""


class DeploymentPromote(CompactRecord):
    """Nomad's ApplyDeploymentPromotion: the groups' canaries are good, replace the rest."""

    deployment_id: str
    groups: list[str] = field(default_factory=list)  # empty: every group awaiting promotion
    eval: Evaluation | None = None


class DeploymentReap(CompactRecord):
    deployments: list[Reap] = field(default_factory=list)


class NodeRegister(CompactRecord):
    node: Node


class NodeUpdateStatus(CompactRecord):
    node_id: str
    status: str
    status_description: str = ""
    evals: list[Evaluation] = field(default_factory=list)


class NodeBatchUpdateStatus(CompactRecord):
    """Several nodes to one status in one entry: the heartbeat monitor's mark-downs.

    A leader that finds 2,000 nodes silent writes a few of these, not 2,000
    entries, and ``evals`` holds one eval per job with live allocs on any of
    them (not one per node per job). A node that is gone, or already has
    ``status``, is skipped: the leader decided on a view that a later entry
    may have changed, and the others still go down.

    ``evals_complete``: ``evals`` covers every job with live allocs on these
    nodes as the leader read them, so its follow-up need not read their
    allocs again. Apply ignores it (it changes no state and no journal
    record); it defaults to false, so older entries apply as before and
    the leader still checks their nodes.
    """

    node_ids: list[str] = field(default_factory=list)
    status: str = ""
    status_description: str = ""
    evals: list[Evaluation] = field(default_factory=list)
    evals_complete: bool = False


class NodeUpdateEligibility(CompactRecord):
    node_id: str
    eligibility: str
    drain: bool | None = None
    evals: list[Evaluation] = field(default_factory=list)


class NodeUpdateDrain(CompactRecord):
    """Nomad's Node.UpdateDrain: start or change a node's drain (``strategy``) or end it (None).

    A drain makes the node ineligible; ending it leaves the node ineligible
    unless ``mark_eligible``. The leader's drainer ends a finished drain with
    ``done_started_at`` set to the drain's start: it applies only while that
    drain is still the node's (an operator may have started another since).
    """

    node_id: str
    strategy: DrainStrategy | None = None
    mark_eligible: bool = False
    done_started_at: int = 0
    evals: list[Evaluation] = field(default_factory=list)


class NodeReap(CompactRecord):
    nodes: list[Reap] = field(default_factory=list)


class ACLTokenBootstrap(CompactRecord):
    token: ACLToken


class ACLTokenUpsert(CompactRecord):
    tokens: list[ACLToken] = field(default_factory=list)


class ACLTokenDelete(CompactRecord):
    accessor_ids: list[str] = field(default_factory=list)
    # Expired-token GC passes the modify index it saw; an explicit delete does not.
    reaps: list[Reap] = field(default_factory=list)


class ACLPolicyUpsert(CompactRecord):
    """Create or replace ACL policies, already parsed and checked by the leader."""

    policies: list[ACLPolicy] = field(default_factory=list)


class ACLPolicyDelete(CompactRecord):
    """Delete ACL policies by name; tokens that name them keep the name and lose its rules (as Nomad)."""

    names: list[str] = field(default_factory=list)


class QueueUpsert(CompactRecord):
    """Create or replace queues (Kueue's ClusterQueues), checked by the leader and again by apply."""

    queues: list[Queue] = field(default_factory=list)


class QueueDelete(CompactRecord):
    """Delete queues by name; refused while a queue holds admitted or pending workloads."""

    names: list[str] = field(default_factory=list)


class PriorityClassUpsert(CompactRecord):
    classes: list[PriorityClass] = field(default_factory=list)


class PriorityClassDelete(CompactRecord):
    """Delete priority classes; workloads keep the value they were given at submission."""

    names: list[str] = field(default_factory=list)


class Admit(CompactRecord):
    """Admit a pending workload, if it still is pending and still fits when applied."""

    job_id: str
    create_index: int  # the submission the leader saw (a re-submission since is another)


class Evict(CompactRecord):
    """Evict an admitted workload back to pending, if it is still admitted when applied."""

    job_id: str
    eviction: Eviction


class QueueAdmission(CompactRecord):
    """One admission cycle's decisions (the leader's), with an eval for each job they touch.

    Apply checks each against the ledger as it stands then: evictions first
    (they free quota), then admissions in order, each only if it still fits.
    A decision that no longer holds is skipped, and its eval with it.
    """

    evictions: list[Evict] = field(default_factory=list)
    admits: list[Admit] = field(default_factory=list)
    evals: list[Evaluation] = field(default_factory=list)


class Barrier(CompactRecord):
    pass


class ReconcileSummaries(CompactRecord):
    """Recount every job summary from its allocs (Nomad's PUT /v1/system/reconcile/summaries)."""


class SchedulerConfigSet(CompactRecord):
    """Nomad's SchedulerSetConfiguration: replace the placement policy (``fsm.scheduler_config``).

    Compare-and-set as Nomad's ``?cas``: with ``cas_index`` set, the config
    is replaced only if the stored one's modify index equals it (0: never
    set); otherwise apply changes nothing and answers ``updated: False``.
    """

    config: SchedulerConfig
    cas_index: int | None = None


class ClientGC(CompactRecord):
    """Ask client nodes to collect their terminal allocs now (Nomad's ``PUT /v1/client/gc``).

    Servers cannot call clients, so the request is replicated and journalled
    (topic ``ClientGC``) for the clients to read on their event streams; a
    client connected to any server, before or after a leader change, sees it
    once. ``node_id`` "" asks every node; with ``alloc_id`` only that alloc's
    node collects only it (Nomad's ``/v1/client/allocation/:id/gc``).
    """

    node_id: str = ""
    alloc_id: str = ""


class Batch(CompactRecord):
    """Several client writes the leader coalesced into one raft entry (as Nomad batches alloc updates).

    Each item is a complete entry of another type (``type byte | envelope``)
    with its own time and request id. The FSM applies them in order at the
    batch's index, each deduplicated, answered and rejected on its own; a
    rejected item changes nothing and leaves the others applied. A batch
    inside a batch is rejected (as an item).
    """

    entries: list[bytes] = field(default_factory=list)


PAYLOADS: dict[MessageType, type] = {
    MessageType.JOB_REGISTER: JobRegister,
    MessageType.JOB_DEREGISTER: JobDeregister,
    MessageType.JOB_BATCH_DEREGISTER: JobBatchDeregister,
    MessageType.EVAL_UPSERT: EvalUpsert,
    MessageType.EVAL_REAP: EvalReap,
    MessageType.PLAN_APPLY: PlanApply,
    MessageType.ALLOC_CLIENT_UPDATE: AllocClientUpdate,
    MessageType.ALLOC_DESIRED_TRANSITION: AllocDesiredTransition,
    MessageType.DEPLOYMENT_UPSERT: DeploymentUpsert,
    MessageType.DEPLOYMENT_STATUS_UPDATE: DeploymentStatusUpdate,
    MessageType.DEPLOYMENT_REAP: DeploymentReap,
    MessageType.DEPLOYMENT_PROMOTE: DeploymentPromote,
    MessageType.NODE_REGISTER: NodeRegister,
    MessageType.NODE_UPDATE_STATUS: NodeUpdateStatus,
    MessageType.NODE_BATCH_UPDATE_STATUS: NodeBatchUpdateStatus,
    MessageType.NODE_UPDATE_ELIGIBILITY: NodeUpdateEligibility,
    MessageType.NODE_UPDATE_DRAIN: NodeUpdateDrain,
    MessageType.NODE_REAP: NodeReap,
    MessageType.ACL_TOKEN_BOOTSTRAP: ACLTokenBootstrap,
    MessageType.ACL_TOKEN_UPSERT: ACLTokenUpsert,
    MessageType.ACL_TOKEN_DELETE: ACLTokenDelete,
    MessageType.BARRIER: Barrier,
    MessageType.RECONCILE_SUMMARIES: ReconcileSummaries,
    MessageType.BATCH: Batch,
    MessageType.SCHEDULER_CONFIG_SET: SchedulerConfigSet,
    MessageType.ACL_POLICY_UPSERT: ACLPolicyUpsert,
    MessageType.ACL_POLICY_DELETE: ACLPolicyDelete,
    MessageType.CLIENT_GC: ClientGC,
    MessageType.QUEUE_UPSERT: QueueUpsert,
    MessageType.QUEUE_DELETE: QueueDelete,
    MessageType.PRIORITY_CLASS_UPSERT: PriorityClassUpsert,
    MessageType.PRIORITY_CLASS_DELETE: PriorityClassDelete,
    MessageType.QUEUE_ADMISSION: QueueAdmission,
}
MESSAGE_OF: dict[type, MessageType] = {cls: mt for mt, cls in PAYLOADS.items()}


@dataclass
class Entry:
    """A decoded log entry."""

    type: MessageType
    time: int
    rid: str
    body: Any


def encode_entry(body: Any, *, time: int, rid: str) -> bytes:
    """Encode a payload record as a log entry (the leader's side)."""
    msg_type = MESSAGE_OF[type(body)]
    # codec.pack gives pack(to_wire(...))'s bytes without building the maps in Python.
    envelope = {"v": codec.SCHEMA_VERSION, "time": time, "rid": rid, "body": body}
    return bytes([msg_type]) + codec.pack(envelope)


def encode_batch(entries: list[bytes], *, time: int) -> bytes:
    """One ``Batch`` entry around already encoded entries (no request id of its own)."""
    envelope = {"v": codec.SCHEMA_VERSION, "time": time, "rid": "", "body": {"entries": entries}}
    return bytes([MessageType.BATCH]) + codec.pack(envelope)


def peek_type(entry: bytes) -> int:
    """The raw type code, or raise CodecError for an empty entry."""
    if not entry:
        raise CodecError("empty entry")
    return entry[0]


_TYPE_OF = {int(t): t for t in MessageType}
_ENVELOPE_FIELDS = frozenset(("v", "time", "rid", "body"))


def _envelope_class(payload: type) -> type:
    """The envelope as one record, so an entry decodes in one msgspec call."""
    return msgspec.defstruct(
        f"{payload.__name__}Envelope", [("v", int), ("time", int), ("rid", str), ("body", payload)], bases=(CompactRecord,)
    )


# Not the Batch: its items are entries of their own, each decoded by
# decode_entry; the Batch's own envelope is read as plain msgpack.
_ENVELOPES: dict[MessageType, type] = {
    t: _envelope_class(cls) for t, cls in PAYLOADS.items() if t is not MessageType.BATCH
}


def _check_envelope(version: Any, time: Any, rid: Any) -> None:
    if version != codec.SCHEMA_VERSION:
        raise CodecError(f"unsupported schema version {version!r} (this build reads {codec.SCHEMA_VERSION})")
    if not isinstance(time, int) or isinstance(time, bool) or time < 0:
        raise CodecError("entry time must be a non-negative integer")
    if not isinstance(rid, str) or len(rid.encode()) > MAX_RID_LEN:
        raise CodecError(f"entry rid must be a string of at most {MAX_RID_LEN} bytes")


def decode_entry(entry: bytes) -> Entry:
    """Strictly decode an entry whose type this version knows."""
    if not entry:
        raise CodecError("empty entry")
    code = entry[0]
    msg_type = _TYPE_OF.get(code)
    if msg_type is None:
        raise CodecError(f"unknown entry type {code}")
    payload = memoryview(entry)[1:]
    envelope_class = _ENVELOPES.get(msg_type)
    typed = None if envelope_class is None else codec.decode_typed(envelope_class, payload)
    if typed is not None:  # built as the strict path would: the envelope's values are still checked
        _check_envelope(typed.v, typed.time, typed.rid)
        return Entry(msg_type, typed.time, typed.rid, typed.body)
    envelope = codec.unpack(payload)
    if not isinstance(envelope, dict):
        raise CodecError("entry payload is not a map")
    time, rid = envelope.get("time"), envelope.get("rid")
    _check_envelope(envelope.get("v"), time, rid)
    if not _ENVELOPE_FIELDS.issuperset(envelope):
        raise CodecError(f"unknown envelope fields {sorted(set(envelope) - _ENVELOPE_FIELDS)}")
    body = codec.from_wire(PAYLOADS[msg_type], envelope.get("body", {}))
    return Entry(msg_type, time, rid, body)
