"""Regenerate the committed monitoring artefacts; `--check` fails when they are stale (CI)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring.dashboards.export import render_dashboards
from monitoring.rules_source import RULES_FILE, render_rules


def artefacts() -> dict[Path, str]:
    return {RULES_FILE: render_rules(), **render_dashboards()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="report stale files, write nothing")
    args = parser.parse_args(argv)
    stale = [
        path for path, text in artefacts().items() if not path.exists() or path.read_text() != text
    ]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run python -m monitoring.build)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in artefacts().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(stale)} changed file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
