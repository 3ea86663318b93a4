"""The scheduler configuration as replicated state: apply, CAS, journal, snapshots, restarts.

Properties: any valid policy survives encode -> apply -> read (and Nomad's
JSON shape) unchanged; any invalid one is refused by apply with exactly the
message the leader's check gives, on every replica alike, changing nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import messages as m
from fsm.scheduler_config import (
    BUCKETED,
    MAX_BUCKETS,
    MAX_CLUSTER_TOP,
    MAX_TOP_K,
    PREFERENCE_NAMES,
    REQUIRED_VALIDATION,
    VALIDATION_NAMES,
    PreferenceSpec,
    SchedulerConfig,
)
from fsm.structs import Evaluation
from fsm.topics import TOPIC_OPERATOR
from scheduler.feasibility import VALIDATION_RULES
from scheduler.policy import DEFAULT_POLICY, Policy, PolicyError
from scheduler.policy_json import config_from_json, config_json
from scheduler.ranking import DEFAULT_BUCKETS, PREFERENCE_RULES
from scheduler.state import load_snapshot
from snapshot import make_deserializer, make_serializer, restore, save
from tests.fsm.support import Harness, dump, without_bookkeeping
from tests.snapshot.test_raft_hooks import RAFT


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness.temp()
    yield harness
    harness.destroy()


INT64 = 2**63 - 1
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- strategies ------------------------------------------------------------------------
@st.composite
def valid_configs(draw: st.DrawFn) -> SchedulerConfig:
    """Any usable policy: a reordered subset of the rules (keeping the required ones), any legal numbers."""
    optional = [n for n in VALIDATION_NAMES if n not in REQUIRED_VALIDATION]
    validation = draw(st.permutations([*REQUIRED_VALIDATION, *draw(st.lists(st.sampled_from(optional), unique=True))]))
    names = draw(st.lists(st.sampled_from(PREFERENCE_NAMES), unique=True))
    preference = [
        PreferenceSpec(n, draw(st.integers(1, MAX_BUCKETS)) if n in BUCKETED else 0) for n in names
    ]
    return SchedulerConfig(
        validation=list(validation),
        preference=preference,
        cluster_top=draw(st.integers(0, MAX_CLUSTER_TOP)),
        top_k_max=draw(st.integers(1, MAX_TOP_K)),
    )


def _break(cfg: SchedulerConfig, how: str, data: st.DataObject) -> SchedulerConfig:
    """``cfg`` made unusable in one way."""
    if how == "missing-required":
        required = data.draw(st.sampled_from(REQUIRED_VALIDATION))
        cfg.validation = [n for n in cfg.validation if n != required]
    elif how == "unknown-validation":
        cfg.validation.insert(data.draw(st.integers(0, len(cfg.validation))), "no-such-rule")
    elif how == "duplicate-validation":
        cfg.validation.append(data.draw(st.sampled_from(cfg.validation)))
    elif how == "unknown-preference":
        cfg.preference.append(PreferenceSpec(data.draw(st.text(alphabet="abcxyz-", min_size=1).filter(lambda t: t not in PREFERENCE_NAMES))))
    elif how == "duplicate-preference":
        name = data.draw(st.sampled_from(sorted(BUCKETED)))
        cfg.preference += [PreferenceSpec(name, 2), PreferenceSpec(name, 2)]
    elif how == "buckets":
        name = data.draw(st.sampled_from(sorted(BUCKETED)))
        bad = data.draw(st.integers(-INT64, 0) | st.integers(MAX_BUCKETS + 1, INT64))
        cfg.preference = [p for p in cfg.preference if p.name != name] + [PreferenceSpec(name, bad)]
    elif how == "buckets-on-plain":
        name = data.draw(st.sampled_from([n for n in PREFERENCE_NAMES if n not in BUCKETED]))
        cfg.preference = [p for p in cfg.preference if p.name != name] + [PreferenceSpec(name, 1)]
    elif how == "cluster-top":
        cfg.cluster_top = data.draw(st.integers(-INT64, -1) | st.integers(MAX_CLUSTER_TOP + 1, INT64))
    else:
        cfg.top_k_max = data.draw(st.integers(-INT64, 0) | st.integers(MAX_TOP_K + 1, INT64))
    return cfg


BREAKS = ["missing-required", "unknown-validation", "duplicate-validation", "unknown-preference",
          "duplicate-preference", "buckets", "buckets-on-plain", "cluster-top", "top-k"]


def _stored(h: Harness) -> SchedulerConfig:
    with h.reader() as r:
        return r.scheduler_config()


# -- properties --------------------------------------------------------------------------
@SETTINGS
@given(cfg=valid_configs(), cas=st.booleans())
def test_any_valid_policy_round_trips_through_the_log(cfg: SchedulerConfig, cas: bool) -> None:
    Policy.from_config(cfg).check()  # the leader accepts it...
    msg = m.SchedulerConfigSet(config=cfg, cas_index=0 if cas else None)
    assert m.decode_entry(m.encode_entry(msg, time=1, rid="r")).body == msg
    h = Harness.temp()
    try:
        value = h.ok(msg)  # ...and so does apply
        assert value == {"updated": True, "modify_index": h.index}
        got = _stored(h)
        want = SchedulerConfig(**{**_fields(cfg), "create_index": h.index, "modify_index": h.index})
        assert got == want
        assert Policy.from_config(got) == Policy(**{**_policy_fields(cfg), "version": h.index})
        # Nomad's JSON shape carries the same policy, and reads back as it.
        again = config_from_json(config_json(got))
        assert _fields(again) == {**_fields(got), "create_index": 0, "modify_index": 0}
    finally:
        h.destroy()


@SETTINGS
@given(cfg=valid_configs(), how=st.sampled_from(BREAKS), data=st.data())
def test_an_invalid_policy_is_refused_alike_by_the_leader_and_every_replica(
    cfg: SchedulerConfig, how: str, data: st.DataObject
) -> None:
    broken = _break(cfg, how, data)
    try:
        Policy.from_config(broken).check()
        raise AssertionError(f"{how}: the leader's check accepted {broken}")
    except PolicyError as exc:
        message = str(exc)
    assert "\n" not in message
    replicas = [Harness.temp(), Harness.temp()]
    try:
        for h in replicas:
            h.ok(m.SchedulerConfigSet(config=SchedulerConfig(top_k_max=7)))
        before = without_bookkeeping(replicas[0].dump())
        results = [h.apply(m.SchedulerConfigSet(config=broken)) for h in replicas]
        for result in results:
            assert (result.ok, result.code, result.error) == (False, "bad_request", message)
        assert without_bookkeeping(replicas[0].dump()) == before, "a refused policy changed state"
        assert _stored(replicas[0]).top_k_max == 7
        assert replicas[0].fsm.digest() == replicas[1].fsm.digest()
    finally:
        for h in replicas:
            h.destroy()


def _fields(cfg: SchedulerConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


def _policy_fields(cfg: SchedulerConfig) -> dict[str, Any]:
    p = Policy.from_config(cfg)
    return {"validation": p.validation, "preference": p.preference, "cluster_top": p.cluster_top, "top_k_max": p.top_k_max}


# -- examples ----------------------------------------------------------------------------
def test_unset_reads_as_the_policy_caravan_always_scheduled_with(h: Harness) -> None:
    cfg = _stored(h)
    assert (cfg.create_index, cfg.modify_index) == (0, 0)
    assert Policy.from_config(cfg) == DEFAULT_POLICY
    assert DEFAULT_POLICY.validation == tuple(rule.name for rule in VALIDATION_RULES)
    assert [p.name for p in DEFAULT_POLICY.preference] == [rule.name for rule in PREFERENCE_RULES]
    assert dict((p.name, p.buckets) for p in DEFAULT_POLICY.preference)["best-fit"] == DEFAULT_BUCKETS


def test_compare_and_set_as_nomad(h: Harness) -> None:
    spread = config_from_json({"SchedulerAlgorithm": "spread"})
    assert h.ok(m.SchedulerConfigSet(config=spread, cas_index=3)) == {"updated": False, "modify_index": 0}
    assert h.ok(m.SchedulerConfigSet(config=spread, cas_index=0)) == {"updated": True, "modify_index": h.index}
    first = h.index
    before = dump(h.fsm)
    # A stale index changes nothing and journals nothing, and says what the index is now.
    assert h.ok(m.SchedulerConfigSet(config=SchedulerConfig(), cas_index=0)) == {"updated": False, "modify_index": first}
    assert without_bookkeeping(dump(h.fsm)) == without_bookkeeping(before)
    assert h.ok(m.SchedulerConfigSet(config=SchedulerConfig(top_k_max=9), cas_index=first))["updated"]
    cfg = _stored(h)
    assert (cfg.create_index, cfg.modify_index, cfg.top_k_max) == (first, h.index, 9)
    result = h.apply(m.SchedulerConfigSet(config=SchedulerConfig(), cas_index=-1))
    assert (result.ok, result.code) == (False, "bad_request")


def test_a_change_is_journaled_for_subscribers(h: Harness) -> None:
    h.ok(m.SchedulerConfigSet(config=config_from_json({"SchedulerAlgorithm": "spread"})))
    with h.reader() as r:
        batches = list(r.journal_batches())
        assert r.table_index("scheduler_config") == h.index
    assert len(batches) == 1
    index, records = batches[0]
    assert index == h.index
    (topic, kind, key, obj), = records
    assert (topic, kind, key) == (TOPIC_OPERATOR, "SchedulerConfigUpdated", "scheduler")
    assert [p["name"] for p in obj["preference"]] == ["avoid-previous-node", "worst-fit", "job-anti-affinity"]


def test_the_scheduler_reads_the_policy_in_force_at_its_snapshot(h: Harness) -> None:
    h.ok(m.SchedulerConfigSet(config=config_from_json({"SchedulerAlgorithm": "spread"})))
    with h.reader() as r:
        snap = load_snapshot(r, Evaluation(id="e1", job_id="nope"), now=h.time)
    assert snap.policy.version == h.index
    assert [p.name for p in snap.policy.preference] == ["avoid-previous-node", "worst-fit", "job-anti-affinity"]
    assert [rule.name for rule in snap.policy.preference_rules()] == [p.name for p in snap.policy.preference]


def test_the_policy_survives_snapshots_restarts_and_snapshot_install(h: Harness, tmp_path: Any) -> None:
    h.ok(m.Barrier())  # so a follower holding one entry of its own is behind the dump
    h.ok(m.SchedulerConfigSet(config=config_from_json(
        {"SchedulerAlgorithm": "spread", "PlacementPolicy": {"ClusterTop": 12, "TopKMax": 8}})))
    want, digest = _stored(h), h.fsm.digest()
    # the operator's snapshot save -> restore
    path = str(tmp_path / "s.snap")
    save(h.fsm, path)
    restored = Harness(str(tmp_path / "restored"))
    restore(path, restored.fsm)
    assert _stored(restored) == want and restored.fsm.digest() == digest
    # a restart (the FSM reopens its store)
    h.reopen()
    assert _stored(h) == want and h.fsm.digest() == digest
    # pysyncobj's dump, installed on a follower that is behind
    dump_path = str(tmp_path / "raft.dump")
    make_serializer(h.fsm)(dump_path, RAFT)
    behind = Harness(str(tmp_path / "behind"))
    behind.ok(m.SchedulerConfigSet(config=SchedulerConfig(top_k_max=2)))
    make_deserializer(behind.fsm)(dump_path)
    assert _stored(behind) == want and behind.fsm.digest() == digest
    for other in (restored, behind):
        other.destroy()
    assert os.path.exists(path)
