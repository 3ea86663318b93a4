"""The CLI's progress reporter: plain periodic lines off a terminal, a rich bar on one, never stdout."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from node.cli.progress import FileReads, Reporter, watching


def test_plain_lines_come_at_the_interval_and_close_with_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARAVAN_PROGRESS_INTERVAL", "0.05")
    err = io.StringIO()
    with Reporter("system gc", unit="objects", total=1000, stream=err, terminal=False) as progress:
        progress.update(10)  # before the first interval: no line yet
        assert err.getvalue() == ""
        time.sleep(0.06)
        progress.update(500)
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("system gc: 500 of 1,000 objects (50%), ")
    assert lines[-1].startswith("system gc: done, 500 of 1,000 objects (50%), ")
    assert all(line.endswith("elapsed") for line in lines)


def test_bytes_are_sized_and_a_failure_says_where_it_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARAVAN_PROGRESS_INTERVAL", "0.05")
    err = io.StringIO()
    with pytest.raises(RuntimeError), Reporter("snapshot save", unit="bytes", stream=err, terminal=False) as p:
        time.sleep(0.06)
        p.advance(3 * 1024 * 1024)
        raise RuntimeError("stream cut")
    assert err.getvalue().splitlines()[-1].startswith("snapshot save: stopped at 3.0 MiB, ")


def test_a_failure_before_any_progress_line_adds_no_line() -> None:
    """A command that fails at once prints its one error line, nothing of ours beside it."""
    err = io.StringIO()
    with pytest.raises(RuntimeError), Reporter("snapshot restore", stream=err, terminal=False):
        raise RuntimeError("corrupt file")
    assert err.getvalue() == ""


def test_a_terminal_gets_a_bar_on_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    err = io.StringIO()
    with Reporter("snapshot restore", unit="bytes", total=100, stream=err, terminal=True) as progress:
        progress.update(50)
        progress.say("seeding server1")
    assert "seeding server1" in err.getvalue()
    assert capsys.readouterr().out == ""


def test_progress_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARAVAN_PROGRESS", "0")
    err = io.StringIO()
    with Reporter("x", stream=err, terminal=False) as progress:
        progress.update(5)
    assert err.getvalue() == ""


def test_file_reads_follow_the_offset_across_passes(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 1000)
    reads = FileReads(str(path))
    assert reads.total_read() == 0  # not open
    with open(path, "rb", buffering=0) as f:  # the kernel's offset is what the watcher sees
        f.read(400)
        assert reads.total_read() == 400
        f.read()
        assert reads.total_read() == 1000
    with open(path, "rb", buffering=0) as f:  # the kernel's offset is what the watcher sees
        f.read(100)
        assert reads.total_read() == 1100  # a second pass


def test_a_failing_watcher_poll_never_breaks_the_operation() -> None:
    calls: list[int] = []

    def poll() -> None:
        calls.append(1)
        raise OSError("gone")

    with watching(poll, 0.01):
        time.sleep(0.05)
    assert calls
