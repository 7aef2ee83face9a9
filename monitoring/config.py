"""The pack's one config (monitoring/config.yml): the selectors, thresholds, rule window, runbook
address and datasource that both the rules and the dashboards are built from. No Grafana
import: Ansible's filter plugin builds the rules through this module on the controller."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

DEFAULT_FILE = Path(__file__).resolve().parent / "config.yml"
_WINDOW = re.compile(r"^[0-9]+[smhdw]$")


class ConfigError(ValueError):
    """A config that cannot build a pack; the message is one line naming the key."""


@dataclass(frozen=True)
class Selectors:
    engines: str
    gateway: str
    exporter: str
    node: str
    etcd: str


SELECTORS = tuple(f.name for f in fields(Selectors))
# A Prometheus duration such as 5m: a rule's hold time (`for`) or a range.
Duration = str


@dataclass(frozen=True)
class Thresholds:
    """The alerts' thresholds and hold times; config.yml gives each its default and says what
    it means. Values are written into the rules as given, not coerced: a malformed one is
    promtool's to refuse (roles/pdstack_prometheus validates the built file before it goes
    live), and a default reads in the rules as config.yml writes it (0, not 0.0)."""

    ttft_p95_seconds: float
    itl_p95_seconds: float
    slo_for: Duration
    kv_usage_ratio: float
    kv_usage_for: Duration
    kv_leak_idle_ratio: float
    kv_leak_for: Duration
    pd_failures_per_5m: float
    pd_failures_for: Duration
    hang_window: Duration
    hang_for: Duration
    retract_for: Duration
    gateway_error_ratio: float
    gateway_errors_for: Duration
    shed_for: Duration
    down_for: Duration
    canary_for: Duration
    eager_for: Duration
    throttle_for: Duration
    xid_for: Duration
    etcd_quorum_for: Duration
    etcd_fsync_p99_seconds: float
    etcd_commit_p99_seconds: float
    etcd_disk_for: Duration
    etcd_quota_used_ratio: float
    etcd_quota_for: Duration


@dataclass(frozen=True)
class Config:
    selectors: Selectors
    rate_window: str
    runbook_url: str
    datasource: str
    thresholds: Thresholds

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"


def _defaults() -> dict[str, Any]:
    loaded = yaml.safe_load(DEFAULT_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    """`over` merged into `base` one level down; a key `base` lacks is a typo."""
    merged = dict(base)
    for key, value in over.items():
        if key not in base:
            raise ConfigError(f"unknown key {where}{key} (known: {', '.join(base)})")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key} must be a mapping, not {value!r}")
            merged[key] = _merge(base[key], value, f"{where}{key}.")
        else:
            merged[key] = value
    return merged


def load(overrides: dict[str, Any] | None = None) -> Config:
    """The default config with `overrides` (the same layout as config.yml) merged over it: the
    one place defaults and a deployment's overrides (a profile's thresholds, --config) meet."""
    data = _merge(_defaults(), overrides or {}, "")
    for name in SELECTORS:
        if not str(data["selectors"][name]).strip():
            raise ConfigError(f'selectors.{name} is empty: give a label matcher such as job="x"')
    if not _WINDOW.match(str(data["rate_window"])):
        raise ConfigError(f"rate_window must be a duration such as 5m, not {data['rate_window']!r}")
    if not re.match(r"^https?://", str(data["runbook_url"])):
        raise ConfigError(
            f"runbook_url must be an absolute http(s) address, not {data['runbook_url']!r}"
        )
    return Config(
        selectors=Selectors(**{k: str(v) for k, v in data["selectors"].items()}),
        rate_window=str(data["rate_window"]),
        runbook_url=str(data["runbook_url"]),
        datasource=str(data["datasource"] or ""),
        thresholds=Thresholds(**data["thresholds"]),
    )


def load_file(path: Path) -> Config:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read {path}: {' '.join(str(e).split())}") from e
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping like monitoring/config.yml")
    return load(loaded)


DEFAULT = load()
