"""A plan's stops, applied on each alloc's stored map, store exactly what the object path stored.

``fsm.apply.plans._stop_allocs`` edits the stored map and writes it with
``update_alloc_map`` (the client updates' hot path) because a node-loss storm
stops hundreds of thousands of allocs on every replica (issue #34). This
property checks it against the object path it replaced (decode the alloc,
change it, ``put_alloc``): the same rows in every database, journal included,
for any allocs and stops.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.apply import plans
from fsm.apply.summaries import move_count
from fsm.record import copy_record
from fsm.structs import CLIENT_STATUSES, DESIRED_STATUSES
from fsm.writer import StateWriter
from tests.fsm.support import Harness, make_alloc, make_eval, make_job, make_node

IDS = [f"a{i}" for i in range(6)]


def _object_path(w: StateWriter, stops: list[m.AllocStop]) -> list[str]:
    """The stop as it was written before the map path: the reference."""
    stopped = []
    for stop in stops:
        alloc = w.alloc(stop.id)
        if alloc is None:
            continue
        old = copy_record(alloc)
        alloc.desired_status = stop.desired_status
        alloc.desired_description = stop.desired_description
        if stop.followup_eval_id:
            alloc.followup_eval_id = stop.followup_eval_id
        if stop.client_status and stop.client_status != alloc.client_status:
            alloc.client_status = stop.client_status
            move_count(w, old, alloc)
        alloc.alloc_modify_index = w.index
        w.put_alloc(alloc, old, "PlanResult")
        stopped.append(alloc.id)
    return stopped


ALLOC = st.tuples(
    st.sampled_from(CLIENT_STATUSES),
    st.sampled_from(DESIRED_STATUSES),
    st.sampled_from(["", "d1"]),  # deployment
    st.sampled_from(["n1", "n2"]),
    st.sampled_from(["g1", "g2"]),
)
STOP = st.tuples(
    st.sampled_from(IDS + ["missing"]),
    st.sampled_from(DESIRED_STATUSES),
    st.sampled_from(["", *CLIENT_STATUSES]),
    st.sampled_from(["", "ev-next"]),
    st.sampled_from(["", "alloc lost"]),
)


@settings(max_examples=60, deadline=None)
@given(allocs=st.lists(ALLOC, min_size=1, max_size=len(IDS)), stops=st.lists(STOP, max_size=8))
def test_stops_on_the_stored_map_store_what_the_object_path_stored(
    allocs: list[tuple[str, str, str, str, str]], stops: list[tuple[str, str, str, str, str]]
) -> None:
    h = Harness.temp()
    try:
        h.ok(m.NodeRegister(node=make_node("n1")))
        h.ok(m.NodeRegister(node=make_node("n2")))
        h.ok(m.JobRegister(job=make_job("web", count=len(allocs)), eval=make_eval("e1", "web")))
        placed = []
        for i, (client, desired, dep, node, group) in enumerate(allocs):
            alloc = make_alloc(IDS[i], "e1", "web", node, group, client=client, desired=desired)
            alloc.deployment_id = dep
            placed.append(alloc)
        h.ok(m.PlanApply(eval_id="e1", job_id="web", allocs_to_place=placed))
        plan = m.PlanApply(
            eval_id="e1",
            job_id="web",
            allocs_to_stop=[
                m.AllocStop(id=a, desired_status=d, client_status=c, followup_eval_id=f, desired_description=why)
                for a, d, c, f, why in stops
            ],
        )
        reference = h.clone()
        try:
            got = h.apply(plan)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(plans, "_stop_allocs", _object_path)
                want = reference.apply(plan)
            assert (got.ok, got.value, got.error) == (want.ok, want.value, want.error)
            assert h.dump() == reference.dump()
        finally:
            reference.destroy()
    finally:
        h.destroy()
