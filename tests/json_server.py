"""A scripted JSON endpoint for the embedding and moderation adapters' tests (`httpx.MockTransport`).

`Script` answers each request with the next of its responses (a response, an exception to raise, or a
function of the request) and records what it saw: the requests, when each came (on the test's clock),
how many were in flight at once, and the bodies it served, so that a test can check each was closed.
Also here: OpenAI's error bodies as it sends them, and the checks every adapter's errors pass.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import orjson

from agentrt import ModelError

Answer = httpx.Response | Exception | Callable[[httpx.Request], "httpx.Response | Awaitable[httpx.Response]"]


class Body(httpx.AsyncByteStream):
    """A response body sent in `parts`; with `hang`, it then waits forever (a server that stalls).
    Records whether it was closed."""

    def __init__(self, *parts: bytes, hang: bool = False) -> None:
        self.parts = list(parts)
        self.hang = hang
        self.closed = False
        self.started = anyio.Event()

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        self.started.set()
        if self.parts:
            return self.parts.pop(0)
        if self.hang:
            await anyio.sleep_forever()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


def respond(
    content: bytes | dict[str, Any] | list[Any],
    status: int = 200,
    headers: dict[str, str] | None = None,
    *,
    hang: bool = False,
) -> httpx.Response:
    """A response with these bytes (or this JSON, compact) as its body, in a `Body`."""
    body = content if isinstance(content, bytes) else orjson.dumps(content)
    all_headers = {"content-type": "application/json", **(headers or {})}
    return httpx.Response(status, headers=all_headers, stream=Body(body, hang=hang))


class Script:
    """Answers requests from a script; the last answer repeats."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []
        self.bodies: list[Body] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(anyio.current_time())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                result = answer(request)
                response = await result if inspect.isawaitable(result) else result
            finally:
                self.in_flight -= 1
        else:
            response = answer
        if isinstance(response.stream, Body):
            self.bodies.append(response.stream)
        return response

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    @property
    def sent(self) -> list[dict[str, Any]]:
        """The request bodies, parsed."""
        return [orjson.loads(request.content) for request in self.requests]

    @property
    def waits(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


def rate_limited(model: str) -> bytes:
    """OpenAI's 429 for too many requests a minute (indented by four spaces, as OpenAI's errors are)."""
    return (
        "{\n"
        '    "error": {\n'
        f'        "message": "Rate limit reached for {model} in organization org-abc on requests per min '
        "(RPM): Limit 3000, Used 3000, Requested 1. Please try again in 20ms. Visit "
        'https://platform.openai.com/account/rate-limits to learn more.",\n'
        '        "type": "requests",\n'
        '        "param": null,\n'
        '        "code": "rate_limit_exceeded"\n'
        "    }\n"
        "}\n"
    ).encode()


SERVER_ERROR = (
    b"{\n"
    b'  "error": {\n'
    b'    "message": "The server had an error while processing your request. Sorry about that!",\n'
    b'    "type": "server_error",\n'
    b'    "param": null,\n'
    b'    "code": null\n'
    b"  }\n"
    b"}\n"
)
"""OpenAI's 500."""


def check_error(
    error: ModelError, kind: type[ModelError], body: bytes, *, status: int, endpoint: str, reported: list[Any]
) -> None:
    """`error` is exactly `kind`, carries the status, request id (`req_e1`), endpoint and OpenAI's
    message, and was the one failure reported to `on_error`."""
    assert type(error) is kind
    assert (error.status, error.request_id) == (status, "req_e1")
    assert error.endpoint == endpoint
    assert error.message == orjson.loads(body)["error"]["message"]
    assert [event.error for event in reported] == [error]


def echoing_key(key: str) -> httpx.Response:
    """A 401 whose message and request id repeat the key (servers do)."""
    body = orjson.dumps(
        {"error": {"message": f"Incorrect API key provided: {key}.", "code": "invalid_api_key"}}
    )
    return respond(body, 401, {"x-request-id": f"req-{key}"})


def key_shown(key: str, error: ModelError, *others: object) -> list[str]:
    """The texts showing `key`: of the error (message, repr, attributes, traceback) and `others`."""
    texts = [
        str(error),
        repr(error),
        repr(vars(error)),
        "".join(traceback.format_exception(error)),
        *(other if isinstance(other, str) else repr(other) for other in others),
    ]
    return [text for text in texts if key in text]
