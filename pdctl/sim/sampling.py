"""Sampling parameters applied to the fake model's text: stops, ignore_eos, seed, logprobs.

As sglang 0.5.23 ends and trims a request (`managers/schedule_batch.py`
Req.update_finish_state, `managers/detokenizer_manager.py` trim_matched_stop):
- A stop string ends the request as soon as the decoded output contains it: finish reason
  "stop", `matched` the string (the first of the list that occurs); the output is cut
  before it. A stream holds back text that may be the start of a stop string until it is
  known not to be (Req.check_match_stop_str_prefix).
- A token in `stop_token_ids` ends it: "stop", `matched` the token id; the token counts as
  generated but its text is trimmed. `ignore_eos` turns token stops off (stop strings still
  apply). A stop string found in the same token wins.
- `seed`: the text depends on the seed and the prompt only, so the same seed and prompt give
  the same text, also across servers and for each of n samples (real SGLang samples that
  way under --enable-deterministic-inference).
Logprobs are made up but well formed: each token is the likeliest of a distribution whose
probabilities sum below 1, drawn apart from the text so asking for them leaves it unchanged.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .model import FIRST_WORD_ID, VOCAB_SIZE, FakeText, token_text

EOS_TOKEN_ID = 2  # the fake tokenizer's eos: `matched` of a request that ended on its own

TopLogprob = tuple[float, int, str]  # SGLang's (logprob, token id, token text)


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True)
class Sample:
    """One generated token."""

    token_id: int
    piece: str  # the token's text
    visible: str  # the output text this token releases
    logprob: float | None
    top: tuple[TopLogprob, ...]
    matched: int | str | None  # the stop string or stop token id it hit


class Sampler:
    def __init__(self, params: SamplingParams, seed: int, key: str) -> None:
        self.params = params
        self._words = FakeText(seed, key)
        self._lp = random.Random(f"logprobs:{seed}:{key}")
        # Text not shown yet because it may start a stop string. Shown text never ends in
        # such a start, so a stop can only begin in here: the search stays this short.
        self._held = ""

    def next(self) -> Sample:
        token_id = self._words.next_id()
        piece = token_text(token_id)
        logprob, top = self._logprobs(token_id) if self.params.logprobs else (None, ())
        text, self._held = self._held + piece, ""
        for stop in self.params.stop:
            pos = text.find(stop)
            if pos >= 0:
                return Sample(token_id, piece, text[:pos], logprob, top, stop)
        if not self.params.ignore_eos and token_id in self.params.stop_token_ids:
            return Sample(token_id, piece, text[: -len(piece)], logprob, top, token_id)
        keep = len(text) - self._stop_prefix_len(text)
        self._held = text[keep:]
        return Sample(token_id, piece, text[:keep], logprob, top, None)

    def flush(self) -> str:
        """The held-back text, when the request ends without reaching a stop."""
        held, self._held = self._held, ""
        return held

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that starts some stop string."""
        best = 0
        for stop in self.params.stop:
            for i in range(min(len(text), len(stop) - 1), best, -1):
                if text.endswith(stop[:i]):
                    best = i
                    break
        return best

    def _logprobs(self, token_id: int) -> tuple[float, tuple[TopLogprob, ...]]:
        rng = self._lp
        p = rng.uniform(0.45, 0.95)
        top: list[TopLogprob] = []
        k = min(self.params.top_logprobs, VOCAB_SIZE)
        if k > 0:
            top.append((math.log(p), token_id, token_text(token_id)))
            others = [FIRST_WORD_ID + i for i in range(VOCAB_SIZE) if FIRST_WORD_ID + i != token_id]
            rest = 1.0 - p  # below p: the sampled token stays the likeliest
            probs = []
            for _ in range(k - 1):
                probs.append(rest * rng.uniform(0.2, 0.6))
                rest -= probs[-1]
            for q, other in zip(
                sorted(probs, reverse=True), rng.sample(others, k - 1), strict=True
            ):
                top.append((math.log(q), other, token_text(other)))
        return math.log(p), tuple(top)
