"""Synthetic journals: decode with a known step-time law, graph buckets and eager overflow;
prefill with a known batch-time law, written with the simulator's own line emitter.

The tests check that `pdctl analyze journal` recovers what was planted here; the throughput
benchmark uses it to make a large journal quickly. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from pdctl.analyze.buckets import padded
from pdctl.sim.logs import PrefillStats, prefill_line

DECODE_LOG_INTERVAL = 40
EIGHTS_TO_96 = (1, 2, 4, *range(8, 97, 8))


@dataclass(frozen=True)
class SynthJournal:
    a_ms: float = 18.0
    b_ms: float = 1.05
    buckets: tuple[int, ...] = EIGHTS_TO_96
    eager_factor: float = 2.5  # an eager step costs this multiple of the unpadded law
    max_running: int = 96  # batch sizes are drawn from 1..max_running
    weights: Mapping[int, float] = field(default_factory=dict)  # batch size -> weight (else 1)
    noise: float = 0.02  # relative spread of each logged throughput
    prefill_every: int = 0  # a `Prefill batch` line after every N decode lines
    style: str = "current"  # current | old (`Decode batch.`, no graph flag) | short (journal)
    seed: int = 0
    # Speculative decoding: each line's accept len is drawn uniformly within accept_len +-
    # accept_spread, and a step yields that many tokens per request.
    accept_len: float | None = None
    accept_spread: float = 0.3
    draft_tokens: int = 4
    ranks: str = "TP0"  # the rank part of the prefix, e.g. "DP1 PP0 ATTN_CP0 MOE_DP1 TP0 EP2"
    host_receive: bool = False  # PD decode with a host-receive threshold < 1

    def step_ms(self, bs: int) -> tuple[float, bool]:
        """(step ms, ran in a graph) for a batch of bs."""
        if bs <= self.buckets[-1]:
            return self.a_ms + self.b_ms * padded(bs, list(self.buckets)), True
        return self.eager_factor * (self.a_ms + self.b_ms * bs), False


def _message(cfg: SynthJournal, bs: int, tps: float, graph: bool, accept: float | None) -> str:
    usage = f"#running-req: {bs}, #token: {bs * 400}, token usage: {bs * 400 / 500000:.2f}, "
    if cfg.style == "old":
        return f"Decode batch. {usage}gen throughput (token/s): {tps:.2f}, #queue-req: 0"
    if accept is not None:
        rate = (accept - 1) / (cfg.draft_tokens - 1)
        usage += f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
    host = "#host-receive-req: 0, " if cfg.host_receive else ""
    return (
        f"Decode batch, {usage}pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, "
        f"{host}#retracted-req: 0, cuda graph: {graph}, gen throughput (token/s): {tps:.2f}, "
        "#queue-req: 0"
    )


def _prefill_message() -> str:
    return (
        "Prefill batch, #new-seq: 1, #new-token: 256, #cached-token: 0, token usage: 0.01, "
        "#running-req: 0, #queue-req: 0, #pending-token: 0, #bootstrap-req: 0, "
        "#inflight-req: 0, #optimistic-req: 0, cuda graph: False, "
        "input throughput (token/s): 2048.00"
    )


def journal_lines(cfg: SynthJournal, n: int, start: datetime | None = None) -> Iterator[str]:
    """n decode lines (plus prefill lines if asked), newline-terminated."""
    rng = random.Random(cfg.seed)
    sizes = list(range(1, cfg.max_running + 1))
    weights = [cfg.weights.get(bs, 1.0) for bs in sizes]
    now = start or datetime(2026, 11, 29, 10, 0, 0)
    for i in range(n):
        bs = rng.choices(sizes, weights)[0]
        step, graph = cfg.step_ms(bs)
        accept = None
        if cfg.accept_len is not None:
            # rounded as logged, so the step planted is the step the line states
            accept = round(cfg.accept_len + rng.uniform(-1, 1) * cfg.accept_spread, 2)
        tps = 1000.0 * bs * (accept or 1.0) / step * (1.0 + rng.gauss(0.0, cfg.noise))
        now += timedelta(milliseconds=step * DECODE_LOG_INTERVAL)
        stamp = f"[{now:%Y-%m-%d %H:%M:%S} {cfg.ranks}] "
        if cfg.style == "short":
            stamp = f"{now:%b %d %H:%M:%S} gpu1 python3[4242]: " + stamp
        yield stamp + _message(cfg, bs, tps, graph, accept) + "\n"
        if cfg.prefill_every and (i + 1) % cfg.prefill_every == 0:
            yield stamp + _prefill_message() + "\n"


def write_journal(path: Path, cfg: SynthJournal, size_bytes: int, block_lines: int = 50_000) -> int:
    """Fill `path` to at least size_bytes by repeating one generated block; returns bytes."""
    block = "".join(journal_lines(cfg, block_lines)).encode()
    written = 0
    with path.open("wb") as f:
        while written < size_bytes:
            f.write(block)
            written += len(block)
    return written


@dataclass(frozen=True)
class SynthPrefill:
    """A PD prefill server: each batch takes a_ms + b_ms x new tokens; `busy` of the lines
    leave requests queued (the next batch follows at once), the others wait `idle_ms` first."""

    a_ms: float = 30.0
    b_ms: float = 0.05
    new_tokens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    busy: float = 0.5
    idle_ms: float = 400.0
    noise: float = 0.02
    seed: int = 0


def prefill_journal_lines(cfg: SynthPrefill, n: int) -> Iterator[str]:
    """n `Prefill batch` lines as sglang 0.5.23 logs them: each at its batch's scheduling,
    carrying the previous batch's new tokens over the time since the previous line."""
    rng = random.Random(cfg.seed)
    now = datetime(2026, 11, 29, 10, 0, 0)
    last_tokens = 0
    last_ms = 0.0  # the previous batch's forward time plus any idle wait after it
    for _ in range(n):
        tokens = rng.choice(cfg.new_tokens)
        queued = rng.random() < cfg.busy
        stats = PrefillStats(
            new_seq=max(1, tokens // 1024),
            new_token=tokens,
            cached_token=0,
            token_usage=0.01,
            running_req=0,
            queue_req=rng.randint(1, 8) if queued else 0,
            pending_token=0,
            cuda_graph=False,
            input_throughput=1000.0 * last_tokens / last_ms if last_ms else 0.0,
            bootstrap_req=0,
            inflight_req=0,
            optimistic_req=0,
        )
        yield f"[{now:%Y-%m-%d %H:%M:%S}] {prefill_line(stats)}\n"
        forward = (cfg.a_ms + cfg.b_ms * tokens) * (1.0 + rng.gauss(0.0, cfg.noise))
        last_tokens, last_ms = tokens, forward + (0.0 if queued else cfg.idle_ms)
        now += timedelta(milliseconds=last_ms)
