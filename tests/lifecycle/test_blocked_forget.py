"""``BlockedEvals.forget`` by eval id, in O(1): the same tracker as a scan of every blocked job.

The tail calls ``forget`` for every terminal eval it sees; after a node-down
storm that is thousands of cancellations, each of which used to scan every
blocked job on the event loop. A reference model (one eval per job, forget
by scanning) must agree with the tracker after any sequence of operations.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.structs import EVAL_BLOCKED, Evaluation
from node.leader.broker import BlockedEvals

JOBS = ["a", "b", "c"]
EVALS = [f"e{i}" for i in range(8)]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("block"), st.sampled_from(EVALS), st.sampled_from(JOBS), st.integers(1, 20)
        ),
        st.tuples(st.just("expect"), st.sampled_from(EVALS), st.integers(0, 20)),
        st.tuples(st.just("forget"), st.sampled_from(EVALS)),
        st.tuples(st.just("untrack"), st.sampled_from(JOBS), st.sampled_from([*EVALS, ""])),
        st.tuples(st.just("capacity"), st.integers(0, 20)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_forget_by_id_matches_a_scan(steps: list[tuple]) -> None:
    t = BlockedEvals()
    model: dict[str, str] = {}  # job -> tracked eval id
    job_of: dict[str, str] = {}  # an eval id keeps the job it was first blocked for
    for step in steps:
        if step[0] == "block":
            _, eval_id, job, index = step
            job = job_of.setdefault(eval_id, job)
            t.block(Evaluation(id=eval_id, job_id=job, status=EVAL_BLOCKED, create_index=index))
        elif step[0] == "expect":
            t.expect(step[1], step[2])
        elif step[0] == "forget":
            t.forget(step[1])
            model = {job: e for job, e in model.items() if e != step[1]}
        elif step[0] == "untrack":
            t.untrack("default", step[1], keep=step[2])
        else:
            t.capacity_changed(step[1])
        # Whatever block/untrack/capacity did, the model follows the tracker's one-per-job table;
        # forget is the operation under test and was checked against the scan above.
        tracked = {key[1]: ev.id for key, ev in t._by_job.items()}
        if step[0] == "forget":
            assert tracked == model
        model = tracked
        assert t._key_of == {ev.id: key for key, ev in t._by_job.items()}
