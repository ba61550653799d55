"""Many concurrent streams from one process: CPU per token, agentrt against plain httpx.

The local OpenAI-compatible server of `bench_http.py` (its own process, so that its CPU is not counted)
streams N one-token events per call. Both clients start all streams at once: plain httpx with a pool as
large as the number of streams (it needs no queue; 100 connections kept alive), agentrt with its own
client (1,000 connections, requests beyond them waiting in agentrt's FIFO admission). Prints, per
client, the client process's CPU time per streamed token, the wall time, and the loop's longest
blocking gap (a task ticking every 1 ms records the longest interval between its ticks). The target:
agentrt at most 1.2x plain httpx's CPU per token, at 1,000 and at 10,000 streams. It prints, it never
asserts.

    .venv/bin/python benchmarks/bench_concurrency.py [STREAMS:TOKENS ...] [--backend asyncio|trio]
        [--clients httpx|agentrt]

The default runs 1,000 streams of 200 tokens and 10,000 streams of 20 tokens, on asyncio then trio.
10,000 streams need about 20,000 file descriptors in all (`ulimit -n`).
"""

from __future__ import annotations

import multiprocessing
import resource
import socket
import sys
import time
from functools import partial
from typing import TYPE_CHECKING

import anyio
import httpx
from bench_http import plain, serve  # benchmarks/ is on the path of a script run from it

import agentrt
from agentrt import ModelSettings, TokenStream
from agentrt.models import OpenAIChatModel, RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


class Service:
    async def stream(self, question: str) -> TokenStream: ...


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


async def measured(work: Callable[[], Awaitable[int]]) -> tuple[float, float, float, int]:
    """CPU seconds, wall seconds, longest loop gap, and tokens streamed by `work`."""
    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.sleep(0.01)
        cpu, wall = time.process_time(), time.perf_counter()
        tokens = await work()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        tg.cancel_scope.cancel()
    return cpu, wall, ticker.gap, tokens


async def raw(base: str, streams: int, tokens: int) -> int:
    url = f"{base}/chat/completions"
    # Keep-alive as agentrt's: httpcore walks its idle connections for each of them at every request
    # and release, so 1,000 idle connections kept alive cost three times the CPU of all the streaming.
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=100)
    texts: list[str] = []
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:

        async def one() -> None:
            texts.append(await plain(client, url, tokens))

        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
    return sum(text.count(" tok") for text in texts)


async def through_agentrt(base: str, streams: int, tokens: int) -> int:
    model = OpenAIChatModel(
        "bench",
        base_url=base,
        api_key="x",
        timeout=600,
        retry=RetryPolicy.never(),
        settings=ModelSettings(max_tokens=tokens),
    )
    service = agentrt.build(Service, model=model)
    count = 0
    async with model:

        async def one() -> None:
            nonlocal count
            async for _ in await service.stream("hi"):
                count += 1

        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
    return count


async def measure(port: int, runs: list[tuple[int, int]], clients: list[str]) -> None:
    base = f"http://127.0.0.1:{port}/v1"
    await raw(base, 10, 10)  # warm up: imports, the SSL context, the server's caches
    await through_agentrt(base, 10, 10)
    for streams, tokens in runs:
        rows = {}
        for name, client in (("plain httpx", raw), ("agentrt", through_agentrt)):
            if name.split()[-1] not in clients:
                continue
            cpu, wall, gap, count = await measured(partial(client, base, streams, tokens))
            assert count == streams * tokens, (name, count)
            rows[name] = cpu / count
            print(
                f"    {streams:6,} streams x {tokens:3} tokens  {name:11}: "
                f"{cpu / count * 1e6:6.2f} µs CPU a token, {wall:6.2f} s wall, "
                f"longest loop gap {gap * 1e3:6.1f} ms"
            )
        if len(rows) == 2:
            print(
                f"    {'':27}agentrt / plain httpx: {rows['agentrt'] / rows['plain httpx']:.2f}x CPU a token"
            )


def main() -> None:
    args = sys.argv[1:]
    options = {"--backend": "asyncio,trio", "--clients": "httpx,agentrt"}
    for option in options:
        if option in args:
            at = args.index(option)
            options[option] = args[at + 1]
            del args[at : at + 2]
    backends, clients = options["--backend"].split(","), options["--clients"].split(",")
    runs = [tuple(int(n) for n in arg.split(":")) for arg in args] or [(1000, 200), (10_000, 20)]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    port = sock.getsockname()[1]
    server = multiprocessing.Process(target=serve, args=(sock,), daemon=True)
    server.start()
    try:
        print(f"concurrent streams from one process, local server on loopback (file limit {hard:,})")
        for backend in backends:
            print(f"  {backend}")
            anyio.run(measure, port, runs, clients, backend=backend)  # type: ignore[arg-type]
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
