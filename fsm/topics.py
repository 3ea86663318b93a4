"""The change journal's vocabulary: its topics, and the records each topic's entries hold.

The writer emits records under these topics; the event stream, its
subscribers and the leader's watchers read them. A reader of the journal
needs these names, not the writer.
"""

from __future__ import annotations

from typing import Any

from fsm import codec
from fsm.scheduler_config import SchedulerConfig
from fsm.structs import ACLToken, Allocation, Deployment, Evaluation, Job, Node

# Change-journal topics, as Nomad's event stream names them.
TOPIC_JOB, TOPIC_EVAL, TOPIC_ALLOC = "Job", "Evaluation", "Allocation"
TOPIC_DEPLOYMENT, TOPIC_NODE, TOPIC_TOKEN = "Deployment", "Node", "ACLToken"
#: Queues (Kueue's ClusterQueues), and workloads: a queued job's place in line and admission.
TOPIC_QUEUE, TOPIC_WORKLOAD, TOPIC_PRIORITY_CLASS = "Queue", "Workload", "PriorityClass"
#: Cluster-wide operator settings (Nomad's ``Operator`` topic): the scheduler configuration.
TOPIC_OPERATOR = "Operator"
SCHEDULER_CONFIG_UPDATED = "SchedulerConfigUpdated"
SCHEDULER_CONFIG_KEY = "scheduler"
#: Requests for client nodes (Caravan's own topic: Nomad's servers call their clients, ours
#: cannot). Key: the node id, "" for every node; object ``{node_id, alloc_id, index}``.
TOPIC_CLIENT_GC = "ClientGC"
CLIENT_GC_REQUESTED = "ClientGCRequested"

#: The record class of each topic's journal records (a token's is ``public_token``'s map).
RECORD_OF_TOPIC: dict[str, type] = {
    TOPIC_JOB: Job,
    TOPIC_EVAL: Evaluation,
    TOPIC_ALLOC: Allocation,
    TOPIC_DEPLOYMENT: Deployment,
    TOPIC_NODE: Node,
    TOPIC_OPERATOR: SchedulerConfig,
}

#: Topics whose records are ``CompactRecord``s: their journal maps leave out fields at their default.
COMPACT_TOPICS = frozenset(t for t, cls in RECORD_OF_TOPIC.items() if cls.__struct_config__.omit_defaults)


def full_record(rec: list[Any]) -> list[Any]:
    """One journal record as subscribers get it: a job or eval (``COMPACT_TOPICS``) with every field."""
    if rec[3] is None or rec[0] not in COMPACT_TOPICS:
        return rec
    return [rec[0], rec[1], rec[2], codec.full_map(RECORD_OF_TOPIC[rec[0]], rec[3])]


def full_records(records: list[Any]) -> list[Any]:
    """A journal batch's records as subscribers get them: every field of each job and eval (``COMPACT_TOPICS``)."""
    return [full_record(rec) for rec in records]


def public_token(token: ACLToken) -> dict[str, Any]:
    """A token as the journal shows it: never the secret, not even hashed."""
    data = codec.to_wire(token)
    data.pop("secret_hash", None)
    return data
