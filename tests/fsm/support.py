"""Builders, a small apply harness and the FSM's invariants as checkable functions.

The invariant checks rebuild everything that apply derives (secondary
indexes, job status, job summaries, GC marks, the per-table ``index`` table)
from the object tables alone and compare. They read raw LMDB rows, not the
``StateReader`` helpers, so a bug in an index cannot hide itself.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from fsm import codec
from fsm.journal import Retention
from fsm.keys import SEP, from_u64, key
from fsm.machine import FSM, ApplyResult
from fsm.messages import encode_entry
from fsm.queues import WL_ADMITTED, WL_PENDING
from fsm.quota import Ledger
from fsm.record import Record, fields
from fsm.store import INDEXES, STRUCT_OF, TABLES, StateReader
from fsm.structs import (
    DEPLOYMENT_ACTIVE,
    EVAL_TERMINAL,
    JOB_DEAD,
    JOB_PENDING,
    JOB_RUNNING,
    NODE_DOWN,
    SECOND,
    ACLToken,
    Allocation,
    AllocStatus,
    Deployment,
    DeploymentState,
    DrainStrategy,
    Evaluation,
    Job,
    JobSummary,
    Node,
    Task,
    TaskGroup,
    count_sum,
)
from fsm.workloads import line_key

T0 = 1_700_000_000 * SECOND  # a fixed "leader wall clock" start
SMALL_MAP = 256 << 20  # test stores are tiny; a small map keeps many open envs cheap

# Databases a rejected entry may still change: the applied index and time
# (meta) and the request-id memory.
BOOKKEEPING_DBS = ("meta", "requests", "requests_by_time")
SUMMARY_FIELD = {
    "pending": "starting",
    "running": "running",
    "complete": "complete",
    "failed": "failed",
    "lost": "lost",
}


class FatalCalled(Exception):
    """Raised by the tests' ``on_fatal``: the FSM asked to stop the node."""


def raise_fatal(exc: BaseException) -> None:
    raise FatalCalled(str(exc)) from exc


# -- builders ------------------------------------------------------------------
def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def make_job(
    job_id: str = "web",
    *,
    type: str = "service",
    groups: Iterable[str] = ("g",),
    count: int = 1,
    **kw: Any,
) -> Job:
    task_groups = [TaskGroup(name=g, count=count, tasks=[Task(name="t")]) for g in groups]
    return Job(id=job_id, name=job_id, type=type, task_groups=task_groups, **kw)


def make_eval(eval_id: str, job_id: str = "web", status: str = "pending", **kw: Any) -> Evaluation:
    return Evaluation(id=eval_id, job_id=job_id, status=status, **kw)


def make_alloc(
    alloc_id: str,
    eval_id: str = "e1",
    job_id: str = "web",
    node_id: str = "n1",
    group: str = "g",
    *,
    client: str = "pending",
    desired: str = "run",
    **kw: Any,
) -> Allocation:
    return Allocation(
        id=alloc_id,
        eval_id=eval_id,
        job_id=job_id,
        node_id=node_id,
        task_group=group,
        client_status=client,
        desired_status=desired,
        **kw,
    )


def make_node(node_id: str = "n1", status: str = "ready", **kw: Any) -> Node:
    return Node(id=node_id, name=node_id, status=status, **kw)


def make_token(
    accessor: str, secret: str | None = None, type: str = "client", expiration: int = 0, **kw: Any
) -> ACLToken:
    return ACLToken(
        accessor_id=accessor,
        secret_hash=secret_hash(secret if secret is not None else "secret-" + accessor),
        type=type,
        expiration_time=expiration,
        **kw,
    )


def make_deployment(
    dep_id: str, job_id: str = "web", status: str = "running", groups=("g",)
) -> Deployment:
    return Deployment(
        id=dep_id,
        job_id=job_id,
        status=status,
        task_groups={g: DeploymentState(desired_total=1) for g in groups},
    )


# -- harness -------------------------------------------------------------------
@dataclass
class Harness:
    """An FSM in a temporary directory that numbers and times entries itself."""

    path: str
    retention: Retention | None = None
    request_ttl: int | None = None
    request_min_entries: int | None = None
    fsm: FSM = field(init=False)
    index: int = 0
    time: int = T0
    entries: list[tuple[int, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fsm = self._open()

    def _open(self) -> FSM:
        kw: dict[str, Any] = {"map_size": SMALL_MAP, "on_fatal": raise_fatal}
        if self.retention is not None:
            kw["retention"] = self.retention
        if self.request_ttl is not None:
            kw["request_ttl"] = self.request_ttl
        if self.request_min_entries is not None:
            kw["request_min_entries"] = self.request_min_entries
        return FSM(self.path, **kw)

    @classmethod
    def temp(cls, **kw: Any) -> Harness:
        return cls(tempfile.mkdtemp(prefix="caravan-fsm-"), **kw)

    def raw(self, entry: bytes, *, commit: bool = True) -> ApplyResult:
        self.index += 1
        self.entries.append((self.index, entry))
        result = self.fsm.apply(self.index, entry)
        if commit:
            self.fsm.commit()
        return result

    def apply(
        self,
        body: Any,
        *,
        time: int | None = None,
        rid: str = "",
        commit: bool = True,
        step: int = SECOND,
    ) -> ApplyResult:
        if time is None:
            self.time += step
            time = self.time
        return self.raw(encode_entry(body, time=time, rid=rid), commit=commit)

    def ok(self, body: Any, **kw: Any) -> dict[str, Any]:
        result = self.apply(body, **kw)
        assert result.ok, (result.code, result.error)
        return result.value

    def reader(self) -> Any:
        return self.fsm.read()

    def dump(self) -> dict[str, dict[bytes, bytes]]:
        return dump(self.fsm)

    def clone(self) -> Harness:
        """A second FSM in a new directory holding this one's state, at the same index and time."""
        self.fsm.close()
        path = tempfile.mkdtemp(prefix="caravan-fsm-")
        shutil.copytree(self.path, path, dirs_exist_ok=True)
        self.fsm = self._open()
        return replace(self, path=path, entries=list(self.entries))

    def reopen(self) -> None:
        self.fsm.close()
        self.fsm = self._open()

    def close(self) -> None:
        self.fsm.close()

    def destroy(self) -> None:
        try:
            self.fsm.close()
        except Exception:
            pass
        shutil.rmtree(self.path, ignore_errors=True)


def dump(fsm: FSM) -> dict[str, dict[bytes, bytes]]:
    """Every database's committed rows (commits a pending group first)."""
    fsm.commit()
    with fsm.read() as r:
        return {name: dict(r.iter_raw(name)) for name in r.dbs}


def without_bookkeeping(state: dict[str, dict[bytes, bytes]]) -> dict[str, dict[bytes, bytes]]:
    return {name: rows for name, rows in state.items() if name not in BOOKKEEPING_DBS}


def state_diff(before: dict, after: dict) -> list[str]:
    """Names of databases whose rows differ (for assertion messages)."""
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


# -- invariants ----------------------------------------------------------------
def rows(r: StateReader, table: str) -> list[Any]:
    cls = STRUCT_OF[table]
    return [codec.load(cls, v) for _, v in r.iter_raw(table)]


def expected_indexes(r: StateReader) -> dict[str, dict[bytes, bytes]]:
    """Every secondary index rebuilt from scratch from the object tables."""
    out: dict[str, dict[bytes, bytes]] = {name: {} for name in INDEXES}
    for e in rows(r, "evals"):
        out["evals_by_job"][key(e.job_id, e.id)] = b""
        out["evals_by_status"][key(e.status, e.id)] = b""
        if e.status not in EVAL_TERMINAL:
            out["evals_live_by_job"][key(e.job_id, e.id)] = b""
    for a in rows(r, "allocs"):
        out["allocs_by_job"][key(a.job_id, a.id)] = b""
        if not a.terminal():
            out["allocs_live_by_job"][key(a.job_id, a.id)] = b""
        out["allocs_by_eval"][key(a.eval_id, a.id)] = b""
        out["allocs_by_node"][key(a.node_id, "1" if a.terminal() else "0", a.id)] = b""
        if a.deployment_id:
            out["allocs_by_deployment"][key(a.deployment_id, a.id)] = b""
    for d in rows(r, "deployments"):
        out["deployments_by_job"][key(d.job_id, d.id)] = b""
    for t in rows(r, "acl_tokens"):
        out["acl_by_secret"][t.secret_hash.encode()] = t.accessor_id.encode()
        if t.expiration_time:
            out["acl_by_expiry"][key(t.expiration_time, t.accessor_id)] = b""
    for n in rows(r, "nodes"):
        if n.secret_hash:
            out["nodes_by_secret"][key(n.secret_hash, n.id)] = b""
    for wl in rows(r, "workloads"):
        if wl.state == WL_PENDING:
            out["workloads_pending"][line_key(wl)] = b""
        elif wl.state == WL_ADMITTED:
            out["workloads_admitted"][key(wl.queue, wl.job_id)] = b""
    return out


def expected_queue_usage(r: StateReader) -> dict[str, dict[str, int]]:
    """Each queue's ledger row recounted from its admitted workloads (the cache equals a fresh sum)."""
    out: dict[str, dict[str, int]] = {}
    for wl in rows(r, "workloads"):
        if wl.state == WL_ADMITTED:
            out[wl.queue] = count_sum(out.get(wl.queue, {}), wl.usage)
    return {q: u for q, u in out.items() if u}


def expected_job_status(
    job: Job, evals: list[Evaluation], allocs: list[Allocation], deps: list[Deployment]
) -> str:
    """Nomad's getJobStatus, written out again from the table rows."""
    if job.type == "system" or job.periodic or job.parameterized:
        return JOB_DEAD if job.stop else JOB_RUNNING
    if any(not a.terminal() for a in allocs):
        return JOB_RUNNING
    if any(e.status not in EVAL_TERMINAL for e in evals):
        return JOB_PENDING
    if any(d.status in DEPLOYMENT_ACTIVE for d in deps):
        return JOB_RUNNING
    if job.stop:
        return JOB_DEAD
    return JOB_DEAD if evals or allocs else JOB_PENDING


def recount_summary(allocs: list[Allocation]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(SUMMARY_FIELD.values(), 0)
    )
    for a in allocs:
        counts[a.task_group][SUMMARY_FIELD[a.client_status]] += 1
    return counts


def expected_gc_marks(r: StateReader) -> dict[tuple[str, str], int | None]:
    """(kind, id) -> eligible-since (None where the time is not derivable from the row)."""
    out: dict[tuple[str, str], int | None] = {}
    for e in rows(r, "evals"):
        if e.status in EVAL_TERMINAL:
            out[("eval", e.id)] = None
    for j in rows(r, "jobs"):
        if j.status == JOB_DEAD:
            out[("job", j.id)] = None
    for d in rows(r, "deployments"):
        if d.status not in DEPLOYMENT_ACTIVE:
            out[("deployment", d.id)] = None
    for n in rows(r, "nodes"):
        if n.status == NODE_DOWN:
            out[("node", n.id)] = n.status_updated_at
    for t in rows(r, "acl_tokens"):
        if t.expiration_time:
            out[("token", t.accessor_id)] = t.expiration_time
    return out


def actual_gc_marks(r: StateReader) -> dict[tuple[str, str], int]:
    """Marks as stored, after checking that ``gc_marks`` and ``gc_mark_of`` mirror each other."""
    mark_of: dict[tuple[str, str], int] = {}
    for k, v in r.iter_raw("gc_mark_of"):
        kind, obj_id = k.split(SEP, 1)
        mark_of[(kind.decode(), obj_id.decode())] = from_u64(v)
    by_time = set()
    for k, v in r.iter_raw("gc_marks"):
        kind, rest = k.split(SEP, 1)
        since, obj_id = from_u64(rest[:8]), rest[9:].decode()
        assert v == b""
        by_time.add((kind.decode(), obj_id, since))
    assert by_time == {(kind, obj_id, since) for (kind, obj_id), since in mark_of.items()}, (
        "gc_marks and gc_mark_of disagree"
    )
    return mark_of


def check_invariants(
    r: StateReader,
    *,
    purged: Iterable[str] = (),
    deleted_from: Iterable[str] | None = None,
    journal_secrets: Iterable[str] = (),
) -> None:
    """Assert every derived structure agrees with the object tables.

    References: every alloc's eval exists and is an eval of the alloc's job
    (reaps take an eval only together with all of its terminal allocs, and
    a GC purge takes a job's evals and allocs together). Its job exists
    unless it was purged: ``purged`` holds the job ids removed by
    ``JobDeregister(purge=True)``, which, as in Nomad, removes the job, its
    versions and summary but leaves its evals and allocs until the collector
    reaps them (a job registered again under that id adopts them, and its
    new summary starts from a recount).

    ``deleted_from``: tables that ever had a row deleted; for the others the
    ``index`` table must equal the highest modify index exactly. ``None``
    means unknown (only the lower bound is checked).
    """
    purged = set(purged)
    jobs = {j.id: j for j in rows(r, "jobs")}
    evals = {e.id: e for e in rows(r, "evals")}
    allocs = {a.id: a for a in rows(r, "allocs")}
    deps = {d.id: d for d in rows(r, "deployments")}
    summaries = {s.job_id: s for s in rows(r, "job_summary")}
    applied = r.applied_index

    # Secondary indexes equal a from-scratch rebuild.
    for name, expected in expected_indexes(r).items():
        actual = dict(r.iter_raw(name))
        assert actual == expected, f"index {name} disagrees with its table: {actual} != {expected}"

    # The light alloc views (whole-state scans, per-node reads) are the records' own fields.
    def status_of(a: Allocation) -> AllocStatus:
        return AllocStatus(a.job_id, a.node_id, a.desired_status, a.client_status, a.followup_eval_id, a.next_allocation)

    assert list(r.alloc_statuses()) == [status_of(a) for a in allocs.values()]
    for node_id in {a.node_id for a in allocs.values()}:
        for terminal in (None, False, True):
            assert r.alloc_statuses_by_node(node_id, terminal) == list(map(status_of, r.allocs_by_node(node_id, terminal)))

    # A node being drained is closed to new work (Nomad's UpdateNodeDrain).
    for n in rows(r, "nodes"):
        if n.drain_strategy is not None:
            assert n.drain and n.scheduling_eligibility == "ineligible", f"draining node {n.id} is open: {n}"
            assert n.drain_strategy.started_at > 0, f"drain of node {n.id} has no start"

    # Every alloc's eval exists; its job exists unless it was purged.
    for a in allocs.values():
        assert a.eval_id in evals, f"alloc {a.id} names missing eval {a.eval_id}"
        assert evals[a.eval_id].job_id == a.job_id, f"alloc {a.id} and its eval disagree on the job"
        assert a.job_id in jobs or a.job_id in purged, f"alloc {a.id} names missing job {a.job_id}"

    evals_of: dict[str, list[Evaluation]] = defaultdict(list)
    allocs_of: dict[str, list[Allocation]] = defaultdict(list)
    deps_of: dict[str, list[Deployment]] = defaultdict(list)
    for e in evals.values():
        evals_of[e.job_id].append(e)
    for a in allocs.values():
        allocs_of[a.job_id].append(a)
    for d in deps.values():
        deps_of[d.job_id].append(d)

    # The queue ledger equals a recount of the admitted workloads, and keeps every quota.
    stored_usage = {u.queue: u.used for u in rows(r, "queue_usage")}
    assert stored_usage == expected_queue_usage(r), f"queue ledger {stored_usage} != recount"
    workloads = {wl.job_id: wl for wl in rows(r, "workloads")}
    ledger = Ledger.build(rows(r, "queues"), stored_usage.items())
    assert not ledger.violations(), ledger.violations()

    # Job status is a re-derivation; summaries equal a recount of the allocs.
    for job in jobs.values():
        want = expected_job_status(job, evals_of[job.id], allocs_of[job.id], deps_of[job.id])
        wl = workloads.get(job.id)
        if want == JOB_DEAD and not job.stop and wl is not None and wl.state == WL_PENDING:
            want = JOB_PENDING  # it waits in its queue
        assert job.status == want, f"job {job.id} status {job.status}, derived {want}"
        assert job.id in summaries, f"job {job.id} has no summary"
        groups = set(summaries[job.id].summary)
        assert {g.name for g in job.task_groups} <= groups, f"job {job.id} summary lacks groups"
    for job_id, summary in summaries.items():
        assert job_id in jobs, f"summary of missing job {job_id}"
        assert isinstance(summary, JobSummary)
        recount = recount_summary(allocs_of[job_id])
        for group in set(summary.summary) | set(recount):
            have = summary.summary.get(group)
            assert have is not None, f"job {job_id}: summary has no group {group}"
            got = {name: getattr(have, name) for name in SUMMARY_FIELD.values()}
            assert got == recount[group], (
                f"job {job_id} group {group}: summary {got} != recount {recount[group]}"
            )
            assert have.unknown == 0 and have.queued >= 0

    # Job versions: only of existing jobs, at most 6, the newest is the job's version.
    versions: dict[str, list[Job]] = defaultdict(list)
    for k, v in r.iter_raw("job_versions"):
        jv = codec.load(Job, v)
        assert k == key(jv.id, jv.version)
        versions[jv.id].append(jv)
    for job_id, kept in versions.items():
        assert job_id in jobs, f"versions of missing job {job_id}"
        assert len(kept) <= 6
        assert max(v.version for v in kept) == jobs[job_id].version
    for job_id in jobs:
        assert versions.get(job_id), f"job {job_id} has no version rows"

    # GC marks: exactly the eligible objects, with the times we can derive.
    marks = actual_gc_marks(r)
    expected = expected_gc_marks(r)
    assert set(marks) == set(expected), f"GC marks {sorted(marks)} != eligible {sorted(expected)}"
    for mark, since in expected.items():
        if since is not None:
            assert marks[mark] == since, f"GC mark {mark} at {marks[mark]}, expected {since}"

    # The index table: at least the newest modify index per table, never past applied.
    deleted = None if deleted_from is None else set(deleted_from)
    for table in TABLES:
        newest = max((obj.modify_index for obj in rows(r, table)), default=0)
        idx = r.table_index(table)
        assert newest <= idx <= applied, (
            f"index[{table}]={idx}, newest modify {newest}, applied {applied}"
        )
        if deleted is not None and table not in deleted:
            assert idx == newest, (
                f"index[{table}]={idx} but nothing was deleted and newest is {newest}"
            )
    for obj_table in TABLES:
        for obj in rows(r, obj_table):
            assert 0 < obj.create_index <= obj.modify_index <= applied

    # Journal: batches at applied indexes, never a secret.
    secrets = [s.encode() for s in journal_secrets]
    newest_batch = 0
    for index, batch in r.journal_batches():
        assert 0 < index <= applied
        assert batch, "empty journal batch"
        newest_batch = index
    if newest_batch:
        assert r.table_index("journal") == newest_batch
    for _, raw in r.iter_raw("journal"):
        for s in secrets:
            assert s not in raw, "a token secret hash reached the journal"


def packed_map(obj: Any) -> Any:
    """What ``codec.encode`` packs for ``obj``, built field by field: the rule msgspec follows.

    A plain ``Record`` packs every field. A ``CompactRecord`` leaves out a
    field whose value is its default object itself, or an empty list or
    map where the default is an empty one. msgspec compares by identity, not
    equality: a value decoded from an entry equal to a non-empty default
    string is a different object and is packed, on every replica alike.
    """
    if isinstance(obj, list):
        return [packed_map(v) for v in obj]
    if isinstance(obj, dict):
        return {k: packed_map(v) for k, v in obj.items()}
    if not isinstance(obj, Record):
        return obj
    compact = type(obj).__struct_config__.omit_defaults
    out = {}
    for f in fields(type(obj)):
        value = getattr(obj, f.name)
        if compact and (
            value is f.default
            or (f.default_factory in (list, dict) and type(value) is f.default_factory and not value)
        ):
            continue
        out[f.name] = packed_map(value)
    return out


def ordered(value: Any) -> Any:
    """Maps as lists of pairs, all the way down: equal only with the same keys in the same order."""
    if isinstance(value, dict):
        return [(k, ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return value


def sample_bodies() -> list[Any]:
    """A log touching every message type, mostly valid, with some rejections."""
    from fsm import messages as m
    from fsm.messages import encode_entry
    from fsm.scheduler_config import PreferenceSpec, SchedulerConfig
    from fsm.structs import (
        ACLNamespaceRule,
        ACLPolicy,
        DeploymentStatus,
        DesiredTransition,
        TaskState,
    )

    job = make_job("web", count=2)
    batch = make_job("etl", type="batch")
    bodies = [
        m.NodeRegister(node=make_node("n1")),
        m.NodeRegister(node=make_node("n2")),
        m.JobRegister(job=job, eval=make_eval("e1", "web")),
        m.JobRegister(job=batch, eval=make_eval("e2", "etl"), enforce_index=0),
        m.PlanApply(
            eval_id="e1",
            job_id="web",
            allocs_to_place=[make_alloc("a1", deployment_id="d1"), make_alloc("a2", node_id="n2")],
            deployment=make_deployment("d1"),
            evals=[make_eval("e1", "web", status="complete")],
        ),
        m.PlanApply(
            eval_id="e2",
            job_id="etl",
            allocs_to_place=[make_alloc("b1", "e2", "etl")],
            evals=[make_eval("e2", "etl", status="complete")],
        ),
        m.AllocClientUpdate(
            allocs=[
                m.AllocClientState(
                    id="a1",
                    client_status="running",
                    task_states={"t": TaskState(state="running")},
                    deployment_status=DeploymentStatus(healthy=True),
                ),
                m.AllocClientState(id="b1", client_status="running"),
            ]
        ),
        m.AllocClientUpdate(allocs=[m.AllocClientState(id="b1", client_status="complete")]),
        m.AllocDesiredTransition(allocs={"a2": DesiredTransition(migrate=True)}),
        m.DeploymentPromote(deployment_id="d1", groups=["g"]),
        m.DeploymentStatusUpdate(deployment_id="d1", status="successful"),
        m.DeploymentUpsert(deployment=make_deployment("d2", "etl", status="cancelled")),
        m.DeploymentReap(deployments=[m.Reap("d2", 11)]),
        m.EvalUpsert(evals=[make_eval("e3", "web", status="blocked", queued_allocations={"g": 1})]),
        m.EvalReap(evals=[m.Reap("e2", 6)], allocs=[m.Reap("b1", 8)]),
        m.NodeUpdateEligibility(node_id="n2", eligibility="ineligible", drain=True),
        m.NodeUpdateStatus(node_id="n2", status="down", evals=[make_eval("e4", "web")]),
        m.NodeBatchUpdateStatus(node_ids=["n1", "n2", "n9"], status="down", evals=[make_eval("e6", "web")]),
        m.NodeBatchUpdateStatus(node_ids=["n1"], status="ready"),
        m.NodeBatchUpdateStatus(node_ids=["n1", "n1"], status="down"),  # bad_request
        m.PlanApply(allocs_to_stop=[m.AllocStop(id="a2", client_status="lost")]),
        m.NodeReap(nodes=[m.Reap("n2", 16)]),
        m.JobDeregister(job_id="etl", eval=make_eval("e5", "etl", status="complete")),
        m.JobBatchDeregister(jobs=[m.Reap("etl", 19)]),
        m.ACLTokenBootstrap(token=make_token("root", "root-secret", type="management")),
        m.ACLTokenUpsert(tokens=[make_token("t1", "s1", expiration=T0), make_token("t2", "s2")]),
        m.ACLTokenDelete(accessor_ids=["t2"], reaps=[m.Reap("t1", 22)]),
        m.ACLTokenBootstrap(token=make_token("root2", type="management")),  # conflict
        m.JobRegister(job=make_job("bad", count=-1)),  # bad_request
        m.ReconcileSummaries(),
        m.JobDeregister(job_id="web", purge=True),
        m.Barrier(),
        m.Batch(
            entries=[
                encode_entry(m.NodeRegister(node=make_node("n3")), time=T0, rid="batched-1"),
                encode_entry(m.JobDeregister(job_id="nope"), time=T0, rid="batched-2"),  # not_found
            ]
        ),
        m.NodeUpdateDrain(node_id="n1", strategy=DrainStrategy(deadline=60 * SECOND)),
        m.NodeUpdateDrain(node_id="n1", done_started_at=1),  # conflict: not the node's drain
        m.NodeUpdateDrain(node_id="n3", mark_eligible=True),
        m.SchedulerConfigSet(config=SchedulerConfig(preference=[PreferenceSpec("worst-fit", 5)]), cas_index=0),
        m.SchedulerConfigSet(config=SchedulerConfig(), cas_index=0),  # not updated: set since
        m.SchedulerConfigSet(config=SchedulerConfig(validation=["resources"])),  # bad_request
        m.ACLPolicyUpsert(policies=[ACLPolicy(name="readers", node="read",
                                              namespaces=[ACLNamespaceRule(name="default", policy="read")])]),
        m.ACLPolicyUpsert(policies=[ACLPolicy(name="read")]),  # bad_request: a built-in name
        m.ACLPolicyDelete(names=["readers"]),
        m.ACLPolicyDelete(names=["readers"]),  # not_found
        m.NodeRegister(node=make_node("n4", secret_hash="a" * 64)),
        m.NodeRegister(node=make_node("n4", secret_hash="b" * 64)),  # permission_denied: the secret is set once
        m.NodeRegister(node=make_node("n4")),  # keeps its secret
        m.ClientGC(node_id="n4"),
        m.ClientGC(),  # every node
        m.ClientGC(node_id="n9"),  # not_found
        m.ClientGC(alloc_id="nope"),  # not_found
    ]
    return bodies + _queue_bodies(len(bodies) + 1)


def _queue_bodies(first: int) -> list[Any]:
    """Queues, a priority class, queued jobs admitted, evicted and finished (``first``: the index of the first)."""
    from fsm import messages as m
    from fsm.queues import Eviction, PriorityClass, Queue, QuotaLimit

    def queue(name: str) -> Queue:
        return Queue(name=name, cohort="lab", resources=[QuotaLimit("cpu", nominal=100, borrowing_limit=100)],
                     reclaim_within_cohort="Any")

    return [
        m.QueueUpsert(queues=[queue("team-a"), queue("team-b")]),
        m.QueueUpsert(queues=[Queue(name="bad", stop_policy="Sometimes")]),  # bad_request
        m.PriorityClassUpsert(classes=[PriorityClass(name="high", value=1000)]),
        m.JobRegister(job=make_job("qa", type="batch", queue="team-a"), eval=make_eval("qe1", "qa")),
        m.JobRegister(job=make_job("qb", type="batch", queue="team-b", priority_class="high")),
        m.JobRegister(job=make_job("qc", queue="nowhere")),  # bad_request: no such queue
        m.QueueAdmission(admits=[m.Admit("qa", 0), m.Admit("qb", 0)]),  # skipped: another submission
        m.QueueAdmission(admits=[m.Admit("qa", first + 3), m.Admit("qb", first + 4)], evals=[make_eval("qe2", "qa")]),
        m.QueueAdmission(evictions=[m.Evict("qa", Eviction("InCohortReclamation", "Preempted", "qb"))]),
        m.QueueDelete(names=["team-a"]),  # conflict: it holds a workload
        m.PriorityClassDelete(names=["high"]),
        m.JobDeregister(job_id="qa", purge=True),
        m.QueueDelete(names=["team-a"]),
    ]


def sample_log(start: int = T0) -> list[tuple[int, bytes]]:
    """``sample_bodies`` as numbered entries, with a retry, a skewed clock and odd bytes."""
    from fsm.messages import encode_entry

    entries: list[bytes] = []
    for i, body in enumerate(sample_bodies()):
        time = start + i * SECOND if i % 7 != 5 else start  # every 7th leader lags
        entries.append(encode_entry(body, time=time, rid=f"r{i}"))
    entries.append(entries[2])  # a client retry of the first registration (same rid)
    entries.append(b"\x03\x91\x01")  # malformed payload
    entries.append(bytes([200]) + b"from the future")  # unknown type, ignore flag
    return list(enumerate(entries, start=1))
