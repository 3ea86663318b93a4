"""Session-wide test setup."""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """Let SIGTERM (``timeout``, a cancelled CI job) end the run the way Ctrl-C does.

    pytest then still tears fixtures down, so the server processes that
    cluster tests start (detached, like ``caravan cluster up``) are stopped
    instead of being left running behind a killed test run.
    """
    signal.signal(signal.SIGTERM, _interrupt)
