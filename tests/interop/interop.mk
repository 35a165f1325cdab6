# Cross-implementation tests (tests/interop): our client against the public sepp server, and
# the public Python client against our server. Included by the root Makefile.
#
#   make test-interop
#
# Both public packages are installed from their registries on first use, into a cache outside
# the repository (INTEROP_CACHE), and reused afterwards: the public server with
# `cargo install sepp --version 0.1.1` (a few minutes to compile once), the public Python
# client `sepp-py` into a virtual environment of its own (it also imports as `sepp`).

INTEROP_CACHE ?= $(HOME)/.cache/sepp-interop
PUBLIC_SEPP_VERSION := 0.1.1
PUBLIC_SEPP_PY_VERSION := 0.1.0
PUBLIC_SEPP_BIN ?= $(INTEROP_CACHE)/public-sepp-$(PUBLIC_SEPP_VERSION)/bin/sepp
PUBLIC_SEPP_PY ?= $(INTEROP_CACHE)/sepp-py-$(PUBLIC_SEPP_PY_VERSION)/bin/python

.PHONY: test-interop

$(PUBLIC_SEPP_BIN):
	cargo install sepp --version $(PUBLIC_SEPP_VERSION) --locked \
		--root $(INTEROP_CACHE)/public-sepp-$(PUBLIC_SEPP_VERSION)

$(PUBLIC_SEPP_PY):
	python3 -m venv $(INTEROP_CACHE)/sepp-py-$(PUBLIC_SEPP_PY_VERSION)
	$(INTEROP_CACHE)/sepp-py-$(PUBLIC_SEPP_PY_VERSION)/bin/pip install --quiet \
		--disable-pip-version-check sepp-py==$(PUBLIC_SEPP_PY_VERSION)

test-interop: $(PUBLIC_SEPP_BIN) $(PUBLIC_SEPP_PY)
	cargo build --bin sepp
	PUBLIC_SEPP_BIN=$(PUBLIC_SEPP_BIN) PUBLIC_SEPP_PY=$(PUBLIC_SEPP_PY) \
		cargo nextest run -p sepp-interop --no-fail-fast

CI_TARGETS += test-interop
