# make demo   - create .venv, install, train the default recipe (digits, a CNN) on this machine
# make test   - install what the tests need, run the whole suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast bench clean

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
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

bench: install
	$(BIN)/python benchmarks/loop_overhead.py

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
