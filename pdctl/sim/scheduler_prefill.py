"""A prefill server's scheduler (SGLang's SchedulerDisaggregationPrefillMixin).

Queues: `bootstrap_queue` (rooms waiting for their decode to bootstrap them) and `inflight`
(prefilled, KV in transfer). It reserves the prompt only, freed after the transfer, and
answers with the first token once the KV reached the decode.

It honours SGLang's test hook SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB as
`disaggregation/prefill.py` does (should_force_retry, optimistic_release_and_requeue): the first
prefill of a request whose rid hashes below the probability is thrown away and the request
queued again. It yields (logged, counted in `num_prefill_retries_total` by every rank, back at
the head of the queue) while `--optimistic-prefill-attempts` has one left, else falls back to
the bootstrap queue; either way it is prefilled once more, and never forced again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Iterator

from .args import SimConfig
from .logs import PrefillStats
from .metrics import SimMetrics
from .req import Req
from .scheduler import DisaggQueues, LoadQueues, Scheduler


def forces_prefill_retry(rid: str, prob: float) -> bool:
    """prefill.should_force_retry's draw: the first 8 bytes of sha256(rid) below prob * 2**64,
    so the same rids retry on every run."""
    digest = hashlib.sha256(rid.encode()).digest()
    return prob > 0 and int.from_bytes(digest[:8], "big") < prob * 2**64


class PrefillScheduler(Scheduler):
    def __init__(self, cfg: SimConfig, metrics: SimMetrics, log: logging.Logger) -> None:
        super().__init__(cfg, metrics, log)
        self.bootstrap_queue: set[Req] = set()
        self.inflight: set[Req] = set()
        self._forced = 0  # forced retries of the last prefill pass

    @contextlib.contextmanager
    def in_bootstrap_queue(self, req: Req) -> Iterator[None]:
        """The request waits for its decode's bootstrap (PrefillBootstrapQueue)."""
        self.bootstrap_queue.add(req)
        try:
            yield
        finally:
            self.bootstrap_queue.discard(req)

    def complete_prefill(self, req: Req) -> None:
        """The KV reached the decode; answer with the first token."""
        if not req.done:
            req.max_new_tokens = 1
            self._emit(req, req.text.next())

    def disagg_queues(self) -> DisaggQueues:
        return DisaggQueues(bootstrap=len(self.bootstrap_queue), inflight=len(self.inflight))

    def load_queues(self) -> LoadQueues:
        queued = [*self.waiting, *self.bootstrap_queue]
        return LoadQueues(queued, list(queued))

    def _occupied(self) -> int:
        return len(self.running) + len(self.inflight)

    def _held(self) -> list[Req]:
        return list(self.inflight)

    def _kv_need(self, req: Req) -> int:
        return req.prompt_tokens

    def _admitted(self, req: Req) -> None:
        self.inflight.add(req)

    def _leave_queues(self, req: Req) -> None:
        super()._leave_queues(req)
        self.inflight.discard(req)
        self.bootstrap_queue.discard(req)

    def _utilization(self) -> float:
        return -1.0

    def _process_prefill_result(self, batch: list[Req], now: float) -> list[Req]:
        """process_batch_result_disagg_prefill: the KV goes to the decode (the leg sends it);
        a forced retry is requeued instead. Health checks have no peer: they answer here."""
        self._forced = 0
        to_bootstrap: list[Req] = []
        for req in batch:
            req.prefill_attempts += 1
            if req.prefill_attempts == 1 and forces_prefill_retry(
                req.rid, self.cfg.knobs.force_prefill_retry_prob
            ):
                self._forced += 1
                if not self._requeue_optimistic(req):
                    to_bootstrap.append(req)
                continue
            self._observe_prefill_forward(req, now)
            if req.fake_bootstrap:
                self._emit(req, req.text.next())
            else:
                req.prefilled.set()
        return to_bootstrap

    def _prefill_stats(self, stats: PrefillStats, to_bootstrap: list[Req]) -> PrefillStats:
        return dataclasses.replace(
            stats,
            running_req=0,
            bootstrap_req=len(self.bootstrap_queue) + len(to_bootstrap),
            inflight_req=len(self.inflight),
            # requests whose bootstrap is still pending after the pass: the forced ones
            optimistic_req=self._forced,
        )

    def _requeue_optimistic(self, req: Req) -> bool:
        """optimistic_release_and_requeue: release the request's KV; with an attempt left it
        yields to the head of the queue (True), else it falls back to the bootstrap queue."""
        self.inflight.discard(req)
        self.pool.release(req.reserved)
        req.reserved = 0
        attempts = self.cfg.optimistic_prefill_attempts
        if (
            req.prefill_attempts >= attempts
            and self.cfg.args.disaggregation_decode_allocation_policy != "prefill_complete"
        ):
            self.log.info(
                "Req %s exhausted optimistic prefill attempts falling back to bootstrap queue",
                req.rid,
            )
            return False
        req.prefill_attempts += 1
        self.log.info(
            "Req %s optimistic prefill yielded (%d/%d attempts used)",
            req.rid,
            req.prefill_attempts,
            attempts,
        )
        self.metrics.rank_inc(self.metrics.num_prefill_retries)
        self.waiting.appendleft(req)
        return True
