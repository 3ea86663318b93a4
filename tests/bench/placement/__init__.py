"""``make bench-placement``: placement at Protean's scale (issue 36), in three parts.

- ``density``: packing density of a synthetic AzurePackingTraceV1 trace replayed
  through the real Selector, BestFit quantized into 1, 3, 5 and unlimited buckets;
- ``latency``: per-placement latency and sustained placements/s on a real local
  cluster with 1,000 to 30,000 simulated nodes, Protean's request mix;
- ``c1m``: Nomad's C1M at home, 100,000 allocations on 5,000 simulated nodes.

The entry point and the flags are in ``tests/bench/placement_bench.py``.
"""
