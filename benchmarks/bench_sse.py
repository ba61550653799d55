"""An SSE endpoint under load: 100 clients at once, each reading a 1,000-token stream, from
`agentrt.sse.endpoint` and from raw sse-starlette over a plain async generator that sends the same
events (the floor), both served by uvicorn in a child process on loopback.

    .venv/bin/python benchmarks/bench_sse.py
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from typing import TYPE_CHECKING

import anyio
import httpx
import orjson
import uvicorn
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import Capabilities, FinishReason, ModelRequest, TextDelta, TokenStream
from agentrt.models import Finish, ModelChunk

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request

CLIENTS = 100
TOKENS = 1_000


class Desk:
    async def ask(self, question: str) -> TokenStream: ...


class Counting:
    """Streams as many tokens as the user message says, from memory."""

    name = "counting"
    capabilities = Capabilities(handles_deadline=True)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for index in range(int(request.messages[-1].text or "0")):
            yield TextDelta(f"t{index} ")
        yield Finish(FinishReason.STOP)


async def raw(request: Request) -> EventSourceResponse:
    count = int(orjson.loads(await request.body())["question"])

    async def events() -> AsyncIterator[ServerSentEvent]:
        for index in range(count):
            data = orjson.dumps({"text": f"t{index} "}).decode()
            yield ServerSentEvent(data=data, event="token", id=str(index + 1))
        done = orjson.dumps({"text": "", "value": None}).decode()
        yield ServerSentEvent(data=done, event="done", id=str(count + 1))

    return EventSourceResponse(events(), ping=15)


def serve(sock: socket.socket) -> None:
    app = Starlette(
        routes=[
            Route(
                "/agentrt", agentrt.sse.endpoint(agentrt.build(Desk, model=Counting()).ask), methods=["POST"]
            ),
            Route("/raw", raw, methods=["POST"]),
        ]
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


async def load(base: str, path: str) -> float:
    """Seconds for CLIENTS clients at once to read a TOKENS-token stream each (the best of three)."""
    best = float("inf")
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for _ in range(3):
            started = time.perf_counter()
            async with anyio.create_task_group() as group:
                for _ in range(CLIENTS):
                    group.start_soon(read, client, f"{base}{path}")
            best = min(best, time.perf_counter() - started)
    return best


async def read(client: httpx.AsyncClient, url: str) -> None:
    response = await client.post(url, json={"question": str(TOKENS)})
    assert response.status_code == 200
    assert response.text.count("event: token") == TOKENS


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = multiprocessing.Process(target=serve, args=(sock,), daemon=True)
    server.start()
    try:
        print(f"SSE under load: {CLIENTS} clients at once, {TOKENS} tokens each, uvicorn on loopback")
        floor = anyio.run(load, base, "/raw")
        ours = anyio.run(load, base, "/agentrt")
        print(f"  raw sse-starlette, plain generator: {floor:6.2f} s")
        print(f"  agentrt.sse.endpoint             : {ours:6.2f} s   ({ours / floor:.2f}x)")
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
