"""The LMDB state store: named tables, their secondary indexes, and reads.

One environment per server. Every table and every index is its own named
database. Reads run in read transactions, so one read sees one raft index.
Writes happen only inside ``fsm.apply`` through ``StateWriter``, which keeps
the indexes in step with the tables.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import lmdb

from fsm import codec
from fsm.digest import full_digest, hexdigest, stored
from fsm.keys import from_u64, key, key_at, last_part, prefix, u64
from fsm.queues import WL_ADMITTED, PriorityClass, Queue, QueueUsage, Workload
from fsm.scheduler_config import CONFIG_KEY, CONFIG_TABLE, SchedulerConfig
from fsm.structs import (
    EVAL_TERMINAL,
    ACLPolicy,
    ACLToken,
    Allocation,
    AllocStatus,
    Deployment,
    Evaluation,
    Job,
    JobSummary,
    Node,
)

T = TypeVar("T")

# Object tables, as the index table and snapshots name them.
TABLES = (
    "jobs",
    "job_versions",
    "job_summary",
    "evals",
    "allocs",
    "deployments",
    "nodes",
    "acl_tokens",
    CONFIG_TABLE,
    "acl_policies",
    "queues",
    "priority_classes",
    "workloads",
    "queue_usage",
)
INDEXES = (
    "evals_by_job",
    "evals_by_status",
    "evals_live_by_job",
    "allocs_by_job",
    "allocs_live_by_job",
    "allocs_by_eval",
    "allocs_by_node",
    "allocs_by_deployment",
    "deployments_by_job",
    "acl_by_secret",
    "acl_by_expiry",
    "nodes_by_secret",  # (node secret hash, node id): a client's node secret as a credential
    "workloads_pending",  # (queue, inverted priority, create index, job id): the line, in order
    "workloads_admitted",  # (queue, job id)
)
SYSTEM = ("index", "meta", "gc_marks", "gc_mark_of", "journal", "requests", "requests_by_time")
ALL_DBS = TABLES + INDEXES + SYSTEM
#: What the state digest covers (``fsm.digest``): every object table and the system state a
#: replica answers from. Left out, because they are derived and hashing them cost more than the
#: rest of apply: the indexes (rebuilt from the tables; the FSM invariant tests check them), the
#: journal (a record per change, trimmed by each server's own retention) and the request
#: memory's time index.
DIGEST_DBS = TABLES + ("index", "meta", "gc_marks", "gc_mark_of", "requests")

STRUCT_OF = {
    "jobs": Job,
    "job_versions": Job,
    "job_summary": JobSummary,
    "evals": Evaluation,
    "allocs": Allocation,
    "deployments": Deployment,
    "nodes": Node,
    "acl_tokens": ACLToken,
    CONFIG_TABLE: SchedulerConfig,
    "acl_policies": ACLPolicy,
    "queues": Queue,
    "priority_classes": PriorityClass,
    "workloads": Workload,
    "queue_usage": QueueUsage,
}

META_APPLIED = b"applied_index"
META_LAST_TIME = b"last_time"
META_SCHEMA = b"schema_version"
META_ACL_BOOTSTRAP = b"acl_bootstrap_index"
META_JOURNAL_BYTES = b"journal_bytes"
META_JOURNAL_TRIMMED = b"journal_trimmed"  # highest batch index ever trimmed by retention
STORE_SCHEMA = 1

DEFAULT_MAP_SIZE = 64 << 30  # sparse; LMDB grows the file as needed


class StateStore:
    """Owns the LMDB environment and its named databases."""

    def __init__(self, path: str, *, map_size: int = DEFAULT_MAP_SIZE, sync: bool = False) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        # sync=False: durability comes from the raft journal, which pysyncobj
        # replays after a crash; the FSM skips what it already applied.
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=len(ALL_DBS) + 4,
            sync=sync,
            metasync=sync,
            writemap=False,
            max_readers=512,
        )
        self.dbs: dict[str, Any] = {name: self.env.open_db(name.encode()) for name in ALL_DBS}

    def close(self) -> None:
        self.env.close()

    def sync(self) -> None:
        self.env.sync(True)

    @contextmanager
    def read(self) -> Iterator[StateReader]:
        with self.env.begin(buffers=False) as txn:
            yield StateReader(self, txn)

    def begin_write(self, parent: lmdb.Transaction | None = None) -> lmdb.Transaction:
        return self.env.begin(write=True, parent=parent)


def keys_with_prefix(cursor: lmdb.Cursor, start: bytes) -> list[bytes]:
    """Keys starting with ``start``, in order, read out as a list (the caller may then delete them)."""
    if not cursor.set_range(start):
        return []
    out = []
    for k in cursor.iternext(keys=True, values=False):
        if not k.startswith(start):
            break
        out.append(k)
    return out


class StateReader:
    """Consistent reads at one raft index (one LMDB read transaction)."""

    def __init__(self, store: StateStore, txn: lmdb.Transaction) -> None:
        self.store = store
        self.txn = txn
        self.dbs = store.dbs

    # -- generic helpers -------------------------------------------------
    def _get(self, table: str, k: bytes, cls: type[T]) -> T | None:
        if not k:
            # No object has an empty id, and LMDB rejects empty keys with an
            # error that apply would have to treat as a storage failure.
            return None
        raw = self.txn.get(k, db=self.dbs[table])
        return None if raw is None else codec.load(cls, raw)

    def _scan(self, db: str, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        cursor = self.txn.cursor(db=self.dbs[db])
        if not cursor.set_range(start):
            return
        for k, v in cursor:
            if not k.startswith(start):
                return
            yield k, v

    def _keys(self, db: str, start: bytes) -> list[bytes]:
        """Keys starting with ``start``, in order (values are not copied out of LMDB)."""
        return keys_with_prefix(self.txn.cursor(db=self.dbs[db]), start)

    def _ids(self, index: str, start: bytes) -> list[str]:
        return [last_part(k) for k in self._keys(index, start)]

    def _any(self, index: str, start: bytes) -> bool:
        cursor = self.txn.cursor(db=self.dbs[index])
        return cursor.set_range(start) and cursor.key().startswith(start)

    def _list(self, table: str, id_prefix: str = "", limit: int | None = None) -> list[Any]:
        """Objects whose id starts with ``id_prefix``, in id order; at most ``limit`` of them."""
        cls = STRUCT_OF[table]
        return [codec.load(cls, v) for _, v in itertools.islice(self._scan(table, id_prefix.encode()), limit)]

    def count(self, db: str) -> int:
        return self.txn.stat(self.dbs[db])["entries"]

    # -- meta ------------------------------------------------------------
    def meta_int(self, name: bytes) -> int:
        raw = self.txn.get(name, db=self.dbs["meta"])
        return 0 if raw is None else from_u64(raw)

    @property
    def applied_index(self) -> int:
        return self.meta_int(META_APPLIED)

    @property
    def last_time(self) -> int:
        return self.meta_int(META_LAST_TIME)

    def time_from(self, wall: int) -> int:
        """The state's time for a wall-clock reading (ns): never before the newest time the log recorded.

        A leader whose clock ran ahead pins the state's times forward; what the
        leader measures in them (deadlines, delays, GC ages) must use this, not
        its own clock. The caller reads the clock: apply never does.
        """
        return max(wall, self.last_time)

    def table_index(self, table: str) -> int:
        raw = self.txn.get(table.encode(), db=self.dbs["index"])
        return 0 if raw is None else from_u64(raw)

    def table_indexes(self) -> dict[str, int]:
        return {k.decode(): from_u64(v) for k, v in self._scan("index")}

    # -- jobs ------------------------------------------------------------
    def job(self, job_id: str) -> Job | None:
        return self._get("jobs", job_id.encode(), Job)

    def jobs(self, id_prefix: str = "") -> list[Job]:
        return self._list("jobs", id_prefix)

    def job_versions(self, job_id: str) -> list[Job]:
        """Newest first, as Nomad lists them."""
        rows = [codec.load(Job, v) for _, v in self._scan("job_versions", prefix(job_id))]
        return sorted(rows, key=lambda j: j.version, reverse=True)

    def job_version(self, job_id: str, version: int) -> Job | None:
        return self._get("job_versions", key_at(job_id, version), Job)

    def job_summary(self, job_id: str) -> JobSummary | None:
        return self._get("job_summary", job_id.encode(), JobSummary)

    def job_has_allocs(self, job_id: str) -> bool:
        return self._any("allocs_by_job", prefix(job_id))

    def job_has_live_allocs(self, job_id: str) -> bool:
        return self._any("allocs_live_by_job", prefix(job_id))

    def job_has_live_evals(self, job_id: str) -> bool:
        return self._any("evals_live_by_job", prefix(job_id))

    # -- evals -----------------------------------------------------------
    def eval(self, eval_id: str) -> Evaluation | None:
        return self._get("evals", eval_id.encode(), Evaluation)

    def evals(self, id_prefix: str = "", limit: int | None = None) -> list[Evaluation]:
        return self._list("evals", id_prefix, limit)

    def eval_ids_by_job(self, job_id: str) -> list[str]:
        return self._ids("evals_by_job", prefix(job_id))

    def evals_by_job(self, job_id: str) -> list[Evaluation]:
        return [e for e in map(self.eval, self.eval_ids_by_job(job_id)) if e is not None]

    def eval_ids_by_status(self, status: str) -> list[str]:
        return self._ids("evals_by_status", prefix(status))

    # -- allocs ----------------------------------------------------------
    def alloc(self, alloc_id: str) -> Allocation | None:
        return self._get("allocs", alloc_id.encode(), Allocation)

    def allocs(self, id_prefix: str = "", limit: int | None = None) -> list[Allocation]:
        return self._list("allocs", id_prefix, limit)

    def _allocs(self, ids: list[str]) -> list[Allocation]:
        return [a for a in map(self.alloc, ids) if a is not None]

    def alloc_ids_by_job(self, job_id: str) -> list[str]:
        return self._ids("allocs_by_job", prefix(job_id))

    def allocs_by_job(self, job_id: str) -> list[Allocation]:
        return self._allocs(self.alloc_ids_by_job(job_id))

    def alloc_ids_by_eval(self, eval_id: str) -> list[str]:
        return self._ids("allocs_by_eval", prefix(eval_id))

    def allocs_by_eval(self, eval_id: str) -> list[Allocation]:
        return self._allocs(self.alloc_ids_by_eval(eval_id))

    def allocs_by_node(self, node_id: str, terminal: bool | None = None) -> list[Allocation]:
        return self._allocs(self._alloc_ids_by_node(node_id, terminal))

    def _alloc_ids_by_node(self, node_id: str, terminal: bool | None) -> list[str]:
        start = prefix(node_id) if terminal is None else prefix(node_id, "1" if terminal else "0")
        return self._ids("allocs_by_node", start)

    def alloc_statuses_by_node(self, node_id: str, terminal: bool | None = None) -> list[AllocStatus]:
        """``allocs_by_node`` as ``AllocStatus`` views: for the leader's reads of many nodes at once."""
        views = (self._get("allocs", alloc_id.encode(), AllocStatus) for alloc_id in self._alloc_ids_by_node(node_id, terminal))
        return [v for v in views if v is not None]

    def alloc_statuses(self) -> Iterator[AllocStatus]:
        """Every alloc as an ``AllocStatus`` view, in id order: a whole-state scan at a third of the cost."""
        for _, raw in self._scan("allocs"):
            yield codec.load(AllocStatus, raw)

    def allocs_by_deployment(self, deployment_id: str) -> list[Allocation]:
        return self._allocs(self._ids("allocs_by_deployment", prefix(deployment_id)))

    # -- deployments -----------------------------------------------------
    def deployment(self, deployment_id: str) -> Deployment | None:
        return self._get("deployments", deployment_id.encode(), Deployment)

    def deployments(self, id_prefix: str = "", limit: int | None = None) -> list[Deployment]:
        return self._list("deployments", id_prefix, limit)

    def deployments_by_job(self, job_id: str) -> list[Deployment]:
        ids = self._ids("deployments_by_job", prefix(job_id))
        return [d for d in map(self.deployment, ids) if d is not None]

    def latest_deployment(self, job_id: str) -> Deployment | None:
        rows = self.deployments_by_job(job_id)
        return max(rows, key=lambda d: d.create_index) if rows else None

    # -- nodes -----------------------------------------------------------
    def node(self, node_id: str) -> Node | None:
        return self._get("nodes", node_id.encode(), Node)

    def nodes(self, id_prefix: str = "", limit: int | None = None) -> list[Node]:
        return self._list("nodes", id_prefix, limit)

    # -- ACL -------------------------------------------------------------
    def token(self, accessor_id: str) -> ACLToken | None:
        return self._get("acl_tokens", accessor_id.encode(), ACLToken)

    def tokens(self) -> list[ACLToken]:
        return self._list("acl_tokens")

    def token_by_secret_hash(self, secret_hash: str) -> ACLToken | None:
        accessor = self.txn.get(secret_hash.encode(), db=self.dbs["acl_by_secret"])
        return None if accessor is None else self.token(accessor.decode())

    def acl_bootstrap_index(self) -> int:
        return self.meta_int(META_ACL_BOOTSTRAP)

    def acl_policy(self, name: str) -> ACLPolicy | None:
        return self._get("acl_policies", name.encode(), ACLPolicy)

    def acl_policies(self) -> list[ACLPolicy]:
        return self._list("acl_policies")

    def node_secret_known(self, secret_hash: str) -> bool:
        """Whether some node registered with this secret (a client's credential for its reads)."""
        return self._any("nodes_by_secret", prefix(secret_hash))

    # -- queues ----------------------------------------------------------
    def queue(self, name: str) -> Queue | None:
        return self._get("queues", name.encode(), Queue)

    def queues(self, name_prefix: str = "", limit: int | None = None) -> list[Queue]:
        return self._list("queues", name_prefix, limit)

    def priority_class(self, name: str) -> PriorityClass | None:
        return self._get("priority_classes", name.encode(), PriorityClass)

    def priority_classes(self, name_prefix: str = "", limit: int | None = None) -> list[PriorityClass]:
        return self._list("priority_classes", name_prefix, limit)

    def workload(self, job_id: str) -> Workload | None:
        return self._get("workloads", job_id.encode(), Workload)

    def workload_admitted(self, job_id: str) -> bool:
        """Whether the job's workload is admitted (a job that names no queue has none)."""
        wl = self.workload(job_id)
        return wl is not None and wl.state == WL_ADMITTED

    def queue_usage(self, name: str) -> dict[str, int]:
        """What the queue has admitted, per resource (the ledger ``fsm.quota`` checks against)."""
        found = self._get("queue_usage", name.encode(), QueueUsage)
        return {} if found is None else dict(found.used)

    def pending_workloads(self, queue: str, limit: int | None = None) -> list[Workload]:
        """The queue's pending workloads in line order: priority, then submission."""
        ids = [last_part(k) for k in itertools.islice(self._keys("workloads_pending", prefix(queue)), limit)]
        return [w for w in map(self.workload, ids) if w is not None]

    def pending_ids(self, queue: str) -> list[str]:
        """The job ids of the queue's line, in order (keys only: no record is read)."""
        return [last_part(k) for k in self._keys("workloads_pending", prefix(queue))]

    def pending_count(self, queue: str) -> int:
        return len(self._keys("workloads_pending", prefix(queue)))

    def admitted_workloads(self, queue: str) -> list[Workload]:
        return [w for w in map(self.workload, self._ids("workloads_admitted", prefix(queue))) if w is not None]

    def admitted_count(self, queue: str) -> int:
        return len(self._keys("workloads_admitted", prefix(queue)))

    # -- scheduler configuration -----------------------------------------
    def scheduler_config(self) -> SchedulerConfig:
        """The placement policy in force: the stored one, or the defaults (modify index 0) if never set."""
        found = self._get(CONFIG_TABLE, CONFIG_KEY, SchedulerConfig)
        return SchedulerConfig() if found is None else found

    # -- GC marks --------------------------------------------------------
    def gc_marks(self, kind: str, until: int, limit: int | None = None) -> list[tuple[int, str]]:
        """(eligible_since, id) of objects of ``kind`` marked at or before ``until``."""
        out = []
        for k, _ in self._scan("gc_marks", prefix(kind)):
            since = from_u64(k[len(kind) + 1 : len(kind) + 9])
            if since > until:
                break
            out.append((since, k[len(kind) + 10 :].decode()))
            if limit is not None and len(out) >= limit:
                break
        return out

    # -- request ids -----------------------------------------------------
    def request_result(self, rid: str) -> dict | None:
        raw = self.txn.get(rid.encode(), db=self.dbs["requests"])
        return None if raw is None else codec.unpack(raw)

    # -- journal ---------------------------------------------------------
    def journal_batches(
        self, after: int = 0, limit: int | None = None, topics: frozenset[str] | None = None
    ) -> Iterator[tuple[int, list]]:
        """Change-record batches with index > ``after``, oldest first (only the records of ``topics``, if given)."""
        cursor = self.txn.cursor(db=self.dbs["journal"])
        if not cursor.set_range(u64(after + 1)):
            return
        n = 0
        for k, v in cursor:
            yield from_u64(k), (codec.unpack(v) if topics is None else codec.unpack_records(v, topics))
            n += 1
            if limit is not None and n >= limit:
                return

    def journal_trimmed(self) -> int:
        """Highest batch index retention has removed (0: nothing ever trimmed).

        A follower positioned at index N has lost batches iff N < this mark.
        """
        return self.meta_int(META_JOURNAL_TRIMMED)

    def journal_bounds(self) -> tuple[int, int]:
        """(oldest, newest) retained batch index; (0, 0) when empty."""
        cursor = self.txn.cursor(db=self.dbs["journal"])
        if not cursor.first():
            return 0, 0
        oldest = from_u64(cursor.key())
        cursor.last()
        return oldest, from_u64(cursor.key())

    # -- whole-state ---------------------------------------------------------
    def iter_raw(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        yield from self._scan(db)

    def digest(self, full: bool = False) -> str:
        """The multiset hash of every record of the databases the digest covers (``DIGEST_DBS``).

        The stored, incrementally kept sum when it is trusted (see
        ``fsm.digest``); else, or with ``full``, recomputed from every record.
        ``FSM.committed_digest`` also remembers what a recomputation found.
        """
        if not full:
            trusted, total = stored(self.txn, self.dbs["meta"], self.applied_index)
            if trusted:
                return hexdigest(total)
        return hexdigest(full_digest(self.txn, self.dbs, DIGEST_DBS))

    # -- list pages ----------------------------------------------------------
    def scan_range(self, db: str, start: bytes, origin: bytes = b"", reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Rows of ``db`` whose key starts with ``start``, lazily, from ``origin`` (inclusive) on.

        A list page reads only until it is full, then resumes at the next
        page's first key (``origin``), so no read copies out a whole table.
        ``reverse`` walks down from ``origin`` (or from the range's end).
        """
        cursor = self.txn.cursor(db=self.dbs[db])
        if not reverse:
            if not cursor.set_range(max(start, origin)):
                return
            rows = cursor.iternext()
        else:
            upper = start.rstrip(b"\xff")
            upper = upper[:-1] + bytes([upper[-1] + 1]) if upper else b""
            seek = origin if origin and (not upper or origin < upper) else upper
            if seek and origin and origin < start:
                return
            positioned = cursor.set_range(seek) if seek else False
            if positioned and cursor.key() != origin:
                positioned = cursor.prev()
            elif not positioned:
                positioned = cursor.last()
            if not positioned:
                return
            rows = cursor.iterprev()
        for k, v in rows:
            if not k.startswith(start):
                return
            yield k, v


def job_key(job_id: str) -> bytes:
    return job_id.encode()


def eval_is_live(status: str) -> bool:
    return status not in EVAL_TERMINAL


__all__ = ["StateStore", "StateReader", "TABLES", "INDEXES", "SYSTEM", "ALL_DBS", "DIGEST_DBS", "key", "prefix"]
