"""Child process that writes a raft dump, so the raft process's tick never waits on it.

Run by ``BackgroundSnapshotter(mode="process")`` as
``python -m snapshot.dump_worker --store DIR --map-size N --out PARTIAL --raft HEX``.
It opens the LMDB environment read-only (LMDB is safe across processes; the
writer in the server process keeps every page this reader uses), writes the
state of one read transaction to ``--out`` and fsyncs it. It does not rename:
the parent installs the file from its tick thread. Exit status 0 means the
file is complete; otherwise the last line on stderr says why.
"""

from __future__ import annotations

import argparse
import sys

import lmdb

from fsm import codec
from fsm.store import ALL_DBS, StateReader
from snapshot.errors import SnapshotError
from snapshot.format import RaftData
from snapshot.writer import write_file


class _ReadOnlyStore:
    """What ``StateReader`` needs from a store: the named databases (opened in ``txn``)."""

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        self.env = env
        self.dbs = {name: env.open_db(name.encode(), txn=txn, create=False) for name in ALL_DBS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snapshot.dump_worker")
    parser.add_argument("--store", required=True)
    parser.add_argument("--map-size", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--raft", required=True, help="msgpack of RaftData.to_wire(), hex")
    parser.add_argument("--cluster-id", default="")
    args = parser.parse_args(argv)
    try:
        raft = RaftData.from_wire(codec.unpack(bytes.fromhex(args.raft)))
        env = lmdb.open(
            args.store,
            readonly=True,
            lock=True,
            map_size=args.map_size,
            max_dbs=len(ALL_DBS) + 4,
            max_readers=512,
        )
        with env.begin(buffers=False) as txn:
            store = _ReadOnlyStore(env, txn)
            write_file(StateReader(store, txn), args.out, raft=raft, cluster_id=args.cluster_id)  # type: ignore[arg-type]
        env.close()
    except (SnapshotError, lmdb.Error, OSError, ValueError) as exc:
        sys.stderr.write(f"raft dump failed: {' '.join(str(exc).split())}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
