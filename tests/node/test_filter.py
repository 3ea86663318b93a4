"""Nomad's filter expressions (go-bexpr's syntax) over objects in Nomad's JSON shape."""

from __future__ import annotations

import pytest

from node.core.filter import FilterError, compile_filter

ALLOC = {
    "ID": "5f2c-0001",
    "JobID": "web",
    "ClientStatus": "running",
    "JobVersion": 2,
    "Drain": False,
    "Meta": {"team": "payments", "tier": ""},
    "Tags": ["a", "b"],
    "TaskGroups": [{"Name": "front"}],
    "DesiredDescription": None,
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('ClientStatus == "running"', True),
        ('ClientStatus != "running"', False),
        ("ClientStatus == running", True),  # a bare word is its text, as go-bexpr reads it
        ("JobVersion == 2", True),
        ('JobVersion == "2"', True),  # coerced to the field's type
        ("JobVersion != 3", True),
        ("Drain == false", True),
        ('Meta.team == "payments"', True),
        ('Meta["team"] == "payments"', True),
        ('"/Meta/team" == "payments"', True),  # a quoted selector is a JSON pointer
        ('Meta.absent == "x"', False),
        ('Meta.absent != "x"', True),
        ("Meta.absent is empty", True),
        ("Meta.tier is empty", True),
        ("Meta.team is not empty", True),
        ('"team" in Meta', True),
        ('"a" in Tags', True),
        ('"z" not in Tags', True),
        ('Tags contains "b"', True),
        ('Tags not contains "b"', False),
        ('JobID contains "e"', True),
        ('ClientStatus in ["running", "pending"]', True),
        ('ClientStatus not in ["running", "pending"]', False),
        ("JobVersion in [1, 2]", True),
        ('JobID matches "^w.b$"', True),
        ('JobID not matches "^w"', False),
        ("TaskGroups.0.Name == front", True),
        ('not ClientStatus == "running"', False),
        ('not not ClientStatus == "running"', True),
        ('ClientStatus == "lost" or JobID == "web"', True),
        ('ClientStatus == "lost" or JobID == "web" and Drain == true', False),  # and binds tighter
        ('(ClientStatus == "lost" or JobID == "web") and not Drain == true', True),
        ("JobID == `web`", True),
        ('DesiredDescription == "x"', False),  # null: as if missing
        ("  JobID   ==\t\"web\"  ", True),
    ],
)
def test_expressions(text: str, expected: bool) -> None:
    assert compile_filter(text).matches(ALLOC) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ClientStatus ==", "column 16: it ends early"),
        ('ClientStatus = "x"', "column 14: unexpected character '='"),
        ('(JobID == "x"', "column 14: it ends early"),
        ('JobID == "x" and', "column 17: it ends early"),
        ('== "x"', "column 1: unexpected '=='"),
        ('JobID == "x" JobID', "column 14: unexpected 'JobID'"),
        ('JobID matches "("', "invalid regular expression"),
        ('JobID in "x"', "right side of 'in'"),
        ("", "empty"),
    ],
)
def test_bad_expressions_say_where(text: str, message: str) -> None:
    with pytest.raises(FilterError, match=message.replace("(", r"\(").replace("[", r"\[")):
        compile_filter(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('JobVersion == "two"', "JobVersion is a number"),
        ('Drain == "maybe"', "Drain is a bool"),
        ('Meta == "x"', "Meta is a collection"),
        ('JobVersion matches "2"', "'matches' needs a string"),
    ],
)
def test_type_mismatches_are_errors(text: str, message: str) -> None:
    with pytest.raises(FilterError, match=message):
        compile_filter(text).matches(ALLOC)
