# The npm package `sepp` (js/), included by the root Makefile. Needs only Rust and Node 20
# (20.19 or later, for require(esm)) with npm; everything else comes from `npm ci`.
#
#   make test-js   install, build the addon (debug) and the server, check the generated files,
#                  type-check the declarations (test/types.ts) and the TypeScript examples
#                  (examples/), then run the tests against the real server.
#
# The tests start target/debug/sepp (CARGO_TARGET_DIR respected) unless SEPP_TEST_SERVER_BIN is set.

JS_DIR := js
# Written by `napi build` from bindings/node; committed, so they must come out unchanged.
JS_GENERATED := $(JS_DIR)/index.js $(JS_DIR)/index.d.ts

CI_TARGETS += test-js

.PHONY: test-js js-node-version js-deps js-build js-check-generated js-typecheck

JS_NODE_CHECK := const [a, b] = process.versions.node.split(".").map(Number); \
	if (a < 20 || (a === 20 && b < 19)) { \
	console.error("js: Node " + process.versions.node + " is too old: use 20.19 or later"); \
	process.exit(1); }

js-node-version:
	@node -e '$(JS_NODE_CHECK)'

# The build tools must support the Node the README promises (20.19+): npm only warns
# (EBADENGINE) about a dependency that needs a newer Node, so a warning fails the target.
# js/package.json pins (`overrides`) the transitive ones whose latest releases need Node 22.
js-deps: js-node-version
	@out=$$(npm ci --prefix $(JS_DIR) --no-audit --no-fund 2>&1); rc=$$?; printf '%s\n' "$$out"; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	if grep -q EBADENGINE <<<"$$out"; then \
		echo "js: npm ci warned EBADENGINE on Node $$(node --version): a dependency does not support it;" \
			"pin one that does (npm view PKG@VERSION engines) in js/package.json"; exit 1; fi

# The debug addon (rewrites the generated loader and declarations) and the server binary.
js-build: js-deps
	npm run --prefix $(JS_DIR) build:debug
	cargo build --bin sepp

js-check-generated: js-build
	@if git ls-files --error-unmatch $(JS_GENERATED) >/dev/null 2>&1; then \
		git diff --exit-code -- $(JS_GENERATED) || { \
			echo "js: $(JS_GENERATED) differ from the committed ones: commit the regenerated files"; \
			exit 1; }; \
	else \
		echo "js: warning: $(JS_GENERATED) are not committed yet, so their freshness is not checked"; \
	fi

js-typecheck: js-build
	$(JS_DIR)/node_modules/.bin/tsc -p $(JS_DIR)/tsconfig.json --strict --noEmit
	$(JS_DIR)/node_modules/.bin/tsc -p $(JS_DIR)/examples/tsconfig.json --strict --noEmit

# Last, so that the output ends with node's test summary.
test-js: js-check-generated js-typecheck
	cd $(JS_DIR) && node --test test/
