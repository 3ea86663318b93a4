"""Restore a snapshot into an FSM (or a closed store directory) without ever half-replacing it.

Steps, and why:

1. Check integrity first (header, version, trailer, SHA-256, metadata, end
   summary, record types, store schema): a damaged file is refused before
   any work.
2. Write the records into a *fresh* LMDB environment in a temporary
   directory beside the store (same filesystem, so the final rename is
   atomic). Records arrive sorted per database, so they are appended with
   ``putmulti(append=True)``; the temporary environment commits in batches
   and is fsynced at the end. This pass also makes every structural check
   of ``verify`` and re-hashes the file (so a file changed since step 1 is
   caught); on any failure the temporary store is deleted.
3. Swap: with the live environment closed (``FSM.reopen``), one
   ``rename(tmp/data.mdb, store/data.mdb)`` replaces the state atomically;
   the directory is fsynced. LMDB's lock file is reinitialised by the first
   opener, so it needs no swap.
4. Reopen and remove the temporary directory.

A failure in 1-2 removes the temporary directory and leaves the live store
untouched (it was never closed). A crash at any point leaves either the old
or the new ``data.mdb`` in place, plus at worst a stale ``.NAME.restore-*``
directory, which the next restore removes.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

import lmdb

from fsm.digest import DIGEST_KEY
from fsm.store import DEFAULT_MAP_SIZE, STORE_SCHEMA, StateStore
from snapshot.errors import CorruptError, RestoreError, SnapshotError, UnknownRecordTypeError
from snapshot.format import TYPE_NAMES, SnapshotMeta, ignorable
from snapshot.info import SnapshotInfo
from snapshot.reader import inspect, scan, unordered
from snapshot.writer import fsync_dir

if TYPE_CHECKING:
    from fsm.machine import FSM

DATA_FILE = "data.mdb"
_COMMIT_CHUNKS = 64  # ~64 MiB of records per temporary-env commit, to bound dirty pages


def _store_dir(target: FSM | str | os.PathLike) -> str:
    if isinstance(target, (str, os.PathLike)):
        return os.path.abspath(os.fspath(target))
    return os.path.abspath(target.store.path)


def _check_meta(name: str, meta: SnapshotMeta) -> None:
    if meta.store_schema > STORE_SCHEMA:
        raise RestoreError(
            f"{name}: snapshot store schema {meta.store_schema} is newer than this build "
            f"({STORE_SCHEMA}); upgrade caravan to restore it"
        )


def build_store(path: str, dest_dir: str, *, map_size: int = DEFAULT_MAP_SIZE) -> SnapshotInfo:
    """Write the snapshot's records into a new LMDB environment at ``dest_dir`` (must not exist).

    The environment is synced and closed on return; on failure ``dest_dir``
    is removed.
    """
    os.makedirs(dest_dir)
    store = StateStore(dest_dir, map_size=map_size, sync=False)
    name = os.path.basename(path)
    try:
        txn = store.begin_write()
        pending = 0

        def consume(code: int, records: list[tuple[bytes, bytes]]) -> None:
            nonlocal txn, pending
            name = TYPE_NAMES[code]
            db = store.dbs[name]
            if name == "meta":
                # The source's digest row is not trusted here: the FSM recomputes it once (fsm.digest).
                records = [r for r in records if r[0] != DIGEST_KEY]
            # Append mode: LMDB refuses a key that is not greater than the previous one.
            consumed, added = txn.cursor(db=db).putmulti(records, append=True)
            if consumed != len(records) or added != len(records):
                raise CorruptError(unordered(name, code))
            pending += 1
            if pending >= _COMMIT_CHUNKS:
                txn.commit()
                txn = store.begin_write()
                pending = 0

        try:
            info = scan(
                path,
                consume,
                check_first=False,
                check_order=False,
                on_meta=lambda m: _check_meta(name, m),
            )
            txn.commit()
        except BaseException:
            txn.abort()
            raise
        store.env.sync(True)
        store.close()
        return info
    except BaseException as exc:
        try:
            store.close()
        finally:
            shutil.rmtree(dest_dir, ignore_errors=True)
        if isinstance(exc, lmdb.Error):
            raise RestoreError(f"{name}: writing the restored store failed: {exc}") from exc
        raise


def _remove_stale(store_dir: str) -> None:
    parent, base = os.path.split(store_dir)
    for stale in glob.glob(os.path.join(parent, f".{glob.escape(base)}.restore-*")):
        shutil.rmtree(stale, ignore_errors=True)


def restore(
    path: str, target: FSM | str | os.PathLike, *, verified: SnapshotInfo | None = None
) -> SnapshotInfo:
    """Replace the state of ``target`` (an open FSM, or a store directory nobody has open) with the snapshot's.

    Verification is complete before anything is replaced, in two steps:
    first the integrity checks (header, version, trailer, SHA-256, metadata,
    end summary, record types, store schema: what ``inspect`` reads), then
    the full structural pass, which runs while the records are written into
    the temporary store and re-hashes the file; the swap happens only after
    both passed. (A separate ``verify`` pass first would read and decode the
    whole file once more for no extra safety: ~6 s of 18 s at 1,000,000
    objects.) ``verified=`` skips the first step when the caller just ran
    ``verify`` or ``inspect``.

    On any failure raises a ``SnapshotError`` and the previous state is
    intact. After success the FSM's digest equals the source's digest at the
    snapshot's index.
    """
    name = os.path.basename(path)
    info = verified if verified is not None else inspect(path)
    for code in info.unknown_types:
        if not ignorable(code):
            label = info.meta.types.get(code, "?") if info.meta is not None else "?"
            raise UnknownRecordTypeError(
                f"{name}: record type {code} ({label}) is unknown to this build and not "
                "ignorable; upgrade caravan to restore this snapshot"
            )
    if info.meta is not None:
        _check_meta(name, info.meta)
    store_dir = _store_dir(target)
    parent, base = os.path.split(store_dir)
    os.makedirs(parent, exist_ok=True)
    _remove_stale(store_dir)
    if isinstance(target, (str, os.PathLike)):
        map_size = DEFAULT_MAP_SIZE
    else:
        map_size = target.store.env.info()["map_size"]
    tmp = tempfile.mkdtemp(prefix=f".{base}.restore-", dir=parent)
    os.rmdir(tmp)  # build_store creates it
    try:
        built = build_store(path, tmp, map_size=map_size)
        if built.sha256 != info.sha256:
            raise RestoreError(f"{name}: the file changed between verification and restore")

        def install(dir_path: str) -> None:
            os.makedirs(dir_path, exist_ok=True)
            os.replace(os.path.join(tmp, DATA_FILE), os.path.join(dir_path, DATA_FILE))
            fsync_dir(dir_path)

        try:
            if isinstance(target, (str, os.PathLike)):
                install(store_dir)
            else:
                target.reopen(install)
        except SnapshotError:
            raise
        except Exception as exc:
            raise RestoreError(f"{name}: swapping the restored store in failed: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return built
