"""Regenerate sglang_<version>_recording.txt: who records each `sglang:*` family, where.

Static analysis of an installed SGLang (plain `ast`, nothing imported), so any Python runs it:

    python tests/data/extract_sglang_recording.py \
        /var/cache/pdstack/sglang-parser/lib/python3.11/site-packages/sglang \
        > tests/data/sglang_0.5.23_recording.txt

For every method of SchedulerMetricsCollector and TokenizerMetricsCollector
(sglang/srt/observability/metrics_collector.py) it finds the families the method writes
(`self.<attr>` of a metric built in __init__), then every call of that method in sglang/srt
and the conditions around the call:

- ranks: each TP rank runs its own scheduler with its own collector. A call under
  `current_scheduler_metrics_enabled` / `is_stats_logging_rank` / `attn_tp_rank == 0` is
  recorded by rank 0 only ("rank0"); one under plain `enable_metrics` by every rank
  ("every"). Tokenizer-side families come from the one tokenizer process ("server").
- modes: a call in sglang/srt/disaggregation/prefill.py (decode.py) happens in PD prefill
  (decode) only; elsewhere it follows `disaggregation_mode`/`disagg_mode` comparisons in the
  enclosing conditions, and a helper defined outside those files takes the modes of its
  callers (looked up by name, a few levels up).

OVERRIDES below holds what the walk cannot see, each with the source line it rests on. A
family with no call site found is listed with ranks and modes "-" (not recorded by default).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

MODES = ("null", "prefill", "decode")
RANK0_MARKERS = ("current_scheduler_metrics_enabled", "is_stats_logging_rank", "attn_tp_rank")
COLLECTORS = {"SchedulerMetricsCollector": "scheduler", "TokenizerMetricsCollector": "tokenizer"}
MODE_FILES = {
    "srt/disaggregation/prefill.py": {"prefill"},
    "srt/disaggregation/decode.py": {"decode"},
    "srt/disaggregation/decode_schedule_batch_mixin.py": {"decode"},
}
# (family, field) -> value, for what the call-site walk cannot decide, with the reason.
OVERRIDES: dict[tuple[str, str], str] = {
    # tokenizer_manager.py collect_metrics: "PD prefill workers never observe TTFT, so they
    # never reach ITL": ITL sits in the `else` of `if not state.ttft_observed`.
    ("sglang:inter_token_latency_seconds", "modes"): "null,decode",
    # tokenizer_manager.py collect_metrics: time_per_output_token is None
    # `if self.disaggregation_mode != DisaggregationMode.PREFILL`, and
    # observe_one_finished_request skips the histogram on None.
    ("sglang:request_time_per_output_token_seconds", "modes"): "null,decode",
    # metrics_reporter.py _calculate_utilization: `utilization = -1` on prefill; it is still
    # written (log_stats) in every mode.
}


def _wire_name(ctor: str, name: str) -> str:
    if ctor.endswith("Counter") and not name.endswith("_total"):
        return name + "_total"
    return name


def collector_methods(tree: ast.Module) -> dict[str, tuple[str, dict[str, set[str]]]]:
    """method name -> (collector, {family written})."""
    out: dict[str, tuple[str, dict[str, set[str]]]] = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.name not in COLLECTORS:
            continue
        attrs: dict[str, str] = {}
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            target = node.targets[0]
            name = next(
                (
                    k.value.value
                    for k in node.value.keywords
                    if k.arg == "name" and isinstance(k.value, ast.Constant)
                ),
                None,
            )
            if (
                isinstance(target, ast.Attribute)
                and isinstance(name, str)
                and name.startswith("sglang:")
            ):
                attrs[target.attr] = _wire_name(ast.unparse(node.value.func), name)
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name != "__init__":
                written = {
                    attrs[n.attr]
                    for n in ast.walk(fn)
                    if isinstance(n, ast.Attribute) and n.attr in attrs
                }
                out[fn.name] = (COLLECTORS[cls.name], {f: set() for f in written})
    return out


class _Site:
    def __init__(self, rel: str, line: int, conds: list[str], func: str) -> None:
        self.rel, self.line, self.conds, self.func = rel, line, conds, func


def _conditions(
    tree: ast.Module,
) -> dict[int, tuple[list[str], str]]:
    """Call line -> (conditions that must hold, enclosing function name)."""
    out: dict[int, tuple[list[str], str]] = {}

    def visit(node: ast.AST, conds: list[str], func: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func, conds = node.name, []
            for stmt in node.body:
                visit(stmt, conds, func)
                # `if <c>: return` guards the rest of the function with `not <c>`.
                if (
                    isinstance(stmt, ast.If)
                    and stmt.body
                    and isinstance(stmt.body[-1], ast.Return)
                    and not stmt.orelse
                ):
                    conds = [*conds, f"not ({ast.unparse(stmt.test)})"]
            return
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            for s in node.body:
                visit(s, [*conds, test], func)
            for s in node.orelse:
                visit(s, [*conds, f"not ({test})"], func)
            return
        if isinstance(node, ast.Call):
            out.setdefault(node.lineno, (conds, func))
        for child in ast.iter_child_nodes(node):
            visit(child, conds, func)

    visit(tree, [], "<module>")
    return out


def _modes_from_conditions(conds: list[str]) -> set[str]:
    modes = set(MODES)
    for cond in conds:
        negated = cond.startswith("not (")
        for mode in MODES:
            m = re.search(rf"(==|!=)\s*DisaggregationMode\.{mode.upper()}\b", cond)
            if not m:
                continue
            equal = (m.group(1) == "==") != negated
            modes &= {mode} if equal else set(MODES) - {mode}
    return modes


class Source:
    """Call sites of sglang/srt by method name. A file is parsed only when its text holds
    `.<name>` for a name looked up (a superset of its calls), and each site's modes are
    computed once: the walk over every file and the caller recursion were the run time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = {
            str(p.relative_to(root)): p.read_text()
            for p in sorted((root / "srt").rglob("*.py"))
            if "__pycache__" not in p.parts
        }
        self._parsed: dict[str, dict[str, list[_Site]]] = {}
        self._lines: dict[str, list[str]] = {}
        self._modes: dict[tuple[str, int, int], set[str]] = {}
        self._holders: dict[str, list[str]] = {}

    def _sites(self, rel: str) -> dict[str, list[_Site]]:
        if rel not in self._parsed:
            tree = ast.parse(self.files[rel])
            conds = _conditions(tree)
            by_name: dict[str, list[_Site]] = defaultdict(list)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    c, func = conds.get(node.lineno, ([], "<module>"))
                    by_name[node.func.attr].append(_Site(rel, node.lineno, c, func))
            self._parsed[rel] = by_name
        return self._parsed[rel]

    def _callers(self, method: str) -> Iterator[_Site]:
        """Calls of `.<method>(` in file order, parsing files as it goes."""
        if method not in self._holders:
            needle = "." + method
            self._holders[method] = [
                rel
                for rel, text in self.files.items()
                if rel != "srt/observability/metrics_collector.py" and needle in text
            ]
        for rel in self._holders[method]:
            yield from self._sites(rel).get(method, [])

    def calls(self, method: str) -> list[_Site]:
        return list(self._callers(method))

    def line(self, site: _Site) -> str:
        if site.rel not in self._lines:
            self._lines[site.rel] = self.files[site.rel].splitlines()
        return self._lines[site.rel][site.line - 1]

    def modes(self, site: _Site, depth: int = 3) -> set[str]:
        key = (site.rel, site.line, depth)
        if key not in self._modes:
            self._modes[key] = self._site_modes(site, depth)
        return self._modes[key]

    def _site_modes(self, site: _Site, depth: int) -> set[str]:
        modes = MODE_FILES.get(site.rel, set(MODES)) & _modes_from_conditions(site.conds)
        if site.rel in MODE_FILES or depth == 0 or site.func.startswith("<"):
            return modes
        callers: set[str] | None = None
        for c in self._callers(site.func):
            if (c.rel, c.line) == (site.rel, site.line):
                continue
            callers = (callers or set()) | self.modes(c, depth - 1)
            if callers >= modes:  # no further caller can narrow the result
                break
        return modes if callers is None else modes & callers


def _collector_sites(src: Source, method: str, collector: str) -> list[_Site]:
    """Calls of the method on a metrics collector (not on a same-named helper elsewhere)."""
    out = []
    for site in src.calls(method):
        if collector == "tokenizer" or "metrics_collector" in src.line(site):
            out.append(site)
    return out


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__import__("sglang").__file__).parent
    version = re.search(
        r"__version__ = (?:version = )?['\"]([^'\"]+)", (root / "_version.py").read_text()
    )
    src = Source(root)
    mc = ast.parse((root / "srt/observability/metrics_collector.py").read_text())
    rows: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for method, (collector, families) in sorted(collector_methods(mc).items()):
        for family in families:
            rows[family]["collector"].add(collector)
        for site in _collector_sites(src, method, collector):
            if collector == "tokenizer":
                ranks = "server"
            elif any(m in c for c in site.conds for m in RANK0_MARKERS):
                ranks = "rank0"
            else:
                ranks = "every"
            modes = src.modes(site)
            for family in families:
                rows[family]["ranks"].add(ranks)
                rows[family]["modes"] |= modes
                rows[family]["sites"].add(f"{site.rel}:{site.line}")
    # The HTTP middleware (add_prometheus_middleware) counts every request of the server
    # process in every mode.
    http = (root / "srt/observability/http_request_metrics.py").read_text()
    for name in re.findall(r'name="(sglang:[a-z_]+)"', http):
        if name != "sglang:routing_keys_active":  # only for requests with x-smg-routing-key
            rows[name]["collector"].add("http")
            rows[name]["ranks"].add("server")
            rows[name]["modes"] |= set(MODES)
            rows[name]["sites"].add("srt/observability/http_request_metrics.py")
    print(f"# Who records each sglang:* family in sglang {version.group(1) if version else '?'}.")
    print("# Generated by tests/data/extract_sglang_recording.py (static walk of the source).")
    print("# ranks: every = each TP rank writes its own series (tp_rank=0..TP-1); rank0 = only")
    print("# attn_tp_rank 0 (current_scheduler_metrics_enabled); server = the tokenizer/HTTP")
    print("# process, no tp_rank label. modes: disaggregation modes that record it (null =")
    print("# unified). '-' = no call site in the default code paths.")
    print("# columns: name collector ranks modes call-sites")
    for family in sorted(rows):
        row = rows[family]
        ranks = OVERRIDES.get((family, "ranks")) or ",".join(sorted(row["ranks"])) or "-"
        modes = OVERRIDES.get((family, "modes")) or (
            ",".join(m for m in MODES if m in row["modes"]) or "-"
        )
        sites = ",".join(sorted(row["sites"])) or "-"
        print(f"{family} {','.join(sorted(row['collector']))} {ranks} {modes} {sites}")


if __name__ == "__main__":
    main()
