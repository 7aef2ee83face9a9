# Entry points. Each target runs scripts/setup.sh first: it is idempotent and cached.
.PHONY: setup demo demo-down test lint unit

PY := .venv/bin/python

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

demo-down:
	@deploy/testhost/testhost down

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Fast tests only: no gateway, no systemd host.
unit: setup
	$(PY) -m pytest tests/unit -q

test: setup lint
	$(PY) -m pytest -q -ra --durations=15
