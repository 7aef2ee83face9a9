"""Random prompts of a given length, the same for a given seed on every host.

bench_serving's random dataset samples token ids from the model's tokenizer; without one we
use three-letter English words, each one token for BPE tokenizers and four characters with its
space, which is also what pdctl.sim's tokenizer (ceil(chars / 4)) counts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_WORD_LIST = (
    "the and for are but not you all any can had her was one our out day get has him his how "
    "man new now old see two way who boy did its let put say she too use end far big few run"
)
WORDS = tuple(_WORD_LIST.split(" "))


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_len: int
    output_len: int


def _length(rng: random.Random, full: int, range_ratio: float) -> int:
    """bench_serving's compute_random_lens: uniform in [max(full * ratio, 1), full]."""
    return rng.randint(max(int(full * range_ratio), 1), full)


def random_prompts(
    n: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[Prompt]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        p_len = _length(rng, input_len, range_ratio)
        o_len = _length(rng, output_len, range_ratio)
        text = " ".join(rng.choice(WORDS) for _ in range(p_len))
        prompts.append(Prompt(text, p_len, o_len))
    return prompts
