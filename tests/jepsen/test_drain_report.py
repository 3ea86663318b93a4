"""What the drain nemesis reports when a drain does not complete: the allocs still running on the node.

A campaign (seed 573) had a drain without a deadline stall for 34 s, and its
report could not say what held it. The report now lists what was left, from
the same ``alloc.list`` answer a user sees.
"""

from __future__ import annotations

from fsm.structs import DeploymentStatus, DesiredTransition
from jepsen_like.nemesis import describe_left
from node.spec.nomadjson import to_nomad
from tests.lifecycle.support import alloc, job


def test_a_stalled_drain_names_each_alloc_left_running_with_its_health_and_mark() -> None:
    web, batch = job("web"), job("nightly", type="batch")
    allocs = [
        alloc(web, 0, "n1", deployment_status=DeploymentStatus(healthy=False), desired_transition=DesiredTransition(migrate=True)),
        alloc(web, 1, "n1", deployment_status=DeploymentStatus(healthy=True)),
        alloc(batch, 0, "n1", client="pending"),
        alloc(batch, 1, "n1", client="complete"),  # ended: not what holds a drain
        alloc(web, 2, "n1", desired="stop"),  # being stopped
    ]
    said = describe_left([to_nomad(a) for a in allocs])
    assert said == "left on it: nightly/g pending; web/g running unhealthy marked to migrate; web/g running healthy"


def test_the_report_is_bounded_and_says_when_nothing_is_left() -> None:
    web = job("web")
    many = [to_nomad(alloc(web, i, "n1")) for i in range(9)]
    assert describe_left(many, most=2) == "left on it: web/g running; web/g running and 7 more"
    assert describe_left([]) == "nothing left running on it"
