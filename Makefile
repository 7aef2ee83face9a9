# Entry points. Each target runs scripts/setup.sh first: it is idempotent and cached.
.PHONY: setup demo demo-down demo-fleet demo-fleet-down test check lint lint-tools unit gpu-bundle durations

PY := .venv/bin/python
# Lanes of the whole suite: most e2e time is waiting on test hosts, so more workers than cores.
# Each module is one unit of work, the longest first by the last run's durations (tests/lanes.py).
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
SHELL_SCRIPTS := scripts/*.sh benchmarks/real_engine/run.sh .ci/run deploy/wheelhouse.sh deploy/testhost/testhost deploy/testhost/lib/*.sh roles/pdstack_etcd/files/pdstack-etcd-snapshot

# The GPU lane's bundle (docs/real-engine.md): SGLang 0.5.17, NIXL and smg from PyPI at the pins
# of benchmarks/real_engine/bundle.lock, trimmed into build/gpu-bundle/site.tar.xz (one call's
# carry to the lent GPU machine). Any Python 3 with pip; the GPU machine runs
# benchmarks/real_engine/run.sh.
gpu-bundle:
	python3 benchmarks/real_engine/bundle.py --out build/gpu-bundle

lint: setup
	@$(MAKE) --no-print-directory lint-tools

lint-tools:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	shellcheck -x $(SHELL_SCRIPTS)

# Fast tests only: no gateway, no systemd host. The longest module (ansible-lint) starts first
# (tests/lanes.py), so that it is not the last lane.
UNIT := $(PY) -m pytest tests/unit -q -n 2 --dist loadscope --no-loadscope-reorder
unit: setup
	$(UNIT)

# Runs its argument with lint (lint-tools: a few seconds with mypy's cache, a minute without)
# beside it, not before: either failing fails the target; lint's output (.lint.log) is shown
# when it failed.
define with_lint
	@$(MAKE) --no-print-directory lint-tools > .lint.log 2>&1 & lint=$$!; \
	$(1); tests=$$?; \
	if wait $$lint; then echo "make $@: lint passed (ruff, mypy, shellcheck)"; \
	else cat .lint.log; echo "make $@: lint failed (above)" >&2; tests=1; fi; \
	exit $$tests
endef

# The inner loop: lint, type checks and the unit tests, in about two minutes on 2 cores.
check: setup
	$(call with_lint,$(UNIT))

# Everything CI runs (.ci/run): lint beside the whole suite in lanes.
test: setup
	$(call with_lint,$(PY) -m pytest -q -ra --durations=0 --durations-min=15 $(LANES))

# The durations a fresh clone (CI) schedules its lanes by: the last run's lane log merged into
# tests/durations.json (commit it after a passing `make test`). Local runs schedule by their
# own record, .durations.json, which each passing run in lanes updates.
durations:
	$(PY) -m tests.lanes .lanes.jsonl tests/durations.json
