"""Format rules: record type codes, unknown types, versions, structural checks, inspect output, failed restores."""

from __future__ import annotations

import json
import os

import pytest

from fsm.store import ALL_DBS
from snapshot import (
    CorruptError,
    NewerVersionError,
    RestoreError,
    UnknownRecordTypeError,
    format_info,
    inspect,
    restore,
    save,
    verify,
)
from snapshot.format import IGNORE_FLAG, TYPE_CODES, TYPE_NAMES
from tests.snapshot.support import apply_entries, example_entries, forge, new_fsm, read_back, tree


@pytest.fixture
def source(tmp_path):
    src = new_fsm(str(tmp_path / "src"))
    apply_entries(src, example_entries())
    path = str(tmp_path / "s.snap")
    save(src, path, term=3, cluster_id="cluster-a")
    yield src, path
    src.close()


@pytest.fixture
def live(tmp_path):
    fsm = new_fsm(str(tmp_path / "live"))
    apply_entries(fsm, example_entries(seed=5, n=4))
    yield fsm
    fsm.close()


def test_every_lmdb_database_has_a_stable_code() -> None:
    assert set(TYPE_CODES) == set(ALL_DBS)
    assert len(set(TYPE_CODES.values())) == len(TYPE_CODES)
    assert all(0 < c < IGNORE_FLAG for c in TYPE_CODES.values())
    # Codes are part of the file format: changing one breaks every existing snapshot.
    assert TYPE_CODES["jobs"] == 1 and TYPE_CODES["acl_tokens"] == 8
    assert (
        TYPE_CODES["evals_by_job"] == 32
        and TYPE_CODES["index"] == 64
        and TYPE_CODES["journal"] == 68
    )


def test_unknown_ignorable_type_is_skipped_on_restore(source, live, tmp_path) -> None:
    src, path = source
    meta, chunks = read_back(path)
    code = IGNORE_FLAG | 5
    meta["types"].append([code, "future_cache"])
    meta["counts"].append([code, 2])
    forged = str(tmp_path / "ignorable.snap")
    forge(forged, meta, chunks[:3] + [(code, [(b"a", b"1"), (b"b", b"2")])] + chunks[3:])
    info = verify(forged)
    assert info.unknown_types == [code]
    assert "future_cache" in format_info(inspect(forged))
    restore(forged, live)
    assert live.digest() == src.digest()


def test_unknown_type_without_ignore_flag_is_refused(source, live, tmp_path) -> None:
    _, path = source
    meta, chunks = read_back(path)
    meta["types"].append([100, "future_table"])
    meta["counts"].append([100, 1])
    forged = str(tmp_path / "unknown.snap")
    forge(forged, meta, chunks + [(100, [(b"k", b"v")])])
    before = live.digest()
    with pytest.raises(
        UnknownRecordTypeError, match=r"record type 100 \(future_table\) is unknown"
    ):
        verify(forged)
    with pytest.raises(UnknownRecordTypeError):
        restore(forged, live)
    assert live.digest() == before
    # inspect still shows what is in it
    assert any(t.name == "future_table" for t in inspect(forged).types)


def test_newer_major_version_is_refused_and_newer_minor_is_read(source, live, tmp_path) -> None:
    src, path = source
    meta, chunks = read_back(path)
    major = str(tmp_path / "v2.snap")
    forge(major, meta, chunks, major=2, minor=0)
    before = live.digest()
    with pytest.raises(NewerVersionError, match="format 2.0 is newer"):
        restore(major, live)
    assert live.digest() == before
    meta["added_in_1_7"] = {"anything": 1}
    minor = str(tmp_path / "v1_7.snap")
    forge(minor, meta, chunks, major=1, minor=7)
    info = verify(minor)
    assert info.version == "1.7" and info.meta.extra == {"added_in_1_7": {"anything": 1}}
    restore(minor, live)
    assert live.digest() == src.digest()


def test_newer_store_schema_is_refused(source, live, tmp_path) -> None:
    _, path = source
    meta, chunks = read_back(path)
    meta["store_schema"] = 99
    forged = str(tmp_path / "schema.snap")
    forge(forged, meta, chunks)
    before = live.digest()
    with pytest.raises(RestoreError, match="store schema 99 is newer"):
        restore(forged, live)
    assert live.digest() == before


@pytest.mark.parametrize(
    "damage, words",
    [
        ("unsorted", "not strictly increasing"),
        ("count", "counts in the metadata and the end summary disagree"),
        ("summary", "do not match the end summary"),
        ("renamed", "is 'allocs' in the file but 'jobs' here"),
    ],
)
def test_structural_damage_with_a_valid_checksum_is_refused(
    source, live, tmp_path, damage, words
) -> None:
    _, path = source
    meta, chunks = read_back(path)
    summary = None
    jobs = TYPE_CODES["jobs"]
    if damage == "unsorted":
        chunks = [(c, list(reversed(r)) if c == jobs else r) for c, r in chunks]
    elif damage == "count":
        meta["counts"] = [[c, n + (c == jobs)] for c, n in meta["counts"]]
    elif damage == "summary":
        totals = {}
        for c, recs in chunks:
            totals[c] = [len(recs), sum(len(k) + len(v) for k, v in recs)]
        for c, _ in meta["counts"]:
            totals.setdefault(c, [0, 0])
        totals[jobs][1] += 1
        summary = {"types": [[c, n, b] for c, (n, b) in totals.items()]}
    elif damage == "renamed":
        meta["types"] = [[c, "allocs" if c == jobs else n] for c, n in meta["types"]]
    forged = str(tmp_path / f"{damage}.snap")
    forge(forged, meta, chunks, summary=summary)
    before = live.digest()
    with pytest.raises(CorruptError, match=words):
        verify(forged)
    with pytest.raises(CorruptError):
        restore(forged, live)
    assert live.digest() == before
    assert tree(str(tmp_path / "live")) == []


def test_failure_late_in_the_restore_pass_leaves_the_live_state(source, live, tmp_path) -> None:
    """Records were already written to the temporary store when the summary check fails."""
    _, path = source
    meta, chunks = read_back(path)
    totals = {c: [0, 0] for c, _ in meta["counts"]}
    for c, recs in chunks:
        totals[c][0] += len(recs)
        totals[c][1] += sum(len(k) + len(v) for k, v in recs)
    totals[TYPE_CODES["journal"]][1] += 1
    forged = str(tmp_path / "late.snap")
    forge(forged, meta, chunks, summary={"types": [[c, n, b] for c, (n, b) in totals.items()]})
    before = live.digest()
    with pytest.raises(CorruptError):
        restore(forged, live, verified=verify(path))  # skip the up-front check to fail mid-way
    assert live.digest() == before
    assert tree(str(tmp_path / "live")) == []


def test_failure_while_swapping_leaves_the_live_state(source, live, tmp_path, monkeypatch) -> None:
    _, path = source
    before = live.digest()

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(RestoreError, match="swapping the restored store in failed"):
        restore(path, live)
    monkeypatch.undo()
    assert live.digest() == before  # reopened on the old file, still usable
    apply_entries(live, example_entries(seed=11, n=2), start=live.applied_index + 1)
    assert tree(str(tmp_path / "live")) == []


def test_stale_restore_directories_are_removed(source, live, tmp_path) -> None:
    src, path = source
    stale = tmp_path / ".live.restore-crashed"
    stale.mkdir()
    (stale / "data.mdb").write_bytes(b"junk")
    restore(path, live)
    assert tree(str(tmp_path / "live")) == []
    assert live.digest() == src.digest()


def test_inspect_output(source) -> None:
    src, path = source
    info = inspect(path)
    digest, index = src.digest()
    assert info.index == index and info.term == 3 and info.cluster_id == "cluster-a"
    assert info.id == f"3-{index}-{info.created // 1_000_000}"
    assert info.version == "1.0" and info.raft_index is None
    assert info.size == os.path.getsize(path)
    sizes = [t.size for t in info.types]
    assert sizes == sorted(sizes, reverse=True)
    assert {t.name for t in info.types} == set(ALL_DBS)
    text = format_info(info)
    lines = text.splitlines()
    for field in ("ID", "Size", "Index", "Term", "Version", "Created", "SHA-256"):
        assert any(line.startswith(field) and " = " in line for line in lines), field
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["Type", "Count", "Size"]
    assert table[-1].split()[:2] == ["Total", str(info.total_count)]
    listed = [row.split()[0] for row in table[1:-1]]
    assert listed == [t.name for t in info.types if t.count]  # sorted by size, empty types left out
    data = json.loads(json.dumps(info.to_json()))
    assert {
        "ID",
        "Size",
        "Index",
        "Term",
        "Version",
        "Created",
        "Types",
        "TotalCount",
        "TotalSize",
    } <= set(data)
    assert data["Types"][0]["Size"] >= data["Types"][-1]["Size"]
    assert data["TotalSize"] == sum(t["Size"] for t in data["Types"])
    assert TYPE_NAMES[TYPE_CODES["allocs"]] == "allocs"
