"""The placement policy's scheduler side: Nomad's algorithms as preference lists, and the JSON and CLI forms.

``binpack`` and ``spread`` are checked by placing with the rules each policy
builds, through the real ``Selector``: binpack puts a job's two allocs on
one node, spread on two.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fsm import codec
from fsm.scheduler_config import PreferenceSpec
from node.http.events import event_json
from scheduler.feasibility import PlacementContext, ask_for
from scheduler.policy import (
    BINPACK,
    DEFAULT_POLICY,
    SPREAD,
    Policy,
    PolicyError,
    WorstFit,
    algorithm_of,
    preset,
    with_algorithm,
)
from scheduler.policy_json import (
    config_from_json,
    config_json,
    parse_preference,
    parse_validation,
    preference_text,
    switch_algorithm,
)
from scheduler.ranking import Request, Selector
from tests.lifecycle.support import job, node


def _names(prefs: list[PreferenceSpec]) -> list[str]:
    return [f"{p.name}:{p.buckets}" if p.buckets else p.name for p in prefs]


def test_spread_is_binpack_with_best_fit_mirrored() -> None:
    spread = preset(SPREAD)
    assert _names(spread) == ["avoid-previous-node", "worst-fit:3", "job-anti-affinity"]
    assert algorithm_of(spread) == SPREAD and algorithm_of(preset(BINPACK)) == BINPACK
    assert with_algorithm(spread, BINPACK) == DEFAULT_POLICY.to_config().preference
    # Buckets and the other rules stay where they were; a list without either fit rule gains worst-fit.
    custom = [PreferenceSpec("job-anti-affinity"), PreferenceSpec("best-fit", 7)]
    assert _names(with_algorithm(custom, SPREAD)) == ["job-anti-affinity", "worst-fit:7"]
    assert _names(with_algorithm([PreferenceSpec("avoid-previous-node")], SPREAD)) == ["avoid-previous-node", "worst-fit:3"]
    assert algorithm_of([PreferenceSpec("job-anti-affinity")]) == BINPACK
    with pytest.raises(PolicyError, match="binpack or spread"):
        with_algorithm(custom, "random")


def _place_two(policy: Policy, cpu: int = 1000, mem: int = 2048) -> Counter[str]:
    """Where a job's two allocs go on two empty default-sized nodes, ranked by ``policy``."""
    nodes = [node("n1"), node("n2")]
    j = job("web", count=2, cpu=cpu, mem=mem)
    ask = ask_for(j, j.task_groups[0])
    selector = Selector(nodes, PlacementContext(usage={}, job_allocs=Counter()), rng=random.Random(7),
                        rules=policy.preference_rules())
    placed: Counter[str] = Counter()
    for _ in range(2):
        chosen = selector.select(Request(ask))
        assert chosen is not None
        selector.claim(chosen, ask)
        placed[chosen.id] += 1
    return placed


def test_binpack_packs_and_spread_spreads() -> None:
    assert sorted(_place_two(DEFAULT_POLICY).values()) == [2]
    spread = Policy.from_config(config_from_json({"SchedulerAlgorithm": "spread"}))
    assert sorted(_place_two(spread).values()) == [1, 1]


def test_worst_fit_prefers_the_emptier_node() -> None:
    j = job("web", cpu=1000, mem=2048)
    ask = ask_for(j, j.task_groups[0])
    busy, empty = node("busy"), node("empty")
    ctx = PlacementContext(usage={}, job_allocs=Counter())
    ctx.used("busy").add(ask.resources)
    rule = WorstFit(3)
    assert rule.score(empty, ask, ctx, Request(ask)) > rule.score(busy, ask, ctx, Request(ask))


# -- Nomad's JSON shape ---------------------------------------------------------------------
def test_json_shape_is_nomads_with_the_policy_beside_it() -> None:
    out = config_json(DEFAULT_POLICY.to_config())
    assert out["SchedulerAlgorithm"] == "binpack"
    assert out["PreemptionConfig"] == dict.fromkeys(
        ("SystemSchedulerEnabled", "SysBatchSchedulerEnabled", "BatchSchedulerEnabled", "ServiceSchedulerEnabled"), False)
    assert out["MemoryOversubscriptionEnabled"] is False
    assert out["PlacementPolicy"]["Preference"][1] == {"Name": "best-fit", "Buckets": 3}
    assert (out["CreateIndex"], out["ModifyIndex"]) == (0, 0)
    # What a Nomad client reads it may write back unchanged.
    assert config_from_json(out) == DEFAULT_POLICY.to_config()
    # A bare {} (and Nomad's empty algorithm) is the default; a bucketed rule without Buckets gets 3.
    assert config_from_json({}) == config_from_json({"SchedulerAlgorithm": ""}) == DEFAULT_POLICY.to_config()
    got = config_from_json({"PlacementPolicy": {"Preference": [{"Name": "worst-fit"}, {"Name": "job-anti-affinity"}]}})
    assert _names(got.preference) == ["worst-fit:3", "job-anti-affinity"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"Colour": 1}, "unknown field 'Colour' in the scheduler configuration"),
        ({"SchedulerAlgorithm": "random"}, "SchedulerAlgorithm must be binpack or spread, not 'random'"),
        ({"MemoryOversubscriptionEnabled": True}, "Caravan does not implement MemoryOversubscriptionEnabled; set it to false"),
        ({"PauseEvalBroker": "yes"}, "PauseEvalBroker must be true or false"),
        ({"PreemptionConfig": {"SystemSchedulerEnabled": True}}, "do not preempt by job type; set PreemptionConfig.SystemSchedulerEnabled to false"),
        ({"PreemptionConfig": {"Bogus": False}}, "unknown field 'Bogus' in PreemptionConfig"),
        ({"PlacementPolicy": []}, "PlacementPolicy must be a JSON object"),
        ({"PlacementPolicy": {"Rules": []}}, "unknown field 'Rules' in PlacementPolicy"),
        ({"PlacementPolicy": {"Validation": "node-status"}}, "Validation must be a list of rule names"),
        ({"PlacementPolicy": {"Validation": ["node-status"]}}, "validation rule 'resources' is required; add it back"),
        ({"PlacementPolicy": {"Preference": [{"Name": "best-fit", "Buckets": "3"}]}}, "Buckets of best-fit must be a whole number"),
        ({"PlacementPolicy": {"Preference": [{"Name": "best-fit", "Buckets": 0}]}}, "needs buckets between 1 and 1000, like best-fit:3"),
        ({"PlacementPolicy": {"Preference": ["best-fit"]}}, 'must be {"Name": rule, "Buckets": n}'),
        ({"PlacementPolicy": {"TopKMax": 0}}, "top_k_max must be between 1 and 64"),
        ({"PlacementPolicy": {"ClusterTop": True}}, "ClusterTop of PlacementPolicy must be a whole number"),
        ({"SchedulerAlgorithm": "spread", "PlacementPolicy": {"Preference": [{"Name": "best-fit", "Buckets": 3}]}},
         "SchedulerAlgorithm 'spread' disagrees with the preference list, which is binpack"),
    ],
)
def test_bad_json_is_refused_in_one_line(body: object, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        config_from_json(body)
    assert message in str(err.value) and "\n" not in str(err.value)


# -- the command line's text forms -------------------------------------------------------------
def test_command_line_forms() -> None:
    prefs = parse_preference("avoid-previous-node, best-fit:5,job-anti-affinity")
    assert prefs == [{"Name": "avoid-previous-node", "Buckets": 0}, {"Name": "best-fit", "Buckets": 5},
                     {"Name": "job-anti-affinity", "Buckets": 0}]
    assert preference_text(prefs) == "avoid-previous-node, best-fit:5, job-anti-affinity"
    assert parse_preference("worst-fit") == [{"Name": "worst-fit", "Buckets": 3}]
    assert parse_validation("node-status,resources") == ["node-status", "resources"]
    assert switch_algorithm(prefs, SPREAD)[1] == {"Name": "worst-fit", "Buckets": 5}
    for bad, message in (("best-fit:x", "needs a whole number of buckets"), ("best-fit,,x", "an empty rule name")):
        with pytest.raises(PolicyError, match=message):
            parse_preference(bad)


def test_the_event_stream_shows_a_change_in_the_shape_get_answers() -> None:
    cfg = config_from_json({"SchedulerAlgorithm": "spread"})
    cfg.modify_index = 42
    event = event_json(42, ["Operator", "SchedulerConfigUpdated", "scheduler", codec.to_wire(cfg)])
    assert (event["Topic"], event["Type"], event["Index"]) == ("Operator", "SchedulerConfigUpdated", 42)
    assert event["Payload"] == {"SchedulerConfig": config_json(cfg)}
