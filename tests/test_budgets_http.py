"""Budgets and stream starts through the OpenAI-compatible adapter, over `httpx.MockTransport`.

`await service.stream(...)` returns once the model accepted the request, so a connection error, 401
or 429 is raised by that await; a deadline cuts a silent HTTP body and closes the response; a
`retry-after` longer than the time left ends the call at once with the rate-limit error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import orjson
import pytest

import agentrt
from agentrt import (
    AuthenticationError,
    Budget,
    BudgetExceededError,
    ModelConnectionError,
    RateLimitError,
    ServerError,
    TokenStream,
)
from agentrt.models import OpenAIChatModel, RetryPolicy

Handler = Callable[[httpx.Request], httpx.Response]


class Chat:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    payload = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class Body(httpx.AsyncByteStream):
    """A streamed body: `parts`, then (with `hang`) silence. Records whether httpx closed it."""

    def __init__(self, parts: list[bytes], *, hang: bool = False, fail: bool = False) -> None:
        self.parts = parts
        self.hang = hang
        self.fail = fail
        self.sent = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            self.sent += 1
            yield part
        if self.fail:
            raise httpx.ReadError("connection reset by peer")
        if self.hang:
            await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = orjson.dumps({"error": {"message": message, "type": "error", "code": None}})
    return httpx.Response(
        status, headers={"content-type": "application/json", **(headers or {})}, content=body
    )


async def service_over(
    handler: Handler, *, budget: Budget | None = None, retry: RetryPolicy | None = None
) -> tuple[Chat, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    model = OpenAIChatModel(
        "gpt-test",
        base_url="https://llm.test/v1",
        api_key="sk-test",
        client=client,
        retry=retry or RetryPolicy.never(),
    )
    return agentrt.build(Chat, model=model, budget=budget), client


# --- the stream starts at the await -------------------------------------------------------------


@pytest.mark.parametrize(
    ("respond", "error"),
    [
        (lambda request: error_response(401, "Incorrect API key provided"), AuthenticationError),
        (lambda request: error_response(429, "Rate limit reached", {"retry-after": "1"}), RateLimitError),
        (lambda request: error_response(500, "The server had an error"), ServerError),
    ],
)
async def test_await_stream_raises_the_request_s_failure(respond: Handler, error: type[Exception]) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return respond(request)

    service, client = await service_over(handler)
    async with client:
        with pytest.raises(error):
            await service.stream("hi")  # not the first step of the returned stream
    assert len(requests) == 1


async def test_await_stream_raises_a_connection_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    service, client = await service_over(handler)
    async with client:
        with pytest.raises(ModelConnectionError):
            await service.stream("hi")


async def test_await_stream_returns_once_the_response_started() -> None:
    body = Body([event({"role": "assistant", "content": "Hel"}), event({"content": "lo"})], fail=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    service, client = await service_over(handler)
    async with client:
        stream = await service.stream("hi")  # accepted: a failure after this is the stream's
        received: list[str] = []

        async def read() -> None:
            async for token in stream:
                received.append(token)

        with pytest.raises(ModelConnectionError):
            await read()
    assert received == ["Hel", "lo"]
    assert body.closed


# --- deadlines over HTTP ----------------------------------------------------------------------------


@pytest.mark.virtual_clock
@pytest.mark.parametrize("view", ["ask", "stream"])
async def test_a_silent_http_body_is_cut_at_the_deadline_and_closed(view: str) -> None:
    body = Body([event({"role": "assistant", "content": "Hel"})], hang=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    service, client = await service_over(handler, budget=Budget(seconds=12))
    start = anyio.current_time()

    async def call() -> None:
        if view == "ask":
            await service.ask("hi")
        else:
            async for _ in await service.stream("hi"):
                pass

    async with client:
        with anyio.fail_after(1000), pytest.raises(BudgetExceededError) as info:
            await call()
    assert anyio.current_time() - start == pytest.approx(12)
    assert info.value.limit == "seconds"
    assert info.value.partial.text == "Hel"
    assert body.closed


@pytest.mark.virtual_clock
async def test_a_retry_after_past_the_deadline_ends_the_call_at_once() -> None:
    requests: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(anyio.current_time())
        return error_response(429, "Rate limit reached", {"retry-after": "30"})

    service, client = await service_over(handler, budget=Budget(seconds=10), retry=RetryPolicy())
    start = anyio.current_time()
    async with client:
        with pytest.raises(RateLimitError):
            await service.ask("hi")
    assert anyio.current_time() - start == pytest.approx(0)
    assert len(requests) == 1


@pytest.mark.virtual_clock
async def test_a_retry_after_within_the_deadline_is_honoured() -> None:
    requests: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(anyio.current_time())
        if len(requests) == 1:
            return error_response(429, "Rate limit reached", {"retry-after": "3"})
        body = Body([event({"role": "assistant", "content": "ok"}, "stop"), b"data: [DONE]\n\n"])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    service, client = await service_over(handler, budget=Budget(seconds=10), retry=RetryPolicy())
    async with client:
        assert await service.ask("hi") == "ok"
    assert requests[1] - requests[0] == pytest.approx(3)


async def test_an_output_token_limit_closes_the_http_response() -> None:
    parts = [event({"role": "assistant", "content": ""})]
    parts += [event({"content": f"w{i:02d} "}) for i in range(40)]
    parts.append(event({}, "stop"))
    parts.append(b"data: [DONE]\n\n")
    body = Body(parts)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    service, client = await service_over(handler, budget=Budget(output_tokens=5))
    async with client:
        with pytest.raises(BudgetExceededError) as info:
            await service.ask("hi")
    assert info.value.partial.text == "".join(f"w{i:02d} " for i in range(6))
    assert body.closed


@pytest.mark.virtual_clock
async def test_a_body_held_open_after_done_does_not_outlast_the_deadline() -> None:
    # The answer is complete at [DONE]; the server keeps the body open. Its end is waited for (so
    # that the connection can be reused) at most half the time left: the answer returns before the
    # deadline.
    body = Body([event({"role": "assistant", "content": "ok"}, "stop"), b"data: [DONE]\n\n"], hang=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    service, client = await service_over(handler, budget=Budget(seconds=0.2))
    start = anyio.current_time()
    async with client:
        assert await service.ask("hi") == "ok"
    assert anyio.current_time() - start == pytest.approx(0.1)
    assert body.closed
