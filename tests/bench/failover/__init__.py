"""Failover and node loss at scale (issue 34): the parts of ``tests.bench.failover_bench``.

- ``state``: the ~1M-object state, built through the real FSM with the nodes the fleets own;
- ``fleetproc``: one simulated fleet process (registers and heartbeats a range of those nodes);
- ``cluster``: the three servers, the fleets and the clean-up on any exit;
- ``probes``: the steady writer and the journal watcher that time the storm;
- ``phases``: leader kills, the follower restart;
- ``storm``: the mass expiry, alone and with a leader kill in the middle;
- ``report``: the table of figure / ours / target / anchor, and the JSON summary.
"""
