"""Helpers for the snapshot tests: a generator of valid log entries, state builders, a forger.

States are built the way a server builds them, by applying entries through
the real FSM (so indexes, journal, GC marks and request ids are all present),
from a small pool of ids so that entries interact (updates, stops, reaps).
The forger writes files in the snapshot format with arbitrary contents and a
correct checksum, to test what the structural checks refuse.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from fsm import codec
from fsm import messages as m
from fsm.machine import FSM
from fsm.scheduler_config import PreferenceSpec, SchedulerConfig
from fsm.structs import (
    CLIENT_STATUSES,
    EVAL_STATUSES,
    NODE_STATUSES,
    SECOND,
    ACLToken,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    Node,
    Task,
    TaskGroup,
)
from snapshot.format import (
    CHUNK,
    CODEC_RAW,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER,
    KIND_END,
    KIND_RECORDS,
    MAGIC,
    META_LEN,
    TRAILER,
    TRAILER_MAGIC,
    pack_records,
)

T0 = 1_700_000_000 * SECOND
SMALL_MAP = 256 << 20  # many small envs per test run; keep the reservation modest

JOBS = [f"job-{i}" for i in range(4)]
NODES = [f"node-{i}" for i in range(3)]
EVALS = [f"eval-{i}" for i in range(6)]
ALLOCS = [f"alloc-{i}" for i in range(8)]
DEPLOYMENTS = [f"dep-{i}" for i in range(2)]
TOKENS = [f"tok-{i}" for i in range(3)]


def new_fsm(path: str) -> FSM:
    def fatal(exc: BaseException) -> None:
        raise AssertionError(f"FSM asked to stop: {exc}")

    return FSM(path, map_size=SMALL_MAP, on_fatal=fatal)


def _job(job_id: str, groups: int, count: int, priority: int, stop: bool, meta: str) -> Job:
    tgs = [
        TaskGroup(name=f"g{i}", count=count, tasks=[Task(name="t", config={"cmd": meta})])
        for i in range(groups)
    ]
    return Job(
        id=job_id, task_groups=tgs, priority=priority, stop=stop, meta={"m": meta} if meta else {}
    )


def _token(accessor: str, type_: str, expiry: int) -> ACLToken:
    return ACLToken(
        accessor_id=accessor,
        secret_hash=hashlib.sha256(accessor.encode()).hexdigest(),
        type=type_,
        expiration_time=expiry,
    )


ids = st.sampled_from
small_text = st.text(alphabet="abcxyz", max_size=6)

_job_register = st.builds(
    lambda job_id, groups, count, prio, stop, meta, with_eval, eval_id: m.JobRegister(
        job=_job(job_id, groups, count, prio, stop, meta),
        eval=Evaluation(id=eval_id, job_id=job_id) if with_eval else None,
    ),
    ids(JOBS),
    st.integers(1, 2),
    st.integers(0, 3),
    st.integers(1, 100),
    st.booleans(),
    small_text,
    st.booleans(),
    ids(EVALS),
)
_job_deregister = st.builds(m.JobDeregister, job_id=ids(JOBS), purge=st.booleans())
_eval_upsert = st.builds(
    lambda eid, jid, status: m.EvalUpsert(evals=[Evaluation(id=eid, job_id=jid, status=status)]),
    ids(EVALS),
    ids(JOBS),
    ids(EVAL_STATUSES),
)
_plan = st.builds(
    lambda place, stop, eid, jid, nid, group: m.PlanApply(
        eval_id=eid,
        job_id=jid,
        allocs_to_place=[
            Allocation(
                id=a, eval_id=eid, job_id=jid, node_id=nid, task_group=group, name=f"{jid}.{group}"
            )
            for a in place
        ],
        allocs_to_stop=[m.AllocStop(id=a) for a in stop],
    ),
    st.lists(ids(ALLOCS), max_size=3, unique=True),
    st.lists(ids(ALLOCS), max_size=2, unique=True),
    ids(EVALS),
    ids(JOBS),
    ids(NODES),
    st.sampled_from(["g0", "g1"]),
)
_client_update = st.builds(
    lambda a, status: m.AllocClientUpdate(allocs=[m.AllocClientState(id=a, client_status=status)]),
    ids(ALLOCS),
    ids(CLIENT_STATUSES),
)
_node_register = st.builds(
    lambda nid, status, attr: m.NodeRegister(
        node=Node(id=nid, status=status, attributes={"a": attr})
    ),
    ids(NODES),
    ids(NODE_STATUSES),
    small_text,
)
_node_status = st.builds(m.NodeUpdateStatus, node_id=ids(NODES), status=ids(NODE_STATUSES))
_node_batch_status = st.builds(
    m.NodeBatchUpdateStatus, node_ids=st.lists(ids(NODES), min_size=1, max_size=3, unique=True), status=ids(NODE_STATUSES)
)
_deployment = st.builds(
    lambda did, jid: m.DeploymentUpsert(deployment=Deployment(id=did, job_id=jid)),
    ids(DEPLOYMENTS),
    ids(JOBS),
)
_tokens = st.builds(
    lambda acc, type_, expiry: m.ACLTokenUpsert(tokens=[_token(acc, type_, expiry)]),
    ids(TOKENS),
    st.sampled_from(["client", "management"]),
    st.sampled_from([0, T0 + 5 * SECOND]),
)
_eval_reap = st.builds(
    lambda eids, mi: m.EvalReap(evals=[m.Reap(e, mi) for e in eids]),
    st.lists(ids(EVALS), max_size=2, unique=True),
    st.integers(0, 40),
)
_node_reap = st.builds(
    lambda nid, mi: m.NodeReap(nodes=[m.Reap(nid, mi)]), ids(NODES), st.integers(0, 40)
)

_scheduler_config = st.builds(
    lambda algorithm, buckets, cas: m.SchedulerConfigSet(
        config=SchedulerConfig(preference=[PreferenceSpec(algorithm, buckets)], cluster_top=buckets),
        cas_index=cas,
    ),
    st.sampled_from(["best-fit", "worst-fit"]),
    st.integers(1, 5),
    st.none() | st.integers(0, 40),
)

payloads = st.one_of(
    _job_register,
    _job_register,
    _job_deregister,
    _eval_upsert,
    _plan,
    _plan,
    _client_update,
    _node_register,
    _node_register,
    _node_status,
    _node_batch_status,
    _deployment,
    _tokens,
    _eval_reap,
    _node_reap,
    _scheduler_config,
    st.just(m.Barrier()),
)
# (payload, seconds since the previous entry, request id or not, commit after this entry)
_SETUP = [(m.NodeRegister(node=Node(id=n, status="ready")), 0, True, False) for n in NODES] + [
    (m.JobRegister(job=_job(j, 2, 1, 50, False, "")), 0, True, False) for j in JOBS
]
# Usually start from registered nodes and jobs, so plans place allocations.
entries = st.builds(
    lambda setup, rest: (_SETUP if setup else []) + rest,
    st.booleans() | st.just(True),
    st.lists(st.tuples(payloads, st.integers(0, 3), st.booleans(), st.booleans()), max_size=40),
)


def apply_entries(fsm: FSM, items: Iterable[tuple[Any, int, bool, bool]], *, start: int = 1) -> int:
    """Apply generated entries with group commits; returns the next index. Index gaps mimic no-ops."""
    index = start
    now = T0
    for n, (body, dt, with_rid, commit) in enumerate(items):
        now += dt * SECOND
        entry = m.encode_entry(body, time=now, rid=f"rid-{index}" if with_rid else "")
        fsm.apply(index, entry)
        if commit:
            fsm.commit()
        index += 2 if n % 7 == 3 else 1
    fsm.commit()
    return index


def example_entries(seed: int = 7, n: int = 60) -> list[tuple[Any, int, bool, bool]]:
    """A fixed, varied entry list (no hypothesis) for deterministic tests."""
    rng = random.Random(seed)
    out: list[tuple[Any, int, bool, bool]] = []
    for nid in NODES:
        out.append((m.NodeRegister(node=Node(id=nid, status="ready")), 1, True, False))
    for i, jid in enumerate(JOBS):
        out.append(
            (
                m.JobRegister(
                    job=_job(jid, 2, 2, 50, False, "x"), eval=Evaluation(id=EVALS[i], job_id=jid)
                ),
                1,
                True,
                True,
            )
        )
    for i in range(n):
        a = ALLOCS[i % len(ALLOCS)]
        jid = JOBS[i % len(JOBS)]
        out.append(
            (
                m.PlanApply(
                    eval_id=EVALS[i % 4],
                    job_id=jid,
                    allocs_to_place=[
                        Allocation(
                            id=a,
                            eval_id=EVALS[i % 4],
                            job_id=jid,
                            node_id=rng.choice(NODES),
                            task_group="g0",
                        )
                    ],
                ),
                rng.randint(0, 2),
                bool(i % 2),
                i % 5 == 0,
            )
        )
        if i % 3 == 0:
            out.append(
                (
                    m.AllocClientUpdate(
                        allocs=[m.AllocClientState(id=a, client_status=rng.choice(CLIENT_STATUSES))]
                    ),
                    1,
                    True,
                    False,
                )
            )
    out.append((m.ACLTokenUpsert(tokens=[_token("tok-0", "management", 0)]), 1, True, True))
    out.append(
        (m.DeploymentUpsert(deployment=Deployment(id="dep-0", job_id="job-0")), 1, True, True)
    )
    return out


# -- forging files -------------------------------------------------------------
def forge(
    path: str,
    meta: dict[str, Any],
    chunks: list[tuple[int, list[tuple[bytes, bytes]]]],
    *,
    major: int = FORMAT_MAJOR,
    minor: int = FORMAT_MINOR,
    summary: dict[str, Any] | None = None,
) -> None:
    """Write a snapshot-format file with the given metadata map and chunks, and a valid checksum.

    ``summary`` defaults to the true per-type counts and sizes of ``chunks``
    (listing every type the metadata counts, as the writer does).
    """
    out = bytearray()
    out += HEADER.pack(MAGIC, major, minor)
    raw_meta = codec.pack(meta)
    out += META_LEN.pack(len(raw_meta)) + raw_meta
    totals: dict[int, list[int]] = {int(c): [0, 0] for c, _ in meta.get("counts", [])}
    for code, records in chunks:
        raw = pack_records([k for k, _ in records], [v for _, v in records])
        out += CHUNK.pack(KIND_RECORDS, code, CODEC_RAW, len(records), len(raw), len(raw)) + raw
        acc = totals.setdefault(code, [0, 0])
        acc[0] += len(records)
        acc[1] += sum(len(k) + len(v) for k, v in records)
    if summary is None:
        summary = {
            "types": [[c, n, b] for c, (n, b) in totals.items()],
            "records": 0,
            "chunks": len(chunks),
        }
    raw_summary = codec.pack(summary)
    end_offset = len(out)
    out += CHUNK.pack(KIND_END, 0, CODEC_RAW, 0, len(raw_summary), len(raw_summary)) + raw_summary
    file_len = len(out) + TRAILER.size
    out += TRAILER.pack(TRAILER_MAGIC, end_offset, file_len, b"")[: TRAILER.size - 32]
    out += hashlib.sha256(out).digest()
    with open(path, "wb") as f:
        f.write(out)


def read_back(path: str) -> tuple[dict[str, Any], list[tuple[int, list[tuple[bytes, bytes]]]]]:
    """A real snapshot's metadata map and chunks (by type), to re-forge with changes."""
    from snapshot.reader import scan

    metas: list[Any] = []
    chunks: list[tuple[int, list[tuple[bytes, bytes]]]] = []
    scan(path, lambda code, recs: chunks.append((code, list(recs))), on_meta=metas.append)
    return metas[0].to_wire(), chunks


def tree(path: str) -> list[str]:
    """Every entry under a directory's parent that looks like restore leftovers."""
    parent = os.path.dirname(os.path.abspath(path))
    return sorted(n for n in os.listdir(parent) if ".restore-" in n)
