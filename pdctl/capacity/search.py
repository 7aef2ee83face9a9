"""The search over layouts: for each decode bucket list, the fewest prefills and decodes that
meet the targets, a few larger layouts for headroom, the recommendation among them, and what
finer buckets would change.

A request's ITL is its decode's alone; its TTFT is the prefill's queue and batch, the
handoff, and the decode step under way when its KV lands. So the decode count is the smallest
meeting the ITL targets whose steps still let a request that finds its prefill idle meet the
TTFT targets, and the prefill count the smallest meeting the TTFT targets beside those
decodes (the busiest considered). The GPU budget then filters the combinations; a layout's
headroom grows the rate on both sides at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pdctl.analyze.buckets import COARSE_STEP, SMALL_GRAPHS, padded
from pdctl.capacity.laws import Laws
from pdctl.capacity.model import (
    DecodeLaw,
    DecodePrediction,
    StepInProgress,
    decode_cap,
    fine_buckets,
    predict_decode,
    sample_quantile,
)
from pdctl.capacity.prefill import (
    Arrivals,
    Handoff,
    Policy,
    PrefillPrediction,
    PrefillSide,
    predict_prefill,
)
from pdctl.capacity.workload import Workload
from pdctl.errors import PdctlError

# sglang 0.5.23's default --cuda-graph-bs-decode: 1, 2, 4, 8, 12, then every 8 up to 256.
SGLANG_DEFAULT_BS = sorted({*SMALL_GRAPHS, *range(COARSE_STEP, 257, COARSE_STEP)})
MAX_INSTANCES = 10_000
MAX_HEADROOM = 64.0  # rate multiples searched for headroom
EXTRA = (0, 1)  # instances added to the fewest, per role, for the options with headroom
IDLE_UTILISATION = 0.01  # prefills this idle that miss TTFT: more of them cannot help


class NoOption(PdctlError):
    """No layout meets the targets (under the budget): the message says which and by how
    much."""


@dataclass(frozen=True)
class Targets:
    ttft_ms: dict[float, float]  # quantile -> ms
    itl_ms: dict[float, float]

    @staticmethod
    def label(q: float) -> str:
        return f"p{q * 100:g}"


@dataclass(frozen=True)
class Shape:
    gpus_per_prefill: int = 4
    gpus_per_decode: int = 4
    gpu_budget: int | None = None


@dataclass(frozen=True)
class Engines:
    """What the engines run with besides the laws: the prefill's batch budget, the PD
    handoff and the gateway's policy (prefill.py), and the decode's KV pool."""

    chunk_tokens: int = 8192
    handoff: Handoff = field(default_factory=Handoff)
    policy: Policy = "round_robin"  # how the gateway deals requests out to the prefills
    kv_pool_tokens: int | None = None  # a decode's KV pool (max_total_num_tokens)
    kv_pool_source: str = ""

    def kv_cap(self, load: Workload) -> int | None:
        """The requests a decode's KV pool holds at their full length (input + output)."""
        if self.kv_pool_tokens is None:
            return None
        return int(self.kv_pool_tokens // math.ceil(load.mean_input + load.mean_output))


@dataclass(frozen=True)
class Buckets:
    sizes: list[int]
    basis: str  # given | chosen | default (sglang's) | per size (one graph each)
    cap: int  # max_running_requests: the most running requests within the ITL target
    kv_bound: bool = False  # the KV pool, not the ITL target, set the cap


@dataclass(frozen=True)
class Option:
    prefill_instances: int
    decode_instances: int
    buckets: Buckets
    prefill: PrefillPrediction
    decode: DecodePrediction
    gpus: int
    output_tok_s: float
    headroom: float  # the rate may grow by this share before a target is missed

    @property
    def tok_s_per_gpu(self) -> float:
        return self.output_tok_s / self.gpus

    def predicted(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"ttft_{Targets.label(q)}_ms": v for q, v in sorted(self.prefill.ttft_ms.items())
        }
        out |= {f"itl_{Targets.label(q)}_ms": v for q, v in sorted(self.decode.itl_ms.items())}
        return out | {"output_tok_s": self.output_tok_s, "gpus": self.gpus}

    def core(self) -> dict[str, Any]:
        """The recommendation's JSON, in the shape the issue names (scripts read it)."""
        return {
            "prefill_instances": self.prefill_instances,
            "decode_instances": self.decode_instances,
            "decode_max_running_requests": self.buckets.cap,
            "cuda_graph_bs_decode": self.buckets.sizes,
            "predicted": self.predicted(),
        }

    def as_dict(self) -> dict[str, Any]:
        return self.core() | {
            "buckets_basis": self.buckets.basis,
            "tok_s_per_gpu": self.tok_s_per_gpu,
            "headroom_pct": 100.0 * self.headroom,
            "prefill_utilisation": self.prefill.utilisation,
            "prefill_mean_batch": self.prefill.mean_batch,
            "decode_mean_running": self.decode.mean_running,
        }


@dataclass(frozen=True)
class BucketComparison:
    """What another bucket list would change: the cap per decode and the decodes needed."""

    label: str
    buckets: Buckets
    decode_instances: int


@dataclass
class Plan:
    options: list[Option]
    recommended: Option
    finer: BucketComparison | None
    warnings: list[str] = field(default_factory=list)


def _prefill_ok(
    side: PrefillSide,
    arrivals: Arrivals,
    rate: float,
    prefills: int,
    targets: Targets,
    decode: StepInProgress | None,
) -> PrefillPrediction | None:
    pred = predict_prefill(side, arrivals, rate, prefills, list(targets.ttft_ms), decode)
    if pred is None or any(pred.ttft_ms[q] > t for q, t in targets.ttft_ms.items()):
        return None
    return pred


def _decode_ok(
    law: DecodeLaw, buckets: Buckets, rate: float, mean_output: float, targets: Targets
) -> DecodePrediction | None:
    pred = predict_decode(law, buckets.sizes, buckets.cap, rate, mean_output, list(targets.itl_ms))
    if pred is None or not pred.within_cap:
        return None
    if any(pred.itl_ms[q] > t for q, t in targets.itl_ms.items()):
        return None
    return pred


def check_ttft_reachable(side: PrefillSide, load: Workload, targets: Targets) -> None:
    """A request alone (idle prefill and decode) must meet the TTFT targets."""
    alone = sorted(side.alone_ms(n) for n in load.inputs)
    for q, target in targets.ttft_ms.items():
        if (ms := sample_quantile(alone, q)) > target:
            raise NoOption(
                f"no option meets TTFT {Targets.label(q)} {target:g} ms: a prefill alone takes "
                f"{ms:.1f} ms for the {Targets.label(q)} input with the handoff, "
                f"{ms - target:.1f} ms over"
            )


def fewest_prefills(
    side: PrefillSide,
    arrivals: Arrivals,
    load: Workload,
    targets: Targets,
    decode: StepInProgress | None = None,
) -> int:
    """The fewest prefills meeting the TTFT targets, their first tokens waiting for
    `decode`'s step under way (check_ttft_reachable has passed). Prefills that are almost
    idle and still miss say so: more of them cannot help."""
    # busy prefills if every batch were full (the per-batch cost spread thin): a lower bound
    mean_in = sum(load.inputs) / len(load.inputs)
    per_request = side.law.b_ms * mean_in + side.law.a_ms * mean_in / max(side.chunk_tokens, 1)
    for n in range(max(1, math.ceil(load.rate * per_request / 1000.0)), MAX_INSTANCES + 1):
        pred = predict_prefill(side, arrivals, load.rate, n, list(targets.ttft_ms), decode)
        if pred is None:
            continue
        missed = [(q, t) for q, t in targets.ttft_ms.items() if pred.ttft_ms[q] > t]
        if not missed:
            return n
        if pred.utilisation < IDLE_UTILISATION:
            q, t = missed[0]
            raise NoOption(
                f"no option meets TTFT {Targets.label(q)} {t:g} ms: {n} prefills, each "
                f"{100 * pred.utilisation:.1f} % busy, still give {pred.ttft_ms[q]:.1f} ms "
                "(the prefill, the handoff and the decode step under way)"
            )
    raise NoOption(f"TTFT targets need more than {MAX_INSTANCES} prefills")


def fewest_decodes(law: DecodeLaw, buckets: Buckets, load: Workload, targets: Targets) -> int:
    if buckets.cap == 0:
        tightest = min(targets.itl_ms.values())
        q = min(q for q, t in targets.itl_ms.items() if t == tightest)
        one = law.step_ms(padded(1, buckets.sizes))
        raise NoOption(
            f"no option meets ITL {Targets.label(q)} {tightest:g} ms: one request alone steps in "
            f"{one:.1f} ms (batch 1 in the {padded(1, buckets.sizes)}-wide graph), "
            f"{one - tightest:.1f} ms over"
        )
    steps = load.mean_output / law.accept_len
    floor = load.rate * steps * law.step_ms(padded(1, buckets.sizes)) / 1000.0 / buckets.cap
    for n in range(max(1, math.ceil(floor)), MAX_INSTANCES + 1):
        if _decode_ok(law, buckets, load.rate / n, load.mean_output, targets) is not None:
            return n
    raise NoOption(f"ITL targets need more than {MAX_INSTANCES} decodes")


def _buckets(
    law: DecodeLaw, sizes: list[int], basis: str, itl_ms: float, kv_cap: int | None,
    graphs: Sequence[int] | None = None,
) -> Buckets:  # fmt: skip
    """max_running_requests is the ITL target's cap over `graphs` (default: the sizes), and
    at most what the KV pool holds."""
    cap = decode_cap(law, sizes if graphs is None else graphs, itl_ms)
    if kv_cap is not None and kv_cap < cap:
        return Buckets(sizes, basis, kv_cap, kv_bound=True)
    return Buckets(sizes, basis, cap)


def bucket_choices(
    law: DecodeLaw, given: Sequence[int] | None, itl_ms: float, kv_cap: int | None = None
) -> list[Buckets]:
    """The given list; else one the planner chooses (SGLang's default shape below the cap,
    and the cap itself) and SGLang's default for comparison, which SGLang itself clamps to
    max_running_requests (none above it, the cap added)."""
    if given:
        return [_buckets(law, sorted(set(given)), "given", itl_ms, kv_cap)]
    out = []
    for basis, graphs in (("chosen", fine_buckets(max(SGLANG_DEFAULT_BS))),
                          ("default", SGLANG_DEFAULT_BS)):  # fmt: skip
        top = _buckets(law, [], basis, itl_ms, kv_cap, graphs)
        sizes = sorted({b for b in SGLANG_DEFAULT_BS if b < top.cap} | {top.cap} - {0})
        out.append(replace(top, sizes=sizes))
    return out


def finer_than(law: DecodeLaw, buckets: Buckets, itl_ms: float, kv_cap: int | None) -> Buckets:
    """The same largest graph with one graph per batch size."""
    return _buckets(law, fine_buckets(max(buckets.sizes)), "per size", itl_ms, kv_cap)


def _growth(meets: Callable[[float], bool]) -> float:
    """How much the rate may grow (as a share) while `meets(rate factor)` holds."""
    lo, hi = 1.0, 2.0
    while meets(hi) and hi < MAX_HEADROOM:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
        if hi - lo < 1e-3:
            break
    return lo - 1.0


@dataclass(frozen=True)
class Layout:
    """What one layout's prediction needs besides its counts."""

    law: DecodeLaw
    buckets: Buckets
    side: PrefillSide
    arrivals: Arrivals
    load: Workload
    targets: Targets

    def decode(self, nd: int, factor: float = 1.0) -> DecodePrediction | None:
        rate = factor * self.load.rate / nd
        return _decode_ok(self.law, self.buckets, rate, self.load.mean_output, self.targets)

    def step(self, decode: DecodePrediction) -> StepInProgress:
        return StepInProgress.of(self.law, self.buckets.sizes, decode.mean_running)

    def prefill(
        self, np_: int, decode: DecodePrediction, factor: float = 1.0
    ) -> PrefillPrediction | None:
        rate = factor * self.load.rate
        return _prefill_ok(self.side, self.arrivals, rate, np_, self.targets, self.step(decode))

    def unqueued_ttft(self, decode: DecodePrediction) -> dict[float, float]:
        """TTFT quantiles of requests that find their prefill idle, beside `decode`'s steps
        under way: no prefill count goes below them."""
        lengths = self.arrivals.of(1)[1]
        waits = self.step(decode).waits_ms(self.arrivals.draws(1))
        ttft = sorted(self.side.alone_ms(n) + w for n, w in zip(lengths, waits, strict=True))
        return {q: sample_quantile(ttft, q) for q in self.targets.ttft_ms}

    def fewest_decodes(self) -> tuple[int, DecodePrediction]:
        """The fewest decodes meeting the ITL targets whose steps under way still let first
        tokens meet the TTFT targets (a busy decode delays every first token)."""
        for nd in range(fewest_decodes(self.law, self.buckets, self.load, self.targets),
                        MAX_INSTANCES + 1):  # fmt: skip
            dec = self.decode(nd)
            if dec is None:
                continue
            floor = self.unqueued_ttft(dec)
            if all(floor[q] <= t for q, t in self.targets.ttft_ms.items()):
                return nd, dec
        raise NoOption(f"TTFT targets need more than {MAX_INSTANCES} decodes")

    def growth(self, np_: int, nd: int) -> float:
        """Both sides at once: a busier decode also delays first tokens (its step under way)."""

        def meets(f: float) -> bool:
            dec = self.decode(nd, f)
            return dec is not None and self.prefill(np_, dec, f) is not None

        return _growth(meets)


def plan(
    laws: Laws,
    load: Workload,
    targets: Targets,
    shape: Shape,
    given_buckets: Sequence[int] | None = None,
    engines: Engines = Engines(),
) -> Plan:
    itl_ms = min(targets.itl_ms.values())
    side = PrefillSide(laws.prefill, engines.chunk_tokens, engines.handoff)
    arrivals = Arrivals(load.inputs, engines.policy)
    check_ttft_reachable(side, load, targets)
    options: list[Option] = []
    fewest: list[tuple[int, int, int]] = []  # (gpus, prefills, decodes) before the budget
    kv_cap = engines.kv_cap(load)
    if kv_cap == 0:
        raise NoOption(
            f"no option: a decode's KV pool ({engines.kv_pool_tokens} tokens, "
            f"{engines.kv_pool_source}) cannot hold one request of "
            f"{math.ceil(load.mean_input + load.mean_output)} tokens (input + output)"
        )
    choices = bucket_choices(laws.decode, given_buckets, itl_ms, kv_cap)
    for buckets in choices:
        layout = Layout(laws.decode, buckets, side, arrivals, load, targets)
        n_decode, fewest_decode = layout.fewest_decodes()
        # the prefills the fewest decodes need (their steps delay first tokens the most)
        n_prefill = fewest_prefills(side, arrivals, load, targets, layout.step(fewest_decode))
        for extra_p in EXTRA:
            for extra_d in EXTRA:
                np_, nd = n_prefill + extra_p, n_decode + extra_d
                gpus = np_ * shape.gpus_per_prefill + nd * shape.gpus_per_decode
                fewest.append((gpus, np_, nd))
                if shape.gpu_budget is not None and gpus > shape.gpu_budget:
                    continue
                dec = layout.decode(nd)
                pre = None if dec is None else layout.prefill(np_, dec)
                if pre is None or dec is None:  # a sampled queue need not shrink monotonically
                    continue
                out = load.rate * load.mean_output
                room = layout.growth(np_, nd)
                options.append(Option(np_, nd, buckets, pre, dec, gpus, out, room))
    if not options:
        gpus, np_, nd = min(fewest)
        raise NoOption(
            f"no option meets the targets within --gpu-budget {shape.gpu_budget}: the smallest "
            f"needs {gpus} GPUs ({np_} prefill x {shape.gpus_per_prefill} + {nd} decode x "
            f"{shape.gpus_per_decode}), {gpus - (shape.gpu_budget or 0)} over"
        )
    options.sort(key=lambda o: (o.gpus, -o.headroom))
    best = options[0]
    comparison = _comparison(laws, best, load, targets, itl_ms, choices, kv_cap)
    notes = flag_warnings(laws, shape, best)
    if best.buckets.kv_bound:
        notes.append(
            f"a decode's KV pool ({engines.kv_pool_tokens} tokens, {engines.kv_pool_source}) "
            f"holds {kv_cap} requests of {math.ceil(load.mean_input + load.mean_output)} tokens "
            "(input + output): that, not the ITL target, caps --max-running-requests"
        )
    return Plan(options, best, comparison, notes)


def flag_warnings(laws: Laws, shape: Shape, best: Option) -> list[str]:
    """Where the recommendation applies a law outside what it was measured under."""
    out = []
    sides = (
        ("decode", laws.decode_flags, laws.decode_source, shape.gpus_per_decode),
        ("prefill", laws.prefill_flags, laws.prefill_source, shape.gpus_per_prefill),
    )
    for role, flags, source, gpus in sides:
        tp = flags.get("tp_size")
        if isinstance(tp, int) and tp != gpus:
            out.append(
                f"the {role} law ({source}) was measured at tp_size={tp}, the layout gives a "
                f"{role} {gpus} GPUs: step times do not carry over between TP sizes"
            )
    measured = laws.decode_flags.get("cuda_graph_bs_decode")
    if isinstance(measured, list) and measured and max(measured) < best.buckets.cap:
        out.append(
            f"the decode law ({laws.decode_source}) was measured with graphs up to "
            f"{max(measured)}; batches up to {best.buckets.cap} extrapolate its line"
        )
    return out


def _comparison(
    laws: Laws, best: Option, load: Workload, targets: Targets, itl_ms: float,
    choices: list[Buckets], kv_cap: int | None,
) -> BucketComparison | None:  # fmt: skip
    """Given buckets against one graph per size; chosen ones against SGLang's default."""
    if best.buckets.basis == "given":
        other = finer_than(laws.decode, best.buckets, itl_ms, kv_cap)
    else:
        other = next(b for b in choices if b is not best.buckets and b.basis != "given")
    if other.cap == best.buckets.cap:
        return None
    try:
        n = fewest_decodes(laws.decode, other, load, targets)
    except NoOption:
        n = 0  # the other list cannot meet the ITL target at all
    return BucketComparison(other.basis, other, n)
