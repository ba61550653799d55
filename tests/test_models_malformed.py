"""Malformed provider payloads: every one is a `ModelResponseError`, never a foreign exception.

A payload that is JSON but not of its protocol's shape (a tool call whose `id` is a number, a `name`
that is a list, a `message` that is a string, ...) used to reach the fold of the response, where
pydantic's `ValidationError` escaped from `await service.method()`. Each adapter and each body
framing is covered: OpenAI's SSE stream and whole JSON response, Ollama's NDJSON stream and whole
JSON response. The bodies are the recorded conformance cassettes, edited at one field, byte for byte.

The error carries the offending payload (scrubbed of the API key, at most `MAX_BODY` characters) as
its `body`, and says what was wrong in its message.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import orjson
import pytest
from adapter_failures import ECHOED_KEY, ENDPOINT, fragments, raised_by, serving, texts_of
from cassettes import Parts, load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentrt
from agentrt import ModelError, ModelRequest, ModelResponseError, UserMessage
from agentrt.models import OllamaChatModel, OpenAIChatModel, RetryPolicy, complete
from agentrt.models._failures import MAX_BODY, ErrorContext, error_from_payload, error_from_response

KEY = "sk-proj-mAlf0rmed-Payload-kEy-0123456789abcdef"
OPENAI_URL = "https://llm.test/v1"
OLLAMA_URL = "http://ollama.test:11434"
OPENAI_ENDPOINT = "https://llm.test/v1/chat/completions"
OLLAMA_ENDPOINT = "http://ollama.test:11434/api/chat"
REQUEST = ModelRequest(messages=(UserMessage.of("What's the weather in Paris?"),))

SSE = "text/event-stream; charset=utf-8"
JSON = "application/json; charset=utf-8"
NDJSON = "application/x-ndjson"

OPENAI_TOOLS_SSE = load("12").body  # a recorded stream of two parallel tool calls
OPENAI_TOOLS_JSON = load("09").body  # a recorded (pretty-printed) response with two tool calls
OLLAMA_TOOL_JSON = load("28").body  # a recorded non-streamed Ollama tool call
OLLAMA_TOOL_NDJSON = (
    b'{"model":"qwen3:8b","created_at":"2026-08-07T06:08:09.1Z","message":{"role":"assistant",'
    b'"content":"","thinking":"The user wants the weather."},"done":false}\n'
    b'{"model":"qwen3:8b","created_at":"2026-08-07T06:08:09.2Z","message":{"role":"assistant",'
    b'"content":"","tool_calls":[{"id":"call_gsiiy8py","function":{"index":0,'
    b'"name":"get_current_weather","arguments":{"city":"Paris"}}}]},"done":false}\n'
    b'{"model":"qwen3:8b","created_at":"2026-08-07T06:08:09.3Z","message":{"role":"assistant",'
    b'"content":""},"done":true,"done_reason":"stop","total_duration":1735248334,'
    b'"load_duration":139246000,"prompt_eval_count":292,"prompt_eval_duration":247164000,'
    b'"eval_count":143,"eval_duration":1337032000}\n'
)
"""Ollama streams a tool call whole, in one line with `done: false`, then the `done: true` line."""

Model = OpenAIChatModel | OllamaChatModel


def server(body: bytes, content_type: str, parts: list[bytes] | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, stream=Parts(parts or [body]))

    return httpx.MockTransport(handler)


def model_for(adapter: str, client: httpx.AsyncClient, streaming: bool) -> Model:
    if adapter == "openai":
        return OpenAIChatModel(
            "gpt-4o-mini",
            base_url=OPENAI_URL,
            api_key=KEY,
            client=client,
            streaming=streaming,
            retry=RetryPolicy.never(),
        )
    return OllamaChatModel(
        "qwen3:8b",
        base_url=OLLAMA_URL,
        api_key=KEY,
        client=client,
        streaming=streaming,
        retry=RetryPolicy.never(),
    )


class Weather:
    async def ask(self, question: str) -> str: ...


def edit(body: bytes, old: bytes, new: bytes) -> bytes:
    assert old in body, old
    return body.replace(old, new, 1)


# (adapter, streaming, content type, body, the edited bytes the error's body must show)
CASES: dict[str, tuple[str, bool, str, bytes, bytes]] = {
    "openai-sse-id-number": (
        "openai",
        True,
        SSE,
        edit(OPENAI_TOOLS_SSE, b'"id":"call_hqkL24CLEwnniv4GDrjk14Iu"', b'"id":7'),
        b'"id":7',
    ),
    "openai-sse-name-number": (
        "openai",
        True,
        SSE,
        edit(OPENAI_TOOLS_SSE, b'"name":"get_current_weather"', b'"name":42'),
        b'"name":42',
    ),
    "openai-sse-name-list": (
        "openai",
        True,
        SSE,
        edit(OPENAI_TOOLS_SSE, b'"name":"get_current_weather"', b'"name":["get_current_weather"]'),
        b'"name":["get_current_weather"]',
    ),
    "openai-json-id-number": (
        "openai",
        False,
        JSON,
        edit(OPENAI_TOOLS_JSON, b'"id": "call_S1xa8vawU2HXSrvSeUcqSCZm"', b'"id": 7'),
        b'"id": 7',
    ),
    "openai-json-name-object": (
        "openai",
        False,
        JSON,
        edit(OPENAI_TOOLS_JSON, b'"name": "get_weather"', b'"name": {"value": "get_weather"}'),
        b'"name": {"value": "get_weather"}',
    ),
    "ollama-ndjson-id-number": (
        "ollama",
        True,
        NDJSON,
        edit(OLLAMA_TOOL_NDJSON, b'"id":"call_gsiiy8py"', b'"id":7'),
        b'"id":7',
    ),
    "ollama-ndjson-name-number": (
        "ollama",
        True,
        NDJSON,
        edit(OLLAMA_TOOL_NDJSON, b'"name":"get_current_weather"', b'"name":42'),
        b'"name":42',
    ),
    "ollama-json-id-number": (
        "ollama",
        False,
        JSON,
        edit(OLLAMA_TOOL_JSON, b'"id":"call_gsiiy8py"', b'"id":7'),
        b'"id":7',
    ),
    "ollama-json-name-list": (
        "ollama",
        False,
        JSON,
        edit(OLLAMA_TOOL_JSON, b'"name":"get_current_weather"', b'"name":[]'),
        b'"name":[]',
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_mistyped_tool_call_is_a_response_error_from_the_service(case: str) -> None:
    adapter, streaming, content_type, body, shown = CASES[case]
    async with httpx.AsyncClient(transport=server(body, content_type)) as client:
        service = agentrt.build(Weather, model=model_for(adapter, client, streaming))
        with pytest.raises(ModelResponseError) as info:
            await service.ask("What's the weather in Paris?")
    error = info.value
    assert error.mid_stream is streaming
    assert error.endpoint == (OPENAI_ENDPOINT if adapter == "openai" else OLLAMA_ENDPOINT)
    assert error.body is not None
    assert shown.decode() in error.body  # the offending payload, as the server sent it
    assert error.__cause__ is not None  # translated once, from what found the payload malformed


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_mistyped_tool_call_is_a_response_error_from_complete(case: str) -> None:
    adapter, streaming, content_type, body, _ = CASES[case]
    events = body.split(b"\n\n") if content_type == SSE else body.splitlines(keepends=True)
    # One read per event or line (the SSE decoder's fast path), and the whole body in one read.
    for parts in ([p + b"\n\n" for p in events if p] if content_type == SSE else events, [body]):
        async with httpx.AsyncClient(transport=server(body, content_type, parts)) as client:
            with pytest.raises(ModelResponseError):
                await complete(model_for(adapter, client, streaming), REQUEST)


def straddling(payload: Callable[[str], dict[str, Any]]) -> bytes:
    """`payload(text)` serialised, with `text` padded so that the key straddles the `MAX_BODY` cut."""
    data = orjson.dumps(payload(KEY))
    shift = MAX_BODY - len(KEY) // 2 - data.index(KEY.encode())
    return orjson.dumps(payload("x" * shift + KEY))


SECRET_CASES: dict[str, tuple[str, bool, str, bytes]] = {
    # A key echoed in answer text that a mistyped tool call then makes unreadable; the key is cut by
    # the body's length limit, so it must be scrubbed before the body is cut.
    "openai-sse": (
        "openai",
        True,
        SSE,
        b"data: "
        + straddling(
            lambda text: {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "model": "gpt-4o-mini",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": text, "tool_calls": [{"index": 0, "id": 7, "function": {}}]},
                        "finish_reason": None,
                    }
                ],
            }
        )
        + b"\n\ndata: [DONE]\n\n",
    ),
    # A key in a string where a number belongs: Python's own message for it quotes the key.
    "openai-json-usage": (
        "openai",
        False,
        JSON,
        edit(OPENAI_TOOLS_JSON, b'"prompt_tokens": 207', b'"prompt_tokens": "' + KEY.encode() + b'"'),
    ),
    "ollama-ndjson": (
        "ollama",
        True,
        NDJSON,
        straddling(
            lambda text: {
                "model": "qwen3:8b",
                "message": {"role": "assistant", "content": text, "tool_calls": [{"id": 7}]},
                "done": False,
            }
        )
        + b"\n",
    ),
    "ollama-json-usage": (
        "ollama",
        False,
        JSON,
        edit(OLLAMA_TOOL_JSON, b'"eval_count":143', b'"eval_count":"' + KEY.encode() + b'"'),
    ),
}


@pytest.mark.parametrize("case", sorted(SECRET_CASES))
async def test_the_excerpt_is_bounded_and_scrubbed_of_the_key(case: str) -> None:
    adapter, streaming, content_type, body = SECRET_CASES[case]
    assert KEY.encode() in body
    async with httpx.AsyncClient(transport=server(body, content_type)) as client:
        with pytest.raises(ModelResponseError) as info:
            await complete(model_for(adapter, client, streaming), REQUEST)
    error = info.value
    assert error.body is not None
    assert len(error.body) <= MAX_BODY
    assert len(error.message) <= 1000
    texts = [
        str(error),
        repr(error),
        error.body,
        repr(vars(error)),
        "".join(traceback.format_exception(error)),
    ]
    start = KEY[: len(KEY) // 3]  # what a body cut before it was scrubbed would show
    assert not [text for text in texts if start in text]


# --- mistyped fields, anywhere ------------------------------------------------------------------


def payloads_of(kind: str, body: bytes) -> list[Any]:
    if kind == "openai-sse":
        datas = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e.startswith(b"data: ")]
        return [json.loads(d) for d in datas if d != b"[DONE]"]
    if kind == "ollama-ndjson":
        return [json.loads(line) for line in body.splitlines() if line.strip()]
    return [json.loads(body)]


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(shape(v) for v in value)
    return type(value).__name__


def distinct(payloads: list[Any]) -> list[Any]:
    """The payloads of a stream, without those shaped like one before (a stream's many tokens)."""
    seen: set[Any] = set()
    kept = []
    for payload in payloads:
        if shape(payload) not in seen:
            seen.add(shape(payload))
            kept.append(payload)
    return kept


BASES: dict[str, tuple[str, list[Any]]] = {
    "openai-sse tools": ("openai-sse", distinct(payloads_of("openai-sse", load("12").body))),
    "openai-sse text": ("openai-sse", distinct(payloads_of("openai-sse", load("04").body))),
    "openai-sse vllm": ("openai-sse", distinct(payloads_of("openai-sse", load("33").body))),
    "openai-json tools": ("openai-json", payloads_of("openai-json", load("09").body)),
    "openai-json refusal": ("openai-json", payloads_of("openai-json", load("17").body)),
    "openai-json reasoning": ("openai-json", payloads_of("openai-json", load("30").body)),
    "ollama-ndjson tools": ("ollama-ndjson", payloads_of("ollama-ndjson", OLLAMA_TOOL_NDJSON)),
    "ollama-ndjson thinking": ("ollama-ndjson", distinct(payloads_of("ollama-ndjson", load("27").body))),
    "ollama-json tools": ("ollama-json", payloads_of("ollama-json", load("28").body)),
}
"""Valid responses of each kind, as the payloads (SSE data, NDJSON lines, the one document) they hold."""

Path = tuple[str | int, ...]


def paths(value: Any, at: Path = ()) -> list[Path]:
    """Every place in `value` (itself included) where a field value can be replaced."""
    found = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*at, index))
    return found


def replaced(value: Any, at: Path, new: Any) -> Any:
    if not at:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[at[0]] = replaced(value[at[0]], at[1:], new)
    return copy


SCALARS = st.sampled_from([0, 7, -1, 2**40, 1.5, True, False, "", "7", "x", "call_1", "stop"])
SMALL = st.one_of(
    SCALARS, st.text(max_size=8), st.integers(), st.floats(allow_nan=False, allow_infinity=False)
)
LISTS = st.one_of(st.just([]), st.lists(SMALL, min_size=1, max_size=3))
DICTS = st.one_of(
    st.just({}), st.dictionaries(st.sampled_from(["id", "name", "text", "x"]), SMALL, max_size=2)
)
NUMBERS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False))
TEXTS = st.one_of(st.sampled_from(["", "0", "12", "x", "null", "{}", "tool_calls"]), st.text(max_size=12))


def wrong(value: Any) -> st.SearchStrategy[Any]:
    """Values of another JSON type than `value`'s."""
    if value is None:
        return st.one_of(TEXTS, NUMBERS, LISTS, DICTS, st.booleans())
    if isinstance(value, bool):
        return st.one_of(st.none(), TEXTS, NUMBERS, LISTS, DICTS)
    if isinstance(value, int | float):
        return st.one_of(st.none(), TEXTS, st.booleans(), LISTS, DICTS)
    if isinstance(value, str):
        return st.one_of(st.none(), NUMBERS, st.booleans(), LISTS, DICTS)
    if isinstance(value, list):
        return st.one_of(
            st.none(), TEXTS, NUMBERS, st.booleans(), DICTS, st.lists(TEXTS, min_size=1, max_size=2)
        )
    return st.one_of(st.none(), TEXTS, NUMBERS, st.booleans(), LISTS, st.lists(DICTS, min_size=1, max_size=2))


def get(value: Any, at: Path) -> Any:
    for step in at:
        value = value[step]
    return value


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, list[Any], int]:
    """A base response with one field value replaced by one of the wrong type: (kind, payloads, which)."""
    kind, payloads = BASES[draw(st.sampled_from(sorted(BASES)))]
    which = draw(st.integers(0, len(payloads) - 1))
    at = draw(st.sampled_from(paths(payloads[which])))
    new = draw(wrong(get(payloads[which], at)))
    mutated = list(payloads)
    mutated[which] = replaced(payloads[which], at, new)
    return kind, mutated, which


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def framed(kind: str, payloads: list[Any]) -> list[bytes]:
    """The body's events or lines, one per payload."""
    if kind == "openai-sse":
        return [b"data: " + dumps(p) + b"\n\n" for p in payloads] + [b"data: [DONE]\n\n"]
    if kind == "ollama-ndjson":
        return [dumps(p) + b"\n" for p in payloads]
    return [dumps(payloads[0])]


async def outcome(kind: str, events: list[bytes], per_event: bool) -> ModelResponseError | None:
    """The error the response framed from `events` ends in (`None` for an answer); nothing else may
    come out."""
    body = b"".join(events)
    content_type = {"openai-sse": SSE, "ollama-ndjson": NDJSON}.get(kind, JSON)
    adapter = "openai" if kind.startswith("openai") else "ollama"
    with anyio.fail_after(10):
        async with httpx.AsyncClient(
            transport=server(body, content_type, events if per_event else [body])
        ) as client:
            try:
                await complete(model_for(adapter, client, kind.endswith(("sse", "ndjson"))), REQUEST)
            except ModelResponseError as error:
                return error
    return None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=mutations(), per_event=st.booleans())
async def test_a_field_of_the_wrong_type_is_a_response_error_or_tolerated(
    mutation: tuple[str, list[Any], int], per_event: bool
) -> None:
    kind, payloads, which = mutation
    error = await outcome(kind, framed(kind, payloads), per_event)
    if error is None:
        return  # a field the adapter ignores, or reads leniently
    assert error.mid_stream is kind.endswith(("sse", "ndjson"))
    if error.body is None:
        assert "ended before" in error.message  # no payload is wrong: the one that ends it is missing
    else:
        assert error.body == dumps(payloads[which]).decode()[:MAX_BODY]  # the mutated payload


async def test_an_http_error_body_is_scrubbed_before_it_is_cut() -> None:
    # The same cut as above, on an error status: a body echoing the key across the MAX_BODY limit.
    body = straddling(lambda text: {"error": {"message": text, "type": "invalid_request_error"}})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, content=body, headers={"content-type": JSON})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(agentrt.BadRequestError) as info:
            await complete(model_for("openai", client, True), REQUEST)
    error = info.value
    assert error.body is not None and len(error.body) <= MAX_BODY
    assert KEY[: len(KEY) // 3] not in error.body + str(error)


# --- error payloads nested deeper than orjson writes --------------------------------------------------------


# A deeply nested (valid JSON) error payload is a `ModelError`, not orjson's `TypeError`.
def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


DEPTHS = [255, 300, 1020]  # orjson writes 254 levels at most, and reads 1024 (the envelope included)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize(
    ("adapter", "status", "content_type", "template", "kind"),
    [
        ("openai", 400, JSON, b'{"error":{"message":%s}}', agentrt.BadRequestError),
        ("openai", 400, JSON, b'{"error":{"message":"x","param":%s}}', agentrt.BadRequestError),
        ("openai", 400, JSON, b'{"detail":%s}', agentrt.BadRequestError),
        ("openai", 200, SSE, b"event: error\ndata: %s\n\n", agentrt.ServerError),
        ("openai", 200, SSE, b'event: error\ndata: {"error":{"message":%s}}\n\n', agentrt.ServerError),
        ("openai", 200, SSE, b'data: {"error":{"message":%s}}\n\n', agentrt.ServerError),
        ("ollama", 400, JSON, b'{"error":{"message":%s}}', agentrt.BadRequestError),
        ("ollama", 400, JSON, b'{"detail":%s}', agentrt.BadRequestError),
        ("ollama", 200, NDJSON, b'{"error":{"message":%s}}\n', agentrt.ServerError),
    ],
    ids=[
        "openai-400-message",
        "openai-400-param",
        "openai-400-detail",
        "openai-sse-error-event",
        "openai-sse-error-event-envelope",
        "openai-sse-error-data",
        "ollama-400-message",
        "ollama-400-detail",
        "ollama-ndjson-error",
    ],
)
async def test_a_deeply_nested_error_payload_is_a_model_error(
    adapter: str, status: int, content_type: str, template: bytes, kind: type[ModelError], depth: int
) -> None:
    error = await raised_by(adapter, serving(status, content_type, template % deep(depth)))
    assert type(error) is kind, repr(error)
    assert isinstance(error, ModelError)
    assert error.body is not None and len(error.body) <= MAX_BODY


@pytest.mark.parametrize("depth", DEPTHS)
def test_error_from_payload_and_response_take_any_depth_orjson_reads(depth: int) -> None:
    context = ErrorContext(ENDPOINT, (ECHOED_KEY,))
    nested = orjson.loads(deep(depth))
    for payload in (nested, {"error": {"message": nested}}, {"error": {"message": "x", "param": nested}}):
        error = error_from_payload(payload, context, request_id=None, mid_stream=True)
        assert isinstance(error, agentrt.ServerError)
    body = b'{"error":{"message":' + deep(depth) + b',"code":"' + ECHOED_KEY.encode() + b'"}}'
    error = error_from_response(400, {}, body, context)
    assert isinstance(error, agentrt.BadRequestError)
    assert not fragments(ECHOED_KEY, texts_of(error))
