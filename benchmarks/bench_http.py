"""agentrt against a local OpenAI-compatible server, next to a plain httpx + orjson client.

A minimal HTTP/1.1 server (its own process, asyncio streams) answers every chat completion with a
pre-built SSE stream of N one-token events, written event by event. Both clients talk to it over
loopback with keep-alive; the difference is what agentrt adds per call and per streamed token (its
service binding, pipeline, events, adapter, accounting). Prints milliseconds per call and microseconds
per token for asyncio and trio; compare with the brief's budget (0.2 ms a call, 10 µs a token).

    .venv/bin/python benchmarks/bench_http.py
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import statistics
import time
from typing import TYPE_CHECKING

import anyio
import httpx
import orjson

import agentrt
from agentrt import LifecycleEvent, TokenStream
from agentrt.models import ModelSettings, OpenAIChatModel, RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

CALLS = 300
TOKENS = 2000


def _event(delta: dict[str, object], finish: str | None = None) -> bytes:
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream(tokens: int) -> list[bytes]:
    events = [_event({"role": "assistant", "content": ""})]
    events += [_event({"content": f" tok{i}"}) for i in range(tokens)]
    events.append(_event({}, "stop"))
    events.append(b"data: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def serve(sock: socket.socket) -> None:
    cache: dict[int, list[bytes]] = {}
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = orjson.loads(await reader.readexactly(length))
                tokens = int(body.get("max_tokens", 1))
                chunks = cache.get(tokens) or cache.setdefault(tokens, _stream(tokens))
                writer.write(head)
                for chunk in chunks:
                    writer.write(chunk)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


async def plain(client: httpx.AsyncClient, url: str, tokens: int) -> str:
    """The floor: httpx streaming bytes, split on blank lines, orjson per event; nothing else."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["max_tokens"] = tokens
    parts: list[str] = []
    loads = orjson.loads
    async with client.stream("POST", url, content=orjson.dumps(body)) as response:
        buffer = b""
        async for raw in response.aiter_bytes():
            buffer = buffer + raw if buffer else raw
            start = 0
            while (end := buffer.find(b"\n\n", start)) >= 0:
                data = buffer[start + 6 : end]
                start = end + 2
                if data != b"[DONE]":
                    choices = loads(data)["choices"]
                    if choices and (content := choices[0]["delta"].get("content")):
                        parts.append(content)
            buffer = buffer[start:]
    return "".join(parts)


async def median_of(runs: int, body: Callable[[], Awaitable[object]]) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await body()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def measure(port: int) -> tuple[float, float]:
    base = f"http://127.0.0.1:{port}/v1"
    events: list[LifecycleEvent] = []
    async with httpx.AsyncClient(timeout=30) as client:
        one = OpenAIChatModel(
            "bench",
            base_url=base,
            api_key="x",
            client=client,
            retry=RetryPolicy.never(),
            settings=ModelSettings(max_tokens=1),
        )
        many = OpenAIChatModel(
            "bench",
            base_url=base,
            api_key="x",
            client=client,
            retry=RetryPolicy.never(),
            settings=ModelSettings(max_tokens=TOKENS),
        )
        ask = agentrt.build(Service, model=one, listeners=[events.append])
        stream = agentrt.build(Service, model=many, listeners=[events.append])
        url = f"{base}/chat/completions"

        async def plain_calls() -> None:
            for _ in range(CALLS):
                await plain(client, url, 1)

        async def agentrt_calls() -> None:
            for _ in range(CALLS):
                await ask.ask("hi")
            events.clear()

        async def plain_tokens() -> None:
            await plain(client, url, TOKENS)

        async def agentrt_tokens() -> None:
            async for _ in await stream.stream("hi"):
                pass
            events.clear()

        await plain_calls()  # warm up both paths and the connection pool
        await agentrt_calls()
        floor_call = await median_of(5, plain_calls) / CALLS
        call = await median_of(5, agentrt_calls) / CALLS
        floor_token = await median_of(9, plain_tokens) / TOKENS
        token = await median_of(9, agentrt_tokens) / TOKENS
    print(f"    plain httpx+orjson: {floor_call * 1e3:6.3f} ms a call, {floor_token * 1e6:5.2f} µs a token")
    print(f"    agentrt           : {call * 1e3:6.3f} ms a call, {token * 1e6:5.2f} µs a token")
    return call - floor_call, token - floor_token


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = multiprocessing.Process(target=serve, args=(sock,), daemon=True)
    server.start()
    try:
        print(
            f"agentrt over a local OpenAI-compatible server ({CALLS} one-token calls; "
            f"{TOKENS}-token streams; listeners on)"
        )
        for backend in ("asyncio", "trio"):
            print(f"  {backend}")
            call, token = anyio.run(measure, port, backend=backend)
            print(f"    agentrt adds      : {call * 1e3:6.3f} ms a call, {token * 1e6:5.2f} µs a token")
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
