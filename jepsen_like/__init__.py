"""jepsen_like: fault-injection runs against a real Caravan cluster, checked for anomalies.

Run one: ``python -m jepsen_like run --nodes 3 --time 60 --nemesis
kill,pause,partition --workload register,set --seed N --out DIR``; re-check a
recorded run: ``python -m jepsen_like check DIR``; several seeds: ``python -m
jepsen_like campaign`` (``make jepsen``). Exit codes: 0 valid, 1 anomaly,
2 inconclusive, 3 could not run.

The harness is only a client of the cluster: server processes are started
and signalled through ``node.devcluster`` and spoken to over ``node.wire.rpc_client``.

Modules:

* ``testbed`` -- the cluster of one run (configs, processes, a simulated
  client) and its raft address layout: every server known by one raft
  identity, where its harness proxy listens, and binding an address of its own;
* ``proxy`` -- those per-server TCP proxies, which cut pairs of servers
  (network partitions);
* ``nemesis`` -- kill, kill-all, pause, partition, snapshot-lag (a follower
  cut off until the others compacted past it, caught up by snapshot install;
  the runner then starts the servers with ``raft_compaction_entries = 300``),
  on one seeded schedule, optionally overlapping;
* ``member_fault`` -- the member nemesis: kill -9 and ``remove-peer`` a
  server, then re-add it wiped (``server join``) or join a new server in its
  place; never below quorum, one change at a time, never overlapped with
  another fault, but in the same runs as partition and snapshot-lag;
* ``health`` -- after each heal, every server that should run is up, or is
  reported at once with its cause, as a harness failure or an anomaly;
* ``workloads`` -- register (read/write/cas on a job's meta), set (unique
  registrations), lifecycle (jobs run, finish, are collected), journal
  (event.stream subscribers on every server); invoke/ok/fail/info rules;
* ``quota`` / ``quota_check`` -- queues with cohorts under faults: lanes
  register, stop and resize queued jobs while an observer samples every
  ledger (through the leader, and each server's own); the checker holds
  every sample to Kueue's quota rules and, after healing, finds no
  acknowledged workload lost and the same admitted set on every server;
* ``recorder`` / ``history`` -- JSONL histories and fault windows;
* ``linearizability`` / ``models`` -- the Porcupine-style checker;
* ``checkers`` -- linearizability, set, journal, gc-safety, convergence
  (digests and member lists), up-after-heal, server-logs verdicts;
* ``report`` -- summary.txt (product anomalies and harness failures apart),
  timeline.html, plot.png;
* ``runner`` -- the phases of a run and ``check_dir``.
"""
