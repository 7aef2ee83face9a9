"""pdctl.sim command line: SGLang's flags and defaults, derived values, PDSIM_* knobs."""

from __future__ import annotations

import pytest

from pdctl.lint.flags import known_flags
from pdctl.sim.args import Knobs, build_parser, resolve

BASE = ["--model-path", "/models/x"]


def test_sglang_defaults() -> None:
    cfg = resolve(BASE, {})
    a = cfg.args
    assert (a.host, a.port, a.tp_size, a.dp_size) == ("127.0.0.1", 30000, 1, 1)
    assert a.disaggregation_mode == "null" and cfg.engine_type == "unified"
    assert a.disaggregation_bootstrap_port == 8998
    assert a.disaggregation_transfer_backend == "mooncake"
    assert a.decode_log_interval == 40
    assert a.kv_cache_dtype == "auto" and a.load_format == "auto" and a.log_level == "info"
    assert not a.enable_metrics
    assert cfg.served_model_name == "/models/x"
    assert cfg.page_size == 1
    # 96 GB GPU, tp < 4: chunked prefill 8192 and graphs up to 256 (memory_hook.py)
    assert cfg.chunked_prefill_size == 8192
    assert max(cfg.decode_buckets) == 256
    assert 2048 <= cfg.max_running_requests <= 4096


def test_seed_launch_line() -> None:
    cfg = resolve(
        [
            *BASE,
            "--served-model-name",
            "dsv4",
            "--tp-size",
            "4",
            "--disaggregation-mode",
            "decode",
            "--disaggregation-transfer-backend",
            "nixl",
            "--mem-fraction-static",
            "0.60",
            "--max-running-requests",
            "96",
            "--context-length",
            "8192",
            "--page-size",
            "64",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--cuda-graph-max-bs-decode",
            "32",
            "--enable-metrics",
        ],
        {},
    )
    assert cfg.engine_type == "decode" and cfg.uses_nixl and not cfg.degraded_enabled
    assert cfg.decode_buckets == [1, 2, 4, 8, 12, 16, 24, 32]
    assert cfg.max_running_requests == 96
    assert cfg.page_size == 64
    # (95.6 GiB * 0.60 - 36.5 GiB) / 16281 B per token
    assert 1_300_000 < cfg.kv_pool_tokens < 1_450_000


def test_explicit_bucket_list_wins_and_is_capped_by_max_running() -> None:
    cfg = resolve(
        [*BASE, "--cuda-graph-bs-decode", "16", "8", "64", "--cuda-graph-max-bs-decode", "128"], {}
    )
    assert cfg.decode_buckets == [8, 16, 64]
    cfg = resolve([*BASE, "--cuda-graph-bs-decode", "8", "64", "--max-running-requests", "40"], {})
    assert cfg.decode_buckets == [8, 40]
    # A default max bs follows --max-running-requests down.
    assert max(resolve([*BASE, "--max-running-requests", "50"], {}).decode_buckets) == 50


def test_unknown_flags_are_kept_for_the_warning() -> None:
    cfg = resolve([*BASE, "--enable-dp-attention", "--num-continuous-decode-steps", "4"], {})
    assert cfg.unknown == ["--enable-dp-attention", "--num-continuous-decode-steps", "4"]


def test_rejects_what_sglang_rejects() -> None:
    with pytest.raises(SystemExit):
        resolve([*BASE, "--disaggregation-mode", "both"], {})
    with pytest.raises(SystemExit):
        resolve(["--port", "1"], {})
    # 0.5.23 split the graph flags per phase; the old spelling is ambiguous.
    with pytest.raises(SystemExit):
        resolve([*BASE, "--cuda-graph-max-bs", "32"], {})
    with pytest.raises(SystemExit):  # --pp-size, --pp-max-micro-batch-size, ...
        resolve([*BASE, "--pp", "2"], {})


def test_knobs_from_env() -> None:
    k = Knobs.from_env(
        {
            "PDSIM_STEP_A_MS": "10",
            "PDSIM_STEP_B_MS": "2",
            "PDSIM_EAGER_OOM": "1",
            "PDSIM_TIME_SCALE": "0.1",
            "PDSIM_DEGRADED": "on",
            "PDSIM_DEGRADED_MODE": "hang",
            "PDSIM_DEGRADED_FAIL_RATIO": "0.25",
            "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1",
            "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "0",
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "7",
            "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "No",
            "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "4",
            "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "y",
        },
        random_seed=5,
    )
    assert (k.step_a_ms, k.step_b_ms, k.eager_oom, k.time_scale) == (10, 2, True, 0.1)
    assert (k.degraded, k.degraded_mode, k.degraded_fail_ratio) == ("on", "hang", 0.25)
    assert k.seed == 5
    # conn.py clamps the heartbeat: interval >= 2 s, failures >= 1
    assert (k.heartbeat_interval_s, k.heartbeat_max_failure) == (2.0, 1)
    assert k.waiting_timeout_s == 7 and k.bootstrap_timeout_s == 300
    # environ.py EnvBool spellings
    assert (k.deferred_kv_release, k.deferred_kv_release_timeout_s) == (False, 4)
    assert k.metrics_device_timer
    defaults = Knobs.from_env({})
    assert (defaults.step_a_ms, defaults.step_b_ms) == (18.0, 1.05)
    assert (defaults.deferred_kv_release, defaults.deferred_kv_release_timeout_s) == (True, 30)
    assert not defaults.metrics_device_timer


@pytest.mark.parametrize(
    "env",
    [
        {"PDSIM_TIME_SCALE": "0"},
        {"PDSIM_DEGRADED_FAIL_RATIO": "2"},
        {"PDSIM_DEGRADED_MODE": "explode"},
        {"PDSIM_DEGRADED": "auto"},
        {"PDSIM_KV_TRANSFER_SCALE": "0"},
        {"PDSIM_KV_TRANSFER_SCALE": "2"},
        {"PDSIM_STEP_A_MS": "fast"},
        {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "sometimes"},
    ],
)
def test_bad_knobs_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SystemExit):
        Knobs.from_env(env)


def test_the_modelled_degradation_is_off_unless_asked_for() -> None:
    """Real NIXL decides what a lone restart does (tests/unit/test_sim_nixl.py)."""
    nixl = [*BASE, "--disaggregation-transfer-backend", "nixl"]
    assert not resolve(nixl, {}).degraded_enabled
    assert not resolve(BASE, {}).degraded_enabled
    assert resolve(nixl, {"PDSIM_DEGRADED": "on"}).degraded_enabled


def test_optimistic_prefill_flags_resolve_as_sglang_does() -> None:
    prefill = [*BASE, "--disaggregation-mode", "prefill"]
    cfg = resolve(prefill, {})
    assert (cfg.optimistic_prefill_attempts, cfg.knobs.force_prefill_retry_prob) == (0, 0.0)
    assert cfg.args.disaggregation_decode_allocation_policy == "early"
    hook = {"SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB": "0.3"}
    cfg = resolve([*prefill, "--optimistic-prefill-attempts", "2"], hook)
    assert (cfg.optimistic_prefill_attempts, cfg.knobs.force_prefill_retry_prob) == (2, 0.3)
    # prefill_complete needs an optimistic attempt on the prefill (pd_disaggregation_hook.py).
    complete = ["--disaggregation-decode-allocation-policy", "prefill_complete"]
    assert resolve([*prefill, *complete], {}).optimistic_prefill_attempts == 1
    # No optimistic prefill with PP: a warning, and none (serving_hook.py).
    cfg = resolve([*prefill, "--optimistic-prefill-attempts", "2", "--pp-size", "2"], {})
    assert cfg.optimistic_prefill_attempts == 0
    assert cfg.warnings == ["Optimistic prefill does not support pp_size > 1"]


@pytest.mark.parametrize(
    ("extra", "unsupported"),
    [
        ((), "aggregated serving"),
        (("--disaggregation-mode", "prefill", "--tp-size", "2"), "attention tensor parallelism"),
        (
            ("--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"),
            "transfer backends other than Mooncake",
        ),
    ],
)
def test_prefill_complete_refuses_what_sglang_does_not_support(
    extra: tuple[str, ...], unsupported: str
) -> None:
    argv = [*BASE, "--disaggregation-decode-allocation-policy", "prefill_complete", *extra]
    with pytest.raises(SystemExit, match=f"prefill_complete does not yet support {unsupported}"):
        resolve(argv, {})


def test_every_flag_the_sim_takes_is_one_sglang_takes() -> None:
    """As the pinned SGLang's parser spells them (pdctl/data, from its own parser), or as an
    abbreviation it accepts (`--tp`: the prefix of one flag only)."""
    sglang = known_flags("0.5.23")
    assert sglang is not None
    ours = {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
    unknown = {o for o in ours - sglang - {"--help"} if sum(f.startswith(o) for f in sglang) != 1}
    assert not unknown


@pytest.mark.parametrize(
    ("mode", "given", "resolved"),
    [
        ("prefill", None, "follow_bootstrap_room"),
        ("decode", None, "round_robin"),
        ("null", None, "round_robin"),
        ("decode", "total_requests", "total_requests"),
    ],
)
def test_load_balance_method_resolves_per_role_as_sglang_does(
    mode: str, given: str | None, resolved: str
) -> None:
    """A real 0.5.17 pair's /server_info says follow_bootstrap_room on the prefill and
    round_robin on the decode (tests/fixtures/real/)."""
    flag = [] if given is None else ["--load-balance-method", given]
    cfg = resolve([*BASE, "--disaggregation-mode", mode, *flag], {})
    assert cfg.load_balance_method == resolved
