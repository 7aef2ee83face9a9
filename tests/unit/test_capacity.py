"""pdctl capacity: the decode cap from the law and the buckets, the queueing arithmetic, the
instance counts, the layout snippet, and every bad input as one line."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from pdctl.analyze.report import analyze_stream
from pdctl.analyze.synth import (
    EIGHTS_TO_96,
    SynthJournal,
    SynthPrefill,
    journal_lines,
    prefill_journal_lines,
)
from pdctl.capacity.laws import Laws
from pdctl.capacity.model import (
    DecodeLaw,
    PrefillLaw,
    StepInProgress,
    decode_cap,
    fine_buckets,
    poisson_pmf,
    predict_decode,
    quantile,
    sample_quantile,
)
from pdctl.capacity.prefill import Arrivals, Handoff, PrefillSide, predict_prefill, replay
from pdctl.capacity.report import Site, layout_snippet
from pdctl.capacity.search import (
    Buckets,
    Engines,
    NoOption,
    Option,
    Shape,
    Targets,
    fewest_decodes,
    fewest_prefills,
    plan,
)
from pdctl.capacity.workload import Workload
from pdctl.cli import cli
from pdctl.errors import PdctlError
from pdctl.lint import lint
from pdctl.spec import Deployment

SEED_LAW = DecodeLaw(18.0, 1.05)  # the reference deployment's production decode law
PREFILL = PrefillLaw(30.0, 0.05)
EIGHTS = list(EIGHTS_TO_96)
P90 = Targets({0.9: 1000.0}, {0.9: 50.0})
SIDE = PrefillSide(PREFILL, 8192, Handoff())


def _laws() -> Laws:
    return Laws(SEED_LAW, PREFILL, Path("decode.json"), Path("prefill.json"))


def test_decode_cap_is_the_largest_bucket_whose_step_fits() -> None:
    # 18 + 1.05 x 24 = 43.2 ms fits 50, the 32-wide graph (51.6 ms) does not
    assert decode_cap(SEED_LAW, EIGHTS, 50.0) == 24
    # one graph per size: floor((50 - 18) / 1.05) = 30
    assert decode_cap(SEED_LAW, fine_buckets(96), 50.0) == 30
    assert decode_cap(SEED_LAW, EIGHTS, 200.0) == 96  # never above the largest graph
    assert decode_cap(SEED_LAW, EIGHTS, 18.5) == 0  # not even batch 1 (19.05 ms)


def test_decode_fixed_point_obeys_littles_law() -> None:
    pred = predict_decode(SEED_LAW, EIGHTS, 24, rate=1.0, mean_output=256, quantiles=[0.9])
    assert pred is not None
    # running = rate x output steps x mean step, the step taken at the running count's padding
    assert pred.mean_running == pytest.approx(1.0 * 256 * pred.mean_step_ms / 1000.0)
    q90 = quantile(poisson_pmf(pred.mean_running), 0.9) + 1  # what a generated token sees
    padded = next(b for b in EIGHTS if b >= q90)
    assert pred.itl_ms[0.9] == pytest.approx(SEED_LAW.step_ms(padded))


def test_decode_over_its_cap_is_infeasible() -> None:
    # 10 req/s x 256 tokens x >= 19 ms per step is > 48 running: above a cap of 24
    assert predict_decode(SEED_LAW, EIGHTS, 24, 10.0, 256, [0.9]) is None


def test_prefill_without_batching_is_pollaczek_khinchine() -> None:
    # prompts too long to share a batch: M/D/1 with S = 100 ms at 5 req/s, rho 0.5, mean
    # wait 5/1000 x 100² / (2 x 0.5) = 50 ms (the sampled queue within a few percent)
    side = PrefillSide(PrefillLaw(50.0, 0.05), 1000, Handoff())
    arrivals = Arrivals([1000], samples=40_000)
    pred = predict_prefill(side, arrivals, 5.0, 1, [0.9])
    assert pred is not None and pred.mean_batch == 1.0
    assert pred.utilisation == pytest.approx(0.5, rel=0.03)
    assert pred.mean_wait_ms == pytest.approx(50.0, rel=0.06)
    assert predict_prefill(side, arrivals, 9.6, 1, [0.9]) is None  # rho 0.96: past the limit


def test_batching_shares_the_base_cost_and_delays_the_first() -> None:
    law = PrefillLaw(5.0, 0.05)
    arrivals = Arrivals([4096])
    alone = PrefillSide(law, 4096, Handoff())  # one 4096-token prompt per batch
    paired = PrefillSide(law, 8192, Handoff())  # two fit
    one, two = (predict_prefill(s, arrivals, 3.0, 1, [0.5, 0.9]) for s in (alone, paired))
    assert one is not None and two is not None
    assert one.mean_batch == 1.0 and 1.0 < two.mean_batch <= 2.0
    assert two.utilisation < one.utilisation  # one 5 ms base per batch, not per request
    # a request batched with the one behind it waits for its 4096 tokens too: 414.6 ms, not 209.8
    assert two.ttft_ms[0.9] > one.ttft_ms[0.9]


def test_round_robin_waits_less_than_a_random_split() -> None:
    # every other arrival (Gamma(2) gaps) queues less than a Poisson half of the stream
    side = PrefillSide(PREFILL, 2048, Handoff())
    dealt = predict_prefill(side, Arrivals([2048], "round_robin"), 12.0, 2, [0.9])
    split = predict_prefill(side, Arrivals([2048], "random"), 12.0, 2, [0.9])
    assert dealt is not None and split is not None
    assert dealt.utilisation == pytest.approx(split.utilisation, rel=0.05)
    assert dealt.mean_wait_ms < 0.8 * split.mean_wait_ms


def test_replay_deals_a_given_arrival_sequence_round_robin() -> None:
    side = PrefillSide(PrefillLaw(5.0, 0.05), 8192, Handoff(2.0))
    # two at once, two a second later: dealt to two prefills, each request is alone
    assert replay(side, [0.0, 0.0, 1000.0, 1000.0], [100] * 4, 2) == [12.0] * 4
    # one prefill batches each pair: 5 + 0.05 x 200 ms for both, plus the handoff
    assert replay(side, [0.0, 0.0, 1000.0, 1000.0], [100] * 4, 1) == [17.0] * 4


def test_handoff_adds_its_fixed_part_and_the_transfer() -> None:
    # 16281 bytes per token at 20 GB/s: 0.814 us per token, 3.33 ms for 4096 tokens
    handoff = Handoff.of(10.0, 16281, 20.0)
    assert handoff.ms(4096) == pytest.approx(10.0 + 4096 * 16281 / 20e6)
    arrivals = Arrivals([4096])
    bare = predict_prefill(SIDE, arrivals, 1.0, 1, [0.9])
    full = predict_prefill(PrefillSide(PREFILL, 8192, handoff), arrivals, 1.0, 1, [0.9])
    assert bare is not None and full is not None
    assert full.ttft_ms[0.9] == pytest.approx(bare.ttft_ms[0.9] + handoff.ms(4096))


def test_the_step_under_way_is_nothing_at_idle_and_a_share_of_the_step_otherwise() -> None:
    idle = StepInProgress.of(SEED_LAW, EIGHTS, 0.0)
    assert idle.waits_ms([(0.99, 0.99)]) == [0.0] and idle.mean_ms == 0.0
    busy = StepInProgress.of(SEED_LAW, EIGHTS, 10.0)
    p_idle = poisson_pmf(10.0)[0]
    # below P(idle) the KV finds no step; above, v of the step at the running count drawn
    assert busy.waits_ms([(p_idle / 2, 0.5)]) == [0.0]
    n = quantile(poisson_pmf(10.0), 0.5)  # 10 running: the 16-wide graph
    assert busy.waits_ms([(0.5, 0.25)]) == [pytest.approx(0.25 * SEED_LAW.step_ms(16))]
    assert n == 10
    # the mean: half the step at the time-average running count
    pmf = poisson_pmf(10.0)
    steps = [0.0] + [SEED_LAW.step_ms(next(b for b in EIGHTS if b >= k)) for k in range(1, 97)]
    assert busy.mean_ms == pytest.approx(sum(p * s / 2 for p, s in zip(pmf, steps, strict=False)))


def test_a_first_token_waits_for_the_decode_step_under_way() -> None:
    """At a rate that never queues, TTFT is the prefill alone plus the wait, draw by draw."""
    arrivals = Arrivals([2048])
    busy = StepInProgress.of(SEED_LAW, EIGHTS, 20.0)
    bare = predict_prefill(SIDE, arrivals, 1e-6, 1, [0.5, 0.9])
    waited = predict_prefill(SIDE, arrivals, 1e-6, 1, [0.5, 0.9], busy)
    assert bare is not None and waited is not None
    waits = sorted(busy.waits_ms(arrivals.draws(1)))
    for q in (0.5, 0.9):
        want = bare.ttft_ms[q] + sample_quantile(waits, q)
        assert waited.ttft_ms[q] == pytest.approx(want, abs=0.01)  # arrival times of ~1e12 ms
    # twenty running in the 24-wide graph (43.2 ms): the median first token waits about half
    assert 15.0 < sample_quantile(waits, 0.5) < 28.0


def test_a_busy_decode_takes_more_decodes_when_first_tokens_cannot_wait_for_its_steps() -> None:
    load = Workload(4.0, [2048], [256], "fixed")
    itl_only = fewest_decodes(SEED_LAW, Buckets(EIGHTS, "given", 24), load, P90)
    # 132.4 ms alone leaves 7.6 ms for the step under way at p90: the decodes must idle
    tight = Targets({0.9: 140.0}, {0.9: 50.0})
    best = plan(_laws(), load, tight, Shape(4, 4), EIGHTS).recommended
    assert best.decode_instances > itl_only
    assert best.prefill.ttft_ms[0.9] <= 140.0
    loose = plan(_laws(), load, P90, Shape(4, 4), EIGHTS).recommended
    assert loose.decode_instances == itl_only


def test_prefills_that_idle_and_still_miss_ttft_say_so() -> None:
    load = Workload(1.0, [2048], [256], "fixed")
    busy = StepInProgress.of(SEED_LAW, EIGHTS, 20.0)  # 132.4 ms + the step under way
    with pytest.raises(NoOption, match=r"TTFT p90 140 ms: \d+ prefills, each 0\.\d % busy"):
        fewest_prefills(SIDE, Arrivals([2048]), load, Targets({0.9: 140.0}, {}), busy)


def test_instance_counts_are_the_fewest_that_meet_the_targets() -> None:
    load = Workload(20.0, [2048], [256], "fixed")
    result = plan(_laws(), load, P90, Shape(4, 4), EIGHTS)
    best = result.recommended
    arrivals = Arrivals([2048])  # 132.4 ms each alone: 20 req/s keep ~2.6 prefills busy
    fewer_p = predict_prefill(SIDE, arrivals, 20.0, best.prefill_instances - 1, [0.9])
    assert fewer_p is None or fewer_p.ttft_ms[0.9] > 1000.0
    assert best.prefill.ttft_ms[0.9] <= 1000.0
    fewer_d = predict_decode(SEED_LAW, EIGHTS, 24, 20.0 / (best.decode_instances - 1), 256, [0.9])
    assert fewer_d is None or not fewer_d.within_cap
    assert best.decode.within_cap and best.buckets.cap == 24
    assert best.gpus == 4 * (best.prefill_instances + best.decode_instances)
    assert best.output_tok_s == pytest.approx(20.0 * 256)
    assert all(o.gpus >= best.gpus for o in result.options)
    # finer buckets: 30 running per decode instead of 24, so fewer decodes for this rate
    assert result.finer is not None and result.finer.buckets.cap == 30
    assert result.finer.decode_instances < best.decode_instances


def test_headroom_is_the_rate_growth_a_layout_absorbs() -> None:
    load = Workload(4.0, [2048], [256], "fixed")
    best = plan(_laws(), load, P90, Shape(4, 4), EIGHTS).recommended
    grown = Workload(4.0 * (1 + best.headroom) * 1.01, [2048], [256], "fixed")
    with pytest.raises(NoOption):
        plan(_laws(), grown, P90, Shape(4, 4, gpu_budget=best.gpus), EIGHTS)
    assert best.headroom > 0


def test_planner_chooses_buckets_up_to_the_cap() -> None:
    result = plan(_laws(), Workload(4.0, [2048], [256], "fixed"), P90, Shape(4, 4))
    chosen = result.recommended.buckets
    assert chosen.basis == "chosen" and chosen.cap == 30 and chosen.sizes[-1] == 30
    assert result.finer is not None and result.finer.label == "default"
    assert result.finer.buckets.cap == 24


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (Targets({0.9: 100.0}, {0.9: 50.0}), "TTFT p90 100 ms: a prefill alone takes 132.4 ms"),
        (Targets({0.9: 1000.0}, {0.9: 18.5}), "ITL p90 18.5 ms: one request alone steps in 19.1"),
    ],
)
def test_unreachable_targets_say_which_and_by_how_much(targets: Targets, message: str) -> None:
    with pytest.raises(NoOption, match=message):
        plan(_laws(), Workload(1.0, [2048], [256], "fixed"), targets, Shape(4, 4), EIGHTS)


def test_budget_too_small_says_what_the_smallest_layout_needs() -> None:
    with pytest.raises(NoOption, match="within --gpu-budget 8: the smallest needs 16 GPUs"):
        plan(_laws(), Workload(4.0, [2048], [256], "fixed"), P90, Shape(4, 4, 8), EIGHTS)


def _option(np_: int, nd: int) -> Option:
    pre, dec = (
        predict_prefill(SIDE, Arrivals([1400]), 1.0, 1, [0.9]),
        predict_decode(SEED_LAW, EIGHTS, 24, 0.1, 64, [0.9]),
    )
    assert pre is not None and dec is not None
    return Option(np_, nd, Buckets(EIGHTS, "given", 24), pre, dec, 0, 0.0, 0.0)


def test_layout_is_pairs_for_equal_counts_and_a_group_otherwise() -> None:
    pairs = layout_snippet(_option(2, 2), Shape(4, 4), Site())
    assert pairs.splitlines() == [
        "layout:  # on 2 [pd_hosts] hosts",
        "  pairs:",
        "    - name: pd0",
        "      prefill: {numa_node: 0, gpus: [0, 1, 2, 3], port: 30000, bootstrap_port: 8998}",
        "      decode: {numa_node: 1, gpus: [4, 5, 6, 7], port: 30001}",
    ]
    group = layout_snippet(_option(2, 1), Shape(2, 4), Site())
    assert group.splitlines() == [
        "layout:  # on 1 [pd_hosts] host",
        "  groups:",
        "    - name: g0",
        "      prefill:",
        "        - {numa_node: 0, gpus: [0, 1], port: 30000, bootstrap_port: 8998}",
        "        - {numa_node: 0, gpus: [2, 3], port: 30001, bootstrap_port: 8999}",
        "      decode:",
        "        - {numa_node: 1, gpus: [4, 5, 6, 7], port: 30002}",
    ]
    # 2 prefills + 6 decodes of 2 GPUs tile two 8-GPU hosts as 1 + 3 each
    tiled = layout_snippet(_option(2, 6), Shape(2, 2), Site())
    assert tiled.splitlines()[0] == "layout:  # on 2 [pd_hosts] hosts"
    assert tiled.count("bootstrap_port") == 1 and tiled.count("port: 3000") == 4


def test_counts_that_need_a_group_across_hosts_get_the_closest_host_local_layout() -> None:
    # 1 prefill + 3 decodes of 4 GPUs: one host holds one of each, so each of 3 hosts does
    spread = layout_snippet(_option(1, 3), Shape(4, 4), Site())
    assert spread.splitlines()[:2] == [
        "# the layout runs 3 prefill + 3 decode on 3 hosts (24 GPUs) for the recommended 1 + 3 "
        "(16 GPUs): those counts need a group across hosts, which profiles do not support yet",
        "layout:  # on 3 [pd_hosts] hosts",
    ]
    assert "host:" not in spread
    too_big = layout_snippet(_option(1, 1), Shape(4, 8), Site())
    assert too_big == (
        "# a prefill (4 GPUs) and a decode (8 GPUs) do not fit one 8-GPU host: no host-local "
        "layout holds them, and profiles do not support groups across hosts yet"
    )


@pytest.mark.parametrize(
    ("counts", "shape", "hosts"),
    [((2, 2), Shape(4, 4), 2), ((2, 1), Shape(2, 4), 1), ((1, 3), Shape(4, 4), 3),
     ((2, 6), Shape(2, 2), 2), ((3, 5), Shape(1, 1), 1)],
)  # fmt: skip
def test_layout_snippets_pass_the_profile_validator(
    counts: tuple[int, int],
    shape: Shape,
    hosts: int,
    shipped: Callable[[str], dict[str, Any]],
    load: Callable[..., Deployment],
) -> None:
    profile = shipped("reference")
    site = Site(8, 30000, 8998, profile["hardware"]["numa_gpus"])
    snippet = layout_snippet(_option(*counts), shape, site)
    profile["layout"] = yaml.safe_load(snippet)["layout"]
    dep = load(profile, hosts=[f"gpu{i}" for i in range(hosts)])
    layout_rules = {"gpu-overlap", "gpu-out-of-range", "tp-mismatch", "numa-unknown-node",
                    "numa-mismatch", "port-collision"}  # fmt: skip
    assert [f for f in lint(dep) if f.id in layout_rules] == []
    assert len(dep.hosts) == hosts


def test_layout_snippet_binds_engines_to_the_profiles_numa_nodes(tmp_path: Path) -> None:
    """--profile's NUMA map, not the even split: here node 1 holds GPUs 0-3."""
    profile = yaml.safe_load((PROFILES / "reference.yml").read_text())
    profile["hardware"]["numa_gpus"] = {0: [4, 5, 6, 7], 1: [0, 1, 2, 3]}
    for pair in profile["layout"]["pairs"]:
        pair["prefill"]["numa_node"], pair["decode"]["numa_node"] = 1, 0
    path = tmp_path / "numa.yml"
    path.write_text(yaml.safe_dump(profile))
    laws = _law_pair(tmp_path, "tp_size=4")
    code, out, exc = _run(*laws, "--rate", "1", *FIXED, *TARGETS, "-p", str(path), "--format=json")
    assert code == 0, (out, exc)
    layout = yaml.safe_load(json.loads(out)["layout"])["layout"]
    (pair,) = layout["pairs"]
    assert (pair["prefill"]["gpus"], pair["prefill"]["numa_node"]) == ([0, 1, 2, 3], 1)
    assert (pair["decode"]["gpus"], pair["decode"]["numa_node"]) == ([4, 5, 6, 7], 0)


# ----- the command, from journals to JSON, and every bad input as one line ----------------


@pytest.fixture(scope="module")
def law_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("laws")
    flags = "[2026-11-29 09:00:00] server_args=ServerArgs(tp_size=4, context_length=8192)\n"
    decode = flags + "".join(journal_lines(SynthJournal(seed=5, noise=0.0), 20_000))
    prefill = flags + "".join(prefill_journal_lines(SynthPrefill(seed=5, noise=0.0), 600))
    paths = root / "decode.json", root / "prefill.json"
    for path, text in zip(paths, (decode, prefill), strict=True):
        path.write_text(json.dumps(analyze_stream(io.BytesIO(text.encode())).as_dict()))
    return paths


def _run(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli, ["capacity", *args])
    return result.exit_code, result.output, result.exception


TARGETS = ("--ttft-p90-ms", "1000", "--itl-p90-ms", "50")
FIXED = ("--input-len", "2048", "--output-len", "256")


def test_cli_json_has_the_recommendation_in_the_issues_shape(law_files: tuple[Path, Path]) -> None:
    code, out, exc = _run(*map(str, law_files), "--rate", "4", *FIXED, *TARGETS, "--format=json")
    assert code == 0, (out, exc)
    data = json.loads(out)
    rec = data["recommended"]
    assert set(rec) == {
        "prefill_instances",
        "decode_instances",
        "decode_max_running_requests",
        "cuda_graph_bs_decode",
        "predicted",
    }
    assert set(rec["predicted"]) == {"ttft_p90_ms", "itl_p90_ms", "output_tok_s", "gpus"}
    assert rec["decode_max_running_requests"] == 30 and rec["cuda_graph_bs_decode"][-1] == 30
    assert data["options"][0]["headroom_pct"] > 0 and "layout" in yaml.safe_load(data["layout"])
    assert data["finer_buckets"]["decode_max_running_requests"] == 24


def test_cli_table_lists_options_buckets_and_layout(law_files: tuple[Path, Path]) -> None:
    eights = ",".join(map(str, EIGHTS))
    args = ("--rate", "4", *FIXED, *TARGETS, "--cuda-graph-bs", eights, "--gpus-per-decode", "2")
    code, out, _ = _run(*map(str, law_files), *args)
    assert code == 0, out
    out = " ".join(out.split())  # the console wraps at 80 columns
    assert "Recommended (★)" in out and "--max-running-requests 24" in out
    assert "per size buckets would allow 30" in out
    assert "measured at tp_size=4, the layout gives a decode 2 GPUs" in out
    assert "layout:" in out


def test_cli_lengths_from_a_bench_result(law_files: tuple[Path, Path], tmp_path: Path) -> None:
    bench = tmp_path / "bench.jsonl"
    row = {"max_concurrency": 16, "completed": 10, "random_input_len": 2048,
           "random_output_len": 256, "random_range_ratio": 0.5}  # fmt: skip
    bench.write_text(json.dumps(row) + "\n")
    code, out, exc = _run(*map(str, law_files), "--rate", "4", "--lengths-from", str(bench),
                          *TARGETS, "--format=json")  # fmt: skip
    assert code == 0, (out, exc)
    workload = json.loads(out)["workload"]
    assert workload["mean_input"] == pytest.approx(1536, rel=0.01)
    assert workload["mean_output"] == pytest.approx(192, rel=0.01)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rate", "0", *FIXED), "--rate must be above 0 requests/s, got 0"),
        (("--rate", "-2", *FIXED), "--rate must be above 0 requests/s, got -2"),
        (
            ("--rate", "1", "--input-len", "8000", "--output-len", "512"),
            "input 8000 + output 512 tokens = 8512 is above the context length 8192 (",
        ),
        (("--rate", "1", "--input-len", "10"), "give --input-len and --output-len"),
        (("--rate", "1", *FIXED, "--gpu-budget", "4"), "no option meets the targets within"),
    ],
)
def test_cli_bad_workloads(
    law_files: tuple[Path, Path], args: tuple[str, ...], message: str
) -> None:
    code, _, exc = _run(*map(str, law_files), *args, *TARGETS)
    assert code != 0 and isinstance(exc, PdctlError)
    assert message in str(exc) and "\n" not in str(exc)


def test_cli_bad_law_files(law_files: tuple[Path, Path], tmp_path: Path) -> None:
    decode, prefill = map(str, law_files)
    not_json = tmp_path / "bench.jsonl"
    not_json.write_text('{"max_concurrency": 1}\n')
    few = tmp_path / "few.json"
    three = "".join(journal_lines(SynthJournal(max_running=2, seed=1), 200))
    few.write_text(json.dumps(analyze_stream(io.BytesIO(three.encode())).as_dict()))
    cases = [
        ((str(not_json), prefill), "bench.jsonl: not `pdctl analyze journal --format json` output"),
        ((decode,), "no prefill law in the files given: "),
        ((prefill,), "no decode law in the files given: "),
        ((decode, decode, prefill), "both hold a decode law"),
        (
            (str(few), prefill),
            "few.json: the decode law was fitted at 2 batch sizes; capacity needs at least 3",
        ),
        ((str(tmp_path / "missing.json"), prefill), "missing.json: No such file"),
    ]
    for files, message in cases:
        code, _, exc = _run(*files, "--rate", "1", *FIXED, *TARGETS)
        assert code != 0 and isinstance(exc, PdctlError), files
        assert message in str(exc) and "\n" not in str(exc), (message, str(exc))


def test_buckets_type_is_what_the_cli_reports() -> None:
    """A given list is kept whole (its graphs are the operator's), its cap from the law."""
    result = plan(_laws(), Workload(1.0, [256], [64], "fixed"), P90, Shape(4, 4), EIGHTS)
    assert result.recommended.buckets == Buckets(EIGHTS, "given", 24)


# ----- the KV pool's cap and the PD handoff ----------------------------------------------------


def test_kv_pool_caps_max_running_below_the_itl_target() -> None:
    load = Workload(4.0, [2048], [256], "fixed")  # 2304 tokens a request at full length
    engines = Engines(kv_pool_tokens=20 * 2304 + 100, kv_pool_source="--kv-pool-tokens")
    result = plan(_laws(), load, P90, Shape(4, 4), None, engines)
    best = result.recommended.buckets
    assert best.cap == 20 and best.kv_bound and best.sizes[-1] == 20  # the ITL target allows 30
    assert any("holds 20 requests of 2304 tokens" in w for w in result.warnings)
    # SGLang's default list, clamped to the cap as SGLang clamps it, is capped alike
    assert result.finer is None  # both lists stop at 20: nothing to compare
    roomy = plan(_laws(), load, P90, Shape(4, 4), None, Engines(kv_pool_tokens=10**7))
    assert roomy.recommended.buckets.cap == 30 and not roomy.recommended.buckets.kv_bound
    given = plan(_laws(), load, P90, Shape(4, 4), EIGHTS, engines).recommended.buckets
    assert given.cap == 20 and given.sizes == EIGHTS  # the operator's graphs stay


def test_kv_pool_smaller_than_one_request_is_no_option() -> None:
    with pytest.raises(
        NoOption, match=r"KV pool \(1000 tokens, x\) cannot hold one request of 2304"
    ):
        plan(_laws(), Workload(1.0, [2048], [256], "fixed"), P90, Shape(4, 4), None,
             Engines(kv_pool_tokens=1000, kv_pool_source="x"))  # fmt: skip


def test_cli_handoff_kv_pool_and_chunk(law_files: tuple[Path, Path]) -> None:
    base = (*map(str, law_files), "--rate", "4", *FIXED, *TARGETS, "--format=json")

    def ttft(*extra: str) -> float:
        code, out, exc = _run(*base, *extra)
        assert code == 0, (out, exc)
        return float(json.loads(out)["recommended"]["predicted"]["ttft_p90_ms"])

    bare = ttft()
    assert ttft("--handoff-ms", "40") == pytest.approx(bare + 40.0, rel=0.02)
    # 2048 tokens x 16281 bytes at 20 GB/s: 1.67 ms of transfer
    moved = ttft("--kv-bytes-per-token", "16281", "--kv-link-gb-s", "20")
    assert moved == pytest.approx(bare + 2048 * 16281 / 20e6, rel=0.02)
    code, out, _ = _run(*base, "--kv-pool-tokens", str(20 * 2304))
    data = json.loads(out)
    assert data["recommended"]["decode_max_running_requests"] == 20
    assert any("--kv-pool-tokens" in w for w in data["warnings"])
    # the fixture's journals name no chunked_prefill_size: the guess is said
    assert any("8192 assumed" in w for w in data["warnings"])
    code, out, _ = _run(*base, "--chunked-prefill-size", "4096", "--handoff-ms", "6")
    data = json.loads(out)
    assert not any("assumed" in w for w in data["warnings"])
    assert data["assumed"] == {
        "chunked_prefill_size": 4096, "handoff_ms": 6.0, "kv_transfer_ms_per_token": 0.0,
        "gateway_policy": "round_robin", "decode_kv_pool_tokens": None,
    }  # fmt: skip
    code, _, exc = _run(*base, "--kv-bytes-per-token", "16281")
    assert code != 0 and str(exc) == "give --kv-bytes-per-token and --kv-link-gb-s together"


# ----- trace files ------------------------------------------------------------------------------


def _trace(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    return path


def test_trace_gives_lengths_and_rate(law_files: tuple[Path, Path], tmp_path: Path) -> None:
    rows = [{"input_len": 1000 + 100 * i, "output_len": 200, "arrival_s": 0.25 * i}
            for i in range(9)]  # fmt: skip
    trace = _trace(tmp_path, "\n".join(json.dumps(r) for r in rows) + "\n\n")
    code, out, exc = _run(*map(str, law_files), "--trace", str(trace), *TARGETS, "--format=json")
    assert code == 0, (out, exc)
    load = json.loads(out)["workload"]
    assert load["rate"] == pytest.approx(4.0)  # 8 gaps over 2 s
    assert load["mean_input"] == pytest.approx(1400) and load["lengths"] == str(trace)
    code, out, _ = _run(*map(str, law_files), "--trace", str(trace), "--rate", "1.5", *TARGETS,
                        "--format=json")  # fmt: skip
    assert json.loads(out)["workload"]["rate"] == 1.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"input_len": 10, "output_len": 5}\nnope\n', "trace.jsonl:2: not a JSON object"),
        ('[1, 2]\n', "trace.jsonl:1: not a JSON object"),
        ('{"input_len": 10}\n', "trace.jsonl:1: output_len is None, not a token count"),
        ('{"input_len": 0, "output_len": 5}\n', "trace.jsonl:1: input_len is 0, not a token"),
        ('{"input_len": 1.5, "output_len": 5}\n', "trace.jsonl:1: input_len is 1.5, not a"),
        ('{"input_len": 10, "output_len": 5, "arrival_s": 0}\n{"input_len": 10, "output_len": 5}\n',
         "trace.jsonl:2: arrival_s must be on every line or on none"),
        ('{"input_len": 10, "output_len": 5, "arrival_s": 2}\n'
         '{"input_len": 10, "output_len": 5, "arrival_s": 1}\n',
         "trace.jsonl:2: arrival_s 1 is before the line above's"),
        ('{"input_len": 10, "output_len": 5, "arrival_s": "soon"}\n',
         "trace.jsonl:1: arrival_s is 'soon', not a number of seconds"),
        ('{"input_len": 10, "output_len": 5, "arrival_s": 3}\n',
         "its 1 arrivals span 0 s: no rate to read; give --rate"),
        ('\n\n', "trace.jsonl: no requests in the trace"),
        ('{"input_len": 10, "output_len": 5}\n', "give --rate (a --trace with arrival_s"),
        ('{"input_len": 8000, "output_len": 500}\n', "above the context length 8192"),
    ],
)  # fmt: skip
def test_bad_traces_are_one_line(
    law_files: tuple[Path, Path], tmp_path: Path, text: str, message: str
) -> None:
    rate = () if "give --rate" in message or "span" in message else ("--rate", "1")
    trace = _trace(tmp_path, text)
    code, _, exc = _run(*map(str, law_files), "--trace", str(trace), *rate, *TARGETS)
    assert code != 0 and isinstance(exc, PdctlError), exc
    assert message in str(exc) and "\n" not in str(exc), str(exc)


def test_trace_and_other_lengths_are_exclusive(
    law_files: tuple[Path, Path], tmp_path: Path
) -> None:
    trace = _trace(tmp_path, '{"input_len": 10, "output_len": 5}\n')
    code, _, exc = _run(
        *map(str, law_files), "--trace", str(trace), "--rate", "1", *FIXED, *TARGETS
    )
    assert code != 0 and str(exc) == "give one of --trace and --input-len/--output-len, not both"
    trace.write_bytes(b"\xff\xfe")
    code, _, exc = _run(*map(str, law_files), "--trace", str(trace), "--rate", "1", *TARGETS)
    assert "not UTF-8 text (byte 0): not a trace" in str(exc)


# ----- --profile: the deployment the plan is for ----------------------------------------------

PROFILES = Path(__file__).resolve().parents[2] / "deploy" / "profiles"


def _law_pair(root: Path, flags: str) -> tuple[str, str]:
    """A decode and a prefill law measured under the start-up line `flags` (none if empty)."""
    head = f"[2026-11-29 09:00:00] server_args=ServerArgs({flags})\n" if flags else ""
    decode = head + "".join(journal_lines(SynthJournal(seed=5, noise=0.0), 20_000))
    prefill = head + "".join(prefill_journal_lines(SynthPrefill(seed=5, noise=0.0), 600))
    paths = root / "decode.json", root / "prefill.json"
    for path, text in zip(paths, (decode, prefill), strict=True):
        path.write_text(json.dumps(analyze_stream(io.BytesIO(text.encode())).as_dict()))
    return str(paths[0]), str(paths[1])


def _warnings(*args: str) -> list[str]:
    code, out, exc = _run(*args, "--rate", "4", *FIXED, *TARGETS, "--format=json")
    assert code == 0, (out, exc)
    return list(json.loads(out)["warnings"])


def test_profile_warns_of_each_flag_the_law_was_measured_under_otherwise(tmp_path: Path) -> None:
    reference = str(PROFILES / "reference.yml")
    laws = _law_pair(tmp_path, "tp_size=4, context_length=8192, disable_cuda_graph=True")
    found = _warnings(*laws, "--profile", reference)
    for role in ("decode", "prefill"):
        (line,) = [w for w in found if w.startswith(f"the {role} law") and "disable_cuda" in w]
        assert line.endswith(f"{reference} gives its {role} disable_cuda_graph=False")
    assert not [w for w in found if "context_length" in w or "tp_size" in w]  # the same there
    assert _warnings(*_law_pair(tmp_path, "tp_size=4"), "--profile", reference) == []


def test_profile_gives_the_gpus_an_explicit_option_overrides(tmp_path: Path) -> None:
    sim = str(PROFILES / "sim.yml")  # one GPU per engine
    laws = _law_pair(tmp_path, "tp_size=4, context_length=8192")
    found = _warnings(*laws, "--profile", sim)
    assert [w for w in found if "tp_size=4, the layout gives a decode 1 GPUs" in w]
    assert [w for w in found if "tp_size=4, the layout gives a prefill 1 GPUs" in w]
    found = _warnings(*laws, "--profile", sim, "--gpus-per-decode", "4")
    assert not [w for w in found if "gives a decode" in w]
    assert [w for w in found if "gives a prefill 1 GPUs" in w]


def test_profile_with_laws_that_name_no_flags_says_so(tmp_path: Path) -> None:
    reference = str(PROFILES / "reference.yml")
    found = _warnings(*_law_pair(tmp_path, ""), "--profile", reference)
    for role in ("decode", "prefill"):
        assert [
            w for w in found if w.startswith(f"the {role} law") and "names no engine flags" in w
        ]


def test_a_bad_profile_is_one_line(law_files: tuple[Path, Path], tmp_path: Path) -> None:
    not_a_mapping = tmp_path / "p.yml"
    not_a_mapping.write_text("- a list\n")
    for path, message in (
        (not_a_mapping, "a profile must be a YAML mapping"),
        (tmp_path / "none.yml", "none.yml"),
    ):
        code, _, exc = _run(*map(str, law_files), "--rate", "1", *FIXED, *TARGETS, "-p", str(path))
        assert code != 0 and isinstance(exc, PdctlError), (path, exc)
        assert message in str(exc) and "\n" not in str(exc), (message, str(exc))


def test_cuda_graph_bs_profile_plans_with_the_profiles_decode_buckets(tmp_path: Path) -> None:
    reference = PROFILES / "reference.yml"
    buckets = yaml.safe_load(reference.read_text())["engine"]["decode"]["cuda_graph_bs"]
    laws = _law_pair(tmp_path, "tp_size=4")
    args = (*laws, "--rate", "4", *FIXED, *TARGETS, "--cuda-graph-bs", "profile")
    code, out, exc = _run(*args, "-p", str(reference), "--format=json")
    assert code == 0, (out, exc)
    data = json.loads(out)
    assert data["recommended"]["cuda_graph_bs_decode"] == buckets
    assert data["options"][0]["buckets_basis"] == "given"
    # 18 + 1.05 x 24 = 43.2 ms fits 50; the next graph, 32, does not
    assert data["recommended"]["decode_max_running_requests"] == 24
    code, _, exc = _run(*args)
    assert code != 0 and isinstance(exc, PdctlError)
    assert str(exc) == "--cuda-graph-bs profile keeps --profile's buckets: give it"
    bare = yaml.safe_load(reference.read_text())
    del bare["engine"]["decode"]["cuda_graph_bs"]
    (tmp_path / "bare.yml").write_text(yaml.safe_dump(bare))
    code, _, exc = _run(*args, "-p", str(tmp_path / "bare.yml"))
    assert code != 0 and isinstance(exc, PdctlError)
    assert str(exc).endswith("bare.yml sets no decode cuda_graph_bs")


def test_kv_transfer_is_one_tp_ranks_share_over_one_ranks_path(tmp_path: Path) -> None:
    """Each decode TP rank pulls its own shard at once (SGLang's _resolve_rank_mapping, equal
    TP sizes): a TP4 request moves kv_bytes_per_token (per GPU) per token over each rank's
    link, in the time one rank's bytes take, not four times that."""
    reference = PROFILES / "reference.yml"
    per_gpu = yaml.safe_load(reference.read_text())["model"]["kv_bytes_per_token"]
    laws = _law_pair(tmp_path, "tp_size=4")
    args = (*laws, "--rate", "1", *FIXED, *TARGETS, "--kv-link-gb-s", "20", "--format=json")
    code, out, exc = _run(*args, "-p", str(reference))
    assert code == 0, (out, exc)
    assumed = json.loads(out)["assumed"]
    assert assumed["kv_transfer_ms_per_token"] == pytest.approx(per_gpu / 20e6)
