"""Build the monitoring pack (rules and dashboards) from one config.

    python -m monitoring.build                          # the committed default build
    python -m monitoring.build --check                  # CI: fail when it is stale
    python -m monitoring.build --config my.yml --out DIR  # your selectors, thresholds, runbook

DIR receives rules/pdstack.rules.yml and dashboards/*.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring.config import DEFAULT, Config, ConfigError, load_file
from monitoring.rules import RULES_FILE, render_rules

DASHBOARDS_DIR = Path(__file__).resolve().parent / "dashboards" / "json"


def artefacts(cfg: Config = DEFAULT, out: Path | None = None) -> dict[Path, str]:
    """Path -> text of every built file: under `out`, or where the default build is committed."""
    from monitoring.dashboards.export import render_dashboards

    rules = out / "rules" / RULES_FILE.name if out else RULES_FILE
    boards = out / "dashboards" if out else DASHBOARDS_DIR
    built = {rules: render_rules(cfg)}
    built.update({boards / name: text for name, text in render_dashboards(cfg).items()})
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monitoring.build",
        description="Build the pdstack monitoring pack (docs/monitoring.md).",
    )
    parser.add_argument(
        "--config", type=Path, help="YAML overriding monitoring/config.yml (needs --out)"
    )
    parser.add_argument("--out", type=Path, help="directory to write rules/ and dashboards/ to")
    parser.add_argument("--check", action="store_true", help="report stale files, write nothing")
    args = parser.parse_args(argv)
    if args.config and not args.out:
        parser.error("--config needs --out: the files in monitoring/ are the default build")
    try:
        cfg = load_file(args.config) if args.config else DEFAULT
    except ConfigError as e:
        parser.error(str(e))
    built = artefacts(cfg, args.out)
    stale = [path for path, text in built.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run python -m monitoring.build)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(built[path])
    print(f"wrote {len(stale)} changed file(s) of {len(built)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
