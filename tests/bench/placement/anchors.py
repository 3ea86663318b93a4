"""The published figures each part is printed beside, and our targets (../shared/reference/protean-kueue.md)."""

from __future__ import annotations

# Protean (OSDI 2020): packing density by the number of BestFit buckets.
PROTEAN_DENSITY: dict[str, float] = {"1": 0.835, "3": 0.863, "5": 0.878, "unlimited": 0.891}

# Protean at a 30,000-server zone.
PROTEAN_LATENCY_AVG_MS = 20.0
PROTEAN_LATENCY_MISS_MS = (70.0, 80.0)
PROTEAN_RESCORED_HIT = 50
PROTEAN_RESCORED_MISS = 2000
PROTEAN_PEAK_RPS = 2000.0
PROTEAN_GIB_PER_10K = 1.0
PROTEAN_REPEAT_SHAPE = 0.80  # requests repeating the previous request's type
PROTEAN_SINGLE = 0.94  # requests asking for one VM

# Targets (issue 36), at 30,000 nodes on this 2-core machine.
TARGET_P50_MS = 20.0
TARGET_RPS = 2000.0

# Nomad: C1M (2016, 0.3.1: 1,000,000 containers, 5,000 hosts, 5 servers, < 5 min)
# and C2M (2020, 1.0: 2,000,000 containers, 6,100 hosts, 3 servers, 22 min 14 s).
NOMAD_C1M_RATE = 3750.0
NOMAD_C2M_RATE = 1500.0
TARGET_C1M_RATE = 3750.0
