"""The HTTP side of the adapters: client lifecycle, cancellation, secrecy, transport failures, and the
connection options every HTTP adapter takes."""

from __future__ import annotations

import logging
import textwrap
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from cassettes import Parts, load
from typecheck import mypy

import agentrt
from agentrt import (
    AuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelRequest,
    ModelTimeoutError,
    TextDelta,
    TokenStream,
    UserMessage,
)
from agentrt.models import (
    AnthropicChatModel,
    HttpErrorEvent,
    HttpRequestEvent,
    HttpResponseEvent,
    OllamaChatModel,
    OpenAIChatModel,
    RetryPolicy,
    complete,
)
from agentrt.moderation.openai import OpenAIModerationModel
from agentrt.rag.ollama import OllamaEmbeddingModel
from agentrt.rag.openai import OpenAIEmbeddingModel

REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))
KEY = "sk-proj-SECRET-4f9a2b7c1d"
FIRST = b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
REST = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


class Endless(httpx.AsyncByteStream):
    """Sends one event, then waits forever (a model still generating); records when it is closed."""

    def __init__(self, first: bytes = FIRST) -> None:
        self.first: bytes | None = first
        self.closed = False

    def __aiter__(self) -> Endless:
        return self

    async def __anext__(self) -> bytes:
        if self.first is not None:
            first, self.first = self.first, None
            return first
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True


def serve(stream: httpx.AsyncByteStream, content_type: str = "text/event-stream") -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": content_type}, stream=stream)
    )


def openai(client: httpx.AsyncClient, **options: Any) -> OpenAIChatModel:
    options.setdefault("api_key", KEY)
    return OpenAIChatModel("m", base_url="https://llm.test/v1", client=client, **options)


# --- cancellation (acceptance item 5) -------------------------------------------------------------


async def test_cancelling_mid_stream_closes_the_response_at_once() -> None:
    body = Endless()
    async with httpx.AsyncClient(transport=serve(body)) as client:
        model = openai(client)
        received: list[Any] = []
        with anyio.CancelScope() as scope:
            async for chunk in model.stream(REQUEST):
                received.append(chunk)
                if isinstance(chunk, TextDelta):
                    scope.cancel()
        # No await between the cancellation unwinding and this line: closed within the same turn.
        assert body.closed
        assert scope.cancelled_caught
        assert [c.text for c in received if isinstance(c, TextDelta)] == ["Hel"]


async def test_cancelling_a_service_token_stream_closes_the_response() -> None:
    class Chat:
        async def stream(self, question: str) -> TokenStream: ...

    body = Endless()
    async with httpx.AsyncClient(transport=serve(body)) as client:
        service = agentrt.build(Chat, model=openai(client))
        tokens: list[str] = []
        with anyio.CancelScope() as scope:
            stream = await service.stream("hi")
            async for token in stream:
                tokens.append(token)
                scope.cancel()
        assert body.closed
        assert tokens == ["Hel"]


async def test_cancelling_from_another_task_closes_the_response() -> None:
    body = Endless()
    got_first = anyio.Event()
    async with httpx.AsyncClient(transport=serve(body)) as client:
        model = openai(client)

        async def read() -> None:
            async for chunk in model.stream(REQUEST):
                if isinstance(chunk, TextDelta):
                    got_first.set()

        async with anyio.create_task_group() as group:
            group.start_soon(read)
            await got_first.wait()
            group.cancel_scope.cancel()
        assert body.closed


async def test_closing_the_iterator_early_closes_the_response() -> None:
    body = Endless()
    async with httpx.AsyncClient(transport=serve(body)) as client:
        stream = openai(client).stream(REQUEST)
        async for chunk in stream:
            if isinstance(chunk, TextDelta):
                break
        await stream.aclose()  # type: ignore[attr-defined]
        assert body.closed


async def test_a_finished_stream_has_closed_its_response() -> None:
    body = Parts([FIRST, REST])
    async with httpx.AsyncClient(transport=serve(body)) as client:
        response = await complete(openai(client), REQUEST)
    assert response.message.text == "Hello"
    assert body.closed


# --- client lifecycle -----------------------------------------------------------------------------


async def test_the_pooled_client_is_created_lazily_and_closed_by_aclose() -> None:
    model = OpenAIChatModel("m", base_url="http://llm.test/v1")
    session = model._session
    assert session._client is None
    first = await session.client()
    assert await session.client() is first  # one pooled client per model
    async with model:
        pass
    assert first.is_closed
    await model.aclose()  # idempotent
    assert not (await session.client()).is_closed  # a closed model opens a fresh client when used again
    await model.aclose()


async def test_a_client_passed_in_is_left_open() -> None:
    async with httpx.AsyncClient(transport=serve(Parts([FIRST, REST]))) as client:
        async with OllamaChatModel("m", base_url="http://o.test", client=client) as model:
            assert await model._session.client() is client
        assert not client.is_closed


# --- secrecy (acceptance item 4) ------------------------------------------------------------------


async def test_a_401_names_endpoint_and_status_and_never_the_key(caplog: pytest.LogCaptureFixture) -> None:
    cassette = load("37")
    events: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {KEY}"  # the key is sent, only here
        return httpx.Response(cassette.status, headers=cassette.headers, content=cassette.body)

    caplog.set_level(logging.DEBUG)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = openai(client, on_request=events.append, on_response=events.append, on_error=events.append)
        with pytest.raises(AuthenticationError) as info:
            await complete(model, REQUEST)
    error = info.value
    assert error.status == 401
    assert error.endpoint == "https://llm.test/v1/chat/completions"
    assert "status 401" in str(error)
    assert "https://llm.test/v1/chat/completions" in str(error)
    assert len(events) == 2
    leaks = [
        str(error),
        repr(error),
        repr(error.args),
        error.body or "",
        "".join(traceback.format_exception(error)),
        repr(model),
        repr(vars(error)),
        caplog.text,
        *map(repr, events),
    ]
    assert not [text for text in leaks if KEY in text]
    assert "sk-proj" not in repr(model)


async def test_a_key_echoed_by_the_server_is_scrubbed() -> None:
    body = orjson.dumps({"error": {"message": f"bad key {KEY} for org", "type": "invalid_request_error"}})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, headers={"content-type": "application/json"}, content=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ModelError) as info:
            await complete(openai(client), REQUEST)
    assert KEY not in str(info.value)
    assert KEY not in (info.value.body or "")
    assert "bad key *** for org" in info.value.message


async def test_a_key_read_with_a_trailing_newline_is_stripped_and_a_bad_key_is_refused() -> None:
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["authorization"])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"data: [DONE]\n\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        await complete(openai(client, api_key=f"  {KEY}\n"), REQUEST)
    assert sent == [f"Bearer {KEY}"]

    for bad in (f"{KEY} extra", f"{KEY}\x00", f"{KEY}é"):
        with pytest.raises(agentrt.ConfigurationError) as info:
            OpenAIChatModel("m", base_url="https://llm.test/v1", api_key=bad)
        assert KEY not in str(info.value)


async def test_the_key_is_scrubbed_in_escaped_forms_and_never_in_a_repr() -> None:
    from agentrt.models._failures import ErrorContext

    context = ErrorContext("https://llm.test/v1/chat/completions", (KEY,))
    escaped = f"Illegal header value b'Bearer {KEY}' in {KEY!r}"

    assert KEY not in context.scrub(escaped)
    assert KEY not in repr(context)


async def test_retries_log_without_the_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    responses = [
        httpx.Response(503, content=b"busy"),
        httpx.Response(200, headers={"content-type": "text/event-stream"}, content=FIRST + REST),
    ]
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: responses.pop(0))) as client:
        model = openai(client, retry=RetryPolicy(initial_delay=0, jitter=0))
        assert (await complete(model, REQUEST)).message.text == "Hello"
    assert "retrying" in caplog.text
    assert KEY not in caplog.text


async def test_the_endpoint_keeps_its_query_but_shows_neither_query_nor_credentials() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(401, content=b"{}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel(
            "m", base_url="https://user:pass@llm.test/v1/?api-version=2024#x", client=client
        )
        assert model.endpoint == "https://llm.test/v1/chat/completions"
        assert "pass" not in repr(model)
        assert "2024" not in repr(model)
        with pytest.raises(AuthenticationError) as info:
            await complete(model, REQUEST)
    assert str(seen[0].url) == "https://user:pass@llm.test/v1/chat/completions?api-version=2024"
    assert "pass" not in str(info.value)


# --- transport failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), ModelConnectionError),
        (httpx.ConnectTimeout("timed out"), ModelTimeoutError),
        (httpx.ReadTimeout("timed out"), ModelTimeoutError),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), ModelConnectionError),
    ],
)
async def test_transport_failures_are_translated(failure: Exception, kind: type[ModelError]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise failure

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(kind) as info:
            await complete(openai(client, retry=RetryPolicy.never()), REQUEST)
    assert info.value.endpoint == "https://llm.test/v1/chat/completions"
    assert not info.value.mid_stream
    assert isinstance(info.value.__cause__, httpx.HTTPError)


class BreaksAfterFirst(httpx.AsyncByteStream):
    def __init__(self, failure: Exception) -> None:
        self.failure = failure
        self.sent = False

    def __aiter__(self) -> BreaksAfterFirst:
        return self

    async def __anext__(self) -> bytes:
        if self.sent:
            raise self.failure
        self.sent = True
        return FIRST


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (httpx.ReadError("connection reset"), ModelConnectionError),
        (httpx.ReadTimeout("idle"), ModelTimeoutError),
    ],
)
async def test_failures_while_streaming_are_mid_stream_errors(
    failure: Exception, kind: type[ModelError]
) -> None:
    errors: list[Any] = []
    async with httpx.AsyncClient(transport=serve(BreaksAfterFirst(failure))) as client:
        with pytest.raises(kind) as info:
            await complete(openai(client, on_error=errors.append), REQUEST)
    assert info.value.mid_stream
    assert [e.error for e in errors] == [info.value]


async def test_a_raising_listener_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: object) -> None:
        raise RuntimeError("listener bug")

    async with httpx.AsyncClient(transport=serve(Parts([FIRST, REST]))) as client:
        response = await complete(openai(client, on_request=broken, on_response=broken), REQUEST)
    assert response.message.text == "Hello"
    assert "listener bug" in caplog.text


# --- one set of connection options for every HTTP adapter ------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """An HTTP adapter, a call of it, and what its server answers that call with."""

    make: Callable[..., Any]
    call: Callable[[Any], Awaitable[object]]
    path: str
    key_header: str
    content_type: str
    answer: bytes


_MESSAGE = (
    b'{"type":"message","id":"m1","model":"m","content":[{"type":"text","text":"hi"}],'
    b'"stop_reason":"end_turn"}'
)
ADAPTERS = {
    "OpenAIChatModel": Adapter(
        lambda **o: OpenAIChatModel("m", **o),
        lambda model: complete(model, REQUEST),
        "/chat/completions",
        "authorization",
        "text/event-stream",
        FIRST + REST,
    ),
    "OllamaChatModel": Adapter(
        lambda **o: OllamaChatModel("m", **o),
        lambda model: complete(model, REQUEST),
        "/api/chat",
        "authorization",
        "application/x-ndjson",
        b'{"model":"m","message":{"role":"assistant","content":"hi"},"done":true,"done_reason":"stop"}\n',
    ),
    "AnthropicChatModel": Adapter(
        lambda **o: AnthropicChatModel("m", **o),
        lambda model: complete(model, REQUEST),
        "/v1/messages",
        "x-api-key",
        "application/json",
        _MESSAGE,
    ),
    "OpenAIEmbeddingModel": Adapter(
        lambda **o: OpenAIEmbeddingModel("m", **o),
        lambda model: model.embed(["a"]),
        "/embeddings",
        "authorization",
        "application/json",
        b'{"data":[{"index":0,"embedding":[0.5,0.25]}]}',
    ),
    "OllamaEmbeddingModel": Adapter(
        lambda **o: OllamaEmbeddingModel("m", **o),
        lambda model: model.embed(["a"]),
        "/api/embed",
        "authorization",
        "application/json",
        b'{"embeddings":[[0.5,0.25]]}',
    ),
    "OpenAIModerationModel": Adapter(
        lambda **o: OpenAIModerationModel("m", **o),
        lambda model: model.moderate(["a"]),
        "/moderations",
        "authorization",
        "application/json",
        b'{"results":[{"flagged":false,"categories":{},"category_scores":{}}]}',
    ),
}


def _sent_key(adapter: Adapter, key: str) -> str:
    return key if adapter.key_header == "x-api-key" else f"Bearer {key}"


@pytest.mark.parametrize("name", list(ADAPTERS))
async def test_every_http_adapter_takes_the_same_connection_options(name: str) -> None:
    adapter = ADAPTERS[name]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(200, headers={"content-type": adapter.content_type}, content=adapter.answer)

    events: list[object] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = adapter.make(
            base_url="https://llm.test/base/",
            api_key=KEY,
            headers={"X-Team": "blue"},
            timeout=7,
            retry=RetryPolicy(max_attempts=2, initial_delay=0, jitter=0),
            client=client,
            on_request=events.append,
            on_response=events.append,
            on_error=events.append,
        )
        await adapter.call(model)
        assert not client.is_closed
    assert [str(request.url) for request in seen] == [f"https://llm.test/base{adapter.path}"] * 2
    for request in seen:
        assert request.headers[adapter.key_header] == _sent_key(adapter, KEY)
        assert request.headers["x-team"] == "blue"
        assert request.extensions["timeout"] == httpx.Timeout(7).as_dict()
    assert [type(event) for event in events] == [
        HttpRequestEvent,
        HttpErrorEvent,
        HttpRequestEvent,
        HttpResponseEvent,
    ]
    assert isinstance(events[1], HttpErrorEvent)
    assert events[1].will_retry
    assert {getattr(event, "endpoint", None) for event in events} == {f"https://llm.test/base{adapter.path}"}


@pytest.mark.parametrize(
    ("name", "url", "key"),
    [
        ("OpenAIChatModel", "https://openai.env/v1", "sk-openai-env"),
        ("OllamaChatModel", "http://ollama.env:11500", "ollama-env"),
        ("AnthropicChatModel", "https://anthropic.env", "sk-ant-env"),
        ("OpenAIEmbeddingModel", "https://openai.env/v1", "sk-openai-env"),
        ("OllamaEmbeddingModel", "http://ollama.env:11500", "ollama-env"),
        ("OpenAIModerationModel", "https://openai.env/v1", "sk-openai-env"),
    ],
)
async def test_each_adapter_finds_its_server_and_key_in_its_providers_variables(
    name: str, url: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "https://openai.env/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-env")
    monkeypatch.setenv("OLLAMA_HOST", "ollama.env:11500")  # a host and port: http:// is added
    monkeypatch.setenv("OLLAMA_API_KEY", "ollama-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://anthropic.env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    adapter = ADAPTERS[name]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"content-type": adapter.content_type}, content=adapter.answer)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = adapter.make(client=client)
        assert model.endpoint == f"{url}{adapter.path}"
        await adapter.call(model)
    assert [str(request.url) for request in seen] == [f"{url}{adapter.path}"]
    assert seen[0].headers[adapter.key_header] == _sent_key(adapter, key)


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_a_misspelled_connection_option_is_refused(name: str) -> None:
    with pytest.raises(TypeError, match=r"__init__\(\) got an unexpected keyword argument 'tmeout'"):
        ADAPTERS[name].make(base_url="https://llm.test", tmeout=5)


@pytest.mark.xdist_group("mypy")  # the type checks share a worker, and so mypy's cache (tests/typecheck.py)
def test_the_connection_options_type_check_as_keywords(tmp_path: Path, mypy_cache: Path) -> None:
    source = textwrap.dedent(
        """
        from agentrt.models import AnthropicChatModel, OpenAIChatModel, RetryPolicy
        from agentrt.moderation.openai import OpenAIModerationModel
        from agentrt.rag.ollama import OllamaEmbeddingModel

        OpenAIChatModel("m", base_url="http://x", api_key="k", timeout=3, retry=RetryPolicy(), headers={})
        OllamaEmbeddingModel("m", client=None, batch_size=2, on_request=print)
        OpenAIModerationModel(on_error=print)
        OpenAIChatModel("m", tmeout=3)  # line 9
        AnthropicChatModel("m", timeout="soon")  # line 10
        """
    )
    target = tmp_path / "use_adapters.py"
    target.write_text(source)
    stdout, status = mypy(target, mypy_cache)
    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert status == 1
    assert len(errors) == 2, stdout
    assert ':9: error: Unexpected keyword argument "tmeout"' in errors[0]
    assert ':10: error: Argument "timeout" to "AnthropicChatModel" has incompatible type "str"' in errors[1]


def test_headers_scrubbed_of_an_echoed_key_keep_a_non_ascii_header() -> None:
    from agentrt.models._failures import ErrorContext
    from agentrt.models._http import _shown

    headers = httpx.Headers([(b"x-echo", b"key sk-secret-123"), (b"x-city", "Zürich".encode("latin-1"))])
    clean, _ = _shown(headers, ErrorContext("endpoint", ("sk-secret-123",)))
    assert "sk-secret-123" not in repr(clean.multi_items())
    assert clean["x-city"] == "Zürich"


@pytest.mark.parametrize(
    "raw",
    [
        [],
        [(b"X-Request-Id", b"req_1"), (b"request-id", b"req_2")],
        [(b"request-id", b"req_2")],
        [(b"x-request-id", b""), (b"request-id", b"req_2")],
        [(b"x-request-id", b"a"), (b"content-type", b"text/event-stream"), (b"x-request-id", b"b")],
        [(b"x-request-id", b"req_sk-secret-123"), (b"x-echo", b"sk-secret-123")],
        [(b"x-echo", b"sk-secret-123"), (b"x-city", "Zürich".encode("latin-1"))],
    ],
)
@pytest.mark.parametrize("secrets", [(), ("sk-secret-123",), ("x",), ("req",)])
def test_the_shown_headers_and_request_id_are_those_of_the_long_way(
    raw: list[tuple[bytes, bytes]], secrets: tuple[str, ...]
) -> None:
    """`_shown` (one pass) gives what scrubbing each header and looking the id up gives."""
    from agentrt.models._failures import ErrorContext, request_id_of
    from agentrt.models._http import _shown

    headers = httpx.Headers(raw)
    context = ErrorContext("endpoint", secrets)
    items = headers.multi_items()
    clean = [(context.scrub(name), context.scrub(value)) for name, value in items]
    expected = headers if clean == items else httpx.Headers(clean, encoding=headers.encoding)
    shown, request_id = _shown(headers, context if secrets else None)
    assert shown.multi_items() == expected.multi_items()
    assert (shown is headers) == (expected is headers)
    assert request_id == request_id_of(expected)
