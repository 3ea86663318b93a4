"""The ``clients`` nemesis: a share of the simulated client's nodes goes silent and comes back.

One short real run (three servers, the simulated client as its own
process) and the client's silence switch on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.silence import Silence, ack_path, read_ack, write_json_atomically
from jepsen_like.runner import EXIT_OK
from tests.jepsen.support import short_run


def test_the_silence_switch_reports_each_change_once_and_acknowledges_it(tmp_path: Path) -> None:
    path = str(tmp_path / "silence.json")
    silence = Silence(path=path)
    assert silence.poll() is None  # no file yet: nothing silenced
    write_json_atomically(path, {"generation": 1, "silenced": ["n1", "n2"]})
    assert silence.poll() == (frozenset({"n1", "n2"}), frozenset())
    silence.acknowledge()
    assert read_ack(path) == 1 and "n1" in silence and "n3" not in silence
    assert silence.poll() is None  # unchanged
    write_json_atomically(path, {"generation": 2, "silenced": ["n2", "n3"]})
    assert silence.poll() == (frozenset({"n3"}), frozenset({"n1"}))
    Path(path).write_text('{"generation": 3, "sil')  # torn (the harness writes atomically; be safe anyway)
    assert silence.poll() is None and silence.generation == 2
    assert not Path(ack_path(str(tmp_path / "other.json"))).exists()
    assert Silence().poll() is None  # without the switch nothing is read


@pytest.mark.cluster
def test_silenced_nodes_lose_their_allocs_and_each_is_replaced_exactly_once(tmp_path: Path) -> None:
    """The nemesis silences 20-50% of the client's ten nodes; only those go down, their allocs are
    replaced once each, the nodes come back ready, and every job of the failover workload (which
    the nemesis brings along) runs its count at the end."""
    out = tmp_path / "clients"
    r = short_run(out, 3, ["clients"], workloads=["journal"], time=15.0, quiet=(0.5, 1.0), hold=(0.5, 1.0))
    assert r.code == EXIT_OK, r.explain()
    assert "failover" in r.meta["active_workloads"]
    faults = [f for f in r.faults if f["kind"] == "clients"]
    assert faults and all(f["end"] is not None for f in faults), r.faults
    assert all("all down after" in f["detail"] and "ready again" in f["detail"] for f in faults), r.explain()
    windows = r.meta["nemesis_stats"]["clients"]["windows"]
    for w in windows:
        assert 1 <= len(w["nodes"]) <= w["of"] // 2, w  # a share, never all
        assert w["others_down"] == [], w  # the switch cut off exactly the nodes it named
    check = r.checker("failover")
    assert check["status"] == "ok", r.explain()
    assert check["details"]["needed_replacement"] > 0 and check["details"]["final_settled"], check
    log = (out / "cluster" / "client-sim.log").read_text()
    assert "node(s) cut off" in log and "Traceback" not in log
    assert json.loads((out / "results.json").read_text())
