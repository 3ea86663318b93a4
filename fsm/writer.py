"""Mutations of the state store, keeping indexes, GC marks and the journal in step.

A ``StateWriter`` lives for one log entry, inside that entry's (nested) write
transaction: if the entry is rejected, the transaction is aborted and nothing
it did remains. It collects the entry's change records and the tables it
touched; ``finish`` writes them.
"""

from __future__ import annotations

from typing import Any

import lmdb

from fsm import codec, errors, record
from fsm.digest import DigestTxn
from fsm.keys import SEP, from_u64, key, key_at, prefix, u64
from fsm.store import StateReader, StateStore, keys_with_prefix
from fsm.structs import (
    EVAL_TERMINAL,
    JOB_DEAD,
    JOB_PENDING,
    NODE_DOWN,
    ACLToken,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    JobSummary,
    Node,
    alloc_map_terminal,
)
from fsm.topics import (
    TOPIC_ALLOC,
    TOPIC_DEPLOYMENT,
    TOPIC_EVAL,
    TOPIC_JOB,
    TOPIC_NODE,
    TOPIC_TOKEN,
    public_token,
)
from fsm.workloads import WorkloadWrites

# GC-mark kinds: the collector scans each kind's marks up to now - threshold.
GC_EVAL, GC_JOB, GC_DEPLOYMENT, GC_NODE, GC_TOKEN = "eval", "job", "deployment", "node", "token"
GC_KINDS = (GC_EVAL, GC_JOB, GC_DEPLOYMENT, GC_NODE, GC_TOKEN)

JOB_VERSIONS_KEPT = 6


class StateWriter(StateReader, WorkloadWrites):
    def __init__(self, store: StateStore, txn: DigestTxn, index: int, now: int) -> None:
        """``txn``: the group's write transaction, shared by every entry of the group.

        Handlers write only through it (never through cursors), so its
        ``wrote`` flag, reset here, tells the FSM whether a rejected entry
        wrote anything that must be rolled back.
        """
        self.store = store
        self.dbs = store.dbs
        txn.wrote = False
        self.txn = txn
        self.index = index
        self.now = now
        # Change records, each already packed as msgpack [topic, type, key, object]:
        # a stored object's bytes are reused in its record (journal.append
        # joins them into the batch array, the same bytes as packing the list).
        self.records: list[bytes] = []
        self.touched: set[str] = set()
        # Jobs whose status must be derived again at the end of the entry, and
        # jobs that only saw allocs or evals end (live -> terminal): those
        # keep their status while they still have a live alloc (see finish).
        self.dirty_jobs: set[str] = set()
        self.ended_jobs: set[str] = set()
        # Jobs ``put_job`` stored in this entry: their bytes and the fields
        # ``set_job_status`` reads, so ``finish`` need not read and unpack them again.
        self._jobs_put: dict[str, tuple[bytes, str, bool, bool, bool, str, bool]] = {}
        # What this entry already knows of a job's index rows, so deriving its
        # status need not probe them again: jobs seen to have no alloc rows
        # (until an alloc row of theirs is linked), and jobs this entry linked
        # a live eval row of (until an eval row of theirs is unlinked).
        self._no_allocs: set[str] = set()
        self._live_evals: set[str] = set()

    # -- primitives ------------------------------------------------------
    def _cursor(self, db: str) -> lmdb.Cursor:
        cursors = self.txn.cursors
        cursor = cursors.get(db)
        if cursor is None:
            cursor = cursors[db] = self.txn.cursor(db=self.dbs[db])
        return cursor

    def _any(self, index: str, start: bytes) -> bool:
        cursor = self._cursor(index)
        return cursor.set_range(start) and cursor.key().startswith(start)

    def job_has_allocs(self, job_id: str) -> bool:
        if self._any("allocs_by_job", prefix(job_id)):
            return True
        self._no_allocs.add(job_id)  # nor live ones: allocs_live_by_job rows are allocs_by_job rows
        return False

    def _keys(self, db: str, start: bytes) -> list[bytes]:
        """Keys starting with ``start``, in order (read out before the caller may delete them)."""
        return keys_with_prefix(self._cursor(db), start)

    def _put(self, table: str, k: bytes, obj: Any) -> bytes:
        """Store ``obj``; returns its packed bytes, which the journal record reuses."""
        raw = codec.encode(obj)
        self.txn.put(k, raw, True, True, False, self.dbs[table])
        self.touched.add(table)
        return raw

    def _delete(self, table: str, k: bytes) -> None:
        if self.txn.delete(k, db=self.dbs[table]):
            self.touched.add(table)

    def _link(self, index: str, k: bytes) -> None:
        self.txn.put(k, b"", db=self.dbs[index])

    def _unlink(self, index: str, k: bytes) -> None:
        self.txn.delete(k, db=self.dbs[index])

    def record(self, topic: str, type_: str, k: str, obj: Any) -> None:
        payload = obj if obj is None or isinstance(obj, dict) else codec.to_wire(obj)
        self.records.append(codec.pack([topic, type_, k, payload]))

    def record_packed(self, topic: str, type_: str, k: str, packed: bytes) -> None:
        """A record whose object is already msgpack bytes (msgpack concatenates)."""
        head = codec.pack((topic, type_, k))  # fixarray(3) header, then the three strings
        self.records.append(b"\x94" + head[1:] + packed)

    def _stamp(self, obj: Any, old: Any) -> None:
        obj.create_index = old.create_index if old is not None else self.index
        obj.modify_index = self.index
        if hasattr(obj, "create_time"):
            obj.create_time = old.create_time if old is not None else self.now
        if hasattr(obj, "modify_time"):
            obj.modify_time = self.now

    # -- GC marks --------------------------------------------------------
    def mark(self, kind: str, obj_id: str, since: int) -> None:
        """Record that an object became GC-eligible at ``since`` (replacing an older mark)."""
        self.unmark(kind, obj_id)
        self._link("gc_marks", key_at(kind, since, obj_id))
        self.txn.put(key(kind, obj_id), u64(since), db=self.dbs["gc_mark_of"])

    def unmark(self, kind: str, obj_id: str) -> None:
        raw = self.txn.pop(key(kind, obj_id), self.dbs["gc_mark_of"])
        if raw is not None:
            self._unlink("gc_marks", key_at(kind, from_u64(raw), obj_id))

    def mark_of(self, kind: str, obj_id: str) -> int | None:
        raw = self.txn.get(key(kind, obj_id), db=self.dbs["gc_mark_of"])
        return None if raw is None else from_u64(raw)

    # -- jobs ------------------------------------------------------------
    def put_job(self, job: Job, new: bool = False) -> bytes:
        """Store a job; returns its bytes (for its version row and journal record).

        ``new``: the job did not exist before this entry, so it has no GC mark
        to remove (``delete_job`` removes a job's mark with it).
        """
        job_id = job.id
        raw = codec.encode(job)
        self.txn.put(job_id.encode(), raw, True, True, False, self.dbs["jobs"])
        self.touched.add("jobs")
        self.dirty_jobs.add(job_id)
        self._jobs_put[job_id] = (
            raw,
            job.type,
            job.periodic,
            job.parameterized,
            job.stop,
            job.status,
            new,
        )
        return raw

    def put_job_version(self, job: Job, raw: bytes | None = None) -> None:
        """Keep ``job`` as a version (``raw``: its bytes, if already packed)."""
        k = key_at(job.id, job.version)
        if raw is None:
            self._put("job_versions", k, job)
        else:
            self.txn.put(k, raw, db=self.dbs["job_versions"])
            self.touched.add("job_versions")
        if job.version < JOB_VERSIONS_KEPT:
            # A job's version rows are of versions 0..job.version only (versions
            # only grow while the job exists; a purge deletes its rows), so
            # there are at most JOB_VERSIONS_KEPT of them: nothing to trim.
            return
        keys = self._keys("job_versions", prefix(job.id))
        for old in keys[:-JOB_VERSIONS_KEPT]:
            self._delete("job_versions", old)

    def put_summary(self, summary: JobSummary) -> None:
        self._put("job_summary", summary.job_id.encode(), summary)

    def summary_map(self, job_id: str) -> dict[str, Any] | None:
        """A job summary as its stored map: counters move on every alloc update."""
        raw = self.txn.get(job_id.encode(), db=self.dbs["job_summary"])
        return None if raw is None else codec.unpack(raw)

    def put_summary_map(self, job_id: str, data: dict[str, Any]) -> None:
        if data["create_index"] == 0:
            data["create_index"] = self.index
        data["modify_index"] = self.index
        self.txn.put(job_id.encode(), codec.pack(data), db=self.dbs["job_summary"])
        self.touched.add("job_summary")

    def delete_job(self, job_id: str) -> None:
        """The job, its versions and summary (a purge); evals and allocs stay."""
        self._delete("jobs", job_id.encode())
        self._jobs_put.pop(job_id, None)
        for k in self._keys("job_versions", prefix(job_id)):
            self._delete("job_versions", k)
        self._delete("job_summary", job_id.encode())
        self.unmark(GC_JOB, job_id)
        self.drop_workload(job_id)
        self.dirty_jobs.discard(job_id)
        self.ended_jobs.discard(job_id)

    def set_job_status(self, job_id: str) -> None:
        """Derive pending/running/dead as Nomad's getJobStatus does.

        Runs for every job an entry touched and usually changes nothing; for
        a job ``put_job`` stored in this entry it takes the fields put_job
        noted instead of loading the job again.
        """
        k = job_id.encode()
        job = None
        written = self._jobs_put.pop(job_id, None)
        if written is not None:
            raw, type_, periodic, parameterized, stop, old_status, new = written
        else:
            new = False
            raw = self.txn.get(k, db=self.dbs["jobs"])
            if raw is None:
                return
            job = codec.load(Job, raw)
            type_, periodic, parameterized, stop, old_status = job.type, job.periodic, job.parameterized, job.stop, job.status
        status = self._derive_status(job_id, type_, periodic, parameterized, stop, k + SEP)
        if status == JOB_DEAD and not stop and self.waits_in_queue(job_id):
            status = JOB_PENDING  # evicted, or never admitted: it waits in its queue, it has not ended
        if status != old_status:
            if job is None:
                job = codec.load(Job, raw)
            job.status = status
            job.modify_index = self.index
            job.modify_time = self.now
            raw = codec.encode(job)
            self.txn.put(k, raw, db=self.dbs["jobs"])
            self.touched.add("jobs")
            self.record_packed(TOPIC_JOB, "JobStatusChanged", job_id, raw)
        if status == JOB_DEAD:
            self.finish_workload(job_id)
            if self.mark_of(GC_JOB, job_id) is None:
                self.mark(GC_JOB, job_id, self.now)
        elif not new:  # a job new in this entry has no mark
            self.unmark(GC_JOB, job_id)

    def derive_job_status(self, job: Job) -> str:
        return self._derive_status(job.id, job.type, job.periodic, job.parameterized, job.stop)

    def _derive_status(
        self,
        job_id: str,
        type_: str,
        periodic: bool,
        parameterized: bool,
        stop: bool,
        start: bytes | None = None,
    ) -> str:
        """``start``: ``prefix(job_id)``, if the caller has it."""
        if type_ == "system" or periodic or parameterized:
            return JOB_DEAD if stop else "running"
        if start is None:
            start = prefix(job_id)
        if job_id not in self._no_allocs and self._any("allocs_live_by_job", start):
            return "running"
        if job_id in self._live_evals or self._any("evals_live_by_job", start):
            return "pending"
        for dep in self.deployments_by_job(job_id):
            if dep.active():
                return "running"
        if stop:
            return JOB_DEAD
        has_history = self._any("evals_by_job", start) or self._any("allocs_by_job", start)
        return JOB_DEAD if has_history else "pending"

    # -- evals -----------------------------------------------------------
    def put_eval(self, ev: Evaluation, old: Evaluation | None) -> None:
        # Written out (no _stamp/_link/_unlink/_put calls): every job
        # registration and most other entries store an eval.
        index, now, dbs, txn = self.index, self.now, self.dbs, self.txn
        put = txn.put
        eval_id, status = ev.id, ev.status
        if old is None:
            ev.create_index, ev.create_time = index, now
        else:
            ev.create_index, ev.create_time = old.create_index, old.create_time
        ev.modify_index, ev.modify_time = index, now
        if old is not None and old.status != status:
            txn.delete(key(old.status, eval_id), b"", dbs["evals_by_status"])
        # key(job_id, id), also its evals_by_job row
        live_key = (ev.job_id + "\x00" + eval_id).encode()
        if old is None:  # an eval never changes job (handlers reject that)
            put(live_key, b"", True, True, False, dbs["evals_by_job"])
        put((status + "\x00" + eval_id).encode(), b"", True, True, False, dbs["evals_by_status"])
        if status in EVAL_TERMINAL:
            txn.delete(live_key, b"", dbs["evals_live_by_job"])
            self._live_evals.discard(ev.job_id)
            if old is None or old.status not in EVAL_TERMINAL:
                self.mark(GC_EVAL, eval_id, now)
        else:
            put(live_key, b"", True, True, False, dbs["evals_live_by_job"])
            self._live_evals.add(ev.job_id)
            # A new eval has no mark (delete_eval removes an eval's mark with it).
            if old is not None:
                self.unmark(GC_EVAL, eval_id)
        raw = codec.encode(ev)
        put(eval_id.encode(), raw, True, True, False, dbs["evals"])
        self.touched.add("evals")
        # Job status depends on whether the job has live evals: only a new
        # eval or a change of liveness can change it.
        if old is None or (old.status in EVAL_TERMINAL and ev.status not in EVAL_TERMINAL):
            self.dirty_jobs.add(ev.job_id)
        elif old.status not in EVAL_TERMINAL and ev.status in EVAL_TERMINAL:
            self.ended_jobs.add(ev.job_id)
        self.record_packed(TOPIC_EVAL, "EvaluationUpdated", ev.id, raw)

    def delete_eval(self, ev: Evaluation) -> None:
        self._delete("evals", ev.id.encode())
        self._unlink("evals_by_job", key(ev.job_id, ev.id))
        self._unlink("evals_by_status", key(ev.status, ev.id))
        self._unlink("evals_live_by_job", key(ev.job_id, ev.id))
        self._live_evals.discard(ev.job_id)
        self.unmark(GC_EVAL, ev.id)
        self.dirty_jobs.add(ev.job_id)
        self.record(TOPIC_EVAL, "EvaluationDeleted", ev.id, None)

    # -- allocs ----------------------------------------------------------
    def _node_key(self, alloc: Allocation) -> bytes:
        return key(alloc.node_id, "1" if alloc.terminal() else "0", alloc.id)

    def put_alloc(self, alloc: Allocation, old: Allocation | None, event: str) -> None:
        """Store an alloc, touching only the index rows whose key parts changed."""
        self._no_allocs.discard(alloc.job_id)  # it may link the job's alloc rows
        self._stamp(alloc, old)
        alloc_id = alloc.id
        terminal = alloc.terminal()
        if old is None:
            self._link("allocs_by_job", key(alloc.job_id, alloc_id))
            self._link("allocs_by_eval", key(alloc.eval_id, alloc_id))
            self._link("allocs_by_node", self._node_key(alloc))
            if alloc.deployment_id:
                self._link("allocs_by_deployment", key(alloc.deployment_id, alloc_id))
            if not terminal:
                self._link("allocs_live_by_job", key(alloc.job_id, alloc_id))
            self.dirty_jobs.add(alloc.job_id)
        else:
            was_terminal = old.terminal()
            job_moved = old.job_id != alloc.job_id
            if job_moved:
                self._unlink("allocs_by_job", key(old.job_id, alloc_id))
                self._unlink("allocs_live_by_job", key(old.job_id, alloc_id))
                self._link("allocs_by_job", key(alloc.job_id, alloc_id))
                self.dirty_jobs.update((old.job_id, alloc.job_id))
            if old.eval_id != alloc.eval_id:
                self._unlink("allocs_by_eval", key(old.eval_id, alloc_id))
                self._link("allocs_by_eval", key(alloc.eval_id, alloc_id))
            if old.node_id != alloc.node_id or was_terminal != terminal:
                self._unlink("allocs_by_node", self._node_key(old))
                self._link("allocs_by_node", self._node_key(alloc))
            if old.deployment_id != alloc.deployment_id:
                if old.deployment_id:
                    self._unlink("allocs_by_deployment", key(old.deployment_id, alloc_id))
                if alloc.deployment_id:
                    self._link("allocs_by_deployment", key(alloc.deployment_id, alloc_id))
            if job_moved or was_terminal != terminal:
                live_key = key(alloc.job_id, alloc_id)
                if terminal:
                    self._unlink("allocs_live_by_job", live_key)
                else:
                    self._link("allocs_live_by_job", live_key)
                # Job status depends on whether the job has live allocs (and
                # any at all): only a new alloc or a change of liveness can
                # change it.
                if job_moved or not terminal:
                    self.dirty_jobs.add(alloc.job_id)
                else:
                    self.ended_jobs.add(alloc.job_id)
        raw = self._put("allocs", alloc_id.encode(), alloc)
        self.record_packed(TOPIC_ALLOC, event, alloc_id, raw)

    def alloc_map(self, alloc_id: str) -> dict[str, Any] | None:
        """An alloc as its stored map (for ``update_alloc_map``)."""
        if not alloc_id:
            return None
        raw = self.txn.get(alloc_id.encode(), db=self.dbs["allocs"])
        return None if raw is None else codec.unpack(raw)

    def update_alloc_map(self, data: dict[str, Any], was_terminal: bool, event: str) -> None:
        """Store an alloc map whose client-reported fields changed (the hot path).

        Equivalent to ``put_alloc(alloc, old, event)`` when ``alloc`` differs
        from ``old`` only in client status, description, task states or
        deployment status: of the index key parts only terminal-ness can
        have changed. Keys keep their order, so the bytes are the same too.
        """
        alloc_id = data["id"]
        data["modify_index"] = self.index
        data["modify_time"] = self.now
        terminal = alloc_map_terminal(data)
        if terminal != was_terminal:
            node_id, job_id = data["node_id"], data["job_id"]
            self._unlink("allocs_by_node", key(node_id, "1" if was_terminal else "0", alloc_id))
            self._link("allocs_by_node", key(node_id, "1" if terminal else "0", alloc_id))
            live_key = key(job_id, alloc_id)
            if terminal:
                self._unlink("allocs_live_by_job", live_key)
                self.ended_jobs.add(job_id)
            else:
                self._link("allocs_live_by_job", live_key)
                self._no_allocs.discard(job_id)
                self.dirty_jobs.add(job_id)
        raw = codec.pack(data)
        self.txn.put(alloc_id.encode(), raw, db=self.dbs["allocs"])
        self.touched.add("allocs")
        self.record_packed(TOPIC_ALLOC, event, alloc_id, raw)

    def delete_alloc(self, alloc: Allocation) -> None:
        self._delete("allocs", alloc.id.encode())
        self._unlink("allocs_by_job", key(alloc.job_id, alloc.id))
        self._unlink("allocs_live_by_job", key(alloc.job_id, alloc.id))
        self._unlink("allocs_by_eval", key(alloc.eval_id, alloc.id))
        self._unlink("allocs_by_node", self._node_key(alloc))
        if alloc.deployment_id:
            self._unlink("allocs_by_deployment", key(alloc.deployment_id, alloc.id))
        self.dirty_jobs.add(alloc.job_id)
        self.record(TOPIC_ALLOC, "AllocationDeleted", alloc.id, None)

    # -- deployments -----------------------------------------------------
    def put_deployment(self, dep: Deployment, old: Deployment | None, event: str) -> None:
        self._stamp(dep, old)
        if old is not None and old.job_id != dep.job_id:
            self._unlink("deployments_by_job", key(old.job_id, dep.id))
            self.dirty_jobs.update((old.job_id, dep.job_id))
        if old is None or old.job_id != dep.job_id:
            self._link("deployments_by_job", key(dep.job_id, dep.id))
        if dep.active():
            self.unmark(GC_DEPLOYMENT, dep.id)
        elif old is None or old.active():
            self.mark(GC_DEPLOYMENT, dep.id, self.now)
        raw = self._put("deployments", dep.id.encode(), dep)
        if old is None or old.active() != dep.active():
            self.dirty_jobs.add(dep.job_id)
        self.record_packed(TOPIC_DEPLOYMENT, event, dep.id, raw)

    def delete_deployment(self, dep: Deployment) -> None:
        self._delete("deployments", dep.id.encode())
        self._unlink("deployments_by_job", key(dep.job_id, dep.id))
        self.unmark(GC_DEPLOYMENT, dep.id)
        self.dirty_jobs.add(dep.job_id)
        self.record(TOPIC_DEPLOYMENT, "DeploymentDeleted", dep.id, None)

    # -- nodes -----------------------------------------------------------
    def put_node(self, node: Node, old: Node | None, event: str) -> None:
        if old is not None and old.secret_hash and node.secret_hash not in ("", old.secret_hash):  # set once
            raise errors.ApplyRejected("permission_denied", f"node {node.id}: wrong node secret; pass its first SecretID")
        node.secret_hash = node.secret_hash or (old.secret_hash if old is not None else "")
        if node.secret_hash and (old is None or not old.secret_hash):
            self._link("nodes_by_secret", key(node.secret_hash, node.id))
        self._stamp(node, old)
        if old is None or old.status != node.status:
            node.status_updated_at = self.now
        else:
            # A re-registration must not move the time the status began (the
            # GC mark of a down node is keyed by it).
            node.status_updated_at = old.status_updated_at
        if node.status == NODE_DOWN:
            if old is None or old.status != NODE_DOWN:
                self.mark(GC_NODE, node.id, node.status_updated_at)
        else:
            self.unmark(GC_NODE, node.id)
        raw = self._put("nodes", node.id.encode(), node)
        if node.secret_hash:  # the journal never shows a node's secret, not even hashed (as tokens')
            raw = codec.encode(record.replace(node, secret_hash=""))
        self.record_packed(TOPIC_NODE, event, node.id, raw)

    def delete_node(self, node: Node) -> None:
        if node.secret_hash:
            self._unlink("nodes_by_secret", key(node.secret_hash, node.id))
        self._delete("nodes", node.id.encode())
        self.unmark(GC_NODE, node.id)
        self.record(TOPIC_NODE, "NodeDeregistration", node.id, None)

    # -- ACL tokens ------------------------------------------------------
    def put_token(self, token: ACLToken, old: ACLToken | None) -> None:
        token.create_index = old.create_index if old is not None else self.index
        token.modify_index = self.index
        token.create_time = old.create_time if old is not None else self.now
        if old is not None:
            self._unlink("acl_by_secret", old.secret_hash.encode())
            if old.expiration_time:
                self._unlink("acl_by_expiry", key(old.expiration_time, old.accessor_id))
        self.txn.put(token.secret_hash.encode(), token.accessor_id.encode(), db=self.dbs["acl_by_secret"])
        if token.expiration_time:
            self._link("acl_by_expiry", key(token.expiration_time, token.accessor_id))
            self.mark(GC_TOKEN, token.accessor_id, token.expiration_time)
        else:
            self.unmark(GC_TOKEN, token.accessor_id)
        self._put("acl_tokens", token.accessor_id.encode(), token)
        self.record(TOPIC_TOKEN, "ACLTokenUpserted", token.accessor_id, public_token(token))

    def delete_token(self, token: ACLToken) -> None:
        self._delete("acl_tokens", token.accessor_id.encode())
        self._unlink("acl_by_secret", token.secret_hash.encode())
        if token.expiration_time:
            self._unlink("acl_by_expiry", key(token.expiration_time, token.accessor_id))
        self.unmark(GC_TOKEN, token.accessor_id)
        self.record(TOPIC_TOKEN, "ACLTokenDeleted", token.accessor_id, None)

    # -- end of entry ----------------------------------------------------
    def finish(self) -> None:
        """Derive job statuses touched by this entry; table index bumps happen in the caller.

        A job that only saw allocs or evals end keeps its status if it still
        has a live alloc: nothing became live in this entry, so it had one
        at the start too, and the status derived then ("running", or for
        system/periodic/parameterized jobs a function of ``stop``, which did
        not change) still holds. That skips the job read on most alloc
        completions.
        """
        dirty = self.dirty_jobs
        for job_id in sorted(dirty | self.ended_jobs):
            if job_id not in dirty and self._any("allocs_live_by_job", prefix(job_id)):
                continue
            self.set_job_status(job_id)
        dirty.clear()
        self.ended_jobs.clear()
