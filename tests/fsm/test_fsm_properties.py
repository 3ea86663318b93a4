"""Hypothesis stateful tests of the FSM: random logs of valid and invalid entries.

The state machine below plays a (sometimes buggy, sometimes hostile) leader:
every rule builds one log entry of some message type — usually valid, often
aimed at objects that exist, sometimes deliberately wrong — and applies it to
store A, committing after each entry. After every step it checks:

* ``last_time`` is ``max(previous, entry time)`` (times do go backwards here);
* a rejected, skipped or duplicate entry changed nothing but ``meta`` and the
  request-id memory, and a duplicate returns the first attempt's result;
* no entry asks to stop the node, and none fails with ``internal`` (a handler
  bug);
* every invariant in ``support.check_invariants`` (indexes equal a rebuild,
  alloc -> eval/job references, job status and summaries re-derived, job
  versions, GC marks, the ``index`` table, the journal).

At the end of each example it replays the same log into fresh stores:

* B applies everything in ONE group commit: same digest, byte-identical
  journal, identical results (group commit = commit per entry);
* C commits a prefix in chunks, applies more without committing, "crashes"
  (closes LMDB under the open transaction), reopens and replays the whole log
  from index 1: same digest (the lost group is re-applied exactly once);
* A is closed, reopened and fed a prefix and then the whole log again: every
  entry is skipped and the digest does not move.
"""

from __future__ import annotations

import shutil
from typing import Any

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from fsm import codec
from fsm import messages as m
from fsm.apply import jobs as handlers
from fsm.journal import Retention
from fsm.keys import MAX_ID_BYTES, valid_id
from fsm.messages import IGNORE_FLAG, MessageType, encode_batch, encode_entry
from fsm.store import TABLES
from fsm.structs import (
    MINUTE,
    SECOND,
    DeploymentStatus,
    DesiredTransition,
    DrainStrategy,
    Evaluation,
    Job,
    Task,
    TaskGroup,
    TaskState,
)
from tests.fsm.support import (
    Harness,
    check_invariants,
    dump,
    make_alloc,
    make_deployment,
    make_node,
    make_token,
    ordered,
    packed_map,
    secret_hash,
    state_diff,
    without_bookkeeping,
)

# -- id pools ------------------------------------------------------------------
# Small pools make entries collide with existing objects; each pool also holds
# one id of exactly the maximum length and two invalid ids.
ODD_IDS = ["", "nul\x00id"]


def ids(pool: list[str], long_char: str) -> st.SearchStrategy[str]:
    return st.sampled_from(pool * 8 + [long_char * MAX_ID_BYTES] + ODD_IDS)


JOB_POOL = ["web", "batch", "sys", "api"]
NODE_POOL = ["n1", "n2", "n3"]
EVAL_POOL = ["e1", "e2", "e3", "e4", "e5"]
ALLOC_POOL = ["a1", "a2", "a3", "a4", "a5", "a6"]
DEP_POOL = ["d1", "d2", "d3"]
TOKEN_POOL = ["t1", "t2", "t3"]

JOB_ID = ids(JOB_POOL, "J")
NODE_ID = ids(NODE_POOL, "N")
EVAL_ID = ids(EVAL_POOL, "E")
ALLOC_ID = ids(ALLOC_POOL, "A")
DEP_ID = ids(DEP_POOL, "D")
TOKEN_ID = ids(TOKEN_POOL, "T")
GROUP = st.sampled_from(["g1", "g2", "g1", "g2", "g3"])

EVAL_STATUS = st.sampled_from(
    ["pending", "complete", "pending", "complete", "blocked", "failed", "canceled", "bogus"]
)
CLIENT_STATUS = st.sampled_from(
    ["running", "complete", "pending", "failed", "lost", "running", "bogus"]
)

DEP_STATUS = st.sampled_from(["running", "successful", "failed", "cancelled", "paused", "bogus"])
NODE_STATUS = st.sampled_from(["ready", "down", "ready", "initializing", "bogus"])
ELIGIBILITY = st.sampled_from(["eligible", "ineligible", "bogus"])
# How a rule stamps the request id: 2 a fresh one, 0 none, 1 a client retry.
RID = st.sampled_from([2, 2, 0, 2, 1])
SECRETS = st.sampled_from(["s1", "s2", "s3", "s4", "s5"])  # few: collisions happen

# Values inside ``Any``-typed fields (task config): nested maps, odd keys, bytes.
CONFIG_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 9), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def job_specs(draw: st.DrawFn, job_id: str | None = None) -> Job:
    names = draw(st.lists(GROUP, min_size=1, max_size=3, unique=True))
    groups = [
        TaskGroup(
            name=name,
            count=draw(st.integers(0, 3)),
            tasks=[
                Task(
                    name="t",
                    config=draw(st.dictionaries(st.text(max_size=3), CONFIG_VALUES, max_size=2)),
                )
            ],
        )
        for name in names
    ]
    job = Job(
        id=job_id if job_id is not None else draw(JOB_ID),
        type=draw(st.sampled_from(["service", "batch", "service", "batch", "system"])),
        priority=draw(st.sampled_from([50, 70, 1, 100])),
        task_groups=groups,
        periodic=draw(st.booleans()) and draw(st.booleans()),
        stop=draw(st.integers(0, 5)) == 0,
        # Status fields are bookkeeping: apply must derive them, whatever is sent.
        status=draw(st.sampled_from(["pending", "running", "dead", "weird"])),
        version=draw(st.integers(0, 9)),
    )
    corruption = draw(
        st.sampled_from(
            [None] * 6
            + ["neg_count", "bad_type", "no_groups", "dup_groups", "priority", "no_tasks"]
        )
    )
    if corruption == "neg_count":
        job.task_groups[0].count = -1
    elif corruption == "bad_type":
        job.type = "bogus"
    elif corruption == "no_groups":
        job.task_groups = []
    elif corruption == "dup_groups":
        job.task_groups.append(TaskGroup(name=names[0], tasks=[Task(name="t")]))
    elif corruption == "priority":
        job.priority = 0
    elif corruption == "no_tasks":
        job.task_groups[0].tasks = []
    return job


@st.composite
def eval_specs(
    draw: st.DrawFn, job_id: str | None = None, eval_id: str | None = None
) -> Evaluation:
    return Evaluation(
        id=eval_id if eval_id is not None else draw(EVAL_ID),
        job_id=job_id if job_id is not None else draw(JOB_ID),
        status=draw(EVAL_STATUS),
        queued_allocations=draw(st.dictionaries(GROUP, st.integers(-1, 3), max_size=2)),
        wait_until=draw(st.sampled_from([0, 0, 5 * SECOND])),
    )


EVAL_LISTS = st.lists(eval_specs(), max_size=2)
MAYBE_EVAL = st.none() | eval_specs()


class FSMMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a: Harness | None = None
        self.clock = 1_700_000_000 * SECOND
        self.rid_seq = 0
        self.rids: list[str] = []
        self.first_result: dict[str, dict[str, Any]] = {}
        self.results: list[tuple[dict[str, Any], bool, bool]] = []
        self.state: dict[str, dict[bytes, bytes]] = {}
        self.purged: set[str] = set()
        self.deleted_from: set[str] = set()
        self.split = 0
        self.extra = 0
        self.chunk = 1
        self.retention: Retention | None = None
        # Batching: while batch_size >= 2, submitted entries are collected and
        # applied as one Batch entry (type 21) once batch_size are queued.
        self.batch_size = 0
        self.queued: list[tuple[bytes, int | None, str, Any]] = []

    # -- set-up ------------------------------------------------------------------
    @initialize(
        small_journal=st.booleans(),
        split=st.integers(0, 60),
        extra=st.integers(0, 8),
        chunk=st.integers(1, 7),
        nodes=st.lists(st.sampled_from(NODE_POOL), min_size=1, max_size=3, unique=True),
        jobs=st.lists(st.sampled_from(JOB_POOL), max_size=3, unique=True),
    )
    def setup(
        self,
        small_journal: bool,
        split: int,
        extra: int,
        chunk: int,
        nodes: list[str],
        jobs: list[str],
    ) -> None:
        self.retention = Retention(max_batches=12, max_bytes=16 << 10) if small_journal else None
        self.a = Harness.temp(retention=self.retention, request_ttl=5 * MINUTE)
        self.split, self.extra, self.chunk = split, extra, chunk
        self.state = dump(self.a.fsm)
        for node_id in nodes:
            self.submit(m.NodeRegister(node=make_node(node_id, status="ready")))
        for job_id in jobs:
            job = Job(
                id=job_id, task_groups=[TaskGroup(name="g1", count=2, tasks=[Task(name="t")])]
            )
            self.submit(m.JobRegister(job=job, eval=Evaluation(id="e1", job_id=job_id)))

    # -- the step: apply, commit, check ----------------------------------------
    def next_time(self, skew: int) -> int:
        """The leader's clock: usually forward, sometimes backwards (a new, skewed leader)."""
        self.clock = max(0, self.clock + skew * SECOND)
        return self.clock

    def next_rid(self, choice: int) -> str:
        if choice == 0 or (choice == 1 and not self.rids):
            return ""
        if choice == 1:
            return self.rids[(self.rid_seq * 7) % len(self.rids)]  # a client retry
        self.rid_seq += 1
        rid = f"r{self.rid_seq}"
        self.rids.append(rid)
        return rid

    def submit(self, body: Any, skew: int = 30, rid_choice: int = 2) -> None:
        time = self.next_time(skew)
        rid = self.next_rid(rid_choice)
        entry = encode_entry(body, time=time, rid=rid)
        if self.batch_size >= 2:
            self.queued.append((entry, time, rid, body))
            if len(self.queued) >= self.batch_size:
                self.flush_batch()
            return
        self.step(entry, time, rid, body)

    # -- batches ---------------------------------------------------------------------
    @rule(size=st.sampled_from([0, 0, 2, 3, 5]))
    def batching(self, size: int) -> None:
        """Switch batching on (size >= 2) or off; what is queued goes out first."""
        self.flush_batch()
        self.batch_size = size

    @rule(kind=st.sampled_from(["garbage", "nested", "unknown_flagged"]))
    def bad_item(self, kind: int) -> None:
        """An item that fails to decode, a batch inside a batch, or an ignorable unknown type."""
        if self.batch_size < 2:
            return
        time = None  # an item that does not decode has no clock
        if kind == "garbage":
            entry = bytes([MessageType.JOB_REGISTER]) + b"\xc1"
        elif kind == "nested":
            # It decodes (and is then rejected): its time moves the FSM's clock, as any item's does.
            time = self.clock
            entry = encode_batch([encode_entry(m.Barrier(), time=time, rid="")], time=time)
        else:
            entry = bytes([IGNORE_FLAG | 99]) + b"later"
        self.queued.append((entry, time, "", None))

    def flush_batch(self) -> None:
        if not self.queued:
            return
        queued, self.queued = self.queued, []
        a = self.a
        assert a is not None
        times = [t for _, t, _, _ in queued if t is not None]
        batch_time = max(times) if times else self.clock
        before = self.state
        last_before = a.fsm.last_time
        result = a.raw(encode_batch([e for e, _, _, _ in queued], time=batch_time))
        after = self.state = dump(a.fsm)
        assert result.ok and result.batch is not None and len(result.batch) == len(queued)
        assert a.fsm.applied_index == a.index
        assert a.fsm.last_time == max(last_before, batch_time)
        applied = False
        for (_, _time, rid, body), sub in zip(queued, result.batch, strict=True):
            label = type(body).__name__ if body is not None else "raw"
            event(f"batched {label}: {'skipped' if sub.skipped else 'duplicate' if sub.duplicate else sub.code or 'ok'}")
            note(f"#{a.index} batched {label} -> ok={sub.ok} code={sub.code} {sub.error} {sub.value}")
            assert sub.code != "internal", f"handler bug: {sub.error}"
            assert sub.index == a.index or sub.duplicate
            if body is None:
                assert not sub.ok or sub.skipped
                continue
            if sub.duplicate:
                assert sub.to_wire() == self.first_result[rid], "a retry must return the first result"
            elif rid:
                self.first_result[rid] = sub.to_wire()
            if sub.ok and not sub.duplicate:
                applied = True
                if isinstance(body, m.JobDeregister) and body.purge:
                    self.purged.add(body.job_id)
        changed = state_diff(without_bookkeeping(before), without_bookkeeping(after))
        if not applied:
            assert not changed, f"a batch of rejected/duplicate items changed {changed}"
        else:
            with a.fsm.read() as r:
                for table in TABLES:
                    newest = max((codec.unpack(v)["modify_index"] for v in after[table].values()), default=0)
                    # deleted: gone since the last step, or created and deleted inside this batch
                    if set(before[table]) - set(after[table]) or r.table_index(table) > newest:
                        self.deleted_from.add(table)
        new_batches = set(after["journal"]) - set(before["journal"])
        assert new_batches <= {a.index.to_bytes(8, "big")}, "journal batch at the wrong index"
        self.record_and_check(result)

    def record_and_check(self, result: Any) -> None:
        """Keep the step's answer (for the replay comparison) and check every invariant on the new state."""
        assert self.a is not None
        self.results.append((result.to_wire(), result.skipped, result.duplicate))
        with self.a.fsm.read() as r:
            check_invariants(
                r,
                purged=self.purged,
                deleted_from=self.deleted_from,
                journal_secrets=[secret_hash(s) for s in ("s1", "s2", "s3", "s4", "s5", "boot")],
            )

    def step(self, entry: bytes, time: int | None, rid: str = "", body: Any = None) -> None:
        a = self.a
        assert a is not None
        last_before = a.fsm.last_time
        before = self.state
        result = a.raw(entry)  # applies and commits; on_fatal raises FatalCalled
        after = dump(a.fsm)
        self.state = after
        label = type(body).__name__ if body is not None else "raw"
        event(
            f"{label}: {'skipped' if result.skipped else 'duplicate' if result.duplicate else result.code or 'ok'}"
        )
        note(
            f"#{a.index} {label} -> ok={result.ok} code={result.code} {result.error} {result.value}"
        )

        assert result.index == a.index or result.duplicate
        assert result.code != "internal", f"handler bug: {result.error}"
        assert a.fsm.applied_index == a.index
        expected_time = last_before if time is None else max(last_before, time)
        assert a.fsm.last_time == expected_time, "last_time must be max(previous, entry time)"
        with a.fsm.read() as r:
            assert r.applied_index == a.index and r.last_time == expected_time

        changed = state_diff(without_bookkeeping(before), without_bookkeeping(after))
        if not result.ok or result.skipped or result.duplicate:
            assert not changed, f"a rejected/skipped/duplicate entry changed {changed}"
        if result.duplicate:
            assert result.to_wire() == self.first_result[rid], (
                "a retry must return the first result"
            )
        elif rid and not result.skipped and time is not None:
            self.first_result[rid] = result.to_wire()
        new_batches = set(after["journal"]) - set(before["journal"])
        assert new_batches <= {a.index.to_bytes(8, "big")}, "journal batch at the wrong index"
        if new_batches:
            assert result.ok and not result.duplicate

        if result.ok and not result.skipped and not result.duplicate:
            for table in TABLES:
                if set(before[table]) - set(after[table]):
                    self.deleted_from.add(table)
            if isinstance(body, m.JobDeregister) and body.purge:
                self.purged.add(body.job_id)
        self.record_and_check(result)

    def modify_index(self, table: str, obj_id: str, right: bool) -> int:
        """The modify index the collector saw: the current one, or a stale one."""
        assert self.a is not None
        current = 0
        if valid_id(obj_id):
            raw = self.state[table].get(obj_id.encode())
            if raw is not None:
                current = codec.unpack(raw)["modify_index"]
        return current if right else current + 1

    # -- jobs ----------------------------------------------------------------------
    @rule(
        job=job_specs(),
        with_eval=st.booleans(),
        eval_id=EVAL_ID,
        enforce=st.sampled_from([None, None, None, "right", "wrong", "zero"]),
        skew=st.integers(-40, 60),
        rid=RID,
    )
    def register_job(
        self, job: Job, with_eval: bool, eval_id: str, enforce: str | None, skew: int, rid: int
    ) -> None:
        ev = Evaluation(id=eval_id, job_id=job.id) if with_eval else None
        index = None
        if enforce == "zero":
            index = 0
        elif enforce is not None:
            current = 0
            if valid_id(job.id) and job.id.encode() in self.state["jobs"]:
                current = codec.unpack(self.state["jobs"][job.id.encode()])["job_modify_index"]
            index = current if enforce == "right" else current + 3
        self.submit(m.JobRegister(job=job, eval=ev, enforce_index=index), skew, rid)

    @rule(
        job_id=JOB_ID,
        purge=st.booleans(),
        ev=MAYBE_EVAL,
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def deregister_job(
        self, job_id: str, purge: bool, ev: Evaluation | None, skew: int, rid: int
    ) -> None:
        if ev is not None:
            ev.job_id = job_id
        self.submit(m.JobDeregister(job_id=job_id, purge=purge, eval=ev), skew, rid)

    @rule(jobs=st.lists(st.tuples(JOB_ID, st.booleans()), max_size=3), skew=st.integers(-5, 60))
    def batch_deregister(self, jobs: list[tuple[str, bool]], skew: int) -> None:
        reaps = [
            m.Reap(id=j, modify_index=self.modify_index("jobs", j, right)) for j, right in jobs
        ]
        self.submit(m.JobBatchDeregister(jobs=reaps), skew)

    # -- evals ---------------------------------------------------------------------
    @rule(
        evals=st.lists(eval_specs(), min_size=1, max_size=3),
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def upsert_evals(self, evals: list[Evaluation], skew: int, rid: int) -> None:
        self.submit(m.EvalUpsert(evals=evals), skew, rid)

    @rule(
        evals=st.lists(st.tuples(EVAL_ID, st.booleans()), max_size=3),
        allocs=st.lists(st.tuples(ALLOC_ID, st.booleans()), max_size=3),
        skew=st.integers(-5, 60),
    )
    def reap_evals(
        self, evals: list[tuple[str, bool]], allocs: list[tuple[str, bool]], skew: int
    ) -> None:
        msg = m.EvalReap(
            evals=[
                m.Reap(id=e, modify_index=self.modify_index("evals", e, right))
                for e, right in evals
            ],
            allocs=[
                m.Reap(id=a, modify_index=self.modify_index("allocs", a, right))
                for a, right in allocs
            ],
        )
        self.submit(msg, skew)

    # -- plans and allocs ----------------------------------------------------------
    @rule(
        job_id=JOB_ID,
        eval_id=EVAL_ID,
        places=st.lists(
            st.tuples(
                ALLOC_ID,
                NODE_ID,
                GROUP,
                st.sampled_from(["pending", "pending", "running"]),
                st.sampled_from(["run", "run", "run", "stop", "evict"]),
                st.sampled_from(["", "", "d1", "d2"]),
                st.sampled_from(["", "", "a1", "a2"]),
                st.sampled_from(["plan", "plan", "plan", "other"]),
            ),
            max_size=3,
        ),
        stops=st.lists(
            st.tuples(
                ALLOC_ID,
                st.sampled_from(["stop", "stop", "evict", "run"]),
                st.sampled_from(["", "", "lost", "complete"]),
            ),
            max_size=2,
        ),
        dep=st.none() | st.tuples(DEP_ID, DEP_STATUS),
        plan_eval_status=st.sampled_from(["complete", "complete", "blocked", None]),
        other_eval=EVAL_ID,
        corruption=st.sampled_from(
            [None] * 5 + ["client_status", "desired_status", "stop_desired", "stop_client"]
        ),
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def plan(
        self,
        job_id: str,
        eval_id: str,
        places: list[tuple],
        stops: list[tuple],
        dep: tuple[str, str] | None,
        plan_eval_status: str | None,
        other_eval: str,
        corruption: str | None,
        skew: int,
        rid: int,
    ) -> None:
        """A plan from the id pools: often aimed at missing jobs, nodes or evals."""
        allocs = []
        for alloc_id, node_id, group, client, desired, dep_id, prev, which_eval in places:
            alloc = make_alloc(
                alloc_id, eval_id if which_eval == "plan" else other_eval, job_id, node_id, group
            )
            alloc.client_status = client
            alloc.desired_status = desired
            alloc.deployment_id = dep_id
            alloc.previous_allocation = prev
            allocs.append(alloc)
        to_stop = [m.AllocStop(id=a, desired_status=d, client_status=c) for a, d, c in stops]
        if corruption in ("client_status", "desired_status") and allocs:
            setattr(allocs[0], corruption, "bogus")
        elif corruption == "stop_desired" and to_stop:
            to_stop[0].desired_status = "bogus"
        elif corruption == "stop_client" and to_stop:
            to_stop[0].client_status = "bogus"
        evals = []
        if plan_eval_status is not None:
            evals = [Evaluation(id=eval_id, job_id=job_id, status=plan_eval_status)]
        deployment = None
        if dep is not None:
            deployment = make_deployment(dep[0], job_id, dep[1], groups=("g1", "g2"))
        msg = m.PlanApply(
            eval_id=eval_id,
            job_id=job_id,
            allocs_to_place=allocs,
            allocs_to_stop=to_stop,
            deployment=deployment,
            evals=evals,
        )
        self.submit(msg, skew, rid)

    def existing(self, table: str) -> list[dict[str, Any]]:
        return [codec.unpack(raw) for raw in self.state[table].values()]

    @rule(
        pick=st.integers(0, 1000),
        allocs=st.lists(st.tuples(ALLOC_ID, st.integers(0, 1000), GROUP), min_size=1, max_size=3),
        stop=st.lists(ALLOC_ID, max_size=1),
        with_deployment=st.booleans(),
        eval_status=st.sampled_from(["complete", "complete", "blocked", "failed"]),
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def schedule(
        self,
        pick: int,
        allocs: list[tuple[str, int, str]],
        stop: list[str],
        with_deployment: bool,
        eval_status: str,
        skew: int,
        rid: int,
    ) -> None:
        """A plan a correct scheduler would make: an existing job, registered nodes."""
        jobs = self.existing("jobs")
        nodes = self.existing("nodes")
        if not jobs or not nodes:
            return
        job = jobs[pick % len(jobs)]
        eval_id = EVAL_POOL[pick % len(EVAL_POOL)]
        dep_id = DEP_POOL[pick % len(DEP_POOL)] if with_deployment else ""
        placed = [
            make_alloc(alloc_id, eval_id, job["id"], nodes[n % len(nodes)]["id"], group)
            for alloc_id, n, group in allocs
        ]
        for alloc in placed:
            alloc.deployment_id = dep_id
        msg = m.PlanApply(
            eval_id=eval_id,
            job_id=job["id"],
            allocs_to_place=placed,
            allocs_to_stop=[m.AllocStop(id=a, client_status="") for a in stop],
            deployment=make_deployment(dep_id, job["id"], "running", ("g1", "g2"))
            if dep_id
            else None,
            evals=[Evaluation(id=eval_id, job_id=job["id"], status=eval_status)],
        )
        self.submit(msg, skew, rid)

    @rule(
        picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
        outcome=st.sampled_from(["complete", "failed", "lost", "complete"]),
        healthy=st.sampled_from([None, True, False]),
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def client_progress(
        self, picks: list[int], outcome: str, healthy: bool | None, skew: int, rid: int
    ) -> None:
        """Clients move existing allocs forward: pending -> running -> a terminal status."""
        allocs = self.existing("allocs")
        if not allocs:
            return
        states = []
        for p in picks:
            alloc = allocs[p % len(allocs)]
            status = "running" if alloc["client_status"] == "pending" else outcome
            states.append(
                m.AllocClientState(
                    id=alloc["id"],
                    client_status=status,
                    deployment_status=None
                    if healthy is None
                    else DeploymentStatus(healthy=healthy),
                )
            )
        self.submit(m.AllocClientUpdate(allocs=states), skew, rid)

    @rule(
        updates=st.lists(
            st.tuples(
                ALLOC_ID, CLIENT_STATUS, st.sampled_from([None, None, True, False]), st.booleans()
            ),
            min_size=1,
            max_size=3,
        ),
        evals=EVAL_LISTS,
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def client_update(
        self, updates: list[tuple], evals: list[Evaluation], skew: int, rid: int
    ) -> None:
        states = [
            m.AllocClientState(
                id=alloc_id,
                client_status=status,
                task_states={"t": TaskState(state="running")} if with_tasks else None,
                deployment_status=None if healthy is None else DeploymentStatus(healthy=healthy),
            )
            for alloc_id, status, healthy, with_tasks in updates
        ]
        self.submit(m.AllocClientUpdate(allocs=states, evals=evals), skew, rid)

    @rule(
        allocs=st.dictionaries(
            ALLOC_ID, st.tuples(st.booleans(), st.booleans(), st.booleans()), max_size=3
        ),
        evals=EVAL_LISTS,
        skew=st.integers(-5, 60),
    )
    def desired_transition(
        self, allocs: dict[str, tuple[bool, bool, bool]], evals: list[Evaluation], skew: int
    ) -> None:
        transitions = {
            a: DesiredTransition(migrate=x, reschedule=y, force_reschedule=z)
            for a, (x, y, z) in allocs.items()
        }
        self.submit(m.AllocDesiredTransition(allocs=transitions, evals=evals), skew)

    # -- deployments ---------------------------------------------------------------
    @rule(dep_id=DEP_ID, job_id=JOB_ID, status=DEP_STATUS, canaries=st.lists(ALLOC_ID, max_size=2), skew=st.integers(-5, 60))
    def upsert_deployment(self, dep_id: str, job_id: str, status: str, canaries: list[str], skew: int) -> None:
        dep = make_deployment(dep_id, job_id, status, ("g1", "g2"))
        dep.task_groups["g1"].desired_canaries = len(canaries)
        dep.task_groups["g1"].placed_canaries = canaries
        self.submit(m.DeploymentUpsert(deployment=dep), skew)

    @rule(dep_id=DEP_ID, groups=st.lists(st.sampled_from(["g1", "g2", "g9"]), max_size=2), ev=MAYBE_EVAL,
          skew=st.integers(-5, 60))
    def promote_deployment(self, dep_id: str, groups: list[str], ev: Evaluation | None, skew: int) -> None:
        """Mostly refused (no canaries, unhealthy ones, a finished rollout); sometimes promoted."""
        self.submit(m.DeploymentPromote(deployment_id=dep_id, groups=groups, eval=ev), skew)

    @rule(dep_id=DEP_ID, status=DEP_STATUS, ev=MAYBE_EVAL, skew=st.integers(-5, 60))
    def deployment_status(self, dep_id: str, status: str, ev: Evaluation | None, skew: int) -> None:
        self.submit(m.DeploymentStatusUpdate(deployment_id=dep_id, status=status, eval=ev), skew)

    @rule(dep_id=DEP_ID, job=job_specs(), ev=MAYBE_EVAL, skew=st.integers(-5, 60))
    def deployment_rollback(self, dep_id: str, job: Job, ev: Evaluation | None, skew: int) -> None:
        """A failed rollout's auto-revert: often refused (another job, a version registered since)."""
        if ev is not None:
            ev.job_id = job.id
        self.submit(m.DeploymentStatusUpdate(deployment_id=dep_id, status="failed", eval=ev, job=job), skew)

    @rule(deps=st.lists(st.tuples(DEP_ID, st.booleans()), max_size=3), skew=st.integers(-5, 60))
    def reap_deployments(self, deps: list[tuple[str, bool]], skew: int) -> None:
        reaps = [
            m.Reap(id=d, modify_index=self.modify_index("deployments", d, right))
            for d, right in deps
        ]
        self.submit(m.DeploymentReap(deployments=reaps), skew)

    # -- nodes ---------------------------------------------------------------------
    @rule(node_id=NODE_ID, status=NODE_STATUS, eligibility=ELIGIBILITY, skew=st.integers(-5, 60))
    def register_node(self, node_id: str, status: str, eligibility: str, skew: int) -> None:
        node = make_node(node_id, status=status, scheduling_eligibility=eligibility)
        node.status_updated_at = 12345  # apply must stamp this itself
        self.submit(m.NodeRegister(node=node), skew)

    @rule(node_id=NODE_ID, status=NODE_STATUS, evals=EVAL_LISTS, skew=st.integers(-5, 60))
    def node_status(self, node_id: str, status: str, evals: list[Evaluation], skew: int) -> None:
        self.submit(m.NodeUpdateStatus(node_id=node_id, status=status, evals=evals), skew)

    @rule(node_ids=st.lists(NODE_ID, max_size=4), status=NODE_STATUS, evals=EVAL_LISTS, skew=st.integers(-5, 60))
    def node_batch_status(self, node_ids: list[str], status: str, evals: list[Evaluation], skew: int) -> None:
        self.submit(m.NodeBatchUpdateStatus(node_ids=node_ids, status=status, evals=evals), skew)

    @rule(
        node_id=NODE_ID,
        eligibility=ELIGIBILITY,
        drain=st.none() | st.booleans(),
        evals=EVAL_LISTS,
        skew=st.integers(-5, 60),
    )
    def node_eligibility(
        self, node_id: str, eligibility: str, drain: bool | None, evals: list[Evaluation], skew: int
    ) -> None:
        self.submit(
            m.NodeUpdateEligibility(
                node_id=node_id, eligibility=eligibility, drain=drain, evals=evals
            ),
            skew,
        )

    @rule(
        node_id=NODE_ID,
        deadline=st.none() | st.sampled_from([-1, 0, SECOND, 3600 * SECOND]),
        ignore_system=st.booleans(),
        mark_eligible=st.booleans(),
        done=st.sampled_from([0, 0, 1]),
        evals=EVAL_LISTS,
        skew=st.integers(-5, 60),
    )
    def node_drain(
        self, node_id: str, deadline: int | None, ignore_system: bool, mark_eligible: bool, done: int,
        evals: list[Evaluation], skew: int,
    ) -> None:
        """Start, change or end a drain; ``done`` ends it as the drainer does (mostly a conflict)."""
        strategy = None if deadline is None else DrainStrategy(deadline=deadline, ignore_system_jobs=ignore_system)
        if done:
            node = next((n for n in self.existing("nodes") if n["id"] == node_id), None)
            drain = node and node.get("drain_strategy")
            done = drain["started_at"] if drain and deadline is None else 1
        self.submit(
            m.NodeUpdateDrain(
                node_id=node_id, strategy=strategy, mark_eligible=mark_eligible, done_started_at=done, evals=evals
            ),
            skew,
        )

    @rule(nodes=st.lists(st.tuples(NODE_ID, st.booleans()), max_size=3), skew=st.integers(-5, 60))
    def reap_nodes(self, nodes: list[tuple[str, bool]], skew: int) -> None:
        reaps = [
            m.Reap(id=n, modify_index=self.modify_index("nodes", n, right)) for n, right in nodes
        ]
        self.submit(m.NodeReap(nodes=reaps), skew)

    # -- ACL -----------------------------------------------------------------------
    @rule(
        accessor=TOKEN_ID,
        type=st.sampled_from(["management", "management", "client", "bogus"]),
        rid=RID,
    )
    def acl_bootstrap(self, accessor: str, type: str, rid: int) -> None:
        self.submit(m.ACLTokenBootstrap(token=make_token(accessor, "boot", type=type)), 10, rid)

    @rule(
        tokens=st.lists(
            st.tuples(
                TOKEN_ID,
                SECRETS,
                st.sampled_from(["client", "management", "client"]),
                st.sampled_from([0, 0, 1, 10**12]),
            ),
            min_size=1,
            max_size=3,
        ),
        corruption=st.sampled_from([None] * 5 + ["bad_hash", "negative_expiry", "bogus_type"]),
        skew=st.integers(-5, 60),
        rid=RID,
    )
    def acl_upsert(self, tokens: list[tuple], corruption: str | None, skew: int, rid: int) -> None:
        now = self.clock
        built = []
        for accessor, secret, type_, expiry in tokens:
            token = make_token(accessor, secret, type=type_)
            # 1: already expired when applied; 10**12: expires ~17 minutes later.
            token.expiration_time = now + expiry if expiry else 0
            built.append(token)
        if corruption == "bad_hash":
            built[0].secret_hash = built[0].secret_hash[:10]
        elif corruption == "negative_expiry":
            built[0].expiration_time = -1
        elif corruption == "bogus_type":
            built[0].type = "bogus"
        self.submit(m.ACLTokenUpsert(tokens=built), skew, rid)

    @rule(
        accessors=st.lists(TOKEN_ID, max_size=2),
        reaps=st.lists(st.tuples(TOKEN_ID, st.booleans()), max_size=2),
        skew=st.integers(-5, 60),
    )
    def acl_delete(self, accessors: list[str], reaps: list[tuple[str, bool]], skew: int) -> None:
        msg = m.ACLTokenDelete(
            accessor_ids=accessors,
            reaps=[
                m.Reap(id=t, modify_index=self.modify_index("acl_tokens", t, right))
                for t, right in reaps
            ],
        )
        self.submit(msg, skew)

    @rule(skew=st.integers(-60, 60), rid=RID)
    def barrier(self, skew: int, rid: int) -> None:
        self.submit(m.Barrier(), skew, rid)

    @rule(skew=st.integers(-5, 60))
    def reconcile_summaries(self, skew: int) -> None:
        """Summaries always equal a recount here, so a reconcile must change no counter."""
        self.flush_batch()  # queued items may rightly change counters
        before = {k: codec.unpack(v)["summary"] for k, v in self.state["job_summary"].items()}
        self.submit(m.ReconcileSummaries(), skew)
        after = {k: codec.unpack(v)["summary"] for k, v in self.state["job_summary"].items()}
        assert after == before

    # -- malformed and unknown entries ---------------------------------------------
    @rule(data=st.binary(max_size=40))
    def random_bytes(self, data: bytes) -> None:
        if data and data[0] & IGNORE_FLAG:
            data = bytes([data[0] & 0x7F]) + data[1:]  # unflagged unknown types stop the node
        if data and data[0] not in MessageType._value2member_map_:
            data = bytes([MessageType.BARRIER]) + data[1:]
        self.step(data, None)

    @rule(
        kind=st.sampled_from(
            [
                "truncate",
                "wrong_type",
                "unknown_field",
                "version",
                "negative_time",
                "envelope",
                "not_map",
            ]
        ),
        cut=st.integers(1, 30),
        skew=st.integers(-5, 60),
    )
    def malformed(self, kind: str, cut: int, skew: int) -> None:
        time = self.next_time(skew)
        job = Job(id="web", task_groups=[TaskGroup(name="g1", tasks=[Task(name="t")])])
        body: dict[str, Any] = codec.to_wire(m.JobRegister(job=job))
        envelope: dict[str, Any] = {
            "v": codec.SCHEMA_VERSION,
            "time": time,
            "rid": "",
            "body": body,
        }
        if kind == "wrong_type":
            body["job"]["task_groups"][0]["count"] = "three"
        elif kind == "unknown_field":
            body["job"]["task_groups"][0]["colour"] = "blue"
        elif kind == "version":
            envelope["v"] = codec.SCHEMA_VERSION + 1
        elif kind == "negative_time":
            envelope["time"] = -1
        elif kind == "envelope":
            envelope["extra"] = 1
        entry = bytes([MessageType.JOB_REGISTER]) + codec.pack(envelope)
        if kind == "truncate":
            entry = entry[: max(1, len(entry) - cut)]
        elif kind == "not_map":
            entry = bytes([MessageType.JOB_REGISTER]) + codec.pack([1, 2, 3])
        self.step(entry, None)

    @rule(code=st.integers(IGNORE_FLAG, 255), payload=st.binary(max_size=20))
    def unknown_flagged(self, code: int, payload: bytes) -> None:
        self.step(bytes([code]) + payload, None)

    # -- end of example: replays ---------------------------------------------------
    def teardown(self) -> None:
        a = self.a
        if a is None:
            return
        self.flush_batch()
        others: list[Harness] = []
        try:
            entries = list(a.entries)
            digest, applied = a.fsm.digest()
            journal = self.state["journal"]
            assert applied == len(entries)

            # B: the whole log in one group commit.
            b = Harness.temp(retention=self.retention, request_ttl=5 * MINUTE)
            others.append(b)
            results = b.fsm.apply_batch(entries)
            assert [(r.to_wire(), r.skipped, r.duplicate) for r in results] == self.results
            assert b.fsm.digest()[0] == digest, "one group commit must equal one commit per entry"
            assert dump(b.fsm)["journal"] == journal

            # C: a committed prefix (in chunks), an uncommitted tail, a crash, a full replay.
            c = Harness.temp(retention=self.retention, request_ttl=5 * MINUTE)
            others.append(c)
            split = min(self.split, len(entries))
            for start in range(0, split, self.chunk):
                c.fsm.apply_batch(entries[start : min(split, start + self.chunk)])
            for index, entry in entries[split : split + self.extra]:
                c.fsm.apply(index, entry)
            c.fsm.store.env.close()  # crash: the open write transaction is lost
            c.fsm = c._open()
            # (apply itself commits early after undoing a rejected entry's writes)
            assert split <= c.fsm.applied_index <= min(len(entries), split + self.extra)
            c.fsm.apply_batch(entries)
            assert c.fsm.digest()[0] == digest, "a crash and a full replay must converge"

            # A: restart, then re-apply a prefix and the whole log: nothing changes.
            a.reopen()
            assert a.fsm.applied_index == len(entries)
            replay = a.fsm.apply_batch(entries[:split]) + a.fsm.apply_batch(entries)
            assert all(r.skipped for r in replay)
            assert a.fsm.digest() == (digest, applied)
        finally:
            for h in [a, *others]:
                try:
                    h.fsm.close()
                except Exception:
                    pass
                shutil.rmtree(h.path, ignore_errors=True)


FSMMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
TestFSMStateMachine = FSMMachine.TestCase


@settings(max_examples=200, deadline=None)
@given(job=job_specs(), time=st.integers(0, 2**63 - 1), rid=st.text(max_size=40))
def test_entry_bytes_are_those_of_the_plain_wire_maps(job: Job, time: int, rid: str) -> None:
    """encode_entry packs records in C; the entry holds exactly the maps ``packed_map`` builds, in order."""
    body = m.JobRegister(job=job, eval=None)
    plain = {"v": codec.SCHEMA_VERSION, "time": time, "rid": rid, "body": packed_map(body)}
    entry = m.encode_entry(body, time=time, rid=rid)
    assert entry[0] == m.MessageType.JOB_REGISTER
    assert ordered(codec.unpack(entry[1:])) == ordered(plain)
    assert m.decode_entry(entry).body == body


def _wire_spec(job: Job) -> dict[str, Any]:
    """The definition ``same_spec`` must agree with: the wire map without the bookkeeping fields."""
    data = codec.to_wire(job)
    for name in handlers._JOB_BOOKKEEPING:
        del data[name]
    return data


@settings(max_examples=300, deadline=None)
@given(
    job=job_specs(),
    bookkeeping=st.dictionaries(
        st.sampled_from(handlers._JOB_BOOKKEEPING), st.sampled_from([0, 7, "", "dead", True, False])
    ),
    change=st.sampled_from([None, "priority", "count", "config", "group", "meta", "stop"]),
)
def test_same_spec_agrees_with_the_wire_maps_without_bookkeeping(
    job: Job, bookkeeping: dict[str, Any], change: str | None
) -> None:
    """Registering a known job keeps its version exactly when its spec is the same, as before."""
    assert set(handlers._NO_BOOKKEEPING) == set(handlers._JOB_BOOKKEEPING)
    other = codec.from_wire(Job, codec.unpack(codec.pack(codec.to_wire(job))))  # as read from the store
    for name, value in bookkeeping.items():
        setattr(other, name, value)
    if change in ("count", "config") and not (other.task_groups and other.task_groups[0].tasks):
        change = "group"  # a corrupted spec without groups or tasks
    if change == "priority":
        other.priority += 1
    elif change == "count":
        other.task_groups[0].count += 1
    elif change == "config":
        other.task_groups[0].tasks[0].config["k"] = [1, {"x": None}]
    elif change == "group":
        other.task_groups.append(TaskGroup(name="zz", tasks=[Task(name="t")]))
    elif change == "meta":
        other.meta["k"] = "v"
    elif change == "stop":
        other.stop = not other.stop
    expected = _wire_spec(job) == _wire_spec(other)
    assert handlers.same_spec(job, other) is expected
    assert handlers.same_spec(other, job) is expected
    assert expected or change is not None
