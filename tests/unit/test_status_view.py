"""pdctl.cli.status_view: the terminal view of a collected Status (80 columns, nothing
cut, the lock holder, an unreachable host)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from pdctl.coord.lock import Holder
from pdctl.ops.status import Status
from tests.unit.ops_fakes import (
    LONG_HOSTS,
    fleet_status,
)


def _render(s: Status, width: int) -> list[str]:
    import io

    from rich.console import Console

    from pdctl.cli.status_view import view

    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(view(s))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 200])
def test_status_view_fits_the_terminal_and_cuts_nothing(width: int) -> None:
    holder = Holder(
        4242, "pdctl restart --both --pair gpu-node-017.dc1.example.com/pd1", time.time() - 75
    )
    lines = _render(fleet_status(holder), width)
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines)
    assert "…" not in text and "..." not in text
    # hosts in order, each followed by its pairs, each pair by its two engines
    for host in LONG_HOSTS:
        assert host in lines
    a, b = lines.index(LONG_HOSTS[0]), lines.index(LONG_HOSTS[1])
    for block in (lines[a:b], lines[b : lines.index("gateways")]):
        heads = [
            line.split()[0]
            for line in block[1:]
            if line.startswith("  ") and not line.startswith("    ")
        ]
        assert heads == ["pd0", "pd1"]
        roles = [
            line.split()[0]
            for line in block
            if line.startswith("    ") and line.split()[0] in ("prefill", "decode")
        ]
        assert roles == ["prefill", "decode", "prefill", "decode"]
    assert "PID 1234567" in text and "1234.5 tok/s" in text and "KV 25%" in text
    assert "canary FAILED 2/3" in text and "[internal] KV transfer failed" in " ".join(text.split())
    assert "unreachable (ConnectionError: [Errno 111] refused)" in " ".join(text.split())
    assert f"drained: pdctl restart --both --pair {LONG_HOSTS[1]}/pd0" in text  # whole, one line
    assert "gateway not registered" in text
    assert "http://gateway.dc1.example.com:8000  ready  request ok 0.050s" in text
    assert "NOT HEALTHY  4 pairs on 2 hosts, 1 gateway" in text
    assert "restart lock:  held by PID 4242 for 1m15s" in text
    assert f"pdctl restart --both --pair {LONG_HOSTS[0]}/pd1" in text
    if width == 200:  # wide: one line per engine
        assert len([line for line in lines if line.startswith("    ")]) == 8


def test_status_view_says_the_lock_is_free_or_unreadable() -> None:
    assert "restart lock:  free" in _render(fleet_status(), 80)
    error = "cannot read the restart lock /run/x: Permission denied"
    text = " ".join(" ".join(_render(replace(fleet_status(), lock_error=error), 80)).split())
    assert f"restart lock: {error}" in text


def test_status_view_names_the_fleet_lock_holder() -> None:
    what = "pdctl restart --both --pair pdf1/pd0"
    live = Holder(4242, what, time.time() - 75, "pdf1", 5.0, 30.0)
    text = " ".join(" ".join(_render(fleet_status(live), 80)).split())
    assert f"restart lock: held by pdf1 PID 4242 for 1m15s {what}" in text


def test_status_view_says_an_unreachable_hosts_systemd_error_once() -> None:
    s = fleet_status()
    host = LONG_HOSTS[1]
    down = [
        replace(i, unit=None, unit_error=f"{host}: unreachable: `systemctl show {i.instance.unit}`")
        if i.instance.host == host
        else i
        for i in s.instances
    ]
    lines = _render(replace(s, instances=down), 80)
    text = " ".join(" ".join(lines).split())
    assert text.count(f"{host}: unreachable") == 1  # once under the host, not per engine
    assert (
        "systemd: " + f"{host}: unreachable: `systemctl show pdstack-pd0-prefill.service`" in text
    )
    assert "(and 3 more units)" in text
    assert sum("unit ?" in line for line in lines) == 4  # the engines of that host
    assert all(len(line) <= 80 for line in lines)


def test_status_view_and_json_show_a_paused_and_a_draining_engine() -> None:
    from pdctl.cli.status_view import to_json

    s = fleet_status()
    first, second = s.instances[0], s.instances[1]
    assert first.unit is not None
    paused = replace(first, probe=replace(first.probe, health="paused"))
    draining = replace(
        second,
        unit=replace(first.unit, active="deactivating", sub="stop-sigterm"),
        probe=replace(second.probe, health="HTTP 503"),
    )
    s = replace(s, instances=[paused, draining, *s.instances[2:]])
    text = "\n".join(_render(s, 200))
    assert "/ready paused" in text and "/ready draining" in text and "/ready ok" in text
    states = [i["state"] for i in to_json(s)["instances"]]
    assert states[:4] == ["paused", "draining", "ready", "not ready"]
    assert to_json(s)["instances"][0]["ready_path"] == "/ready"
