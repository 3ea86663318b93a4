"""Helpers shared by the journal tests: an FSM harness, entry builders, raw journal reads.

Kept apart from ``tests/fsm`` (another area, changing on its own schedule):
these builders make entries that mostly succeed, so journals fill quickly.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from fsm import codec
from fsm import messages as m
from fsm.journal import Retention
from fsm.keys import from_u64
from fsm.machine import FSM, ApplyResult
from fsm.messages import encode_entry
from fsm.structs import SECOND, Allocation, Evaluation, Job, Node, Resources, Task, TaskGroup
from fsm.topics import full_records

T0 = 1_700_000_000 * SECOND
SMALL_MAP = 256 << 20


class Fatal(Exception):
    """The FSM asked to stop the node (never expected in these tests)."""


def _raise(exc: BaseException) -> None:
    raise Fatal(str(exc)) from exc


@dataclass
class Harness:
    """A real FSM in a temp dir; numbers and times entries like a leader would."""

    retention: Retention | None = None
    path: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="caravan-journal-"))
    index: int = 0
    time: int = T0

    def __post_init__(self) -> None:
        kw: dict[str, Any] = {"map_size": SMALL_MAP, "on_fatal": _raise}
        if self.retention is not None:
            kw["retention"] = self.retention
        self.fsm = FSM(self.path, **kw)

    def apply(self, body: Any, *, commit: bool = True) -> ApplyResult:
        self.index += 1
        self.time += SECOND
        result = self.fsm.apply(self.index, encode_entry(body, time=self.time, rid=""))
        if commit:
            self.fsm.commit()
        return result

    def commit(self) -> None:
        self.fsm.commit()

    def close(self) -> None:
        try:
            self.fsm.close()
        finally:
            shutil.rmtree(self.path, ignore_errors=True)


# -- builders -----------------------------------------------------------------------
def node(node_id: str, status: str = "ready") -> m.NodeRegister:
    return m.NodeRegister(node=Node(id=node_id, name=node_id, status=status))


def job(job_id: str, *, meta: dict[str, str] | None = None, with_eval: bool = True) -> m.JobRegister:
    """A job (one batch of two records with its evaluation, or one without)."""
    spec = Job(id=job_id, name=job_id, task_groups=[TaskGroup(name="g", tasks=[Task(name="t")])], meta=meta or {})
    ev = Evaluation(id=f"eval-{job_id}", job_id=job_id) if with_eval else None
    return m.JobRegister(job=spec, eval=ev)


def place(alloc_id: str, job_id: str, node_id: str, cpu: int = 100, memory_mb: int = 64, disk_mb: int = 0) -> m.PlanApply:
    alloc = Allocation(
        id=alloc_id,
        eval_id=f"eval-{job_id}",
        job_id=job_id,
        node_id=node_id,
        task_group="g",
        resources=Resources(cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb),
    )
    return m.PlanApply(job_id=job_id, allocs_to_place=[alloc])


# -- the journal read straight from LMDB -----------------------------------------------
def read_journal_raw(state_dir: str | Path) -> dict[int, bytes]:
    """{index: packed batch} from a server's LMDB, read-only (the server may be running)."""
    env = lmdb.open(str(state_dir), readonly=True, lock=True, max_dbs=64, subdir=True)
    try:
        db = env.open_db(b"journal", create=False)
        with env.begin(db=db, buffers=False) as txn:
            return {from_u64(k): v for k, v in txn.cursor()}
    finally:
        env.close()


def read_journal(state_dir: str | Path) -> dict[int, list[Any]]:
    """{index: records} as subscribers get them (jobs and evals with every field, which the journal leaves out)."""
    return {i: full_records(codec.unpack(v)) for i, v in read_journal_raw(state_dir).items()}
