"""Queue and priority class definitions: HCL and JSON read to the same records, round trips, and every refusal.

An operator sees these messages verbatim (CLI, HTTP 400, RPC), so each
refusal is pinned: one line, naming the queue, the field and the fix.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import codec
from fsm.queues import (
    QUEUEING_STRATEGIES,
    RECLAIM_POLICIES,
    STOP_POLICIES,
    WITHIN_QUEUE_POLICIES,
    PriorityClass,
    Queue,
    QuotaLimit,
)
from fsm.record import replace
from node.spec.queues import (
    MAX_QUANTITY,
    QueueSpecError,
    ledger_to_json,
    pending_to_json,
    priority_class_row_to_json,
    priority_class_to_json,
    queue_row_to_json,
    queue_status_to_json,
    queue_to_json,
    read_priority_class,
    read_priority_classes,
    read_queue,
    read_queues,
    validate_priority_class,
    validate_queue,
)

TEAM_A_HCL = """
queue "team-a" {
  cohort            = "lab"
  queueing_strategy = "StrictFIFO"
  stop_policy       = "Hold"
  description       = "team a's GPUs"
  resource "nvidia/gpu" {
    nominal         = 2
    borrowing_limit = 2     # optional
    lending_limit   = 1     # optional
  }
  resource "cpu" { nominal = 20000 }
  preemption {
    reclaim_within_cohort = "Any"
    within_queue          = "LowerPriority"
  }
}
"""

TEAM_A = Queue(
    name="team-a",
    cohort="lab",
    resources=[
        QuotaLimit(name="nvidia/gpu", nominal=2, borrowing_limit=2, lending_limit=1),
        QuotaLimit(name="cpu", nominal=20000),
    ],
    reclaim_within_cohort="Any",
    within_queue="LowerPriority",
    queueing_strategy="StrictFIFO",
    stop_policy="Hold",
    description="team a's GPUs",
)

TEAM_A_JSON: dict[str, Any] = {
    "Name": "team-a",
    "Cohort": "lab",
    "Resources": [
        {"Name": "nvidia/gpu", "Nominal": 2, "BorrowingLimit": 2, "LendingLimit": 1},
        {"Name": "cpu", "Nominal": 20000},
    ],
    "Preemption": {"ReclaimWithinCohort": "Any", "WithinQueue": "LowerPriority"},
    "QueueingStrategy": "StrictFIFO",
    "StopPolicy": "Hold",
    "Description": "team a's GPUs",
}


# -- reading --------------------------------------------------------------------------------
def test_hcl_and_json_read_to_the_same_queue() -> None:
    assert read_queues(TEAM_A_HCL, "lab.hcl") == [TEAM_A]
    assert read_queue(TEAM_A_JSON) == TEAM_A
    assert read_queue({"Queue": TEAM_A_JSON}) == TEAM_A
    assert read_queue(json.dumps(TEAM_A_JSON)) == TEAM_A
    assert read_queues(json.dumps({"Queue": TEAM_A_JSON}), "lab.json") == [TEAM_A]
    # By content when the name says nothing: JSON starts with { or [.
    assert read_queues(json.dumps([TEAM_A_JSON]), "-") == [TEAM_A]
    assert read_queues(TEAM_A_HCL, "stdin") == [TEAM_A]


def test_defaults_are_kueues() -> None:
    (q,) = read_queues('queue "solo" {\n  resource "memory" { nominal = 1024 }\n}\n')
    assert (q.cohort, q.queueing_strategy, q.stop_policy) == ("", "BestEffortFIFO", "None")
    assert (q.reclaim_within_cohort, q.within_queue) == ("Never", "Never")
    assert q.resources == [QuotaLimit(name="memory", nominal=1024)]
    assert read_queue({"Name": "solo", "Resources": [{"Name": "memory", "Nominal": 1024}]}) == q


def test_a_file_holds_several_queues_and_nulls_mean_unset() -> None:
    text = (
        TEAM_A_HCL
        + 'queue "team-b" {\n  cohort = "lab"\n  resource "nvidia/gpu" {\n    nominal = 2\n    borrowing_limit = null\n  }\n}\n'
    )
    a, b = read_queues(text, "lab.hcl")
    assert a == TEAM_A and b.resources == [QuotaLimit(name="nvidia/gpu", nominal=2)]
    got = read_queue(
        {
            **TEAM_A_JSON,
            "Cohort": "lab",
            "Resources": [{"Name": "cpu", "Nominal": 2.0, "LendingLimit": None}],
        }
    )
    assert got.resources == [QuotaLimit(name="cpu", nominal=2)]


def test_what_a_get_answers_can_be_applied_back() -> None:
    stored = replace(TEAM_A, create_index=7, modify_index=9)
    answer = {
        **queue_to_json(stored),
        "Ledger": ledger_to_json(LEDGER),
        "Admitted": 1,
        "Pending": 0,
    }
    assert read_queue(answer) == TEAM_A  # indexes and status are the server's: accepted, not taken


def test_priority_classes_read_from_hcl_and_json() -> None:
    hcl = 'priority_class "high" {\n  value       = 1000\n  description = "on call"\n}\npriority_class "low" {\n  value = -5\n}\n'
    high, low = read_priority_classes(hcl, "classes.hcl")
    assert high == PriorityClass(name="high", value=1000, description="on call")
    assert low == PriorityClass(name="low", value=-5)
    assert read_priority_class({"Name": "high", "Value": 1000, "Description": "on call"}) == high
    assert read_priority_class({"PriorityClass": {"Name": "low", "Value": -5}}) == low
    assert read_priority_classes(
        json.dumps([priority_class_to_json(high), priority_class_to_json(low)]), "c.json"
    ) == [high, low]


# -- refusals --------------------------------------------------------------------------------
HCL_REFUSALS = [
    (
        'queue "a" {\n  resource "cpu" { nominal = -1 }\n}',
        'queue "a": resource "cpu": nominal must be an integer >= 0, not -1',
    ),
    (
        'queue "a" {\n  resource "cpu" { nominal = "lots" }\n}',
        'resource "cpu": nominal must be an integer >= 0, not "lots"',
    ),
    (
        'queue "a" {\n  resource "cpu" { nominal = 1.5 }\n}',
        "nominal must be an integer >= 0, not 1.5",
    ),
    (
        'queue "a" {\n  resource "cpu" {\n    nominal = 1\n    borrowing_limit = -2\n  }\n}',
        "borrowing_limit must be an integer >= 0",
    ),
    ('queue "a" {\n  resource "cpu" {}\n}', 'resource "cpu": nominal is missing'),
    (
        f'queue "a" {{\n  resource "cpu" {{ nominal = {MAX_QUANTITY + 1} }}\n}}',
        f"nominal must be at most {MAX_QUANTITY}",
    ),
    (
        'queue "a" {\n  cohort = "lab"\n  resource "cpu" {\n    nominal = 1\n    lending_limit = 2\n  }\n}',
        'queue "a": resource "cpu": lending_limit (2) must not exceed nominal (1)',
    ),
    (
        'queue "a" {\n  resource "cpu" {\n    nominal = 1\n    borrowing_limit = 2\n  }\n}',
        'resource "cpu" sets borrowing_limit, but a queue needs a cohort to borrow or lend; set cohort',
    ),
    (
        'queue "a" {\n  resource "cpu" {\n    nominal = 1\n    lending_limit = 0\n  }\n}',
        "sets lending_limit, but a queue needs a cohort to borrow or lend",
    ),
    (
        'queue "a" {\n  resource "cpu" { nominal = 1 }\n  resource "cpu" { nominal = 2 }\n}',
        'resource "cpu" is listed twice',
    ),
    (
        'queue "a" {\n  resource "gpu" { nominal = 1 }\n}',
        'resource "gpu" is not a resource name; use cpu (MHz), memory (MB) or a device name vendor/type',
    ),
    (
        'queue "a" {\n  resource "nvidia/" { nominal = 1 }\n}',
        'resource "nvidia/" is not a resource name',
    ),
    (
        'queue "a" {\n  queueing_strategy = "FIFO"\n}',
        'queueing_strategy must be one of StrictFIFO, BestEffortFIFO, not "FIFO"',
    ),
    (
        'queue "a" {\n  stop_policy = "hold"\n}',
        "stop_policy must be one of None, Hold, HoldAndDrain",
    ),
    (
        'queue "a" {\n  preemption { reclaim_within_cohort = "Always" }\n}',
        "reclaim_within_cohort must be one of Never, LowerPriority, Any",
    ),
    (
        'queue "a" {\n  preemption { within_queue = "Any" }\n}',
        "within_queue must be one of Never, LowerPriority, LowerOrNewerEqualPriority",
    ),
    ('queue "a" {\n  preemption {}\n  preemption {}\n}', "more than one preemption block"),
    ('queue "a" {\n  cohort = "my lab"\n}', 'queue "a": cohort "my lab" is not a valid name'),
    ('queue "a b" {}', 'queue name "a b" is not valid; use 1-128 letters, digits'),
    (f'queue "{"x" * 129}" {{}}', "is not valid; use 1-128"),
    ("queue {}", "takes 1 label"),
    (
        'queue "a" {\n  borowing_limit = 1\n}',
        'unknown attribute "borowing_limit"; use cohort, queueing_strategy',
    ),
    (
        'queue "a" {\n  resource "cpu" {\n    nominal = 1\n    limit = 2\n  }\n}',
        'resource "cpu": unknown attribute "limit"; use nominal, borrowing_limit, lending_limit',
    ),
    ('queue "a" {\n  flavor "x" {}\n}', 'unknown block "flavor"'),
    ('queue "a" {}\nqueue "a" {}', 'queue "a" is defined twice'),
    ('priority_class "p" { value = 1 }', 'unknown block "priority_class"'),
    ('cohort = "lab"', 'unknown attribute "cohort"'),
    ("", 'no queue "NAME"'),
    ('queue "a" {', "invalid HCL"),
]


@pytest.mark.parametrize(("text", "says"), HCL_REFUSALS, ids=[s[:40] for _, s in HCL_REFUSALS])
def test_hcl_refusals_are_one_line_naming_the_field_and_line(text: str, says: str) -> None:
    with pytest.raises(QueueSpecError) as err:
        read_queues(text, "q.hcl")
    message = str(err.value)
    assert says in message and "\n" not in message, message
    assert message.startswith("q.hcl"), message  # where: the file (and the line, when there is one)


def test_an_hcl_refusal_names_the_line_of_what_is_wrong() -> None:
    text = 'queue "ok" {}\n\nqueue "bad" {\n  stop_policy = "Paused"\n}\n'
    with pytest.raises(QueueSpecError, match=r'^q\.hcl:4: queue "bad": stop_policy'):
        read_queues(text, "q.hcl")
    with pytest.raises(QueueSpecError, match=r'^q\.hcl:4: queue "bad": unknown attribute "stopp"'):
        read_queues('queue "ok" {}\n\nqueue "bad" {\n  stopp = 1\n}\n', "q.hcl")
    limits = 'queue "b" {\n  cohort = "lab"\n  resource "cpu" { nominal = 1 }\n  resource "nvidia/gpu" {\n    nominal = 2\n    lending_limit = 3\n  }\n}\n'
    with pytest.raises(
        QueueSpecError, match=r'^q\.hcl:6: queue "b": resource "nvidia/gpu": lending_limit \(3\)'
    ):
        read_queues(limits, "q.hcl")
    twice = 'queue "b" {\n  resource "cpu" { nominal = 1 }\n  resource "cpu" { nominal = 2 }\n}\n'
    with pytest.raises(
        QueueSpecError, match=r'^q\.hcl:3: queue "b": resource "cpu" is listed twice'
    ):
        read_queues(twice, "q.hcl")
    preemption = 'queue "c" {\n  preemption {\n    within_queue = "Any"\n  }\n}\n'
    with pytest.raises(QueueSpecError, match=r'^q\.hcl:3: queue "c": within_queue'):
        read_queues(preemption, "q.hcl")
    missing = 'queue "d" {\n  resource "cpu" {\n    lending_limit = 1\n  }\n}\n'
    with pytest.raises(
        QueueSpecError, match=r'^q\.hcl:2: queue "d": resource "cpu": nominal is missing'
    ):
        read_queues(missing, "q.hcl")


def _with(**changes: Any) -> dict[str, Any]:
    return {**TEAM_A_JSON, **changes}


JSON_REFUSALS = [
    (
        _with(Resources=[{"Name": "cpu", "Nominal": -1}]),
        'resource "cpu": Nominal must be an integer >= 0, not -1',
    ),
    (
        _with(Resources=[{"Name": "cpu", "Nominal": True}]),
        "Nominal must be an integer >= 0, not true",
    ),
    (_with(Resources=[{"Name": "cpu"}]), 'resource "cpu": Nominal is missing'),
    (_with(Resources=[{"Nominal": 1}]), "a resource has no Name"),
    (
        _with(Resources=[{"Name": "cpu", "Nominal": 1, "LendingLimit": 5}]),
        "LendingLimit (5) must not exceed Nominal (1)",
    ),
    (
        _with(Cohort="", Resources=[{"Name": "cpu", "Nominal": 1, "BorrowingLimit": 1}]),
        "sets BorrowingLimit, but a queue needs a cohort to borrow or lend; set Cohort or remove the limit",
    ),
    (
        _with(Resources=[{"Name": "cpu", "Nominal": 1}, {"Name": "cpu", "Nominal": 1}]),
        'resource "cpu" is listed twice',
    ),
    (
        _with(Resources=[{"Name": "cpu", "Nominal": 1, "Max": 3}]),
        'resource "cpu": unknown field "Max"; use Name, Nominal, BorrowingLimit, LendingLimit',
    ),
    (_with(Resources={"cpu": 1}), "Resources must be a list of resources"),
    (_with(Resources=["cpu"]), "each resource must be an object"),
    (
        _with(QueueingStrategy="StrictFifo"),
        'QueueingStrategy must be one of StrictFIFO, BestEffortFIFO, not "StrictFifo"',
    ),
    (
        _with(StopPolicy=None, Preemption={"WithinQueue": "Any"}),
        "WithinQueue must be one of Never, LowerPriority, LowerOrNewerEqualPriority",
    ),
    (_with(Preemption="Any"), "Preemption must be an object"),
    (
        _with(Preemption={"Reclaim": "Any"}),
        'Preemption: unknown field "Reclaim"; use ReclaimWithinCohort, WithinQueue',
    ),
    (_with(Cohrt="lab"), 'unknown field "Cohrt"'),
    (_with(Cohort=7), "Cohort 7 is not a valid name"),
    (_with(Description=["x"]), "Description must be a string"),
    (_with(Description="x" * 2000), "keep it to 1024"),
    (_with(Name=""), "Name is missing"),
    (_with(Name=5), "Name must be a string"),
    (_with(Name="a/b"), 'queue name "a/b" is not valid'),
    ([TEAM_A_JSON], "must be a JSON object"),
    ("{not json", "not valid JSON"),
]


@pytest.mark.parametrize(("data", "says"), JSON_REFUSALS, ids=[s[:40] for _, s in JSON_REFUSALS])
def test_json_refusals_name_the_field_as_json_spells_it(data: Any, says: str) -> None:
    with pytest.raises(QueueSpecError) as err:
        read_queue(data)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "q.json: not valid JSON"),
        ("[]", "holds no queue"),
        (json.dumps([TEAM_A_JSON, TEAM_A_JSON]), 'queue "team-a" is defined twice'),
    ],
)
def test_json_files_are_refused_as_a_whole(text: str, says: str) -> None:
    with pytest.raises(QueueSpecError, match=says):
        read_queues(text, "q.json")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"Name": "high"}, "Value is missing"),
        (
            {"Name": "high", "Value": "1"},
            'Value must be an integer from -2147483648 to 2147483647 (higher goes first), not "1"',
        ),
        ({"Name": "high", "Value": 2**31}, "must be an integer from"),
        (
            {"Name": "high", "Value": 1, "Priority": 2},
            'unknown field "Priority"; use Name, Value, Description',
        ),
        ({"Value": 1}, "priority class: Name is missing"),
        ({"Name": "hi gh", "Value": 1}, 'priority class name "hi gh" is not valid'),
    ],
)
def test_priority_class_refusals(data: Any, says: str) -> None:
    with pytest.raises(QueueSpecError) as err:
        read_priority_class(data)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_priority_class_hcl_refusals_name_the_line() -> None:
    with pytest.raises(
        QueueSpecError, match=r'^c\.hcl:3: priority class "x": value must be an integer'
    ):
        read_priority_classes('\npriority_class "x" {\n  value = "high"\n}\n', "c.hcl")
    with pytest.raises(QueueSpecError, match='unknown block "queue".*caravan queue apply'):
        read_priority_classes('queue "a" {}', "c.hcl")
    with pytest.raises(QueueSpecError, match='unknown attribute "weight"; use value, description'):
        read_priority_classes('priority_class "x" {\n  weight = 1\n}\n', "c.hcl")


def test_validate_checks_records_however_they_arrived() -> None:
    """The server calls these on records sent by RPC: field names as the records spell them."""
    validate_queue(TEAM_A)
    validate_priority_class(PriorityClass(name="high", value=10))
    bad_limit = replace(TEAM_A, resources=[QuotaLimit(name="cpu", nominal=1, lending_limit=3)])
    with pytest.raises(
        QueueSpecError,
        match='resource "cpu": lending_limit \\(3\\) must not exceed nominal \\(1\\)',
    ):
        validate_queue(bad_limit)
    with pytest.raises(QueueSpecError, match="needs a cohort"):
        validate_queue(replace(TEAM_A, cohort=""))
    with pytest.raises(QueueSpecError, match="stop_policy must be one of"):
        validate_queue(replace(TEAM_A, stop_policy="Drain"))
    with pytest.raises(QueueSpecError, match="each resource must be a resource definition"):
        validate_queue(replace(TEAM_A, resources=[{"name": "cpu"}]))  # type: ignore[list-item]
    with pytest.raises(QueueSpecError, match="expected a queue"):
        validate_queue(PriorityClass(name="x"))  # type: ignore[arg-type]
    with pytest.raises(QueueSpecError, match="value must be an integer"):
        validate_priority_class(PriorityClass(name="x", value=True))


# -- round trips ----------------------------------------------------------------------------------
NAMES = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
DEVICES = st.from_regex(r"[a-z0-9]{1,8}/[a-z0-9_.-]{1,8}(/[a-z0-9]{1,6})?", fullmatch=True)
QUANTITY = st.integers(min_value=0, max_value=MAX_QUANTITY)
# Descriptions that HCL writes as a plain quoted string (no escapes, no ${ templates).
PLAIN_TEXT = st.text(
    st.characters(whitelist_categories=("L", "N", "Zs"), whitelist_characters="-_.,:;'()!?"),
    max_size=40,
)


ANY_TEXT = st.text(max_size=60)


@st.composite
def quota_limits(draw: st.DrawFn, name: str, cohort: bool) -> QuotaLimit:
    nominal = draw(QUANTITY)
    if not cohort:
        return QuotaLimit(name=name, nominal=nominal)
    borrowing = draw(st.none() | QUANTITY)
    lending = draw(st.none() | st.integers(min_value=0, max_value=nominal))
    return QuotaLimit(name=name, nominal=nominal, borrowing_limit=borrowing, lending_limit=lending)


@st.composite
def queues(draw: st.DrawFn, description: st.SearchStrategy[str] = ANY_TEXT) -> Queue:
    cohort = draw(st.just("") | NAMES)
    names = draw(st.lists(st.sampled_from(["cpu", "memory"]) | DEVICES, unique=True, max_size=5))
    return Queue(
        name=draw(NAMES),
        cohort=cohort,
        resources=[draw(quota_limits(n, bool(cohort))) for n in names],
        reclaim_within_cohort=draw(st.sampled_from(RECLAIM_POLICIES)),
        within_queue=draw(st.sampled_from(WITHIN_QUEUE_POLICIES)),
        queueing_strategy=draw(st.sampled_from(QUEUEING_STRATEGIES)),
        stop_policy=draw(st.sampled_from(STOP_POLICIES)),
        description=draw(description),
    )


@given(queues())
def test_any_valid_queue_survives_json_and_back(queue: Queue) -> None:
    validate_queue(queue)
    assert read_queue(queue_to_json(queue)) == queue
    assert read_queues(json.dumps(queue_to_json(queue)), "q.json") == [queue]
    assert codec.from_wire(Queue, codec.to_wire(queue)) == queue  # what the CLI sends by RPC


def _hcl(queue: Queue) -> str:
    """A queue written as an operator would write it (limits left out when unset)."""
    lines = [f'queue "{queue.name}" {{']
    for attr in ("cohort", "queueing_strategy", "stop_policy", "description"):
        lines.append(f"  {attr} = {json.dumps(getattr(queue, attr), ensure_ascii=False)}")
    for q in queue.resources:
        lines.append(f'  resource "{q.name}" {{\n    nominal = {q.nominal}')
        lines += [
            f"    {f} = {getattr(q, f)}"
            for f in ("borrowing_limit", "lending_limit")
            if getattr(q, f) is not None
        ]
        lines.append("  }")
    lines.append(
        f'  preemption {{\n    reclaim_within_cohort = "{queue.reclaim_within_cohort}"\n'
        f'    within_queue = "{queue.within_queue}"\n  }}'
    )
    return "\n".join([*lines, "}", ""])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues(PLAIN_TEXT))
def test_any_valid_queue_written_as_hcl_reads_back_equal(queue: Queue) -> None:
    assert read_queues(_hcl(queue), "q.hcl") == [queue]


@given(NAMES, st.integers(min_value=-(2**31), max_value=2**31 - 1), st.text(max_size=40))
def test_any_valid_priority_class_survives_json_and_back(
    name: str, value: int, description: str
) -> None:
    pc = PriorityClass(name=name, value=value, description=description)
    assert read_priority_class(priority_class_to_json(pc)) == pc


# -- the reads' JSON names ---------------------------------------------------------------------------
LEDGER = {
    "nvidia/gpu": {
        "nominal": 2,
        "borrowing_limit": None,
        "lending_limit": 1,
        "used": 3,
        "borrowed": 1,
        "lent": 0,
    }
}


def test_read_answers_take_the_definitions_json_names() -> None:
    ledger = ledger_to_json(LEDGER)
    assert ledger == {
        "nvidia/gpu": {
            "Nominal": 2,
            "BorrowingLimit": None,
            "LendingLimit": 1,
            "Used": 3,
            "Borrowed": 1,
            "Lent": 0,
        }
    }
    row = queue_row_to_json(
        {
            "name": "team-a",
            "cohort": "lab",
            "stop_policy": "None",
            "queueing_strategy": "StrictFIFO",
            "admitted": 3,
            "pending": 1,
            "ledger": LEDGER,
        }
    )
    assert row == {
        "Name": "team-a",
        "Cohort": "lab",
        "StopPolicy": "None",
        "QueueingStrategy": "StrictFIFO",
        "Admitted": 3,
        "Pending": 1,
        "Ledger": ledger,
    }
    status = queue_status_to_json(
        {"queue": codec.to_wire(TEAM_A), "ledger": LEDGER, "admitted": 3, "pending": 1}
    )
    assert status == {**queue_to_json(TEAM_A), "Ledger": ledger, "Admitted": 3, "Pending": 1}
    eviction = {
        "reason": "InCohortReclamation",
        "message": "Preempted",
        "preemptor": "b",
        "index": 9,
        "time": 5,
    }
    pending = pending_to_json(
        {
            "job_id": "j",
            "namespace": "default",
            "position": 1,
            "priority": 10,
            "priority_class": "high",
            "reason": "waiting",
            "create_index": 4,
            "evictions": 1,
            "last_eviction": eviction,
        }
    )
    assert pending == {
        "JobID": "j",
        "Namespace": "default",
        "Position": 1,
        "Priority": 10,
        "PriorityClass": "high",
        "Reason": "waiting",
        "CreateIndex": 4,
        "Evictions": 1,
        "LastEviction": {
            "Reason": "InCohortReclamation",
            "Message": "Preempted",
            "Preemptor": "b",
            "Index": 9,
            "Time": 5,
        },
    }
    assert pending_to_json({"job_id": "j", "last_eviction": None})["LastEviction"] is None
    wire = codec.to_wire(PriorityClass(name="high", value=5, create_index=3, modify_index=4))
    assert priority_class_row_to_json(wire) == {
        "Name": "high",
        "Value": 5,
        "Description": "",
        "CreateIndex": 3,
        "ModifyIndex": 4,
    }
