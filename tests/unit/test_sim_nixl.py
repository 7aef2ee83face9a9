"""The sim's nixl backend moves KV through the real NIXL library (nixl-cu12, UCX, host memory):
the bytes land in the decode's registered pool, the metrics come from the real WRITEs, peers
are kept by agent name as SGLang keeps them, and what a lone restart does is what NIXL and
SGLang's caching make of it (docs/sim.md "KV transfer")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdctl.render import environment
from pdctl.sim.args import SimConfig
from pdctl.sim.nixl_conn import TransferError
from pdctl.sim.procs import Tree
from pdctl.sim.server import SimServer
from pdctl.spec import Deployment
from pdctl.testing.stack import SimProc, free_port, in_process, pd_generate

pytest.importorskip("nixl_cu12", reason="nixl-cu12 is not installed; run scripts/setup.sh")

FAST = {
    "PDSIM_TIME_SCALE": "0.01",
    "PDSIM_STARTUP_DELAY_S": "0",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "200",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "200",
}
NIXL = ("--enable-metrics", "--disaggregation-transfer-backend", "nixl")
PROMPT = "kv through nixl " * 40


def family(text: str, name: str) -> dict[str, float]:
    """sample name -> value summed over labels."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@asynccontextmanager
async def prefill_at(port: int, env: Mapping[str, str] = FAST) -> AsyncIterator[SimServer]:
    async with in_process("prefill", env, *NIXL, bootstrap_port=port) as server:
        yield server


@asynccontextmanager
async def decode(env: Mapping[str, str] = FAST) -> AsyncIterator[SimServer]:
    async with in_process("decode", env, *NIXL) as server:
        yield server


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


async def request(
    http: aiohttp.ClientSession, prefill: HasUrl, dec: HasUrl, port: int, room: int
) -> tuple[int, str]:
    """One PD request to an engine pair (in-process or SimProc); the decode leg's answer."""
    _, answer = await pd_generate(http, prefill.url, dec.url, port, room, text=PROMPT)
    return answer


def run(coro: object, timeout: float = 90) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def test_kv_bytes_land_in_the_decode_pool_and_feed_the_transfer_metrics() -> None:
    async def go() -> None:
        port = free_port()
        async with prefill_at(port) as p, decode() as d, aiohttp.ClientSession() as http:
            assert p.nixl is not None and d.nixl is not None
            assert p.nixl.name != d.nixl.name
            room = 3
            off = d.nixl.slot_offset(room)
            untouched = bytes(d.nixl.pool[off : off + 16])
            p.nixl.pool[:] = 0xC3  # what the prefill's "KV" holds
            status, text = await request(http, p, d, port, room)
            assert status == 200, text
            # The decode registered itself once, under its agent name.
            assert list(p.nixl.peers) == [d.nixl.name]
            async with http.get(f"{p.url}/metrics") as resp:
                metrics = await resp.text()
            total = family(metrics, "sglang:kv_transfer_total_mb")
            latency = family(metrics, "sglang:kv_transfer_latency_ms")
            speed = family(metrics, "sglang:kv_transfer_speed_gb_s")
            assert total["sglang:kv_transfer_total_mb_count"] == 1
            moved = round(total["sglang:kv_transfer_total_mb_sum"] * 2**20)
            assert moved > 0
            assert latency["sglang:kv_transfer_latency_ms_sum"] > 0
            assert speed["sglang:kv_transfer_speed_gb_s_sum"] > 0
            landed = d.nixl.pool[off : off + moved]
            assert untouched == b"\x5a" * 16
            assert bytes(landed) == b"\xc3" * moved
            # Past the request's bytes the pool is as the decode left it.
            assert int(d.nixl.pool[off + moved]) == 0x5A
            # kv_bytes_per_token x tokens x PDSIM_KV_TRANSFER_SCALE (default 1/64)
            tokens = json.loads(text)["meta_info"]["prompt_tokens"]
            assert moved == int(tokens * p.cfg.knobs.kv_bytes_per_token / 64)

    run(go())


def test_a_lone_decode_restart_registers_a_new_agent_and_the_pair_keeps_working() -> None:
    """Observed with NIXL 1.5.1: the restarted decode is a new agent (fresh uuid) the prefill
    adds beside the old one; transfers to it work, and only a WRITE to the departed agent
    fails, with NIXL's NIXL_ERR_REMOTE_DISCONNECT."""

    async def go() -> None:
        port = free_port()
        async with prefill_at(port) as p, aiohttp.ClientSession() as http:
            assert p.nixl is not None
            async with decode() as d1:
                status, text = await request(http, p, d1, port, 1)
                assert status == 200, text
                assert d1.nixl is not None
                first = d1.nixl.name
            async with decode() as d2:
                assert d2.nixl is not None and d2.nixl.name != first
                for room in (2, 3):
                    status, text = await request(http, p, d2, port, room)
                    assert status == 200, text
                assert set(p.nixl.peers) == {first, d2.nixl.name}
            # A name already registered is ignored, as _add_remote_peer does.
            assert p.nixl.add_peer(p.nixl.peers[first]) is False

    run(go())


def test_a_write_to_a_decode_process_that_died_fails_with_nixls_text(tmp_path: Path) -> None:
    """The decode is a separate process killed with SIGKILL (its UCX endpoint really goes)."""

    async def go() -> None:
        port = free_port()
        dec = SimProc.create("decode", tmp_path, FAST, backend="nixl")
        async with prefill_at(port) as p, aiohttp.ClientSession() as http:
            assert p.nixl is not None
            dec.start()
            try:
                await asyncio.to_thread(dec.wait_healthy, 60)
                status, text = await request(http, p, dec, port, 5)
                assert status == 200, text
                (name,) = p.nixl.peers
                dec.kill()
            finally:
                dec.stop()
            with pytest.raises(TransferError, match="NIXL_ERR_REMOTE_DISCONNECT"):
                await p.nixl.write(name, 4096, 0, 6)

    run(go())


def test_a_quick_lone_prefill_restart_fails_rooms_until_the_decode_re_registers() -> None:
    """SGLang's decode registers its KV args once per bootstrap address and keeps that until
    its heartbeat drops the prefill. A prefill back within the heartbeat window has no entry
    for the decode's agent: its transfer worker fails every room ("KV transfer failed"), a
    failure both engines count."""
    slow_heartbeat = {**FAST, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "100000"}

    async def go() -> None:
        port = free_port()
        async with decode(slow_heartbeat) as d, aiohttp.ClientSession() as http:
            async with prefill_at(port) as p1:
                status, text = await request(http, p1, d, port, 1)
                assert status == 200, text
            async with prefill_at(port) as p2:
                assert p2.nixl is not None and p2.nixl.peers == {}
                status, text = await request(http, p2, d, port, 2)
                assert status == 500
                assert "KV transfer failed" in text
                for server in (p2, d):
                    async with http.get(f"{server.url}/metrics") as resp:
                        failed = family(await resp.text(), "sglang:num_transfer_failed_reqs")
                    assert failed["sglang:num_transfer_failed_reqs_total"] == 1

    run(go())


def test_a_prefill_restart_the_heartbeat_sees_heals_the_pair() -> None:
    """A prefill down for longer than the heartbeat allows (interval x max failures) is
    dropped by the decode, which registers again with the new prefill: no failures."""

    async def go() -> None:
        port = free_port()
        async with decode() as d, aiohttp.ClientSession() as http:
            async with prefill_at(port) as p1:
                status, text = await request(http, p1, d, port, 1)
                assert status == 200, text
            assert d.tm.decode_leg is not None
            deadline = asyncio.get_running_loop().time() + 20
            while d.tm.decode_leg.peers and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assert d.tm.decode_leg.peers == {}, "the heartbeat kept the stopped prefill"
            async with prefill_at(port) as p2:
                status, text = await request(http, p2, d, port, 2)
                assert status == 200, text
                assert p2.nixl is not None and d.nixl is not None
                assert list(p2.nixl.peers) == [d.nixl.name]

    run(go())


SIM = [sys.executable, "-m", "pdctl.sim", "--model-path", "/m", "--port", "0"]
PREFILL_NIXL = [
    *SIM,
    "--disaggregation-mode",
    "prefill",
    "--disaggregation-bootstrap-port",
    "0",
    "--disaggregation-transfer-backend",
    "nixl",
]


def start_up(env: Mapping[str, str], argv: list[str] = PREFILL_NIXL) -> tuple[int, str]:
    """Run an engine that must fail at start-up: exit code and its last stderr line."""
    proc = subprocess.run(
        argv,
        env={**os.environ, **FAST, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


@pytest.mark.parametrize(
    ("variable", "value"), [("UCX_NET_DEVICES", "bogus0"), ("UCX_TLS", "bogus")]
)
def test_a_ucx_variable_the_library_refuses_stops_the_engine_with_one_line(
    variable: str, value: str
) -> None:
    code, last = start_up({variable: value})
    assert code == 1
    assert last.startswith("Error: NIXL could not start its UCX backend (nixlBackendError")
    assert f"{variable}={value}" in last and last.endswith(variable)
    assert "Traceback" not in last


def test_nixl_missing_stops_the_engine_naming_the_package() -> None:
    argv = [
        sys.executable,
        "-c",
        "import sys; sys.modules['nixl_cu12'] = None; sys.argv[0] = 'pdctl.sim';"
        "from pdctl.sim.__main__ import main; main()",
        *PREFILL_NIXL[3:],
    ]
    code, last = start_up({}, argv)
    assert code == 1
    assert last.startswith("Error: --disaggregation-transfer-backend nixl needs the nixl-cu12")


@pytest.mark.parametrize("ucx", [{}, {"UCX_TLS": "tcp"}], ids=["ucx-defaults", "ucx-tcp"])
def test_the_sim_profile_env_moves_kv_over_loopback(
    tmp_path: Path,
    load: Callable[..., Deployment],
    shipped: Callable[[str], dict[str, Any]],
    ucx: dict[str, str],
) -> None:
    """The demo profile's rendered env files (no UCX variables; the test fleet adds
    UCX_TLS=tcp) bring NIXL up on a CPU-only host and a request's KV moves."""
    dep = load(shipped("sim"))
    pair = dep.groups()[0]
    prefill_inst, decode_inst = pair.instances
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "PDSIM_"))}
    procs = []
    try:
        for inst in (prefill_inst, decode_inst):
            env = {**base, **environment(inst, dep), **FAST, **ucx}
            env.pop("PDSIM_PAIR_PARTNER", None)
            sim = SimProc.create(inst.role.value, tmp_path, {}, backend="nixl")
            sim.env = env
            procs.append(sim.start())
        prefill, dec = procs
        for sim in procs:
            sim.wait_healthy(60)

        async def go() -> None:
            async with aiohttp.ClientSession() as http:
                status, text = await request(http, prefill, dec, prefill.bootstrap_port, 9)
                assert status == 200, text
                async with http.get(f"{prefill.url}/metrics") as resp:
                    total = family(await resp.text(), "sglang:kv_transfer_total_mb")
                assert total["sglang:kv_transfer_total_mb_count"] == 1

        run(go())
    finally:
        for sim in procs:
            sim.stop()


def test_harness_engines_keep_ucx_on_loopback_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test host's veth removed while a local engine starts must not stop it (CI: "No such
    device"): the harness limits UCX to lo; a test's own UCX_NET_DEVICES still wins."""
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    assert SimProc.create("prefill", tmp_path, {}).env["UCX_NET_DEVICES"] == "lo"
    told = SimProc.create("prefill", tmp_path, {"UCX_NET_DEVICES": "bogus0"})
    assert told.env["UCX_NET_DEVICES"] == "bogus0"


def test_the_sim_process_starts_ucx_without_memory_hooks_unless_its_env_file_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`python -m pdctl.sim` sets its process defaults before NIXL loads UCX (its start-up
    costs 0.3 CPU-s instead of 0.8); a value from the engine env file is kept."""
    from pdctl.sim import __main__ as entry

    seen: dict[str, str | None] = {}

    async def serve(cfg: SimConfig, tree: Tree) -> int:
        seen.update({k: os.environ.get(k) for k in ("UCX_MEM_EVENTS", "OPENBLAS_NUM_THREADS")})
        return 0

    monkeypatch.setattr(entry, "serve", serve)
    monkeypatch.setattr(entry, "launch", lambda tp_size, pp_size: Tree())  # no children here
    # A copy: main() sets the process's variables, which must not reach this worker's others.
    monkeypatch.setattr(os, "environ", {"OPENBLAS_NUM_THREADS": "4"})
    monkeypatch.setattr(sys, "argv", ["pdctl.sim", "--model-path", "/m"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 0
    assert seen == {"UCX_MEM_EVENTS": "no", "OPENBLAS_NUM_THREADS": "4"}
