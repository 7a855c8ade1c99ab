# make demo   - create .venv, install, train the default recipe (digits, a CNN) on this machine
# make test   - install what the tests need (as root also the system packages: scripts/test-system-packages.sh), run
#               the whole suite on every core (scripts/run-tests.sh); `make test WORKERS=1` runs it in one process
# make gpu-check - on a CUDA GPU: the planner, throughput, LoRA and int8 measured in under 8 minutes
#                  (runs/gpu-check.json; without a GPU it checks its own plumbing on the CPU and says so)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
WORKERS ?=

.PHONY: install demo test test-fast bench gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/trainforge train

test: install
	scripts/test-system-packages.sh
	WORKERS=$(WORKERS) PYTHON=$(BIN)/python scripts/run-tests.sh

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

bench: install
	$(BIN)/python benchmarks/loop_overhead.py

gpu-check: install
	$(BIN)/python benchmarks/gpu_check.py --budget-s 420 --save runs/gpu-check.json

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
