# Entry points. Each target runs scripts/setup.sh first: it is idempotent and cached.
.PHONY: setup demo demo-down demo-fleet demo-fleet-down test check lint lint-tools unit

PY := .venv/bin/python
# Lanes of the whole suite: most e2e time is waiting on test hosts, so more workers than cores.
# Each module is one unit of work (tests/conftest.py); the e2e units start first.
TEST_WORKERS ?= 5
LANES := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

demo-down:
	@deploy/testhost/testhost down

demo-fleet: setup
	@bash scripts/demo-fleet.sh

demo-fleet-down:
	@deploy/testhost/testhost fleet-down --fleet pdfleet

# Every shell script (tests/unit/test_lint_coverage.py keeps this list whole); -x follows the
# files they source.
SHELL_SCRIPTS := scripts/*.sh .ci/run deploy/wheelhouse.sh deploy/testhost/testhost deploy/testhost/lib/*.sh roles/pdstack_etcd/files/pdstack-etcd-snapshot

lint: setup
	@$(MAKE) --no-print-directory lint-tools

lint-tools:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	shellcheck -x $(SHELL_SCRIPTS)

# Fast tests only: no gateway, no systemd host.
unit: setup
	$(PY) -m pytest tests/unit -q -n 2 --dist loadscope

# The inner loop: lint, type checks and the unit tests, in about three minutes on 2 cores.
check: lint unit

# Lint runs beside the suite, not before it: its minute of CPU overlaps the test hosts' boots.
# Either failing fails the target; lint's output (.lint.log) is shown when it failed.
test: setup
	@$(MAKE) --no-print-directory lint-tools > .lint.log 2>&1 & lint=$$!; \
	$(PY) -m pytest -q -ra --durations=0 --durations-min=15 $(LANES); tests=$$?; \
	if wait $$lint; then echo "make test: lint passed (ruff, mypy, shellcheck)"; \
	else cat .lint.log; echo "make test: lint failed (above)" >&2; tests=1; fi; \
	exit $$tests
