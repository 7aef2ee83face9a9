"""pdstack.decode: eager (graph-less) decode batches, retractions, and the latency SLOs."""

from __future__ import annotations

from monitoring.alerts.common import Area, Rule, label, value
from monitoring.queries import series

GROUP = "pdstack.decode"


def rules(area: Area) -> list[Rule]:
    s, t, w = area.sel, area.th, area.window
    running = series("sglang:num_running_reqs", s.engines, 'engine_type="decode"')
    graph_max = series("pdstack_decode_cuda_graph_max_batch_size", s.exporter)
    return [
        # Batches larger than the largest captured CUDA graph run eager: slow, and their
        # temporaries can OOM the server.
        area.alert(
            "PDDecodeEagerFallback",
            f"engine:sglang_decode_eager_passes:rate{w} > 0 or on (engine)"
            f" max by (pair, role, engine) ({running})"
            f" > on (engine) group_left max by (engine) ({graph_max})",
            t.eager_for,
            "warning",
            "Decode runs batches outside its CUDA graphs (eager mode).",
            f"Decode engine {label('engine')} of pair {label('pair')} runs eager batches"
            f" (value {value('humanize')}): running requests exceed the largest captured graph.",
        ),
        # Decode ran out of KV for running requests and sent some back to the queue: the
        # classic sign of decode memory pressure (too many requests or too long outputs).
        area.alert(
            "PDDecodeRetractions",
            f"engine:sglang_retracted_requests:rate{w} > 0",
            t.retract_for,
            "warning",
            "Decode retracts running requests (KV memory pressure).",
            f"Engine {label('engine')} of pair {label('pair')} retracts"
            f" {value('humanize')} requests/s; their work is redone and latency suffers.",
        ),
        area.alert(
            "PDTTFTSLOBreach",
            f"pair:sglang_time_to_first_token_seconds:p95_{w} > {t.ttft_p95_seconds}",
            t.slo_for,
            "warning",
            "Time to first token is above its SLO.",
            f"p95 TTFT of pair {label('pair')} is {value('humanizeDuration')}"
            f" (SLO {t.ttft_p95_seconds}s).",
        ),
        area.alert(
            "PDITLSLOBreach",
            f"pair:sglang_inter_token_latency_seconds:p95_{w} > {t.itl_p95_seconds}",
            t.slo_for,
            "warning",
            "Inter-token latency is above its SLO.",
            f"p95 inter-token latency of pair {label('pair')} is"
            f" {value('humanizeDuration')} (SLO {t.itl_p95_seconds}s).",
        ),
    ]
