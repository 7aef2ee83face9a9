"""Dashboard JSON as committed under json/ (the default config's build), plus the helpers
tests use to read it back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from monitoring.config import DEFAULT, Config
from monitoring.dashboards import decode, gateway, gpus, overview, pipeline

MODULES = (overview, pipeline, decode, gpus, gateway)


def render_dashboards(cfg: Config = DEFAULT) -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    out = {}
    for module in MODULES:
        board = json.loads(JSONEncoder().encode(module.build(cfg).build()))
        out[f"{module.UID}.json"] = json.dumps(board, indent=2, sort_keys=True) + "\n"
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
