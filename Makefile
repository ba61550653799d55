# Everything runs in a project virtualenv (.venv) created from the machine's python3.
# The install is redone only when pyproject.toml changes (the stamp file tracks it).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: install demo test check lint format typecheck bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check agentrt tests examples benchmarks
	$(BIN)/ruff format --check agentrt tests examples benchmarks

format: $(STAMP)
	$(BIN)/ruff format agentrt tests examples benchmarks
	$(BIN)/ruff check --fix agentrt tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy agentrt examples

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_pipeline.py
	$(BIN)/python benchmarks/bench_decode.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
