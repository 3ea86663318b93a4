"""``caravan node drain --monitor``'s output from a scripted sequence of node and alloc reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from node.cli import nodes as cli


class _Script:
    """Answers node.get from a list of states (the last one repeats); the node has no allocs."""

    def __init__(self, states: list[dict[str, Any] | None]) -> None:
        self.states: Iterator[dict[str, Any] | None] = iter(states)
        self.last: dict[str, Any] | None = None

    def call(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        if method == "node.get":
            self.last = next(self.states, self.last)
            return {"data": {"ID": "n1", "Status": "ready", "DrainStrategy": self.last}}
        assert method == "alloc.list"
        return {"data": [], "next_token": ""}

    def read_answer(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        return self.call(method, args)


def test_monitoring_a_node_without_allocs_says_so_once_and_sees_the_drain_complete(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "DRAIN_POLL", 0)
    drain = {"Deadline": 0, "IgnoreSystemJobs": False}
    code = cli.monitor_drain(_Script([drain, drain, drain, None]), "n1", just_set=False)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("Monitoring node") == 1, out
    assert "Drain complete for node n1" in out and "No drain strategy" not in out, out


def test_monitoring_a_node_that_is_not_draining(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "DRAIN_POLL", 0)
    assert cli.monitor_drain(_Script([None]), "n1", just_set=False) == 0  # type: ignore[arg-type]
    assert capsys.readouterr().out.strip().endswith("No drain strategy set for node n1")
