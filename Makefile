# `make demo` and `make test` each set up .venv on a fresh machine (torch 2.13.0 first: on these machines pip
# takes a local CPU wheel for it, where an open range would pull GBs of CUDA packages).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# the optional Ray backend too, so that tests/execute/test_ray.py runs (not skipped) in CI
	$(BIN)/python -m pip install --quiet -e '.[dev,ray]'
	# Holistic Trace Analysis (tests load our traces in it); --no-deps skips its jupyterlab requirement
	$(BIN)/python -m pip install --quiet --no-deps holistictraceanalysis==0.5.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/commsched demo --out-dir demo_out

test: $(STAMP)
	# the HTML report is rendered in headless Chromium by the tests
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	# the shaped-network tests of commsched.runtime run ip netns / tc (iproute2)
	(command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf demo_out .pytest_cache
