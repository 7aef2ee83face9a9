"""What the lane keeps of the real engines, written as small text files under
record/sglang-<version>/ (committed as tests/fixtures/real/sglang-<version>/ and replayed by
tests/unit/test_real_record.py):

- VERSION: the sglang version /server_info reported (the replay refuses a directory whose
  name says another);
- metrics.txt: `role family type labels` per /metrics family of each engine and smg;
- exposition-<role>.txt: each engine's last /metrics text;
- logs.txt: `role<TAB>kind<TAB>example`: one line of each kind each process logged;
- endpoints.json: each engine's answers of /health, /ready, /server_info, /get_server_info,
  /model_info, /v1/models, /v1/loads;
- canary.json: pdctl's pair canary and one PD request's two legs as the engines answered;
- gateway.json: smg's worker view, traffic through it, its warnings;
- status.json, bench.json, analyze.json, timings.json: what pdctl said and measured.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import requests
from prometheus_client.parser import text_string_to_metric_families

ENDPOINTS = (
    "/health",
    "/ready",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/v1/models",
    "/v1/loads",
    "/v1/loads?include=all",
)
MAX_KINDS = 120  # per process: a log with free text in its lines stays bounded
# Batch lines are kept as lines, not kinds (the replay parses their numbers, and a /health
# batch differs from a request's only in them): the first of each distinct body, this many.
MAX_BATCH_LINES = 40
BATCH = ("Prefill batch", "Decode batch")
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] ")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = re.compile(r"0x[0-9a-f]+|[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{32}|\d+(?:\.\d+)?(?:e-?\d+)?")


class Engine(Protocol):
    mode: str
    url: str


class Pair(Protocol):
    @property
    def prefill(self) -> Any: ...
    @property
    def decode(self) -> Any: ...


def _answer(url: str) -> dict[str, Any]:
    try:
        r = requests.get(url, timeout=30)
    except requests.RequestException as e:
        return {"status": None, "error": f"{type(e).__name__}"}
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text[:4000]
    return {"status": r.status_code, "body": body}


def endpoints(url: str) -> dict[str, Any]:
    return {path: _answer(url + path) for path in ENDPOINTS}


def pd_legs(pair: Pair) -> dict[str, Any]:
    """One request down the pair's PD path, as smg and pdctl's canary send it: the same
    /generate body to both engines at once."""
    body = {
        "text": "a request through the pair",
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": pair.prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    with ThreadPoolExecutor(2) as pool:
        legs = {
            role: pool.submit(requests.post, f"{e.url}/generate", json=body, timeout=60)
            for role, e in (("prefill", pair.prefill), ("decode", pair.decode))
        }
        out: dict[str, Any] = {"request": body}
        for role, f in legs.items():
            r = f.result()
            out[role] = {"status": r.status_code, "body": r.text[:4000]}
    return out


def families(text: str) -> dict[str, tuple[str, list[str]]]:
    """family (counters with _total, as SGLang names them) -> (type, label names)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels = sorted({k for s in fam.samples for k in s.labels} - {"le"})
        out[name] = (fam.type, labels)
    return out


def log_kinds(text: str) -> dict[str, str]:
    """kind -> the first line of that kind: the line without its time prefix, numbers and
    ids masked (batch lines: the body itself, up to MAX_BATCH_LINES)."""
    kinds: dict[str, str] = {}
    batches = 0
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if not line.strip():
            continue
        body = _PREFIX.sub("", line)
        if body.startswith(BATCH):
            if body not in kinds and batches < MAX_BATCH_LINES:
                kinds[body[:300]] = line[:600]
                batches += 1
            continue
        kind = _NUM.sub("#", body)[:160]
        if kind not in kinds and len(kinds) - batches < MAX_KINDS:
            kinds[kind] = line[:600]
    return kinds


def machine() -> dict[str, str]:
    def out(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            return f"unavailable: {e}"

    query = "--query-gpu=name,memory.total,driver_version"
    gpu = out("nvidia-smi", query, "--format=csv,noheader")
    return {"gpu": gpu, "python": out("python3", "-V")}


@dataclass
class Record:
    endpoints: dict[str, Any] = field(default_factory=dict)
    canary: dict[str, Any] = field(default_factory=dict)
    gateway: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    status_after_restart: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    analyze: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    expositions: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)

    def version(self) -> str:
        for answers in self.endpoints.values():
            body = answers.get("/server_info", {}).get("body")
            if isinstance(body, dict) and body.get("version"):
                return str(body["version"])
        return "unknown"

    def scrape(self, engines: list[Any], gw: Any) -> None:
        for e in engines:
            self.expositions[e.mode] = requests.get(f"{e.url}/metrics", timeout=30).text
        metrics = f"http://127.0.0.1:{gw.metrics_port}/metrics"
        self.expositions["gateway"] = requests.get(metrics, timeout=30).text
        self.gateway["workers"] = requests.get(f"{gw.url}/workers", timeout=30).json()

    def families(self) -> dict[str, dict[str, tuple[str, list[str]]]]:
        return {role: families(text) for role, text in self.expositions.items()}

    def write(self, root: Path) -> Path:
        d = root / f"sglang-{self.version()}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "VERSION").write_text(self.version() + "\n")
        rows = [
            f"{role} {name} {typ} {','.join(labels) or '-'}"
            for role, fams in self.families().items()
            for name, (typ, labels) in sorted(fams.items())
        ]
        header = "# role family type labels (from each process's /metrics after the lane's traffic)"
        (d / "metrics.txt").write_text("\n".join([header, *rows]) + "\n")
        for role, text in self.expositions.items():
            (d / f"exposition-{role}.txt").write_text(text)
        kinds = [
            f"{role}\t{kind}\t{example}"
            for role, text in self.logs.items()
            for kind, example in log_kinds(text).items()
        ]
        (d / "logs.txt").write_text("\n".join(kinds) + "\n")
        self.gateway["warnings"] = [
            line for line in self.logs.get("gateway", "").splitlines() if "WARN" in line
        ][:50]
        for name, value in (
            ("endpoints", self.endpoints),
            ("canary", self.canary),
            ("gateway", self.gateway),
            ("status", {"before": self.status, "after_restart": self.status_after_restart}),
            ("bench", self.bench),
            ("analyze", self.analyze),
            ("timings", self.timings),
        ):
            (d / f"{name}.json").write_text(json.dumps(value, indent=2, default=str) + "\n")
        return d
