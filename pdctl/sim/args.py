"""Command line (SGLang's) and sim knobs (PDSIM_* environment) of the simulated engine.

The parser accepts the `python -m sglang.launch_server` flags our renderer emits, with the
defaults of sglang 0.5.23 (`sglang/srt/server_args.py`, `arg_groups/`); unknown flags are
kept and reported once at startup. Values SGLang resolves after parsing (page size, graph
buckets, max running requests, chunked prefill size, served model name) are resolved in
`resolve()` with SGLang's rules, using the simulated GPU's memory.

Sim-only knobs, all optional (docs/sim.md has the full table): PDSIM_STARTUP_DELAY_S (2),
PDSIM_STEP_A_MS (18) and PDSIM_STEP_B_MS (1.05) for the decode step `a + b * padded_batch`,
PDSIM_EAGER_PENALTY (3), PDSIM_EAGER_OOM (0), PDSIM_PREFILL_MS_PER_TOKEN (0.05),
PDSIM_PREFILL_BASE_MS (5), PDSIM_GPU_MEM_GIB (95.6), PDSIM_WEIGHTS_GIB (36.5),
PDSIM_KV_BYTES_PER_TOKEN (16281), PDSIM_KV_POOL_TOKENS (derived from the previous three and
--mem-fraction-static), PDSIM_OUTPUT_TOKENS (128, tokens before EOS when no max is given),
PDSIM_SEED (--random-seed or 0), PDSIM_KV_TRANSFER_SCALE (1/64: the share of a request's KV
bytes the nixl backend really moves through NIXL), PDSIM_DEGRADED (off | on: the modelled
lone-restart failure NIXL over host memory cannot show, docs/sim.md),
PDSIM_DEGRADED_FAIL_RATIO (0.5), PDSIM_DEGRADED_MODE (fail | hang), PDSIM_TIME_SCALE (1.0
wall seconds per simulated second), PDSIM_DRAIN_CHECK_S (5: SIGTERM's drain checks the
requests left this often, as sigterm_watchdog does), PDSIM_SPEC_ACCEPT_LEN
(mean tokens per request per decode step with --speculative-algorithm; halfway between 1 and
the draft tokens) and PDSIM_PAIR_PARTNER (a decode's own prefills as bootstrap host:port,
comma-separated: its pair's one, its group's every one; unset = no cross-group accounting).

SGLang's own variables are read as SGLang reads them: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
(300), SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300), SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL
(5, at least 2), SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE (2, at least 1), and the test hook
SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB (0: a prefill server retries the first prefill
of a request whose rid hashes below it, scheduler_prefill.py), SGL_FORCE_SHUTDOWN (false: SIGTERM
ends the engine without waiting for its requests, tokenizer_manager.py sigterm_watchdog).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .mode import DisaggregationMode

GIB = 1024**3

# sglang/srt/arg_groups/memory_hook.py: GPU-memory tiers (MiB) -> (chunked prefill size,
# decode graph max bs for tp < 4, for tp >= 4).
_GPU_TIERS: tuple[tuple[int, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
)
_GPU_TOP_TIER = (16384, 512, 512)


def build_parser() -> argparse.ArgumentParser:
    # Abbreviations stay on, as in SGLang: `--cuda-graph-max-bs` is ambiguous there and here.
    p = argparse.ArgumentParser(
        prog="python -m pdctl.sim",
        description="GPU-free engine with sglang.launch_server's command line (see docs/sim.md)",
    )
    _add_server_and_parallelism(p)
    _add_speculative_and_disaggregation(p)
    _add_memory_graphs_and_logging(p)
    return p


def _add_server_and_parallelism(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--pp-size", dest="pp_size", type=int, default=1)
    # Accepted and unused; with them `--pp` is ambiguous here as in SGLang.
    p.add_argument("--pp-max-micro-batch-size", type=int, default=None)
    p.add_argument("--pp-async-batch-depth", type=int, default=None)
    # Only the log prefix (logs.rank_prefix) follows these three.
    p.add_argument(
        "--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1
    )
    p.add_argument(
        "--attn-cp-size", "--attention-context-parallel-size", dest="attn_cp_size", type=int,
        default=1,
    )  # fmt: skip
    p.add_argument(
        "--moe-dp-size", "--moe-data-parallel-size", dest="moe_dp_size", type=int, default=1
    )


def _add_speculative_and_disaggregation(p: argparse.ArgumentParser) -> None:
    # Speculative decoding: `accept len` tokens per request per step (PDSIM_SPEC_ACCEPT_LEN).
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument(
        "--load-balance-method",
        choices=["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"],
        default="auto",
    )
    p.add_argument(
        "--disaggregation-transfer-backend",
        choices=["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"],
        default="mooncake",
    )
    p.add_argument("--disaggregation-ib-device", default=None)
    p.add_argument("--disaggregation-decode-host-receive-threshold", type=float, default=1.0)
    p.add_argument(
        "--disaggregation-decode-allocation-policy",
        choices=["early", "prefill_complete"],
        default="early",
    )
    # Read for the role they belong to only (_role_flags); the sim keeps no host KV pool.
    p.add_argument("--disaggregation-decode-enable-offload-kvcache", action="store_true")
    p.add_argument(
        "--disaggregation-decode-retraction-backup",
        choices=["cpu_tensor", "host_pool", "none"],
        default=None,
    )
    p.add_argument("--enable-kv-cache-sharding", action="store_true")
    # Prefill passes allowed before the bootstrap completes; the sim prefills after it, so
    # this only decides whether a forced retry yields or falls back (scheduler_prefill.py).
    p.add_argument("--optimistic-prefill-attempts", type=int, default=0)
    # KV headroom a decode server keeps per active request (scheduler_decode.py: admission,
    # retraction).
    p.add_argument("--num-reserved-decode-tokens", type=int, default=512)


def _add_memory_graphs_and_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument(
        "--kv-cache-dtype",
        choices=[
            "auto",
            "fp8_e5m2",
            "fp8_e4m3",
            "mxfp8",
            "bf16",
            "bfloat16",
            "nvfp4",
            "fp4_mx_block16",
        ],
        default="auto",
    )
    p.add_argument("--cuda-graph-max-bs-decode", type=int, default=None)
    p.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    p.add_argument("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--log-level", default="info")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--random-seed", type=int, default=None)


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as e:
        raise SystemExit(f"{name}={raw!r} is not a number") from e


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """environ.py EnvBool: true/1/yes/y or false/0/no/n, any case."""
    raw = (env.get(name) or "").lower()
    if raw in ("true", "1", "yes", "y"):
        return True
    if raw in ("false", "0", "no", "n"):
        return False
    if raw:
        raise SystemExit(f"{name}={raw!r} is not a boolean")
    return default


def _env_choice(env: Mapping[str, str], name: str, default: str, choices: Sequence[str]) -> str:
    raw = env.get(name, default) or default
    if raw not in choices:
        raise SystemExit(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


@dataclass(frozen=True)
class Knobs:
    startup_delay_s: float = 2.0
    step_a_ms: float = 18.0
    step_b_ms: float = 1.05
    eager_penalty: float = 3.0
    eager_oom: bool = False
    prefill_ms_per_token: float = 0.05
    prefill_base_ms: float = 5.0
    gpu_mem_gib: float = 97887 / 1024
    weights_gib: float = 36.5
    kv_bytes_per_token: int = 16281
    kv_pool_tokens: int | None = None
    output_tokens: int = 128
    seed: int = 0
    kv_transfer_scale: float = 1 / 64
    degraded: str = "off"
    degraded_fail_ratio: float = 0.5
    degraded_mode: str = "fail"
    time_scale: float = 1.0
    drain_check_s: float = 5.0
    spec_accept_len: float | None = None  # with --speculative-algorithm; see resolve()
    pair_partners: frozenset[str] = frozenset()
    # SGLang's own variables
    force_prefill_retry_prob: float = 0.0
    force_shutdown: bool = False
    bootstrap_timeout_s: float = 300.0
    waiting_timeout_s: float = 300.0
    heartbeat_interval_s: float = 5.0
    heartbeat_max_failure: int = 2
    deferred_kv_release: bool = True
    deferred_kv_release_timeout_s: float = 30.0
    metrics_device_timer: bool = False

    @property
    def degraded_hangs(self) -> bool:
        """A degraded pair's rooms hang (PDSIM_DEGRADED_MODE=hang) rather than fail."""
        return self.degraded_mode == "hang"

    @classmethod
    def from_env(cls, env: Mapping[str, str], random_seed: int | None = None) -> Knobs:
        d = cls()
        pool = env.get("PDSIM_KV_POOL_TOKENS")
        scale = _env_float(env, "PDSIM_TIME_SCALE", d.time_scale)
        ratio = _env_float(env, "PDSIM_DEGRADED_FAIL_RATIO", d.degraded_fail_ratio)
        if scale <= 0:
            raise SystemExit("PDSIM_TIME_SCALE must be > 0")
        if not 0.0 <= ratio <= 1.0:
            raise SystemExit("PDSIM_DEGRADED_FAIL_RATIO must be within [0, 1]")
        kv_scale = _env_float(env, "PDSIM_KV_TRANSFER_SCALE", d.kv_transfer_scale)
        if not 0.0 < kv_scale <= 1.0:
            raise SystemExit("PDSIM_KV_TRANSFER_SCALE must be within (0, 1]")
        return cls(
            startup_delay_s=_env_float(env, "PDSIM_STARTUP_DELAY_S", d.startup_delay_s),
            step_a_ms=_env_float(env, "PDSIM_STEP_A_MS", d.step_a_ms),
            step_b_ms=_env_float(env, "PDSIM_STEP_B_MS", d.step_b_ms),
            eager_penalty=_env_float(env, "PDSIM_EAGER_PENALTY", d.eager_penalty),
            eager_oom=env.get("PDSIM_EAGER_OOM", "0") in ("1", "true", "yes", "on"),
            prefill_ms_per_token=_env_float(
                env, "PDSIM_PREFILL_MS_PER_TOKEN", d.prefill_ms_per_token
            ),
            prefill_base_ms=_env_float(env, "PDSIM_PREFILL_BASE_MS", d.prefill_base_ms),
            gpu_mem_gib=_env_float(env, "PDSIM_GPU_MEM_GIB", d.gpu_mem_gib),
            weights_gib=_env_float(env, "PDSIM_WEIGHTS_GIB", d.weights_gib),
            kv_bytes_per_token=int(
                _env_float(env, "PDSIM_KV_BYTES_PER_TOKEN", d.kv_bytes_per_token)
            ),
            kv_pool_tokens=int(pool) if pool else None,
            output_tokens=int(_env_float(env, "PDSIM_OUTPUT_TOKENS", d.output_tokens)),
            seed=int(_env_float(env, "PDSIM_SEED", random_seed or 0)),
            kv_transfer_scale=kv_scale,
            degraded=_env_choice(env, "PDSIM_DEGRADED", d.degraded, ("off", "on")),
            degraded_fail_ratio=ratio,
            degraded_mode=_env_choice(
                env, "PDSIM_DEGRADED_MODE", d.degraded_mode, ("fail", "hang")
            ),
            time_scale=scale,
            drain_check_s=_env_float(env, "PDSIM_DRAIN_CHECK_S", d.drain_check_s),
            spec_accept_len=(
                _env_float(env, "PDSIM_SPEC_ACCEPT_LEN", 0.0)
                if env.get("PDSIM_SPEC_ACCEPT_LEN")
                else None
            ),
            pair_partners=frozenset(
                a.strip() for a in env.get("PDSIM_PAIR_PARTNER", "").split(",") if a.strip()
            ),
            force_prefill_retry_prob=_env_float(
                env, "SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB", d.force_prefill_retry_prob
            ),
            # get_bool_env_var: "true" or "1", any case
            force_shutdown=env.get("SGL_FORCE_SHUTDOWN", "false").lower() in ("true", "1"),
            bootstrap_timeout_s=_env_float(
                env, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", d.bootstrap_timeout_s
            ),
            waiting_timeout_s=_env_float(
                env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", d.waiting_timeout_s
            ),
            deferred_kv_release=_env_bool(
                env, "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", d.deferred_kv_release
            ),
            deferred_kv_release_timeout_s=_env_float(
                env,
                "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
                d.deferred_kv_release_timeout_s,
            ),
            metrics_device_timer=_env_bool(
                env, "SGLANG_ENABLE_METRICS_DEVICE_TIMER", d.metrics_device_timer
            ),
            # conn.py clamps: interval >= 2 s, max failures >= 1.
            heartbeat_interval_s=max(
                _env_float(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", d.heartbeat_interval_s),
                2.0,
            ),
            heartbeat_max_failure=max(
                int(
                    _env_float(
                        env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", d.heartbeat_max_failure
                    )
                ),
                1,
            ),
        )


def default_decode_buckets(max_bs: int) -> list[int]:
    """sglang/srt/arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes
    (no speculative decoding, padding enabled)."""
    bs = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs:
        bs.append(max_bs)
    return bs


@dataclass(frozen=True)
class SimConfig:
    """Parsed flags with SGLang's post-parse resolution applied."""

    args: argparse.Namespace
    knobs: Knobs
    mode: DisaggregationMode
    unknown: list[str]
    served_model_name: str
    page_size: int
    context_length: int
    kv_pool_tokens: int
    max_running_requests: int
    chunked_prefill_size: int
    decode_buckets: list[int] = field(default_factory=list)
    # Speculative decoding: draft tokens per verify (None: off) and the mean accept length.
    spec_draft_tokens: int | None = None
    spec_accept_len: float = 1.0
    optimistic_prefill_attempts: int = 0
    warnings: list[str] = field(default_factory=list)  # SGLang's warnings while resolving
    load_balance_method: str = "round_robin"  # `auto` resolved (load_balance_method())

    @property
    def engine_type(self) -> str:
        return self.mode.engine_type

    @property
    def degraded_enabled(self) -> bool:
        return self.knobs.degraded == "on"

    @property
    def uses_nixl(self) -> bool:
        """KV moves through the real NIXL library (a PD engine on the nixl backend)."""
        return self.mode.is_pd and self.args.disaggregation_transfer_backend == "nixl"

    @property
    def kv_slot_bytes(self) -> int:
        """Bytes NIXL moves for a full-context request (one slot of the registered pool)."""
        return max(
            int(self.context_length * self.knobs.kv_bytes_per_token * self.knobs.kv_transfer_scale),
            1,
        )


def _gpu_tier(gpu_mem_mib: float, tp_size: int) -> tuple[int, int]:
    for limit, chunk, bs_small_tp, bs_large_tp in _GPU_TIERS:
        if gpu_mem_mib < limit:
            return chunk, bs_small_tp if tp_size < 4 else bs_large_tp
    return _GPU_TOP_TIER[0], _GPU_TOP_TIER[1] if tp_size < 4 else _GPU_TOP_TIER[2]


def load_balance_method(given: str, mode: DisaggregationMode) -> str:
    """`auto` as sglang arg_groups/serving_hook.py handle_load_balance_method resolves it:
    follow_bootstrap_room on a PD prefill, round_robin otherwise; /server_info reports it
    (and smg compares a prefill's with a decode's)."""
    if given != "auto":
        return given
    return "follow_bootstrap_room" if mode is DisaggregationMode.PREFILL else "round_robin"


def resolve(argv: Sequence[str], env: Mapping[str, str]) -> SimConfig:
    args, unknown = build_parser().parse_known_args(list(argv))
    knobs = Knobs.from_env(env, args.random_seed)
    mem_fraction = args.mem_fraction_static if args.mem_fraction_static is not None else 0.85
    if knobs.kv_pool_tokens is not None:
        pool = knobs.kv_pool_tokens
    else:
        free = knobs.gpu_mem_gib * mem_fraction - knobs.weights_gib
        pool = max(int(free * GIB / max(knobs.kv_bytes_per_token, 1)), 0)
    if pool <= 0:
        raise SystemExit(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
        )
    # The fake model's native context; --context-length caps it like SGLang does.
    context_length = args.context_length or 8192
    chunk_default, max_bs_default = _gpu_tier(knobs.gpu_mem_gib * 1024, args.tp_size)
    # pool_configurator.py: clamp(pool / context_len * 512, 2048, 4096)
    max_running = args.max_running_requests or max(
        min(int(pool / context_length * 512), 4096), 2048
    )
    if args.cuda_graph_bs_decode:
        buckets = sorted(set(args.cuda_graph_bs_decode))
    else:
        max_bs = args.cuda_graph_max_bs_decode
        if max_bs is None:
            max_bs = max_bs_default
            if args.max_running_requests is not None:
                max_bs = min(max_bs, args.max_running_requests)
        buckets = default_decode_buckets(max_bs)
    # base_cuda_graph_runner.get_batch_sizes_to_capture: clamp to the request pool.
    if max(buckets) > max_running:
        buckets = sorted({b for b in buckets if b <= max_running} | {max_running})
    draft_tokens, accept_len = _speculative(args, knobs)
    warnings: list[str] = []
    mode = DisaggregationMode(args.disaggregation_mode)
    _role_flags(args, mode)
    attempts = _optimistic_prefill_attempts(args, mode, warnings)
    return SimConfig(
        args=args,
        knobs=knobs,
        unknown=unknown,
        served_model_name=args.served_model_name or args.model_path,
        mode=mode,
        page_size=args.page_size or 1,
        context_length=context_length,
        kv_pool_tokens=pool,
        max_running_requests=max_running,
        chunked_prefill_size=args.chunked_prefill_size or chunk_default,
        decode_buckets=buckets,
        spec_draft_tokens=draft_tokens,
        spec_accept_len=accept_len,
        optimistic_prefill_attempts=attempts,
        warnings=warnings,
        load_balance_method=load_balance_method(args.load_balance_method, mode),
    )


def _role_flags(args: argparse.Namespace, mode: DisaggregationMode) -> None:
    """The start-up refusals of one role's flags on another: arg_groups/kv_cache_hook.py
    handle_cache_compatibility and kv_shard_hook.py (their messages, ValueError)."""
    refused = [
        (
            args.disaggregation_decode_retraction_backup == "host_pool"
            and mode is not DisaggregationMode.DECODE,
            "--disaggregation-decode-retraction-backup=host_pool is only supported on a PD "
            "decode server.",
        ),
        (
            args.disaggregation_decode_enable_offload_kvcache
            and mode is not DisaggregationMode.DECODE,
            "The argument disaggregation-decode-enable-offload-kvcache is only supported for "
            "decode side.",
        ),
        (
            args.enable_kv_cache_sharding and mode is not DisaggregationMode.PREFILL,
            "--enable-kv-cache-sharding is only supported on PD prefill workers: a rank's pool "
            "holds only its stripe of every cached page, which is incompatible with local decode.",
        ),
    ]
    for bad, message in refused:
        if bad:
            raise SystemExit(f"ValueError: {message}")


def _optimistic_prefill_attempts(
    args: argparse.Namespace, mode: DisaggregationMode, warnings: list[str]
) -> int:
    """pd_disaggregation_hook.py (prefill_complete: its unsupported setups, at least one
    attempt on a prefill) and serving_hook.handle_other_validations (none with PP), for the
    settings the sim has."""
    attempts = int(args.optimistic_prefill_attempts)
    if args.disaggregation_decode_allocation_policy == "prefill_complete":
        unsupported = [
            what
            for what, bad in (
                ("aggregated serving", not mode.is_pd),
                (  # mooncake_tcp is mooncake by then
                    "transfer backends other than Mooncake",
                    args.disaggregation_transfer_backend not in ("mooncake", "mooncake_tcp"),
                ),
                (
                    "pipeline or attention context parallelism",
                    args.pp_size != 1 or args.attn_cp_size != 1,
                ),
                # The sim has no DP attention, so the attention TP size is the TP size.
                ("attention tensor parallelism greater than one", args.tp_size != 1),
                ("decode host KV buffering", args.disaggregation_decode_host_receive_threshold < 1),
            )
            if bad
        ]
        if unsupported:
            raise SystemExit(
                "ValueError: --disaggregation-decode-allocation-policy prefill_complete does "
                "not yet support " + ", ".join(unsupported)
            )
        if mode is DisaggregationMode.PREFILL and attempts == 0:
            attempts = 1
    if attempts > 0 and mode is DisaggregationMode.PREFILL and args.pp_size > 1:
        warnings.append("Optimistic prefill does not support pp_size > 1")
        attempts = 0
    return attempts


def _speculative(args: argparse.Namespace, knobs: Knobs) -> tuple[int | None, float]:
    """(draft tokens per verify, mean accept length). SGLang's auto choice for most models is
    3 steps, top-k 1, 4 draft tokens (arg_groups/speculative_hook.py); a request gains 1 to
    `draft tokens` tokens per step, by default halfway."""
    if args.speculative_algorithm is None:
        if knobs.spec_accept_len is not None:
            raise SystemExit("PDSIM_SPEC_ACCEPT_LEN needs --speculative-algorithm")
        return None, 1.0
    steps = args.speculative_num_steps or 3
    draft = args.speculative_num_draft_tokens or steps + 1
    accept = knobs.spec_accept_len if knobs.spec_accept_len is not None else (1 + draft) / 2
    if not 1.0 <= accept <= draft:
        raise SystemExit(f"PDSIM_SPEC_ACCEPT_LEN={accept:g} must be within [1, {draft}]")
    return draft, accept
