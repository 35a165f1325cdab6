# The cross-language behaviour suite (tests/behaviour), included by the root Makefile: the
# scripted scenarios of scenarios.json through the Rust, Python and Node clients against one
# real server, whose records must be identical across the three.
#
#   make test-behaviour
#
# Needs the Python package installed in the test venv (python-install) and the Node addon built
# (js-build); both come from python/python.mk and js/js.mk.

.PHONY: test-behaviour

test-behaviour: python-install js-build
	cargo build --bin sepp
	SEPP_TEST_SERVER_BIN=$(abspath $(or $(CARGO_TARGET_DIR),target)/debug/sepp) \
	SEPP_TEST_BEHAVIOUR_PYTHON=$(CURDIR)/$(PY_VENV)/bin/python \
		cargo nextest run -p sepp-behaviour --no-fail-fast

CI_TARGETS += test-behaviour
