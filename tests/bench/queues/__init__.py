"""``make bench-queues``: Kueue's baseline scheduler benchmark, reproduced on Caravan (issue 33).

- ``plan``: Kueue's generator config (cohorts, queues, workload classes) and the jobs it makes;
- ``metrics``: the figures from the workloads' records, as Kueue's recorder and checker compute them;
- ``run``: one run on a fresh 3-server cluster with simulated clients, observed on ``event.stream``;
- ``report``: the table beside Kueue's published means;
- ``__main__``: the command line.
"""
