"""Defects of the model adapters found by an outside review, each pinned by a test.

- A deeply nested (valid JSON) error payload must be a `ModelError`, not orjson's `TypeError`.
- A hostile `retry-after` / `retry-after-ms` never makes `parse_retry_after` raise.
- No fragment of the API key survives where a text is cut: Python's own messages cut what they quote
  (`int()` quotes 200 characters), a non-JSON error body is cut to a message; neither may show a piece
  of the key, in the error, its traceback or its cause chain.
- The escaped forms servers write a key in (JSON `\\/` and `\\uXXXX`, percent-encoding in either case,
  with or without `/`) are scrubbed, in error bodies and in the headers listeners see.
- `SSEChunkDecoder`'s one-event shortcut reads a bare `\\r` line end like the full SSE decoder.
"""

from __future__ import annotations

import json
import re
import time
import traceback
import urllib.parse
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from cassettes import Parts
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import agentrt
from agentrt import ModelError, ModelResponseError, UserMessage
from agentrt.models import (
    HttpResponseEvent,
    ModelRequest,
    OllamaChatModel,
    OpenAIChatModel,
    RetryPolicy,
    complete,
)
from agentrt.models._decoders import SSEChunkDecoder
from agentrt.models._failures import (
    MAX_BODY,
    REDACTED,
    ErrorContext,
    error_from_payload,
    error_from_response,
    excerpt,
    parse_retry_after,
)
from agentrt.models._sse import SSEDecoder

OPENAI_URL = "http://llm.test/v1"
OLLAMA_URL = "http://ollama.test:11434"
ENDPOINT = "http://llm.test/v1/chat/completions"
REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))
SSE = "text/event-stream; charset=utf-8"
JSON = "application/json; charset=utf-8"
NDJSON = "application/x-ndjson"

KEY = "sk-proj-Zq7SECRETx9Kw4mNbV2-4f9a2b7cD1eF"
"""A key with no 8-character run in common with anything else the tests write."""
SLASHED_KEY = "gw-AbCdEf0123/GhIjKl4567+MnOp=="
"""A base64-style key (gateways, self-hosted proxies): `/`, `+` and `=` are escaped by some encoders."""


def model(adapter: str, client: httpx.AsyncClient, *, key: str = KEY, **options: Any) -> Any:
    options.setdefault("retry", RetryPolicy.never())
    if adapter == "openai":
        return OpenAIChatModel("m", base_url=OPENAI_URL, api_key=key, client=client, **options)
    return OllamaChatModel("m", base_url=OLLAMA_URL, api_key=key, client=client, **options)


def serving(status: int, content_type: str, body: bytes, **headers: str) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type, **headers}, stream=Parts([body]))

    return httpx.MockTransport(handler)


async def failure(adapter: str, transport: httpx.MockTransport, **options: Any) -> Exception:
    """What `complete` raised (any exception: a foreign one must show up as itself)."""
    async with httpx.AsyncClient(transport=transport) as client:
        try:
            await complete(model(adapter, client, **options), REQUEST)
        except Exception as exc:
            return exc
    raise AssertionError("the call succeeded")


def chain(error: BaseException) -> list[BaseException]:
    """`error` and every exception it is chained to (cause or context)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def texts_of(error: BaseException) -> list[str]:
    """Every text the error shows: str, repr, fields, traceback, and each chained exception's own."""
    texts = ["".join(traceback.format_exception(error))]
    for exc in chain(error):
        texts += [str(exc), repr(exc), repr(exc.args), repr(getattr(exc, "__dict__", {}))]
        texts += [repr(getattr(exc, name, None)) for name in ("body", "message", "doc", "object")]
    return texts


def fragments(key: str, texts: list[str], size: int = 8) -> list[str]:
    """The pieces of `key` (`size` characters or more) that some text shows."""
    pieces = {key[i : i + size] for i in range(len(key) - size + 1)}
    return sorted({piece for text in texts for piece in pieces if piece in text})


# --- 4: a deeply nested error payload ---------------------------------------------------------------


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
    error = await failure(adapter, serving(status, content_type, template % deep(depth)))
    assert type(error) is kind, repr(error)
    assert isinstance(error, ModelError)
    assert error.body is not None and len(error.body) <= MAX_BODY


@pytest.mark.parametrize("depth", DEPTHS)
def test_error_from_payload_and_response_take_any_depth_orjson_reads(depth: int) -> None:
    context = ErrorContext(ENDPOINT, (KEY,))
    nested = orjson.loads(deep(depth))
    for payload in (nested, {"error": {"message": nested}}, {"error": {"message": "x", "param": nested}}):
        error = error_from_payload(payload, context, request_id=None, mid_stream=True)
        assert isinstance(error, agentrt.ServerError)
    body = b'{"error":{"message":' + deep(depth) + b',"code":"' + KEY.encode() + b'"}}'
    error = error_from_response(400, {}, body, context)
    assert isinstance(error, agentrt.BadRequestError)
    assert not fragments(KEY, texts_of(error))


# --- 5: a hostile retry-after -----------------------------------------------------------------------

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
    error = await failure(adapter, serving(429, JSON, body, **{"retry-after": date}))
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
    error = await failure(adapter, httpx.MockTransport(handler), retry=retry)
    assert isinstance(error, agentrt.RateLimitError), repr(error)
    assert calls == 2


# --- 6: a piece of the key, left by a cut -------------------------------------------------------------

# `int()` quotes the first 199 characters of a string (its repr cut at 200): padding of these lengths
# cuts the key after 1, 8, half of it, and all but one of its characters.
CUTS = [1, 8, len(KEY) // 2, len(KEY) - 1]


def usage_body(framing: str, value: str) -> bytes:
    """A response whose token count is the text `value` (a server echoing the key into it)."""
    if framing == "openai-json":
        message = {"role": "assistant", "content": "hi"}
        choices = [{"index": 0, "message": message, "finish_reason": "stop"}]
        return orjson.dumps({"id": "c", "model": "m", "choices": choices, "usage": {"prompt_tokens": value}})
    if framing == "openai-sse":
        first = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
        last = {"id": "c", "model": "m", "choices": [], "usage": {"completion_tokens": value}}
        return b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in (first, last)) + b"data: [DONE]\n\n"
    line = {
        "model": "m",
        "message": {"role": "assistant", "content": "hi"},
        "done": True,
        "eval_count": value,
    }
    return orjson.dumps(line) + (b"\n" if framing == "ollama-ndjson" else b"")


FRAMINGS = {
    "openai-json": ("openai", JSON, False),
    "openai-sse": ("openai", SSE, True),
    "ollama-json": ("ollama", JSON, False),
    "ollama-ndjson": ("ollama", NDJSON, True),
}


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
async def test_a_key_cut_by_a_python_message_leaves_no_fragment(framing: str, cut: int) -> None:
    adapter, content_type, streaming = FRAMINGS[framing]
    value = "x" * (199 - cut) + KEY
    with pytest.raises(ValueError, match="invalid literal") as quoted:
        int(value)
    assert KEY[:cut] in str(quoted.value) and KEY not in str(quoted.value)  # the cut this test is about
    error = await failure(
        adapter, serving(200, content_type, usage_body(framing, value)), streaming=streaming
    )
    assert isinstance(error, ModelResponseError), repr(error)
    assert error.body is not None and REDACTED in error.body
    assert "ValueError" in error.message  # what went wrong is still said
    assert not fragments(KEY, texts_of(error))


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
async def test_a_malformed_payload_without_the_key_keeps_its_cause_and_message(framing: str) -> None:
    adapter, content_type, streaming = FRAMINGS[framing]
    body = usage_body(framing, "x" * 300)
    error = await failure(adapter, serving(200, content_type, body), streaming=streaming)
    assert isinstance(error, ModelResponseError), repr(error)
    assert isinstance(error.__cause__, ValueError)
    assert "invalid literal for int()" in error.message


@pytest.mark.parametrize(
    ("adapter", "content_type", "body"),
    [
        ("openai", SSE, b'data: {"id":"c","choices":[{"delta":{"content":"' + KEY.encode() + b'"}}]\n\n'),
        ("openai", JSON, b'{"id":"c","choices":[{"message":{"content":"' + KEY.encode() + b'"}}]'),
        ("ollama", NDJSON, b'{"model":"m","message":{"content":"' + KEY.encode() + b'"}\n'),
    ],
    ids=["openai-sse", "openai-json", "ollama-ndjson"],
)
async def test_a_payload_that_is_not_json_leaves_no_key_in_the_cause_chain(
    adapter: str, content_type: str, body: bytes
) -> None:
    # orjson's decode error keeps the whole document in its `doc` attribute.
    error = await failure(adapter, serving(200, content_type, body), streaming=content_type != JSON)
    assert isinstance(error, ModelResponseError), repr(error)
    assert "not JSON" in error.message
    assert not fragments(KEY, texts_of(error))


@pytest.mark.parametrize("before", [500 - cut for cut in CUTS] + [0, 499, 500, 520])
@pytest.mark.parametrize("adapter", ["openai", "ollama"])
async def test_a_non_json_error_body_cut_to_a_message_leaves_no_fragment(adapter: str, before: int) -> None:
    # An HTML proxy page echoing the key: its start, cut to 500 characters, is the message.
    page = "<html><body>Unauthorized. " + "." * max(before - 26, 0)
    body = (page[:before] + KEY + "</body></html>").encode()
    error = await failure(adapter, serving(401, "text/html", body))
    assert isinstance(error, agentrt.AuthenticationError), repr(error)
    assert len(error.message) <= 500
    if before >= 26:
        assert error.message.startswith("<html><body>Unauthorized.")
    assert not fragments(KEY, texts_of(error))


# --- 7: escaped forms of a key ----------------------------------------------------------------------


def lower_percent(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), text)


def escaped_forms(key: str) -> dict[str, str]:
    """The forms servers and loggers write a key in."""
    json_slash = key.replace("/", "\\/")
    return {
        "raw": key,
        "json": json.dumps(key)[1:-1],
        "json \\/": json_slash,
        "json \\u002B": key.replace("+", "\\u002B"),
        "json \\u002b": key.replace("+", "\\u002b"),
        "json \\/ and \\u002B": json_slash.replace("+", "\\u002B"),
        "json, every character escaped": "".join(f"\\u{unit:04x}" for char in key for unit in _utf16(char)),
        "json in json": json.dumps(json.dumps(json_slash))[3:-3],  # without the inner quotes
        "repr": repr(key)[1:-1],
        "repr of bytes": repr(key.encode())[2:-1],
        "repr of json": repr(json_slash)[1:-1],
        "quote()": urllib.parse.quote(key),
        "quote(safe='')": urllib.parse.quote(key, safe=""),
        "quote_plus()": urllib.parse.quote_plus(key),
        "lowercase %xx": lower_percent(urllib.parse.quote(key, safe="")),
        "lowercase %xx keeping /": lower_percent(urllib.parse.quote(key)),
        "percent-encoded twice": urllib.parse.quote(urllib.parse.quote(key, safe=""), safe=""),
    }


KEYS = [
    SLASHED_KEY,
    KEY,
    "sk-live'Zq7SECRETx9\"\\tail",
    "k3y/with+<html>&'quotes'\"=",
    "sk-ünïcödé-Zq7SECRETx9-€𝄞",
]


@pytest.mark.parametrize("key", KEYS)
def test_the_scrubber_knows_the_escaped_forms_of_a_key(key: str) -> None:
    context = ErrorContext(ENDPOINT, (key,))
    for name, form in escaped_forms(key).items():
        for text in (form, f"Invalid API key: {form}.", f'{{"error":{{"message":"bad key {form}"}}}}'):
            scrubbed = context.scrub(text)
            assert REDACTED in scrubbed, (name, text)
            assert form not in scrubbed, (name, text)
        assert context.scrub(f"<{form}>") == f"<{REDACTED}>", name


@st.composite
def encoded_keys(draw: st.DrawFn) -> tuple[str, str]:
    """A key and a text writing it with each character in one of its encodings, chosen freely."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_/+=.~'\"\\é€𝄞"
    key = draw(st.text(alphabet, min_size=8, max_size=40))
    parts = []
    for char in key:
        utf8 = char.encode()
        options = [
            char,
            "".join(f"\\u{unit:04x}" for unit in _utf16(char)),
            "".join(f"%{b:02X}" for b in utf8),
        ]
        options += ["".join(f"\\u{unit:04X}" for unit in _utf16(char)), "".join(f"%{b:02x}" for b in utf8)]
        if char in "/\\'\"":
            options.append("\\" + char)
        if char == "/":
            options.append("\\\\\\/")  # JSON in JSON
        parts.append(draw(st.sampled_from(options)))
    return key, "".join(parts)


def _utf16(char: str) -> list[int]:
    data = char.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


@settings(max_examples=500, deadline=None)
@given(encoded=encoded_keys(), before=st.text(" <>{}:!", max_size=5), after=st.text(" <>{}:,;!", max_size=5))
def test_the_scrubber_matches_any_mix_of_encodings(encoded: tuple[str, str], before: str, after: str) -> None:
    key, form = encoded
    scrubbed = ErrorContext(ENDPOINT, (key,)).scrub(before + form + after)
    assert scrubbed == before + REDACTED + after


def test_an_excerpt_cut_through_the_longest_form_of_a_key_shows_none_of_it() -> None:
    # Each character as `\\uNNNN` escaped three times over (eight backslashes): the longest form the
    # scrubber matches, which an excerpt must search past its cut to recognise.
    context = ErrorContext(ENDPOINT, (SLASHED_KEY,))
    form = "".join("\\" * 8 + f"u{ord(char):04x}" for char in SLASHED_KEY)
    limit = 1000
    for offset in range(limit - len(form), limit + 1, 7):
        text = "x" * offset + form + "y" * 50
        expected = ("x" * offset + REDACTED + "y" * 50)[:limit]
        assert excerpt(text, context, limit) == expected, offset
        assert excerpt(text.encode(), context, limit) == expected, offset


def test_scrubbing_a_16_kib_body_takes_well_under_a_millisecond() -> None:
    context = ErrorContext(ENDPOINT, (SLASHED_KEY, KEY))
    # JSON-like text full of the characters the escaped forms start with.
    chunk = '{"message":"a\\/b \\u00e9 100%25 sk-proj gw-Ab","type":"invalid_request_error"}, '
    body = (chunk * (16 * 1024 // len(chunk) + 1))[: 16 * 1024]
    assert context.scrub(body) == body
    timings = []
    for _ in range(50):
        start = time.perf_counter()
        context.scrub(body)
        timings.append(time.perf_counter() - start)
    assert sorted(timings)[len(timings) // 2] < 0.001 * 5  # generous: shared CI machines (measured ~0.1 ms)


@pytest.mark.parametrize("name", sorted(escaped_forms(SLASHED_KEY)))
async def test_an_escaped_key_reaches_no_error_body_and_no_listener(name: str) -> None:
    form = escaped_forms(SLASHED_KEY)[name]
    body = ('{"error":{"message":"Invalid API key: ' + form + '","type":"invalid_request_error"}}').encode()
    error = await failure("openai", serving(401, JSON, body), key=SLASHED_KEY)
    assert isinstance(error, agentrt.AuthenticationError)
    texts = texts_of(error)
    assert not [text for text in texts if form in text]
    assert not fragments(SLASHED_KEY, texts)
    assert REDACTED in (error.body or "")

    seen: list[HttpResponseEvent] = []
    answer = b'{"choices":[{"index":0,"message":{"content":"hi"},"finish_reason":"stop"}]}'
    transport = serving(200, JSON, answer, **{"x-echo": form, "x-request-id": f"req-{form}"})
    async with httpx.AsyncClient(transport=transport) as client:
        options = {"on_response": seen.append, "streaming": False}
        await complete(model("openai", client, key=SLASHED_KEY, **options), REQUEST)
    assert seen[0].headers["x-echo"] == REDACTED
    assert seen[0].request_id == f"req-{REDACTED}"


@pytest.mark.parametrize("name", ["json \\/", "json \\u002B", "json \\u002b"])
async def test_an_escaped_key_in_a_stream_error_event_is_scrubbed(name: str) -> None:
    form = escaped_forms(SLASHED_KEY)[name]
    body = (
        'event: error\ndata: {"error":{"message":"Invalid key ' + form + '"},"echo":"' + form + '"}\n\n'
    ).encode()
    error = await failure("openai", serving(200, SSE, body), key=SLASHED_KEY)
    assert isinstance(error, ModelError)
    assert not [text for text in texts_of(error) if form in text or SLASHED_KEY in text]


# --- 10: the SSE chunk decoder's one-event shortcut ---------------------------------------------------


class Recorder:
    """A mapper that keeps what it is given: JSON objects are chunks, anything else is malformed."""

    finished = False

    def __init__(self) -> None:
        self.trail: list[tuple[str, Any]] = []

    def feed(self, payload: Any, out: list[Any], *, mid_stream: bool = True) -> None:
        if payload.__class__ is not dict:
            raise ValueError("not an object")
        out.append(payload)

    def flush(self, out: list[Any]) -> None:
        pass

    def error(self, payload: Any, *, mid_stream: bool) -> ModelError:
        self.trail.append(("error", payload))
        return agentrt.ServerError("error event")

    def unreadable(
        self, what: str, *, mid_stream: bool, data: bytes | None = None, cause: BaseException | None = None
    ) -> ModelError:
        self.trail.append(("unreadable", data))
        return ModelResponseError(what)


def chunk_decoder_reads(parts: list[bytes]) -> tuple[list[list[Any]], list[tuple[str, Any]]]:
    """What `SSEChunkDecoder` gives at each read (reading stops once it is done), and how it ended."""
    recorder = Recorder()
    decoder = SSEChunkDecoder(recorder)
    reads = []
    for part in parts:
        reads.append(decoder.feed(part))
        if decoder.done:
            break
    else:
        reads.append(decoder.close())
    end = [("done", None)] if decoder.error is None else recorder.trail
    return reads, end


def reference_reads(parts: list[bytes]) -> tuple[list[list[Any]], list[tuple[str, Any]]]:
    """The same, from the full SSE decoder's events and the chunk decoder's documented rules: JSON
    objects of unnamed (or `message`) events are chunks, `[DONE]` ends the stream, an `error` event
    fails it, other named events are skipped; a stream that ends otherwise is incomplete."""
    sse = SSEDecoder()
    reads: list[list[Any]] = []

    def take(events: list[tuple[str, bytes]]) -> tuple[str, Any] | None:
        out: list[Any] = []
        reads.append(out)
        for event, data in events:
            if event not in ("", "message"):
                if event == "error":
                    try:
                        payload = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        payload = None
                    return ("error", payload if payload is not None else data.decode("utf-8", "replace"))
                continue
            if data.startswith(b"[DONE]"):
                return ("done", None)
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                return ("unreadable", data)
            if not isinstance(payload, dict):
                return ("unreadable", data)
            out.append(payload)
        return None

    for part in parts:
        end = take(sse.feed(part))
        if end is not None:
            return reads, [end]
    end = take(sse.close())
    return reads, [end or ("unreadable", None)]


def test_the_chunk_decoder_reads_a_bare_cr_line_end_like_the_sse_decoder() -> None:
    parts = [
        b'data: {"a":0}\n\n',
        b'data: {"a":1}\r: keep-alive\n\n',
        b'data: {"a":2}\n\n',
        b"data: [DONE]\n\n",
    ]
    expected = ([[{"a": 0}], [{"a": 1}], [{"a": 2}], []], [("done", None)])
    assert reference_reads(parts) == expected
    assert chunk_decoder_reads(parts) == expected
    for read in (
        b'data: {"a":1}\r\r',
        b'data: {"a":1}\r\n\r\n',
        b'data: {"a":1}\n\r',
        b'data: {"a":1}\r\n\n',
    ):
        parts = [b'data: {"a":0}\n\n', read, b'data: {"a":2}\n\n', b"data: [DONE]\n\n"]
        assert chunk_decoder_reads(parts) == reference_reads(parts), read


_JSON_DATA = st.one_of(
    st.sampled_from(
        [b"{}", b'{"a":1}', b'{"a":"data: x\\r\\n"}', b'{"choices":[{"delta":{"content":" tok"}}]}']
    ),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9), max_size=2).map(orjson.dumps),
)
_LINE = st.one_of(
    _JSON_DATA.map(lambda data: b"data: " + data),
    _JSON_DATA.map(lambda data: b"data:" + data),
    st.sampled_from(
        [
            b"",
            b"",
            b": keep-alive",
            b":",
            b"event: ping",
            b"event: message",
            b"event: error",
            b"id: 7",
            b"retry: 5",
            b"data: [DONE]",
            b"data: 7",
            b"data: {",
            b"data",
        ]
    ),
)
_END = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r"])
_LINES = st.lists(st.tuples(_LINE, _END).map(b"".join), min_size=1, max_size=3).map(b"".join)
_EVENT = st.one_of(
    _JSON_DATA.map(lambda data: b"data: " + data + b"\n\n"),  # the common event, most often
    _JSON_DATA.map(lambda data: b"data: " + data + b"\n\n"),
    st.tuples(_LINE, _END).map(b"".join),
    # Lines with any line ends, then a blank line.
    st.tuples(_LINES, _END).map(b"".join),
    # A data line ended by a bare "\r", another line, a blank line: `data: {...}\r: keep-alive\n\n`.
    st.tuples(_JSON_DATA, _LINE).map(lambda t: b"data: " + t[0] + b"\r" + t[1] + b"\n\n"),
)


@settings(max_examples=2000, deadline=None)
@given(events=st.lists(_EVENT, max_size=12), done=st.booleans(), data=st.data())
@example(events=[b'data: {"a":0}\n\n', b'data: {"a":1}\r: keep-alive\n\n'], done=True, data=None)
def test_the_chunk_decoder_reads_like_the_sse_decoder_however_split(
    events: list[bytes], done: bool, data: st.DataObject | None
) -> None:
    body = b"".join(events) + (b"data: [DONE]\n\n" if done else b"")
    # Reads cut anywhere, and at event boundaries (where servers flush) more often than chance.
    boundaries = [len(b"".join(events[:i])) for i in range(len(events) + 1)]
    if data is None:
        cuts = boundaries
    else:
        cuts = data.draw(
            st.lists(st.one_of(st.integers(0, len(body)), st.sampled_from(boundaries)), max_size=12)
        )
    offsets = sorted(set(cuts) - {0, len(body)})
    parts = [body[a:b] for a, b in zip([0, *offsets], [*offsets, len(body)], strict=True)]
    assert chunk_decoder_reads(parts) == reference_reads(parts), parts


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=120), data=st.data())
def test_the_chunk_decoder_reads_any_bytes_like_the_sse_decoder(body: bytes, data: st.DataObject) -> None:
    body = b'data: {"a":0}\n\n' + body  # started, so that the shortcut can be taken from the second read
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(body) - 1), max_size=8))))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert chunk_decoder_reads(parts) == reference_reads(parts), parts
