"""How long agentrt keeps the event loop from other streams: the longest blocking gap.

A task ticks every 1 ms while agentrt works and records the longest interval between two ticks: how
long every other stream served by the same process would have waited. Two cases:

- one long SSE event (a big tool-call argument or text delta) of 1, 2 and 10 MB arriving in 1 KB reads
  (each read a network wait, as from a socket), through `OpenAIChatModel.stream`: the time to decode it
  and the longest gap. Decoding is linear when 10 MB take about ten times as long as 1 MB;
- the first request of each new model (an app that builds a model per user, with the user's own key)
  against a local server: the longest gap while 20 models make their first call, and when a 0.1 s
  deadline fires on the first call of the process (before: it waited for the client's construction,
  which loaded the CA bundle on the loop).

It prints, it never asserts.

    .venv/bin/python benchmarks/bench_loop.py [--quick]    (--quick: one run of each event size)
"""

from __future__ import annotations

import multiprocessing
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import orjson
from bench_http import serve  # benchmarks/ is on the path of a script run from it

from agentrt import ModelRequest, ModelSettings, ModelTimeoutError, TextDelta, UserMessage
from agentrt.models import OpenAIChatModel, RetryPolicy, complete

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))
MODELS = 20


class Ticker:
    """Ticks every millisecond; `gap` is the longest time between two ticks (the loop was busy)."""

    def __init__(self) -> None:
        self.gap = 0.0

    async def run(self) -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            self.gap = max(self.gap, now - last)
            last = now


async def with_ticker(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Seconds `work` took and the longest gap between ticks meanwhile."""
    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.sleep(0.005)
        ticker.gap = 0.0
        started = time.perf_counter()
        await work()
        took = time.perf_counter() - started
        tg.cancel_scope.cancel()
    return took, ticker.gap


class Reads(httpx.AsyncByteStream):
    """A body in `size`-byte reads, each a wait for the network (a checkpoint)."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size = body, size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body, size = self.body, self.size
        for at in range(0, len(body), size):
            await anyio.lowlevel.checkpoint()
            yield body[at : at + size]


def long_event(megabytes: int) -> bytes:
    text = "x" * (megabytes * 1024 * 1024)
    delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    return b"data: %s\n\ndata: %s\n\ndata: [DONE]\n\n" % (orjson.dumps(delta), orjson.dumps(stop))


async def one_long_event(runs: int) -> None:
    took_1mb = 0.0
    for megabytes in (1, 2, 10):
        body = long_event(megabytes)

        def answer(_: httpx.Request, body: bytes = body) -> httpx.Response:
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=Reads(body, 1024)
            )

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            model = OpenAIChatModel(
                "m", base_url="http://bench.test/v1", client=client, retry=RetryPolicy.never()
            )
            sizes: list[int] = []

            async def read(model: OpenAIChatModel = model, sizes: list[int] = sizes) -> None:
                size = 0
                async for chunk in model.stream(REQUEST):
                    if isinstance(chunk, TextDelta):
                        size += len(chunk.text)
                sizes.append(size)

            samples = [await with_ticker(read) for _ in range(runs)]
        assert sizes == [megabytes * 1024 * 1024] * runs
        took = min(took for took, _ in samples)
        gap = max(gap for _, gap in samples)
        took_1mb = took_1mb or took
        print(
            f"    one {megabytes:2} MB event in 1 KB reads: {took:7.3f} s ({took / took_1mb:5.1f}x 1 MB), "
            f"longest loop gap {gap * 1e3:7.1f} ms"
        )


async def first_requests(port: int) -> None:
    base = f"http://127.0.0.1:{port}/v1"
    settings = ModelSettings(max_tokens=1)

    async def per_user() -> None:
        for user in range(MODELS):
            async with OpenAIChatModel(
                "bench", base_url=base, api_key=f"key-{user}", settings=settings, retry=RetryPolicy.never()
            ) as model:
                await complete(model, REQUEST)

    took, gap = await with_ticker(per_user)
    print(
        f"    {MODELS} new models, one first call each: {took / MODELS * 1e3:6.2f} ms a call, "
        f"longest loop gap {gap * 1e3:6.1f} ms"
    )


async def deadline_on_a_first_call(silent: int) -> None:
    # A server that accepts connections (the kernel does) and never answers.
    model = OpenAIChatModel("bench", base_url=f"http://127.0.0.1:{silent}/v1", retry=RetryPolicy.never())
    started = anyio.current_time()
    request = ModelRequest(messages=REQUEST.messages, deadline=started + 0.1)
    try:
        await complete(model, request)
    except ModelTimeoutError:
        pass
    fired = anyio.current_time() - started
    await model.aclose()
    print(f"    a 0.1 s deadline on the process's first call fired after {fired * 1e3:6.1f} ms")


async def measure(port: int, silent: int, first: bool, runs: int) -> None:
    if first:
        await deadline_on_a_first_call(silent)
    await first_requests(port)
    await one_long_event(runs)


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    server = multiprocessing.Process(target=serve, args=(sock,), daemon=True)
    server.start()
    try:
        print("the event loop's longest blocking gap (a task ticking every 1 ms)")
        for i, backend in enumerate(("asyncio", "trio")):
            print(f"  {backend}")
            runs = 1 if "--quick" in sys.argv else 5  # the time is the best run's; the gap the worst's
            anyio.run(measure, sock.getsockname()[1], silent.getsockname()[1], i == 0, runs, backend=backend)
    finally:
        server.terminate()
        server.join()
        silent.close()


if __name__ == "__main__":
    main()
