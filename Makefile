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
# SkyPilot's own YAML parser for the test of `launch skypilot` files: in a venv of its own, since skypilot pins
# click<8.2 and uvicorn<0.36, older than trainforge's (a failed install only makes that one test skip)
SKY_VENV  := .venv-skypilot
SKY_STAMP := $(SKY_VENV)/.installed
# nuscenes-devkit, the reference the 3D detection metrics are checked against: it pins numpy<2, older than
# trainforge's, so it too has a venv of its own (a failed install only makes that one test skip)
NUSC_VENV  := .venv-nuscenes
NUSC_STAMP := $(NUSC_VENV)/.installed

.PHONY: install demo test test-deps system-packages test-fast bench gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/trainforge train

$(SKY_STAMP):
	@$(PYTHON) -m venv $(SKY_VENV) && $(SKY_VENV)/bin/python -m pip install --quiet 'skypilot==0.14.1' && touch $@ \
	  || echo "note: SkyPilot could not be installed in $(SKY_VENV); the test of its YAML parser will skip" >&2

$(NUSC_STAMP):
	@$(PYTHON) -m venv $(NUSC_VENV) && $(NUSC_VENV)/bin/python -m pip install --quiet 'nuscenes-devkit==1.2.0' \
	  && touch $@ \
	  || echo "note: nuscenes-devkit could not be installed in $(NUSC_VENV); the test against it will skip" >&2

system-packages:
	scripts/test-system-packages.sh

# what the tests need, the installs side by side (pip into three venvs, apt): minutes of the suite's 30 on a new machine
test-deps:
	$(MAKE) --no-print-directory -j4 install $(SKY_STAMP) $(NUSC_STAMP) system-packages

test: test-deps
	WORKERS=$(WORKERS) PYTHON=$(BIN)/python scripts/run-tests.sh

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

bench: install
	$(BIN)/python benchmarks/loop_overhead.py

gpu-check: install
	$(BIN)/python benchmarks/gpu_check.py --budget-s 420 --save runs/gpu-check.json

clean:
	rm -rf $(VENV) $(SKY_VENV) $(NUSC_VENV) runs build *.egg-info src/*.egg-info
