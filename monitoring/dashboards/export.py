"""Dashboard JSON as committed under json/, plus the helpers tests use to read it back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from monitoring.dashboards import decode, gateway, gpus, overview, pipeline

JSON_DIR = Path(__file__).resolve().parent / "json"
MODULES = (overview, pipeline, decode, gpus, gateway)


def render_dashboards() -> dict[Path, str]:
    out = {}
    for module in MODULES:
        board = json.loads(JSONEncoder().encode(module.build().build()))
        out[JSON_DIR / f"{module.UID}.json"] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    return out


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        if panel["type"] != "row":
            yield panel


def expressions(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
