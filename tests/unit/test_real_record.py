"""The record of a real SGLang pair (tests/fixtures/real/sglang-<version>/, written on a GPU by
benchmarks/real_engine/run.sh, docs/real-engine.md) replayed against the sim and the product.

- The sim's `sglang:*` families per role (the PD scenario of test_sim_metrics_fidelity) against
  the real engines' after the lane's traffic: each family missing on one side, or with other
  labels or type, is a row of docs/sim.md's "Against a real engine" table, and each row is
  still a difference.
- `pdctl analyze journal`'s parser reads every batch line the real engines wrote.
- pdctl's engine probe and in-flight count read the real /health, /metrics and /v1/loads.
- A record whose VERSION is not its directory's version is refused, naming both.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdctl import render, topology
from pdctl.analyze.decode_table import is_health_check
from pdctl.analyze.logparse import DecodeBatch, PrefillBatch, parse_line
from pdctl.analyze.report import analyze_stream
from pdctl.exporter.graph_sizes import GraphSizes
from pdctl.ops.health import in_flight, probe_engine
from pdctl.ops.restart import registrations
from pdctl.ops.source import Source
from pdctl.spec.load import load_deployment
from pdctl.spec.profile import Role
from tests.unit.test_sim_metrics_fidelity import scrape_pd_pair_and_unified

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "real"
RECORDS = sorted(FIXTURES.glob("sglang-*"))
SIM_DOC = ROOT / "docs" / "sim.md"
ROLES = ("prefill", "decode")


class RecordVersionError(ValueError):
    pass


@dataclass(frozen=True)
class RealRecord:
    path: Path
    version: str

    def text(self, name: str) -> str:
        return (self.path / name).read_text()

    def json(self, name: str) -> Any:
        return json.loads(self.text(name))

    def families(self) -> dict[str, dict[str, tuple[str, frozenset[str]]]]:
        """role -> family -> (type, label names), from metrics.txt."""
        out: dict[str, dict[str, tuple[str, frozenset[str]]]] = {}
        for line in self.text("metrics.txt").splitlines():
            if line and not line.startswith("#"):
                role, name, typ, labels = line.split()
                names = frozenset() if labels == "-" else frozenset(labels.split(","))
                out.setdefault(role, {})[name] = (typ, names)
        return out

    def log_lines(self, role: str) -> list[str]:
        rows = (line.split("\t") for line in self.text("logs.txt").splitlines() if line)
        return [row[2] for row in rows if row[0] == role]


def load(path: Path) -> RealRecord:
    """The record in `path` (named sglang-<version>), refused when it says another version."""
    named = path.name.removeprefix("sglang-")
    recorded = (path / "VERSION").read_text().strip()
    if recorded != named:
        raise RecordVersionError(
            f"{path}: recorded from sglang {recorded}, but its directory is for sglang {named}"
        )
    return RealRecord(path, recorded)


def test_there_is_a_record() -> None:
    if not RECORDS:
        pytest.skip(f"blocked: no record under {FIXTURES} yet (docs/real-engine.md: run the lane)")


def test_a_record_from_another_version_is_refused(tmp_path: Path) -> None:
    wrong = tmp_path / "sglang-0.5.23"
    wrong.mkdir()
    (wrong / "VERSION").write_text("0.5.17\n")
    with pytest.raises(RecordVersionError, match=r"sglang 0\.5\.17.*sglang 0\.5\.23"):
        load(wrong)


@pytest.fixture(params=RECORDS, ids=[p.name for p in RECORDS], scope="module")
def record(request: pytest.FixtureRequest) -> RealRecord:
    return load(request.param)


# --- the sim's families against the real ones ------------------------------------------------


def sim_families() -> dict[str, dict[str, tuple[str, frozenset[str]]]]:
    texts = asyncio.run(asyncio.wait_for(scrape_pd_pair_and_unified(), 60))
    out: dict[str, dict[str, tuple[str, frozenset[str]]]] = {}
    for role, text in zip(ROLES, texts, strict=False):
        fams = out.setdefault(role, {})
        for fam in text_string_to_metric_families(text):
            name = fam.name + "_total" if fam.type == "counter" else fam.name
            if name.startswith("sglang:"):
                labels = frozenset({k for s in fam.samples for k in s.labels} - {"le"})
                fams[name] = (fam.type, labels)
    return out


def differences(
    real: dict[str, dict[str, tuple[str, frozenset[str]]]],
    sim: dict[str, dict[str, tuple[str, frozenset[str]]]],
) -> set[tuple[str, str, str]]:
    """(family, role, what): `real only`, `sim only`, `labels`, `type`."""
    out: set[tuple[str, str, str]] = set()
    for role in ROLES:
        r = {n: f for n, f in real.get(role, {}).items() if n.startswith("sglang:")}
        s = sim.get(role, {})
        out |= {(n, role, "real only") for n in r.keys() - s.keys()}
        out |= {(n, role, "sim only") for n in s.keys() - r.keys()}
        for n in r.keys() & s.keys():
            if r[n][0] != s[n][0]:
                out.add((n, role, "type"))
            if r[n][1] != s[n][1]:
                out.add((n, role, "labels"))
    return out


def listed(version: str) -> set[tuple[str, str, str]]:
    """docs/sim.md's rows for `version`: | `family` | roles | what | why |."""
    text = SIM_DOC.read_text()
    start = text.index(f"## Against a real engine (sglang {version})")
    end = text.find("\n## ", start + 1)
    rows = re.findall(r"^\| `(sglang:\w+)` \| ([a-z,]+) \| ([a-z ]+) \| [^|]+\|$",
                      text[start:end], re.M)  # fmt: skip
    return {(n, role, what) for n, roles, what in rows for role in roles.split(",")}


def test_each_difference_from_the_real_families_is_listed_with_a_reason(
    record: RealRecord,
) -> None:
    found = differences(record.families(), sim_families())
    rows = listed(record.version)
    unlisted = sorted(found - rows)
    assert not unlisted, f"differences not listed in docs/sim.md: {unlisted}"
    stale = sorted(rows - found)
    assert not stale, f"docs/sim.md lists differences that are gone: {stale}"


def test_the_real_pd_roles_label_engine_type(record: RealRecord) -> None:
    for role in ROLES:
        assert f'engine_type="{role}"' in record.text(f"exposition-{role}.txt")


# --- the analyzer on the real log lines ------------------------------------------------------


def _fields(line: str) -> dict[str, float]:
    """`name: number` pairs of a batch line (`gen throughput (token/s): 140.91` included)."""
    return {k: float(v) for k, v in re.findall(r"(#?[a-z][a-z ()/-]*?): (\d+(?:\.\d+)?)", line)}


def test_the_analyzer_parses_every_real_batch_line(record: RealRecord) -> None:
    seen = {"Prefill batch": 0, "Decode batch": 0}
    for role in ROLES:
        for line in record.log_lines(role):
            kind = next((k for k in seen if k in line), None)
            if kind is None:
                continue
            parsed = parse_line(line)
            assert parsed is not None, line
            f = _fields(line)
            if isinstance(parsed, DecodeBatch):
                assert parsed.running == f["#running-req"], line
                assert parsed.gen_throughput == pytest.approx(f["gen throughput (token/s)"])
            else:
                assert isinstance(parsed, PrefillBatch)
                assert parsed.new_token == f["#new-token"], line
            seen[kind] += 1
    assert all(seen.values()), seen


# --- pdctl's probes on the real answers ------------------------------------------------------


@contextlib.contextmanager
def replaying(answers: dict[str, tuple[int, str]]) -> Iterator[str]:
    """An HTTP server answering each recorded path (query included) as the engine did."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.get(self.path, (404, "not recorded"))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _body(answer: dict[str, Any]) -> str:
    body = answer["body"]
    return body if isinstance(body, str) else json.dumps(body)


def _gauge(text: str, name: str) -> float:
    return sum(
        s.value for fam in text_string_to_metric_families(text) for s in fam.samples
        if s.name == name
    )  # fmt: skip


@pytest.mark.parametrize("role", ROLES)
def test_the_engine_probe_reads_the_real_answers(record: RealRecord, role: str) -> None:
    recorded = record.json("endpoints.json")[role]
    exposition = record.text(f"exposition-{role}.txt")
    answers = {path: (a["status"], _body(a)) for path, a in recorded.items() if a["status"]}
    answers["/metrics"] = (200, exposition)
    answers["/v1/loads?include=core"] = answers["/v1/loads"]
    with replaying(answers) as url:
        probe = probe_engine(url)
        held = in_flight(url)
    assert probe.healthy, probe
    assert probe.metrics_error is None
    assert probe.running == _gauge(exposition, "sglang:num_running_reqs")
    assert probe.queued == _gauge(exposition, "sglang:num_queue_reqs")
    assert probe.token_usage is not None
    loads = recorded["/v1/loads"]["body"]["loads"]
    assert held == sum(x["num_running_reqs"] + x["num_waiting_reqs"] for x in loads)


def test_health_check_batches_are_not_counted_as_traffic(record: RealRecord) -> None:
    """SGLang's /health logs a one-token `Prefill batch` per check (smg checks every few
    seconds): `pdctl analyze journal` counts them apart, not as prefill traffic."""
    lines = record.log_lines("prefill")
    batches = [b for b in map(parse_line, lines) if isinstance(b, PrefillBatch)]
    checks = [b for b in batches if is_health_check(b)]
    assert checks, "the record holds no /health batch line"
    report = analyze_stream(io.BytesIO(("\n".join(lines) + "\n").encode()))
    got = report.as_dict()["input"]
    assert got["health_check_lines"] == len(checks)
    assert got["prefill_lines"] == len(batches) - len(checks)


# --- what the lane found, fixed (docs/real-engine.md, "What the lane found") -----------------

LANE_INVENTORY = ROOT / "benchmarks" / "real_engine" / "inventory.ini"


def _lane_topology() -> topology.Topology:
    return topology.from_deployment(load_deployment(LANE_INVENTORY))


def _worker(record: RealRecord, role: str) -> dict[str, Any]:
    workers = record.json("gateway.json")["workers"]["workers"]
    return next(w for w in workers if w["worker_type"] == role)


def test_the_decode_is_registered_with_the_running_window_its_profile_sets(
    record: RealRecord,
) -> None:
    """smg's PD admission is off for a decode without a `max_running_requests` label:
    pdctl registers the profile's value, and smg holds it."""
    (decode,) = [i for i in _lane_topology().instances if i.role is Role.DECODE]
    assert decode.max_running_requests == 32  # benchmarks/real_engine/profile.yml
    pairs = Source(_lane_topology(), None).pairs()
    (reg,) = [r for r in registrations(pairs) if r.worker_type == "decode"]
    assert reg.running_window == decode.max_running_requests
    labels = _worker(record, "decode")["labels"]
    assert labels["max_running_requests"] == str(decode.max_running_requests)
    warnings = "\n".join(record.json("gateway.json")["warnings"])
    assert "PD admission is off" not in warnings


def test_pdctl_leaves_load_balance_method_to_sglangs_per_role_default(record: RealRecord) -> None:
    """pdctl renders no --load-balance-method: SGLang's `auto` resolves to
    follow_bootstrap_room on a prefill (a decode finds a DP prefill's rank as the bootstrap
    room modulo its DP size without asking it) and round_robin on a decode (sglang
    arg_groups/serving_hook.py, handle_load_balance_method). smg's warning about the two
    differing is an equality check (update_policies.rs, check_worker_conflicts), expected
    (docs/gateway.md)."""
    dep = load_deployment(LANE_INVENTORY)
    for inst in dep.instances:
        assert "--load-balance-method" not in render.launch_args(inst, dep)
    info = {role: record.json("endpoints.json")[role]["/server_info"]["body"] for role in ROLES}
    assert info["prefill"]["load_balance_method"] == "follow_bootstrap_room"
    assert info["decode"]["load_balance_method"] == "round_robin"
    assert "conflicting load_balance_method" in "\n".join(record.json("gateway.json")["warnings"])


def test_pd_exporter_reads_server_info_not_the_deprecated_path(record: RealRecord) -> None:
    """The exporter's graph sizes come from /server_info (a real 0.5.17 logs a deprecation
    for /get_server_info): the replay serves only the former."""
    answer = record.json("endpoints.json")["decode"]["/server_info"]
    assert answer["status"] == 200
    with replaying({"/server_info": (200, _body(answer))}) as url:
        size = GraphSizes(timeout_s=5).get(url)
    # The lane runs without CUDA graphs: the decode reports none captured.
    assert size is None
    assert answer["body"]["disable_cuda_graph"] is True
