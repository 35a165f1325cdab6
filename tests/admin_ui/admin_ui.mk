# The admin web UI in headless Chromium (server/tests/admin_ui.rs + tests/admin_ui/browser.mjs).
# Needs Debian's chromium (.ci/run installs it when missing) and playwright-core (npm ci here).
CI_TARGETS += test-admin-ui
.PHONY: test-admin-ui

test-admin-ui:
	cd tests/admin_ui && npm ci --no-audit --no-fund
	cargo nextest run -p sepp-server --test admin_ui --run-ignored only
