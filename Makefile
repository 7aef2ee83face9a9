# Entry points. Each target runs scripts/setup.sh first: it is idempotent and cached.
.PHONY: setup demo demo-down demo-fleet demo-fleet-down test lint unit

PY := .venv/bin/python

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

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Fast tests only: no gateway, no systemd host.
unit: setup
	$(PY) -m pytest tests/unit -q

test: setup lint
	$(PY) -m pytest -q -ra --durations=15
