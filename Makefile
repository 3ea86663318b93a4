# Every target that needs Python depends on the virtualenv, so a fresh machine
# with only Python 3.11 can run `make run` or `make test` directly.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DIR ?= .caravan/dev

.PHONY: install run test lint bench bench-fsm clean

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
	$(BIN)/python -m pytest -q -m "not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: bench-fsm

bench-fsm: $(STAMP)
	$(BIN)/python -m tests.bench.fsm_bench

clean:
	rm -rf $(VENV) .caravan .pytest_cache .hypothesis
