"""The dashboard previews read as a person would want: monitoring.preview renders every
dashboard over a short planted window of the live stack (sim pair, real gateway, pd-exporter,
node exporter, Prometheus) and every panel is drawn, on a sound grid, with its unit on the
axis; the only empty panels are the ones below, for the reason given. The plant: steady load,
the decode restarted alone (the pair canary fails, every KV transfer fails, the gateway
answers 5xx and retries) and both engines restarted together (what `pdctl restart --both`
does), under load throughout."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from monitoring.preview import DashboardPreview, Prometheus, boards, render, report
from pdctl.testing.stack import constant_load
from tests.integration.live_prometheus import GPU_ONLY, GPU_PANELS, monitored_pair

pytestmark = pytest.mark.gateway

SCRAPE_S = 1.0  # render_prometheus_config scrapes every second
# Panels the plant leaves empty: (dashboard uid, panel title) -> why.
EXPECTED_EMPTY = {
    ("pdstack-gateway", "Stalled workers"): "smg writes smg_worker_stalled only when it vetoes "
    "a worker (a stall, not a failure: the plant has none)",
    **{("pdstack-gpus", title): GPU_ONLY for title in GPU_PANELS},
}
# Panels that count things or read 0/1 states: their axis has no unit to show.
UNITLESS = {"none", "short"}
A_UNIT = re.compile(r"[^\d.\- ]")


@pytest.fixture(scope="module")
def previews(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[DashboardPreview], Path]:
    root = tmp_path_factory.mktemp("preview")
    out = root / "img"
    with monitored_pair(root, {}) as pair, constant_load(pair.gateway.url, 2, 24):
        start = time.time()
        time.sleep(8)
        pair.restart_decode_alone()
        time.sleep(5)
        pair.restart_both()
        pair.prom.wait_scrapes(3)  # the healed pair is in the window's last samples
        end = time.time()
        prom = Prometheus(pair.prom.url)
        return [
            render(b, prom, start, end, SCRAPE_S, out / f"{b['uid']}.png") for b in boards()
        ], out


def test_every_panel_is_drawn_on_a_sound_grid(
    previews: tuple[list[DashboardPreview], Path],
) -> None:
    drawn, out = previews
    lines, ok = report(drawn)
    assert ok, "\n".join(lines)
    assert sorted(d.uid for d in drawn) == sorted(b["uid"] for b in boards())
    for d in drawn:
        png = out / f"{d.uid}.png"
        assert 0 < png.stat().st_size < 300_000, png
        (board,) = boards(d.uid)
        titles = [p["title"] for p in board["panels"] if p["type"] != "row"]
        assert [p.title for p in d.panels] == titles, d.uid


def test_only_the_explained_panels_are_empty(previews: tuple[list[DashboardPreview], Path]) -> None:
    drawn, _ = previews
    empty = {(d.uid, p.title) for d in drawn for p in d.panels if p.empty}
    assert empty == set(EXPECTED_EMPTY), (
        f"empty but the plant fills them: {sorted(empty - set(EXPECTED_EMPTY))}; "
        f"expected empty but drawn with data: {sorted(set(EXPECTED_EMPTY) - empty)}"
    )


def test_axes_show_the_panels_units(previews: tuple[list[DashboardPreview], Path]) -> None:
    drawn, _ = previews
    for d in drawn:
        for p in d.panels:
            if p.kind != "timeseries" or p.empty:
                continue
            assert p.y_ticks, (d.uid, p.title)
            if p.unit not in UNITLESS:
                assert all(A_UNIT.search(t) for t in p.y_ticks), (d.uid, p.title, p.y_ticks)


def test_the_plant_shows_where_an_on_call_engineer_looks(
    previews: tuple[list[DashboardPreview], Path],
) -> None:
    """The degraded pair is on the overview's canary and the pipeline's failure panels."""
    drawn, _ = previews
    by_title = {(d.uid, p.title): p for d in drawn for p in d.panels}
    canary = by_title[("pdstack-pipeline", "Pair canary failures")]
    assert max(v for s in canary.series for v in s.values) > 0
    transfers = by_title[("pdstack-pipeline", "KV transfer failures")]
    assert any(v > 0 for s in transfers.series if "decode" in s.name for v in s.values)
    up = by_title[("pdstack-overview", "Engines up")]
    assert sorted(s.name for s in up.series) == ["testhost/pd0-decode", "testhost/pd0-prefill"]
