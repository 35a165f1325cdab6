# The Python package `sepp` (python/, native module in bindings/python). Included by the root
# Makefile, so paths are relative to the repository root. Needs only cargo and python3 + pip:
# the virtual environment, the test tools and maturin (the build backend) come from PyPI.
#
#   make test-python    mypy --strict (package, examples, typing test) and stubtest, then pytest
#                       against the debug server
#
# The server binary comes from `cargo build --bin sepp` and is found in $CARGO_TARGET_DIR (or
# target/), unless SEPP_TEST_SERVER_BIN names another.

# Targets defined here must not become the default goal of the root Makefile.
python_mk_default_goal := $(.DEFAULT_GOAL)

PYTHON ?= python3
PY_VENV := .venv
PY_TOOLS := pytest==9.2.0 pytest-asyncio==1.5.0 mypy==2.4.1 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: test-python python-env python-install

$(PY_VENV)/bin/python:
	$(PYTHON) -m venv $(PY_VENV)

python-env: $(PY_VENV)/bin/python
	$(PY_VENV)/bin/pip install $(PIP_QUIET) $(PY_TOOLS)

# A debug build of the extension (seconds when incremental); maturin uses the cargo target dir.
python-install: python-env
	MATURIN_PEP517_ARGS="--profile dev" $(PY_VENV)/bin/pip install $(PIP_QUIET) ./python

# Type checks first (stubtest runs inside the venv so that its cache lands there), then pytest,
# so the output ends with pytest's summary line.
test-python: python-install
	cargo build --bin sepp
	MYPY_CACHE_DIR=$(PY_VENV)/.mypy_cache $(PY_VENV)/bin/mypy --strict python/src/sepp python/tests/typing_usage.py python/examples
	cd $(PY_VENV) && bin/python -m mypy.stubtest sepp._native
	cd python && ../$(PY_VENV)/bin/python -m pytest -p no:cacheprovider

CI_TARGETS += test-python

.DEFAULT_GOAL := $(python_mk_default_goal)
