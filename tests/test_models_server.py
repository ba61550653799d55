"""Against a real HTTP server on loopback: a small OpenAI-compatible app served by uvicorn in a
separate process (tests/servers/openai_app.py), on a socket this test opened."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from served import serve

import agentrt
from agentrt import (
    AuthenticationError,
    FinishReason,
    ModelConnectionError,
    ModelRequest,
    TextDelta,
    TokenStream,
    UserMessage,
)
from agentrt.models import OpenAIChatModel, RetryPolicy, complete

APP = Path(__file__).parent / "servers" / "openai_app.py"
KEY = "test-key"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The base URL of the app, served in a child process (see `served.serve`)."""
    yield from serve(APP)


def model(base_url: str, **options: object) -> OpenAIChatModel:
    options.setdefault("api_key", KEY)
    options.setdefault("timeout", 20.0)
    return OpenAIChatModel("echo", base_url=base_url, **options)  # type: ignore[arg-type]


def ask(text: str) -> ModelRequest:
    return ModelRequest(messages=(UserMessage.of(text),))


async def test_streamed_and_whole_answers_over_http(server: str) -> None:
    async with model(server) as streamed, model(server, streaming=False) as whole:
        first = await complete(streamed, ask("hello there"))
        second = await complete(whole, ask("hello there"))
    assert first.message.text == second.message.text == "You said: hello there"
    assert first.usage == second.usage
    assert not first.usage.estimated
    assert (first.usage.input_tokens, first.usage.output_tokens) == (2, 4)
    assert first.finish_reason is second.finish_reason is FinishReason.STOP
    assert first.model == "echo-1"


async def test_a_service_streams_tokens_from_the_server(server: str) -> None:
    class Echo:
        async def stream(self, text: str) -> TokenStream: ...

    async with model(server) as echo_model:
        service = agentrt.build(Echo, model=echo_model)
        stream = await service.stream("one two three")
        tokens = [token async for token in stream]
    assert tokens == ["You", " said:", " one", " two", " three"]


async def test_a_wrong_key_is_an_authentication_error(server: str) -> None:
    async with model(server, api_key="sk-wrong-SECRET") as bad:
        with pytest.raises(AuthenticationError) as info:
            await complete(bad, ask("hi"))
    assert info.value.status == 401
    assert info.value.request_id == "req_invalid_api_key"
    assert server in str(info.value)
    assert "sk-wrong-SECRET" not in str(info.value)


async def test_a_429_is_retried_over_the_wire(server: str) -> None:
    async with model(server) as retrying:
        response = await complete(retrying, ask("rate limit me"))
    assert response.message.text == "You said: rate limit me"


async def test_cancelling_mid_stream_closes_the_connection(server: str) -> None:
    stream_id = f"hang-{anyio.current_time()}"
    async with model(server, headers={"x-test-stream": stream_id}) as hanging:
        received: list[str] = []
        with anyio.CancelScope() as scope:
            async for chunk in hanging.stream(ask("hang")):
                if isinstance(chunk, TextDelta):
                    received.append(chunk.text)
                    if len(received) == 2:
                        scope.cancel()
        assert scope.cancelled_caught
        # Chunks already read in the same network read may still arrive before the next checkpoint.
        assert received[:2] == ["You", " said:"]
    # The server sees its response end (the client went away); it tells us when, no polling.
    async with httpx.AsyncClient(timeout=20) as client:
        answer = await client.get(f"{server}/streams/{stream_id}/closed")
    assert answer.json() == {"closed": True}


async def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        refused = model(f"http://127.0.0.1:{port}/v1", retry=RetryPolicy(max_attempts=2, initial_delay=0))
        with pytest.raises(ModelConnectionError) as info:
            await complete(refused, ask("hi"))
        await refused.aclose()
    assert info.value.endpoint == f"http://127.0.0.1:{port}/v1/chat/completions"
