"""An agentrt SSE endpoint served by uvicorn, for the tests over real HTTP (tests/test_sse_server.py).

`POST /tokens` streams as many tokens as its question says, from a model in memory. `POST /ask`
streams `Desk.ask` over SSE; its model is the OpenAI-compatible test server at the URL
given as the second argument (tests/servers/openai_app.py), asked with the header `x-test-stream:
<id>` taken from the request's own `x-test-stream` header, so that a test can ask that server when
the upstream response ended.

Run as `python sse_app.py <fd> <upstream base URL>` to serve on an already listening socket inherited
as `<fd>`.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import Capabilities, FinishReason, ModelRequest, TextDelta, TokenStream
from agentrt.models import Finish, ModelChunk, OpenAIChatModel, RetryPolicy


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


def app(upstream: str) -> Starlette:
    services: dict[str, Desk] = {}

    def service(stream_id: str) -> Desk:
        # One model per watched stream id: the id goes upstream as a header.
        if stream_id not in services:
            model = OpenAIChatModel(
                "echo",
                base_url=upstream,
                api_key="test-key",
                retry=RetryPolicy(max_attempts=1),
                headers={"x-test-stream": stream_id},
            )
            services[stream_id] = agentrt.build(Desk, model=model)
        return services[stream_id]

    async def ask(request):  # type: ignore[no-untyped-def]
        handler = agentrt.sse.endpoint(service(request.headers.get("x-test-stream", "-")).ask, ping=1)
        return await handler(request)

    tokens = agentrt.sse.endpoint(agentrt.build(Desk, model=Counting()).ask)
    return Starlette(
        routes=[Route("/ask", ask, methods=["POST"]), Route("/tokens", tokens, methods=["POST"])]
    )


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(sys.argv[2]), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])
