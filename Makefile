# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test lint lint-types bench venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[server,sim,test]'
	$(PY) -c 'import backends.handoff, backends.piper.winograd_kernels'  # compiles the numba kernels once (cached: backends/kernel_cache.py)
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/voxpool serve --parallel-jobs

# The suite's files run on up to four worker processes (one per core; a file stays on one
# worker, so its module fixtures start once): TEST_JOBS=0 runs them all in pytest's own process.
TEST_JOBS ?= $(shell $(PYTHON) -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) lint-types

lint-types: $(STAMP)
	$(VENV)/bin/mypy --strict core sim server backends

bench: $(STAMP)
	$(PY) bench/core.py
