"""sglang's bench_serving, counting failures by pdctl's rule (pdctl/bench/stream.py).

    <SGLang venv python> judged_bench_serving.py <bench_serving arguments>

The sglang driver runs this instead of `python -m sglang.bench_serving`. bench_serving (sglang
0.5.23, `sglang/benchmark/serving.py`) counts a streamed request as completed whenever it
answered 200 and the connection closed cleanly: its chat parser skips a chunk without
`choices`, so an in-band `{"error": …}` passes, and a stream that ends before its finish
chunk is recorded with the asked length (`output_len` defaults to it when no usage arrives).

Here every streamed response is also read by `StreamCheck`: a request that carries an error,
ends without a finish reason or short of the tokens asked (bench_serving sends `ignore_eos`
unless --disable-ignore-eos) leaves bench_serving's request function with `success` False and
the reason as its `error`. bench_serving's own code then times, counts and writes the result
as it always does, so `completed` and every metric cover only the requests that passed.
The response is seen through aiohttp's request tracing (`on_request_end`), installed on the
sessions bench_serving opens; its request functions are wrapped, not replaced.

The judge adds `stream_options.include_usage` (unless the request body sets stream_options)
so tokens are counted by the server; bench_serving's completions parser indexes `choices[0]`
of every chunk, so the usage-only chunk is kept from it (it never asks for usage itself).

This runs in the SGLang venv, where pdctl is not installed: stream.py (standard library only)
is loaded from this file's folder. The failures of the measured requests, first ones first,
go to `<--output-file>.failures.json`.
"""

from __future__ import annotations

import contextvars
import importlib
import importlib.util
import json
import sys
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
KEEP_ERRORS = 5


def _load_stream() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("pdctl_bench_stream", HERE / "stream.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


stream = _load_stream()


@dataclass
class Judged:
    check: Any  # stream.StreamCheck
    hide_usage: bool  # keep usage-only chunks from a parser that cannot take them
    streamed: bool = False


CURRENT: contextvars.ContextVar[Judged | None] = contextvars.ContextVar("judged", default=None)


class JudgedContent:
    """A response's `content` as bench_serving iterates it, every SSE payload fed to the check."""

    def __init__(self, content: aiohttp.StreamReader, judged: Judged) -> None:
        self._content = content
        self._judged = judged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._content, name)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        async for line in self._content:
            payload = stream.sse_payload(line)
            if payload is not None:
                data = self._judged.check.feed(payload)
                if self._judged.hide_usage and data is not None and not data.get("choices"):
                    continue
            yield line


async def _on_request_end(
    _session: aiohttp.ClientSession, _ctx: Any, params: aiohttp.TraceRequestEndParams
) -> None:
    judged = CURRENT.get()  # the request function's task runs this hook
    if judged is not None and params.response.status == 200:
        judged.streamed = True
        params.response.content = JudgedContent(params.response.content, judged)  # type: ignore[assignment]


TRACE = aiohttp.TraceConfig()
TRACE.on_request_end.append(_on_request_end)


class TracedAiohttp(types.ModuleType):
    """bench_serving's `aiohttp`: sessions it opens carry the judge's trace."""

    def __getattr__(self, name: str) -> Any:
        return getattr(aiohttp, name)

    @staticmethod
    def ClientSession(*args: Any, **kwargs: Any) -> aiohttp.ClientSession:
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or ()), TRACE]
        return aiohttp.ClientSession(*args, **kwargs)


RequestFunc = Callable[..., Awaitable[Any]]


@dataclass
class Outcomes:
    """Failures of the measured requests: bench_serving's warm-up ones come first."""

    skip: int  # warm-up requests still to come
    errors: list[str]

    def add(self, out: Any) -> None:
        if self.skip > 0:
            self.skip -= 1
        elif not out.success and len(self.errors) < KEEP_ERRORS:
            self.errors.append(str(out.error)[-500:])


def judged(
    serving: Any, request_func: RequestFunc, hide_usage: bool, outcomes: Outcomes
) -> RequestFunc:
    async def run(request_func_input: Any, pbar: Any = None) -> Any:
        body = request_func_input.extra_request_body
        body.setdefault("stream_options", {"include_usage": True})
        ignore_eos = body.get("ignore_eos", not getattr(serving.args, "disable_ignore_eos", False))
        judge = Judged(
            stream.StreamCheck(request_func_input.output_len if ignore_eos else 0), hide_usage
        )
        token = CURRENT.set(judge)
        try:
            out = await request_func(request_func_input=request_func_input, pbar=pbar)
        finally:
            CURRENT.reset(token)
        # The rule's reason wins over bench_serving's parser error on the same stream.
        if judge.streamed and (why := judge.check.failure()):
            out.success, out.error = False, why
        outcomes.add(out)
        return out

    return run


def bench_serving() -> Any:  # a module whose globals are patched
    for name in ("sglang.benchmark.serving", "sglang.bench_serving"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(module, "cli_main") and hasattr(module, "ASYNC_REQUEST_FUNCS"):
            return module
    raise SystemExit("no sglang bench_serving with cli_main (sglang 0.5.23 has one) to run")


def main(argv: list[str]) -> None:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # no pdctl shadows
    serving = bench_serving()
    outcomes = Outcomes(skip=0, errors=[])
    funcs = serving.ASYNC_REQUEST_FUNCS
    completions = getattr(serving, "async_request_openai_completions", None)
    for backend, func in list(funcs.items()):
        funcs[backend] = judged(serving, func, func is completions, outcomes)
    serving.aiohttp = TracedAiohttp("aiohttp")  # its module global
    sys.argv = ["bench_serving", *argv]
    original_run = serving.run_benchmark

    def run_benchmark(args: Any) -> Any:
        outcomes.skip = int(getattr(args, "warmup_requests", 1))
        return original_run(args)

    serving.run_benchmark = run_benchmark  # cli_main calls it by name
    serving.cli_main()
    output_file = getattr(serving.args, "output_file", None)
    if output_file:
        failures = Path(f"{output_file}.failures.json")
        failures.write_text(json.dumps({"errors": outcomes.errors}))


if __name__ == "__main__":
    main(sys.argv[1:])
