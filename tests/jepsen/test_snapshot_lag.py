"""The snapshot-lag nemesis: a follower cut off past the others' log compaction catches up by snapshot install.

The real runs use servers with ``raft_compaction_entries = 300`` (the runner's
default with this nemesis), so a few seconds of load compact the others' logs
past the isolated follower. The must-fail run turns on the server's test-only
bug ``CARAVAN_UNSAFE_SKIP_SNAPSHOT_RESTORE`` (a follower told to install a
dump keeps its old store): the same run that is VALID without it must report
the diverged replica.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jepsen_like.__main__ import main
from jepsen_like.nemesis import SnapshotLag
from jepsen_like.runner import EXIT_ANOMALY, EXIT_OK
from jepsen_like.testbed import Testbed
from jepsen_like.workloads import LIFECYCLE_GC_CONFIG
from node.core.config import load_config
from tests.jepsen.support import ShortRun, short_run

UNSAFE_SKIP_RESTORE = "CARAVAN_UNSAFE_SKIP_SNAPSHOT_RESTORE"
BY_INSTALL = "by snapshot install"


def lag_run(out: Path, seed: int, **overrides: object) -> ShortRun:
    return short_run(out, seed, ["snapshot-lag"], hold=(2.0, 3.0), time=20.0, convergence_wait=30.0, **overrides)


# -- without a cluster ---------------------------------------------------------------------
def test_testbed_writes_the_compaction_threshold_before_the_tables(tmp_path: Path) -> None:
    """raft_compaction_entries is a top-level key: it must land before the extra config's [gc] table."""
    testbed = Testbed.create(tmp_path, 3, extra_config=LIFECYCLE_GC_CONFIG, compaction_entries=200)
    try:
        for node in testbed.cluster.nodes:
            config = load_config(node.config_file)
            assert config.raft_compaction_entries == 200
            assert config.gc.job_interval == 2.0  # the extra config still applies
    finally:
        testbed.teardown()


def test_unavailable_without_a_small_compaction_threshold(tmp_path: Path) -> None:
    plain = Testbed.create(tmp_path / "plain", 3)
    try:
        reason = SnapshotLag().unavailable(plain)
        assert reason is not None and "raft_compaction_entries" in reason
    finally:
        plain.teardown()
    direct = Testbed.create(tmp_path / "direct", 3, proxies=False, compaction_entries=200)
    try:
        reason = SnapshotLag().unavailable(direct)
        assert reason is not None and "proxies" in reason
    finally:
        direct.teardown()


def test_cli_rejects_a_non_positive_compaction_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["run", "--nemesis", "snapshot-lag", "--compaction-entries", "0", "--time", "5", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.count("\n") == 0 and "--compaction-entries must be positive" in err
    assert not out.exists() or not any(out.iterdir())


# -- real clusters -----------------------------------------------------------------------------
@pytest.mark.cluster
def test_lagging_follower_catches_up_by_snapshot_install(tmp_path: Path) -> None:
    out = tmp_path / "lag"
    r = lag_run(out, 31)
    why = r.explain()
    assert r.code == EXIT_OK, why
    assert r.faults and all(f["kind"] == "snapshot-lag" and f["end"] is not None for f in r.faults), why
    assert any(BY_INSTALL in f["detail"] for f in r.faults), why
    assert r.meta["compaction_entries"] == 300
    assert r.meta["nemesis_stats"]["snapshot-lag"]["caught_up_by_snapshot_install"] >= 1, why
    for checker in ("linearizability", "set", "journal", "convergence"):
        assert r.checker(checker)["status"] == "ok", why
    assert r.checker("linearizability")["operations"] > 100, why


@pytest.mark.cluster
def test_skipped_snapshot_restore_is_reported(tmp_path: Path) -> None:
    """A follower that ignores the dump it is sent diverges; the run must say so."""
    out = tmp_path / "buggy"
    r = lag_run(out, 31, server_env={UNSAFE_SKIP_RESTORE: "1"})
    why = r.explain()
    assert r.code == EXIT_ANOMALY, why
    assert not any(BY_INSTALL in f["detail"] for f in r.faults), why  # nothing was restored
    assert r.checker("convergence")["status"] == "anomaly", why
    assert "DIVERGED" in r.checker("convergence")["summary"], why
