# Every target that needs Python depends on the virtualenv, so a fresh machine
# with only Python 3.11 can run `make run` or `make test` directly.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DIR ?= .caravan/dev

.PHONY: install run test test-slow lint bench bench-fsm bench-raft bench-cluster bench-snapshot bench-gc bench-journal bench-lifecycle bench-http bench-placement bench-failover bench-queues clean jepsen jepsen-member jepsen-all

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=python3 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/caravan dev --dir $(DIR) --nodes 3

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=15 tests

# What `make test` leaves out for time: whole fault-harness and benchmark runs (minutes).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests

# Fault-injection campaign (minutes): one 60 s run per seed, cycling the
# nemeses, each checked for lost writes, non-linearizable reads and diverged
# replicas; exits non-zero if any run found an anomaly. Reports under
# JEPSEN_OUT (each run: summary.txt, timeline.html, plot.png, histories).
JEPSEN_OUT ?= .caravan/jepsen
JEPSEN_SEEDS ?= 1:12
JEPSEN_NEMESIS ?= kill,kill-all,pause,partition,snapshot-lag,clock,clients
JEPSEN_TIME ?= 60
JEPSEN_WORKLOAD ?= register,set,journal
# Further campaign options, e.g. JEPSEN_ARGS="--mixed --overlap --think 0": every
# fault in every run, sometimes two at once, clients back to back (a bigger state,
# so snapshot installs take several chunks).
JEPSEN_ARGS ?=
jepsen: $(STAMP)
	$(BIN)/python -m jepsen_like campaign --seeds $(JEPSEN_SEEDS) --rotate --nemesis $(JEPSEN_NEMESIS) \
		--time $(JEPSEN_TIME) --workload $(JEPSEN_WORKLOAD) $(JEPSEN_ARGS) --out $(JEPSEN_OUT)/$$(date +%Y%m%d-%H%M%S)

# The member nemesis at five servers (remove, wipe and re-add, replace), one
# seeded run per seed, the campaign's workloads checked. It also runs beside
# partition and snapshot-lag (every server keeps one raft address behind its
# harness proxy: jepsen_like/testbed.py), e.g. JEPSEN_ARGS='--nemesis partition,snapshot-lag,member'.
JEPSEN_MEMBER_SEEDS ?= 1:3
JEPSEN_MEMBER_NODES ?= 5
jepsen-member: $(STAMP)
	$(BIN)/python -m jepsen_like campaign --seeds $(JEPSEN_MEMBER_SEEDS) --nodes $(JEPSEN_MEMBER_NODES) --nemesis member \
		--time $(JEPSEN_TIME) --workload $(JEPSEN_WORKLOAD) $(JEPSEN_ARGS) --out $(JEPSEN_OUT)/member-$$(date +%Y%m%d-%H%M%S)

# The whole campaign at five servers (about an hour): every nemesis in every
# run, two faults sometimes held at once (their network cuts combine), clients
# back to back, 90 s per seed. Any anomaly fails it; harness failures show as
# UNKNOWN with their cause.
JEPSEN_ALL_SEEDS ?= 1:20
JEPSEN_ALL_NEMESIS ?= kill,kill-all,pause,partition,snapshot-lag,clock,client-kill,drain,member,clients
jepsen-all: $(STAMP)
	$(BIN)/python -m jepsen_like campaign --seeds $(JEPSEN_ALL_SEEDS) --mixed --overlap --think 0 --nodes 5 --time 90 \
		--nemesis $(JEPSEN_ALL_NEMESIS) --workload $(JEPSEN_WORKLOAD) $(JEPSEN_ARGS) --out $(JEPSEN_OUT)/all-$$(date +%Y%m%d-%H%M%S)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: bench-fsm bench-raft bench-cluster bench-snapshot bench-gc bench-journal bench-lifecycle bench-http bench-placement

bench-fsm: $(STAMP)
	$(BIN)/python -m tests.bench.fsm_bench

bench-raft: $(STAMP)
	$(BIN)/python -m tests.bench.raft_bench

bench-cluster: $(STAMP)
	$(BIN)/python -m tests.bench.cluster_bench

bench-snapshot: $(STAMP)
	$(BIN)/python -m tests.bench.snapshot_bench

bench-gc: $(STAMP)
	$(BIN)/python -m tests.bench.gc_bench

bench-journal: $(STAMP)
	$(BIN)/python -m tests.bench.journal_bench

bench-lifecycle: $(STAMP)
	$(BIN)/python -m tests.bench.lifecycle_bench

bench-http: $(STAMP)
	$(BIN)/python -m tests.bench.http_bench

# Placement at Protean's scale (issue 36), about ten minutes on 2 cores: packing
# density, latency/throughput at 1,000-30,000 simulated nodes, C1M at home.
# Parts and sizes by flags, e.g. PLACEMENT_ARGS="--only density --vms 2000".
PLACEMENT_ARGS ?=
bench-placement: $(STAMP)
	$(BIN)/python -m tests.bench.placement_bench $(PLACEMENT_ARGS)

# Failover and node loss at scale (issue 34), one run: a 3-server cluster restored with
# about 1M objects and 5,000 live simulated nodes; leader kill -9 -> first write (median),
# restarted follower -> first stale read, 2,000 nodes' client killed at once (alone and with
# a leader kill). Long and disk-hungry (~4 GB under TMPDIR), so not part of `bench`.
# Sizes by flags, e.g. FAILOVER_ARGS="--objects 50000 --nodes 500 --expire 200" (minutes).
FAILOVER_ARGS ?=
bench-failover: $(STAMP)
	$(BIN)/python -m tests.bench.failover_bench $(FAILOVER_ARGS)

# Kueue's baseline scheduler benchmark (issue 33), about five minutes on 2 cores: 5 cohorts
# of 6 queues, 15,000 workloads at Kueue's pace on 3 servers and simulated clients; wall
# time, minimum queue usage and time to admission per class beside Kueue's published means,
# with a no-queue run of the same jobs as the baseline. Not part of `bench`.
# Options by flags, e.g. QUEUES_ARGS="--scale 0.1 --no-baseline" (1,500 workloads, ~30 s).
QUEUES_ARGS ?=
bench-queues: $(STAMP)
	$(BIN)/python -m tests.bench.queues $(QUEUES_ARGS)

clean:
	rm -rf $(VENV) .caravan .pytest_cache .hypothesis
