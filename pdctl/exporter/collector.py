"""The pd-exporter collector: fresh metric families on every scrape, one section per source;
a failing source is reported (pdstack_scrape_success, pdstack_scrape_errors_total, one log
line) and the others are still served."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import requests
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pdctl.exporter.canary import Canary
from pdctl.exporter.gpu import Nvml
from pdctl.exporter.graph_sizes import GraphSizes
from pdctl.exporter.journal import DecodeJournal
from pdctl.exporter.statelog import StateLog
from pdctl.exporter.targets import HostTargets, TopologyFile, host_targets

GPU_LABELS = ["gpu", "uuid", "role", "numa_node", "engine", "pair"]
# (family suffix, help) of the single-value GPU readings; GpuReading.values keys.
GPU_GAUGES = (
    ("power_watts", "Power draw."),
    ("power_limit_watts", "Enforced power limit."),
    ("sm_utilization_ratio", "Share of time at least one kernel ran (NVML utilization.gpu)."),
    ("memory_utilization_ratio", "Share of time device memory was read or written."),
    ("memory_used_bytes", "Device memory in use."),
    ("memory_total_bytes", "Device memory in total."),
    ("temperature_celsius", "GPU core temperature."),
)


class PdCollector(Collector):
    def __init__(
        self,
        topology: TopologyFile,
        host: str,
        nvml: Nvml,
        canary: Canary,
        graphs: GraphSizes,
        journal_files: dict[str, Path],
        log: StateLog,
    ) -> None:
        self.topology = topology
        self.host = host
        self.nvml = nvml
        self.canary = canary
        self.graphs = graphs
        self.journal_files = journal_files
        self.log = log
        self.targets = HostTargets()
        self.journals: dict[str, DecodeJournal] = {}
        self.errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def refresh(self) -> bool:
        """Re-read the topology and point the canary and journal followers at it."""
        topo = self.topology.refresh()
        self.log.report("topology", self.topology.error)
        if topo is not None:
            self.targets = host_targets(topo, self.host, self.journal_files)
        self.canary.set_targets(self.targets.pairs)
        wanted = {t.engine: t for t in self.targets.journals}
        for engine in set(self.journals) - set(wanted):
            self.journals.pop(engine).stop()
        for engine, target in wanted.items():
            if engine not in self.journals or self.journals[engine].target != target:
                if engine in self.journals:
                    self.journals[engine].stop()
                self.journals[engine] = DecodeJournal(target, self.log).start()
        return self.topology.error is None

    def stop(self) -> None:
        for journal in self.journals.values():
            journal.stop()

    def collect(self) -> Iterator[Metric]:
        # The HTTP server scrapes in threads; one scrape at a time keeps the followers and
        # error counts consistent.
        with self._lock:
            families = list(self._collect())
        yield from families

    def _collect(self) -> Iterator[Metric]:
        success = GaugeMetricFamily(
            "pdstack_scrape_success",
            "1 when the collector's source answered this scrape.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "pdstack_scrape_duration_seconds",
            "Time each collector took this scrape.",
            labels=["collector"],
        )
        sections: tuple[tuple[str, Callable[[list[Metric]], bool]], ...] = (
            ("topology", self._topology),
            ("gpu", self._gpu),
            ("canary", self._canary),
            ("decode", self._decode),
        )
        all_ok = True
        for name, section in sections:
            t0 = time.perf_counter()
            families: list[Metric] = []
            ok = section(families)
            yield from families
            if not ok:
                self.errors[name] = self.errors.get(name, 0) + 1
            all_ok = all_ok and ok
            success.add_metric([name], 1.0 if ok else 0.0)
            duration.add_metric([name], time.perf_counter() - t0)
        errors = CounterMetricFamily(
            "pdstack_scrape_errors", "Scrapes on which a collector failed.", labels=["collector"]
        )
        for name, _ in sections:
            errors.add_metric([name], self.errors.get(name, 0))
        yield success
        yield duration
        yield errors
        yield GaugeMetricFamily(
            "pdstack_up", "1 when every collector succeeded this scrape.", 1.0 if all_ok else 0.0
        )

    def _topology(self, out: list[Metric]) -> bool:
        ok = self.refresh()
        members = GaugeMetricFamily(
            "pdstack_group_members",
            "Members the topology gives each role of a group on this host.",
            labels=["pair", "role"],
        )
        for (pair, role), count in sorted(self.targets.members.items()):
            members.add_metric([pair, role], count)
        out.append(members)
        return ok

    def _gpu(self, out: list[Metric]) -> bool:
        """No NVML is a state (pdstack_gpu_up 0), not a collector failure; a GPU that
        cannot be read is."""
        up = GaugeMetricFamily("pdstack_gpu_up", "1 when NVML is usable on this host.")
        out.append(up)
        if not self.nvml.init():
            up.add_metric([], 0.0)
            return True
        up.add_metric([], 1.0)
        readings, errors = self.nvml.read()
        self.log.report("gpu", "; ".join(errors) or None)
        gauges = {
            suffix: GaugeMetricFamily(f"pdstack_gpu_{suffix}", doc, labels=GPU_LABELS)
            for suffix, doc in GPU_GAUGES
        }
        clocks = GaugeMetricFamily(
            "pdstack_gpu_clock_hertz", "Current clock.", labels=[*GPU_LABELS, "clock"]
        )
        pcie = GaugeMetricFamily(
            "pdstack_gpu_pcie_throughput_bytes_per_second",
            "PCIe traffic (NVML sample).",
            labels=[*GPU_LABELS, "direction"],
        )
        throttle = GaugeMetricFamily(
            "pdstack_gpu_throttle_reason",
            "1 while the clock throttle reason is active.",
            labels=[*GPU_LABELS, "reason"],
        )
        index_labels: dict[int, list[str]] = {}
        for r in readings:
            owner = self.targets.gpus.get(r.index)
            labels = [
                str(r.index),
                r.uuid,
                *(
                    (owner.role, owner.numa_node, owner.engine, owner.pair)
                    if owner
                    else ("", "", "", "")
                ),
            ]
            index_labels[r.index] = labels
            for suffix, value in r.values.items():
                gauges[suffix].add_metric(labels, value)
            for clock, hz in r.clocks_hz.items():
                clocks.add_metric([*labels, clock], hz)
            for direction, rate in r.pcie_bytes_per_second.items():
                pcie.add_metric([*labels, direction], rate)
            for reason, active in r.throttle.items():
                throttle.add_metric([*labels, reason], 1.0 if active else 0.0)
        xids = CounterMetricFamily(
            "pdstack_gpu_xid_errors",
            "XID errors the driver reported since the exporter started.",
            labels=[*GPU_LABELS, "xid"],
        )
        for (index, xid), count in sorted(self.nvml.xids().items()):
            labels = index_labels.get(index, [str(index), "", "", "", "", ""])
            xids.add_metric([*labels, str(xid)], count)
        out.extend([*gauges.values(), clocks, pcie, throttle, xids])
        return not errors

    def _canary(self, out: list[Metric]) -> bool:
        results, runs, failures = self.canary.snapshot()
        ok = GaugeMetricFamily(
            "pdstack_pair_canary_success",
            "1 when the last canary generate through the group succeeded.",
            labels=["pair"],
        )
        took = GaugeMetricFamily(
            "pdstack_pair_canary_duration_seconds",
            "Duration of the last canary generate.",
            labels=["pair"],
        )
        when = GaugeMetricFamily(
            "pdstack_pair_canary_last_run_timestamp_seconds",
            "When the last canary finished.",
            labels=["pair"],
        )
        ran = CounterMetricFamily(
            "pdstack_pair_canary_runs", "Canary generates sent.", labels=["pair"]
        )
        failed = CounterMetricFamily(
            "pdstack_pair_canary_failures", "Canary generates that failed.", labels=["pair"]
        )
        for pair, result in sorted(results.items()):
            ok.add_metric([pair], 1.0 if result.ok else 0.0)
            took.add_metric([pair], result.duration_s)
            when.add_metric([pair], result.finished_at)
            ran.add_metric([pair], runs.get(pair, 0))
            failed.add_metric([pair], failures.get(pair, 0))
        out.extend([ok, took, when, ran, failed])
        # A failing pair is what the canary reports, not a failure of the canary itself.
        return True

    def _decode(self, out: list[Metric]) -> bool:
        labels = ["engine", "pair"]
        batches = CounterMetricFamily(
            "pdstack_decode_batches",
            "Decode batch lines logged, by CUDA graph mode "
            "(graph, eager, unknown when the release does not log it).",
            labels=[*labels, "mode"],
        )
        running = HistogramMetricFamily(
            "pdstack_decode_running_requests",
            "Running requests of each logged decode batch.",
            labels=labels,
        )
        step = HistogramMetricFamily(
            "pdstack_decode_step_seconds",
            "Decode step time of each logged batch (running requests / generation throughput).",
            labels=labels,
        )
        graph = GaugeMetricFamily(
            "pdstack_decode_cuda_graph_max_batch_size",
            "Largest decode batch captured as a CUDA graph (from /server_info).",
            labels=labels,
        )
        ok = True
        for engine, journal in sorted(self.journals.items()):
            key = [engine, journal.target.pair]
            stats = journal.stats()
            for mode, count in sorted(stats.batches.items()):
                batches.add_metric([*key, mode], count)
            running.add_metric(key, stats.running.cumulative(), stats.running.total)
            step.add_metric(key, stats.step_s.cumulative(), stats.step_s.total)
            ok = ok and journal.error is None
        for decode in self.targets.decodes:
            try:
                size = self.graphs.get(decode.url)
            except (requests.RequestException, ValueError) as e:
                self.log.report(f"server_info {decode.engine}", f"{type(e).__name__}: {e}")
                ok = False
                continue
            self.log.report(f"server_info {decode.engine}", None)
            if size is not None:
                graph.add_metric([decode.engine, decode.pair], size)
        out.extend([batches, running, step, graph])
        return ok
