"""Cost of the OpenAI adapter's stream decoding over a minimal httpx + orjson loop.

A 10,000-token streamed answer (OpenAI's SSE framing, recorded chunk shape, `obfuscation` padding and
a usage chunk included) is held in memory and served by an `httpx.MockTransport`, one network read per
event. The same bytes are read twice: through `OpenAIChatModel.stream` (SSE decoder, chunk mapping,
model chunks out) and through the smallest loop that still yields every token's text (find the blank
lines, `orjson.loads`, index into the payload). Prints microseconds per token and the ratio for asyncio
and trio; the target is a ratio of at most 1.3. It prints, it never asserts.

    .venv/bin/python benchmarks/bench_decode.py
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import orjson

from agentrt import ModelRequest, TextDelta, UserMessage
from agentrt.models import OpenAIChatModel, RetryPolicy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine

TOKENS = 10_000
RUNS = 15
URL = "http://bench.test/v1/chat/completions"
REQUEST = ModelRequest(messages=(UserMessage.of("Write a long story."),))


def events(n: int) -> list[bytes]:
    """One SSE event per token, shaped like OpenAI's 2025 chunks."""
    head = {"id": "chatcmpl-C2P2HtMJhPkWjQ2adKerkdVilXmRL", "object": "chat.completion.chunk",
            "created": 1754688929, "model": "gpt-4o-2024-08-06", "service_tier": "default",
            "system_fingerprint": "fp_07871e2ad8"}  # fmt: skip

    def event(choices: list[Any], usage: Any = None, pad: str = "Qk5ENocFq") -> bytes:
        body = {**head, "choices": choices, "usage": usage, "obfuscation": pad}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    out = [
        event(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "", "refusal": None},
                    "finish_reason": None,
                }
            ]
        )
    ]
    for i in range(n):
        out.append(
            event(
                [{"index": 0, "delta": {"content": f" tok{i % 97}"}, "logprobs": None, "finish_reason": None}]
            )
        )
    out.append(event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]))
    out.append(event([], {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": n + 12}, ""))
    out.append(b"data: [DONE]\n\n")
    return out


class Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Reads(self.parts)


class _Reads:
    def __init__(self, parts: list[bytes]) -> None:
        self._parts = iter(parts)

    def __aiter__(self) -> _Reads:
        return self

    async def __anext__(self) -> bytes:
        try:
            return next(self._parts)
        except StopIteration:
            raise StopAsyncIteration from None


def transport(parts: list[bytes]) -> httpx.MockTransport:
    headers = {"content-type": "text/event-stream; charset=utf-8"}
    return httpx.MockTransport(lambda request: httpx.Response(200, headers=headers, stream=Body(parts)))


async def through_adapter(client: httpx.AsyncClient) -> int:
    model = OpenAIChatModel(
        "gpt-4o", base_url="http://bench.test/v1", client=client, retry=RetryPolicy.never()
    )
    texts: list[str] = []
    append = texts.append
    async for chunk in model.stream(REQUEST):
        if chunk.__class__ is TextDelta:
            append(chunk.text)  # type: ignore[union-attr]
    return len(texts)


async def minimal_loop(client: httpx.AsyncClient) -> int:
    texts: list[str] = []
    append = texts.append
    loads = orjson.loads
    async with client.stream("POST", URL, content=b"{}") as response:
        buffer = b""
        async for raw in response.aiter_bytes():
            buffer = buffer + raw if buffer else raw
            start = 0
            while (end := buffer.find(b"\n\n", start)) >= 0:
                data = buffer[start + 6 : end]
                start = end + 2
                if data == b"[DONE]":
                    continue
                choices = loads(data)["choices"]
                if choices:
                    content = choices[0]["delta"].get("content")
                    if content:
                        append(content)
            buffer = buffer[start:]
    return len(texts)


async def timed(run: Callable[[httpx.AsyncClient], Coroutine[Any, Any, int]], parts: list[bytes]) -> float:
    samples = []
    async with httpx.AsyncClient(transport=transport(parts)) as client:
        for _ in range(RUNS):
            start = time.perf_counter()
            count = await run(client)
            samples.append(time.perf_counter() - start)
            assert count == TOKENS, count
    return statistics.median(sorted(samples)[: RUNS // 2 + 1])


def reads_of(parts: list[bytes], size: int) -> list[bytes]:
    """The same body cut into network reads of `size` bytes (0: one event per read)."""
    if not size:
        return parts
    body = b"".join(parts)
    return [body[i : i + size] for i in range(0, len(body), size)]


async def main(backend: str, size: int) -> None:
    parts = reads_of(events(TOKENS), size)
    await timed(through_adapter, parts)  # warm up
    adapter = await timed(through_adapter, parts)
    baseline = await timed(minimal_loop, parts)
    reads = "one event a read" if not size else f"{size:>5}-byte reads "
    print(
        f"{backend:8} {reads}  adapter {adapter / TOKENS * 1e6:5.2f} µs/token   "
        f"httpx+orjson loop {baseline / TOKENS * 1e6:5.2f} µs/token   ratio {adapter / baseline:.2f}x"
    )


if __name__ == "__main__":
    best = RUNS // 2 + 1
    print(f"decoding a {TOKENS:,}-token OpenAI stream held in memory (median of the best {best} of {RUNS})")
    print("(a server that flushes every token gives one event a read; a client that falls behind reads")
    print(" several events at once, cut anywhere)")
    for size in (0, 1024, 16384):
        for backend in ("asyncio", "trio"):
            anyio.run(main, backend, size, backend=backend)
