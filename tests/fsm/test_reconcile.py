"""ReconcileSummaries recounts job summaries from the allocs, deterministically."""

from __future__ import annotations

from pathlib import Path

from fsm import codec
from fsm import messages as m
from fsm.machine import FSM
from fsm.structs import Allocation, Evaluation, Job, JobSummary, Node, Task, TaskGroup

T0 = 1_700_000_000_000_000_000


def _fsm(path: Path) -> FSM:
    def fatal(exc: BaseException) -> None:
        raise exc

    return FSM(str(path), on_fatal=fatal)


def test_reconcile_repairs_a_drifted_summary_and_changes_nothing_when_right(tmp_path: Path) -> None:
    fsm = _fsm(tmp_path / "a")
    job = Job(
        id="j", type="batch", task_groups=[TaskGroup(name="g", count=2, tasks=[Task(name="t")])]
    )
    entries = [
        m.JobRegister(job=job, eval=Evaluation(id="e", job_id="j")),
        m.NodeRegister(node=Node(id="n", status="ready")),
        m.PlanApply(
            allocs_to_place=[
                Allocation(id=f"a{i}", eval_id="e", job_id="j", node_id="n", task_group="g")
                for i in range(2)
            ]
        ),
        m.AllocClientUpdate(allocs=[m.AllocClientState(id="a0", client_status="complete")]),
    ]
    for i, body in enumerate(entries, start=1):
        assert fsm.apply(i, m.encode_entry(body, time=T0 + i, rid=f"r{i}")).ok
    fsm.commit()
    # Drift the stored summary by hand (what the reconcile call exists to repair).
    with fsm.store.env.begin(write=True) as txn:
        summary = codec.load(JobSummary, txn.get(b"j", db=fsm.store.dbs["job_summary"]))
        summary.summary["g"].complete = 7
        txn.put(b"j", codec.encode(summary), db=fsm.store.dbs["job_summary"])
    result = fsm.apply(5, m.encode_entry(m.ReconcileSummaries(), time=T0 + 5, rid="r5"))
    fsm.commit()
    assert result.ok and result.value == {"reconciled": ["j"]}
    with fsm.read() as r:
        group = r.job_summary("j").summary["g"]
    assert (group.complete, group.starting, group.running) == (1, 1, 0)
    again = fsm.apply(6, m.encode_entry(m.ReconcileSummaries(), time=T0 + 6, rid="r6"))
    assert again.ok and again.value == {"reconciled": []}
    fsm.close()
