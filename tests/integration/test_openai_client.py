"""The official `openai` client through the real gateway (smg) to a simulated PD pair:
n, logprobs, stop, ignore_eos and seed behave as SGLang 0.5.23 answers them, whole and
streamed. Engine time runs 20x faster (conftest.FAST_SIM_ENV); every call has a timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from pdctl.testing.stack import PDStack

pytestmark = pytest.mark.gateway

TIMEOUT = 30
MESSAGES: Any = [{"role": "user", "content": "tell me a story"}]


@pytest.fixture
def client(pd_stack: PDStack) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=f"{pd_stack.url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    ) as c:
        yield c


def chat_stream(client: OpenAI, **kw: Any) -> tuple[dict[int, str], dict[int, Any], Any]:
    """Per choice index: the streamed text and the finishing chunk choice; the usage."""
    texts: dict[int, str] = {}
    finals: dict[int, Any] = {}
    usage = None
    stream = client.chat.completions.create(
        model="sim",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **kw,
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason is not None:
                finals[c.index] = c
    return texts, finals, usage


def test_n_gives_n_choices(client: OpenAI) -> None:
    r = client.chat.completions.create(model="sim", messages=MESSAGES, n=2, max_tokens=5)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(len((c.message.content or "").split()) == 5 for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 10

    texts, finals, usage = chat_stream(client, n=2, max_tokens=4)
    assert sorted(texts) == [0, 1] and all(len(t.split()) == 4 for t in texts.values())
    assert {i: f.finish_reason for i, f in finals.items()} == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 8

    c = client.completions.create(model="sim", prompt="once upon", n=2, max_tokens=3)
    assert [x.index for x in c.choices] == [0, 1]
    assert all(len(x.text.split()) == 3 for x in c.choices)


def test_logprobs(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="sim", messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=2
    )
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    assert all(t.bytes == list(t.token.encode()) for t in content)

    stream = client.chat.completions.create(
        model="sim", messages=MESSAGES, max_tokens=4, logprobs=True, stream=True
    )
    streamed = [
        t for chunk in stream for c in chunk.choices if c.logprobs and c.logprobs.content
        for t in c.logprobs.content
    ]  # fmt: skip
    assert len(streamed) == 4

    comp = client.completions.create(model="sim", prompt="hi", max_tokens=3, logprobs=1)
    lp = comp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == comp.choices[0].text
    assert [len(d) for d in lp.top_logprobs] == [1, 1, 1]


def test_stop_and_seed(client: OpenAI) -> None:
    def once(**kw: Any) -> Any:
        return client.chat.completions.create(
            model="sim", messages=MESSAGES, max_tokens=10, seed=21, **kw
        ).choices[0]

    free = once()
    assert once().message.content == free.message.content  # same seed, same prompt
    text = free.message.content
    assert text is not None and free.finish_reason == "length"
    other = client.chat.completions.create(
        model="sim", messages=MESSAGES, max_tokens=10, seed=22
    ).choices[0]
    assert other.message.content != text

    stop = text.split()[3]
    stopped = once(stop=[stop])
    assert stopped.message.content == text[: text.find(stop)]
    assert stop not in (stopped.message.content or "")
    assert (stopped.finish_reason, getattr(stopped, "matched_stop", None)) == ("stop", stop)

    texts, finals, _ = chat_stream(client, max_tokens=10, seed=21, stop=[stop])
    assert texts[0] == text[: text.find(stop)]
    assert finals[0].finish_reason == "stop"
    texts, _, _ = chat_stream(client, max_tokens=10, seed=21)
    assert texts[0] == text


def test_ignore_eos_runs_to_max_tokens(client: OpenAI) -> None:
    # Without max_tokens the fake model ends on its own ("stop", the eos id matched).
    natural = client.chat.completions.create(model="sim", messages=MESSAGES)
    assert natural.choices[0].finish_reason == "stop"
    assert getattr(natural.choices[0], "matched_stop", None) == 2

    r = client.chat.completions.create(
        model="sim", messages=MESSAGES, max_tokens=9, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 9
    _, finals, usage = chat_stream(client, max_tokens=9, extra_body={"ignore_eos": True})
    assert finals[0].finish_reason == "length"
    assert usage is not None and usage.completion_tokens == 9
