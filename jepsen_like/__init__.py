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
  client) and why per-link raft proxies need the address layout they have;
* ``proxy`` -- those per-link TCP proxies (network partitions);
* ``nemesis`` -- kill, kill-all, pause, partition, snapshot-lag (a follower
  cut off until the others compacted past it, caught up by snapshot install;
  the runner then starts the servers with ``raft_compaction_entries = 300``),
  on one seeded schedule, optionally overlapping;
* ``workloads`` -- register (read/write/cas on a job's meta), set (unique
  registrations), lifecycle (jobs run, finish, are collected), journal
  (event.stream subscribers on every server); invoke/ok/fail/info rules;
* ``recorder`` / ``history`` -- JSONL histories and fault windows;
* ``linearizability`` / ``models`` -- the Porcupine-style checker;
* ``checkers`` -- linearizability, set, journal, gc-safety, convergence,
  server-logs verdicts;
* ``report`` -- summary.txt, timeline.html, plot.png;
* ``runner`` -- the phases of a run and ``check_dir``.
"""
