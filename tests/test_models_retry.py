"""Retries (acceptance item 3): only before a response started, honouring retry-after where it
applies, bounded, on virtual time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import httpx
import orjson
import pytest
from adapter_failures import JSON, raised_by, serving
from cassettes import Parts, load
from hypothesis import example, given, settings
from hypothesis import strategies as st

import agentrt
from agentrt import (
    ConfigurationError,
    ModelConnectionError,
    ModelError,
    ModelRequest,
    ModelTimeoutError,
    OverloadedError,
    RateLimitError,
    ServerError,
    TextDelta,
    UserMessage,
)
from agentrt.models import (
    HttpErrorEvent,
    HttpResponseEvent,
    ModelChunk,
    OpenAIChatModel,
    RetryPolicy,
    complete,
)
from agentrt.models._failures import parse_retry_after

REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))
STREAM = load("04")  # a recorded streamed answer
ANSWER = "".join(
    orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    for line in STREAM.body.decode().split("\n")
    if line.startswith("data: {") and orjson.loads(line[6:])["choices"]
)


class Server:
    """Answers each request with the next scripted response; records when each request came."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(anyio.current_time())
        response = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(response, Exception):
            raise response
        return response

    @property
    def waits(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


def streamed(status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers={**STREAM.headers, **(headers or {})}, stream=Parts([STREAM.body]))


def failure(
    status: int, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None
) -> httpx.Response:
    content = orjson.dumps(body or {"error": {"message": f"status {status}", "type": "server_error"}})
    return httpx.Response(
        status, headers={"content-type": "application/json", **(headers or {})}, content=content
    )


async def read_into(chunks: list[ModelChunk], model: OpenAIChatModel) -> None:
    async for item in model.stream(REQUEST):
        chunks.append(item)


async def call(server: Server, **options: Any) -> tuple[Any, OpenAIChatModel]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = OpenAIChatModel("gpt-4", base_url="https://llm.test/v1", client=client, **options)
        return await complete(model, REQUEST), model


@pytest.mark.virtual_clock
async def test_429_with_retry_after_2_is_retried_once_after_2_seconds() -> None:
    server = Server(failure(429, {"retry-after": "2"}), streamed())
    response, _ = await call(server)
    assert response.message.text == ANSWER
    assert len(server.times) == 2
    assert server.waits == [pytest.approx(2.0)]


@pytest.mark.virtual_clock
async def test_retry_after_on_a_successful_response_is_ignored() -> None:
    # Cassette 21 (Anthropic) recorded `retry-after: 28` on a 200; carried here by an OpenAI answer.
    headers = {k: v for k, v in load("21").headers.items() if k.lower() != "content-type"}
    assert headers["retry-after"] == "28"
    server = Server(streamed(200, headers))
    start = anyio.current_time()
    response, _ = await call(server)
    assert response.message.text == ANSWER
    assert len(server.times) == 1
    assert anyio.current_time() - start < 1


def sse_then(tail: bytes) -> httpx.Response:
    first = STREAM.body.split(b"\n\n")[:2]  # the role chunk and the first token
    return httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        stream=Parts([b"\n\n".join(first) + b"\n\n", tail]),
    )


@pytest.mark.virtual_clock
async def test_a_500_after_the_first_token_is_a_typed_error_without_retry_or_duplicates() -> None:
    error_event = b'event: error\ndata: {"error": {"message": "internal", "status_code": 500}}\n\n'
    server = Server(sse_then(error_event), streamed())
    chunks: list[ModelChunk] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = OpenAIChatModel("gpt-4", base_url="https://llm.test/v1", client=client)
        with pytest.raises(ServerError) as info:
            await read_into(chunks, model)
    assert info.value.mid_stream
    assert info.value.status == 500
    assert len(server.times) == 1
    first_token = orjson.loads(STREAM.body.split(b"\n\n")[1][6:])["choices"][0]["delta"]["content"]
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == [first_token]


class Broken(httpx.AsyncByteStream):
    """A body that breaks after its first part."""

    def __init__(self, first: bytes) -> None:
        self.first = first

    def __aiter__(self) -> Broken:
        self.sent = False
        return self

    async def __anext__(self) -> bytes:
        if not self.sent:
            self.sent = True
            return self.first
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.mark.virtual_clock
async def test_a_broken_stream_after_the_first_token_is_not_retried() -> None:
    first = b"\n\n".join(STREAM.body.split(b"\n\n")[:2]) + b"\n\n"
    broken = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken(first))
    server = Server(broken, streamed())
    chunks: list[ModelChunk] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = OpenAIChatModel("gpt-4", base_url="https://llm.test/v1", client=client)
        with pytest.raises(ModelConnectionError) as info:
            await read_into(chunks, model)
    assert info.value.mid_stream
    assert len(server.times) == 1
    assert len([c for c in chunks if isinstance(c, TextDelta)]) == 1


@pytest.mark.virtual_clock
@pytest.mark.parametrize("status", [408, 409, 500, 502, 503, 529])
async def test_retryable_statuses_back_off_exponentially_with_jitter(status: int) -> None:
    policy = RetryPolicy(max_attempts=4, initial_delay=1.0, max_delay=3.0, jitter=0.25)
    server = Server(failure(status))
    with pytest.raises(ModelError) as info:
        await call(server, retry=policy)
    assert info.value.status == status
    if status in (503, 529):
        assert isinstance(info.value, OverloadedError)
    assert len(server.times) == 4
    for wait, base in zip(server.waits, [1.0, 2.0, 3.0], strict=True):  # capped at max_delay
        assert base * 0.75 - 1e-6 <= wait <= base + 1e-6


@pytest.mark.virtual_clock
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_not_retried(status: int) -> None:
    server = Server(failure(status))
    with pytest.raises(ModelError) as info:
        await call(server)
    assert info.value.status == status
    assert len(server.times) == 1


@pytest.mark.virtual_clock
async def test_the_server_can_say_not_to_retry() -> None:
    server = Server(failure(500, {"x-should-retry": "false"}))
    with pytest.raises(ServerError):
        await call(server)
    assert len(server.times) == 1
    quota = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    server = Server(failure(429, body=quota))
    with pytest.raises(RateLimitError):
        await call(server)
    assert len(server.times) == 1


@pytest.mark.virtual_clock
async def test_a_retry_after_longer_than_the_policy_allows_is_not_waited_for() -> None:
    server = Server(failure(429, {"retry-after": "3600"}))
    with pytest.raises(RateLimitError) as info:
        await call(server, retry=RetryPolicy(max_retry_after=60))
    assert info.value.retry_after == 3600
    assert len(server.times) == 1


@pytest.mark.virtual_clock
async def test_total_wait_is_bounded() -> None:
    server = Server(failure(429, {"retry-after": "20"}))
    with pytest.raises(RateLimitError):
        await call(server, retry=RetryPolicy(max_attempts=10, max_total_wait=50))
    assert server.waits == [pytest.approx(20.0), pytest.approx(20.0)]  # a third wait would pass 50 s


@pytest.mark.virtual_clock
async def test_http_date_and_milliseconds_retry_after() -> None:
    server = Server(failure(503, {"retry-after-ms": "1500"}), streamed())
    await call(server)
    assert server.waits == [pytest.approx(1.5)]
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after({"retry-after": later}, now=now) == pytest.approx(7)
    assert (
        parse_retry_after({"retry-after": format_datetime(now - timedelta(seconds=7), usegmt=True)}, now=now)
        == 0
    )
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "nan"}) is None
    assert parse_retry_after({}) is None


@pytest.mark.virtual_clock
async def test_connection_failures_are_retried() -> None:
    server = Server(httpx.ConnectError("refused"), streamed())
    response, _ = await call(server)
    assert response.message.text == ANSWER
    assert len(server.times) == 2
    server = Server(httpx.ConnectError("refused"))
    with pytest.raises(ModelConnectionError) as info:
        await call(server, retry=RetryPolicy(max_attempts=2))
    assert not info.value.mid_stream
    assert len(server.times) == 2


@pytest.mark.virtual_clock
async def test_read_timeouts_are_not_retried() -> None:
    server = Server(httpx.ReadTimeout("slow"), streamed())
    with pytest.raises(ModelTimeoutError):
        await call(server)
    assert len(server.times) == 1


@pytest.mark.virtual_clock
async def test_listeners_see_each_attempt() -> None:
    events: list[Any] = []
    server = Server(failure(429, {"retry-after": "1"}), streamed())
    await call(server, on_request=events.append, on_response=events.append, on_error=events.append)
    kinds = [(type(e).__name__, e.attempt) for e in events]
    assert kinds == [
        ("HttpRequestEvent", 1),
        ("HttpErrorEvent", 1),
        ("HttpRequestEvent", 2),
        ("HttpResponseEvent", 2),
    ]
    error = events[1]
    assert isinstance(error, HttpErrorEvent)
    assert error.will_retry
    assert error.delay == 1
    assert isinstance(error.error, RateLimitError)
    response = events[3]
    assert isinstance(response, HttpResponseEvent)
    assert response.status == 200
    assert response.request_id == STREAM.header("x-request-id")
    assert response.body["messages"] == [{"role": "user", "content": "hi"}]


def test_policy_validation() -> None:
    assert RetryPolicy.never().max_attempts == 1
    for bad in ({"max_attempts": 0}, {"jitter": 2.0}, {"initial_delay": -1.0}):
        with pytest.raises(ConfigurationError):
            RetryPolicy(**bad)
    policy = RetryPolicy(initial_delay=0.5, max_delay=4.0, jitter=0.0)
    assert [policy.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert all(RetryPolicy.retries_status(s) for s in (408, 409, 429, 500, 503, 529))
    assert not any(RetryPolicy.retries_status(s) for s in (200, 400, 401, 404, 422))


# --- retry-after values no server should send ---------------------------------------------------------------


# A hostile `retry-after` / `retry-after-ms` never makes `parse_retry_after` raise.
HOSTILE_RETRY_AFTER = [
    "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",
    "Mon, 01 Jan 10000 00:00:00 GMT",
    "Mon, 01 Jan 0000 00:00:00 GMT",
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 -9999",
    "Fri, 31 Dec 9999 23:59:59 +2400",
    "Fri, 31 Dec 9999 23:59:59 +99999999999999999999",
    "Mon, 01 Jan 2026 00:00:00 -99999999999999999999",
    "Mon, 32 Jan 2026 00:00:00 GMT",
    "Mon, 01 Jan 2026 99999999999999999999:00:00 GMT",
    "Mon, 01 Jan 2026 00:00:99999999999999999999 GMT",
    "Mon, 99999999999999999999 Jan 2026 00:00:00 GMT",
    "01 Jan 2026 00:00:00",
    "Mon, 01 Jan 2026",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "infinity",
    "1e999",
    "-1e999",
    "1e308",
    "-1",
    "-0",
    "9" * 5000,
    "0x10",
    "1_000",
    "١٢",
    "",
    " ",
    ",",
    "\x00",
    "\udcff",
    "GMT",
]


@pytest.mark.parametrize("value", HOSTILE_RETRY_AFTER)
@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms"])
def test_parse_retry_after_never_raises(header: str, value: str) -> None:
    seconds = parse_retry_after({header: value})
    assert seconds is None or (seconds >= 0 and seconds == seconds and seconds != float("inf"))


_DATE_TOKEN = st.one_of(
    st.sampled_from(
        ["Mon,", "Jan", "Dec", "GMT", "UT", "EST", "+0000", "-2359", "+2400", ":", ",", "-", "+"]
    ),
    st.integers(-(10**25), 10**25).map(str),
    st.from_regex(r"\A[0-9]{1,25}(:[0-9]{1,25}){0,2}\Z"),
    st.text(max_size=6),
)


@settings(max_examples=500, deadline=None)
@given(tokens=st.lists(_DATE_TOKEN, max_size=8), header=st.sampled_from(["retry-after", "retry-after-ms"]))
@example(tokens=["Mon,", "01", "Jan", "99999999999999999999", "00:00:00", "GMT"], header="retry-after")
def test_parse_retry_after_never_raises_on_generated_values(tokens: list[str], header: str) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    seconds = parse_retry_after({header: " ".join(tokens)}, now=now)
    assert seconds is None or 0 <= seconds < float("inf")


@pytest.mark.parametrize("adapter", ["openai", "ollama"])
async def test_a_429_with_an_absurd_retry_after_date_is_a_rate_limit_error(adapter: str) -> None:
    body = b'{"error":{"message":"slow down"}}'
    date = "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"
    error = await raised_by(adapter, serving(429, JSON, body, **{"retry-after": date}))
    assert isinstance(error, agentrt.RateLimitError), repr(error)
    assert error.retry_after is None


@pytest.mark.virtual_clock
@pytest.mark.parametrize("adapter", ["openai", "ollama"])
async def test_a_retried_429_with_an_absurd_retry_after_date_backs_off(adapter: str) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        date = "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"
        return httpx.Response(429, headers={"retry-after": date}, json={"error": {"message": "slow"}})

    retry = RetryPolicy(max_attempts=2, initial_delay=0.5, jitter=0)
    error = await raised_by(adapter, httpx.MockTransport(handler), retry=retry)
    assert isinstance(error, agentrt.RateLimitError), repr(error)
    assert calls == 2
