"""The collector's full passes are timed, and the long ones logged (they stall every thread, raft's too)."""

from __future__ import annotations

import gc
from typing import Any

from node.core.process import GCPauses


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))


def test_a_full_pass_longer_than_the_threshold_is_logged_and_a_young_one_is_not() -> None:
    log = Log()
    pauses = GCPauses(log, threshold=0.0)
    pauses.install()
    try:
        gc.collect(0)
        assert pauses.full_passes == 0 and log.lines == []
        gc.collect(2)
    finally:
        pauses.uninstall()
    assert pauses.full_passes == 1 and pauses.longest > 0
    assert [event for event, _ in log.lines] == ["gc_full_pass_slow"]
    assert log.lines[0][1]["seconds"] >= 0


def test_short_passes_are_counted_but_not_logged() -> None:
    log = Log()
    pauses = GCPauses(log, threshold=60.0)
    pauses.install()
    try:
        gc.collect(2)
    finally:
        pauses.uninstall()
    assert pauses.full_passes == 1 and log.lines == []
    assert pauses not in gc.callbacks
