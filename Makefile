# Set-up and entry points. `make test` and `make app` create .venv/ when missing and install into it.
# TORCH_REQUIREMENT overrides the torch install (e.g. a CUDA or ROCm build you already chose).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_REQUIREMENT ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp

.PHONY: setup test test-fast lint format app bench clean-venv browser notebooks

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_REQUIREMENT)"
	$(PY) -m pip install -e ".[app,notebooks,dev,datasets]"
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them: most
# tests compile, spawn ranks or wait on a browser with one core to spare. TEST_WORKERS=0 runs it in
# this process.
TEST_WORKERS ?= 2

test: setup lint browser
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# The edit-test loop: every test but those marked slow (multi-rank runs, notebooks, the browser test,
# corpus builds, compiled decodes); `make test` still runs them all.
test-fast: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow"

# Debian's Chromium for the browser end-to-end test (installed only when missing).
browser:
	sh .ci/ensure_chromium.sh

app: setup
	$(VENV)/bin/streamlit run apps/trajectories.py --server.address localhost

# JupyterLab on notebooks/ (each notebook finds the repository root itself, wherever it starts).
# NOTEBOOK_ARGS adds options, e.g. NOTEBOOK_ARGS="--no-browser --port 8890" (or --allow-root as root).
NOTEBOOK_ARGS ?=
notebooks: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(NOTEBOOK_ARGS)

bench: setup
	for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean-venv:
	rm -rf $(VENV)
