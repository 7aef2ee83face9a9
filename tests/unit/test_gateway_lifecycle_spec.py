"""The gateway's worker lifecycle settings: profile router keys rendered on smg's line
(docs/gateway.md, "The gateway's worker lifecycle")."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from pdctl import render
from pdctl.errors import SpecError
from pdctl.spec import Deployment
from pdctl.spec.profile import Router
from pdctl.testing.stack import smg_binary

Load = Callable[..., Deployment]
Shipped = Callable[[str], dict[str, Any]]


def _flag_values(args: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(args, [*args[1:], ""], strict=True) if a.startswith("--")}


def test_each_lifecycle_key_reaches_the_gateway_line(load: Load, shipped: Shipped) -> None:
    profile = shipped("reference")
    chosen = {
        "health_failure_threshold": 4,
        "health_success_threshold": 1,
        "health_check_timeout_secs": 7,
        "cb_failure_threshold": 6,
        "cb_success_threshold": 2,
        "cb_timeout_duration_secs": 9,
        "cb_window_duration_secs": 33,
        "worker_startup_timeout_secs": 600,
    }
    profile["router"] |= chosen
    flags = _flag_values(render.router_args(load(profile)))
    for key, value in chosen.items():
        assert flags["--" + key.replace("_", "-")] == str(value), key
    assert "--no-remove-unhealthy-workers" in flags


@pytest.mark.parametrize("flag", ["--remove-unhealthy-workers", "--worker-auto-recovery"])
def test_removing_failed_workers_is_refused_in_extra_args(
    flag: str, load: Load, shipped: Shipped
) -> None:
    profile = shipped("reference")
    profile["router"]["extra_args"] = [flag]
    with pytest.raises(SpecError) as e:
        load(profile)
    assert e.value.key == "router"
    assert flag in e.value.message and "nothing adds it back" in e.value.message


def test_smg_knows_every_lifecycle_flag() -> None:
    """The flags pdstack renders are smg 1.13's (its argparse refuses unknown ones at start)."""
    binary = smg_binary()
    if binary is None:
        pytest.skip("smg is not installed; run scripts/setup.sh")
    helptext = subprocess.run(
        [binary, "launch", "--help"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    for flag in (a for a in render.lifecycle_args(Router()) if a.startswith("--")):
        assert flag in helptext, flag
