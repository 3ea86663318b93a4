"""Bad GC settings and requests end ``caravan client ...`` with one clear line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def caravan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--gc-interval", "soon"), "Error: --gc-interval: invalid duration 'soon'"),
        (("--gc-interval", "0s"), "Error: --gc-interval must be longer than 0s"),
        (("--gc-report-interval", "-1s"), "Error: --gc-report-interval: invalid duration '-1s'"),
    ],
)
def test_bad_gc_settings_are_one_line(flags: tuple[str, ...], message: str) -> None:
    out = caravan("client", "sim", "--servers", "127.0.0.1:1", *flags)
    assert out.returncode != 0 and out.stderr.strip().startswith(message), out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr


def test_out_of_range_thresholds_are_refused_by_the_option_itself() -> None:
    out = caravan("client", "sim", "--servers", "127.0.0.1:1", "--gc-disk-usage-threshold", "120")
    assert out.returncode == 2 and "--gc-disk-usage-threshold" in out.stderr, out.stderr


def test_client_gc_takes_a_node_or_an_alloc_not_both() -> None:
    out = caravan("client", "gc", "--node", "n1", "--alloc", "a1", "--address", "127.0.0.1:1")
    assert (
        out.returncode == 1
        and out.stderr.strip()
        == "Error: give --node or --alloc, not both (an allocation's node is known)"
    )
