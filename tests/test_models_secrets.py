"""The API key stays out of listener events and out of every log record, also when a server echoes it.

A server that repeats the `Authorization` header (in response headers, in the request id, in an error
body) must not make the key reach `on_response`/`on_error` listeners, lifecycle listeners, errors, or
the DEBUG records of httpx and httpcore (`receive_response_headers.complete return_value=(...,
[(b'x-echo', b'sk-...')])`). `httpx.MockTransport` bypasses httpcore, so the end-to-end tests use a real
server on loopback: this file, run as a script, serves the small echoing app below (the way
tests/servers/openai_app.py is served in test_models_server.py).

Errors keep it out as well: no piece of a key survives where a text is cut (a Python message, an error
body cut to a message), and the escaped forms servers write a key in (JSON, percent-encoding, `repr`)
are scrubbed from error bodies and from the headers listeners see.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from adapter_failures import (
    ECHOED_KEY,
    ENDPOINT,
    JSON,
    NDJSON,
    REQUEST,
    SLASHED_KEY,
    SSE,
    adapter_model,
    fragments,
    raised_by,
    serving,
    texts_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from served import serve

import agentrt
from agentrt import ModelError, ModelResponseError
from agentrt.models import HttpResponseEvent, complete
from agentrt.models._failures import ErrorContext, excerpt
from agentrt.models._scrub import REDACTED

CORE = "Zq7SECRETx9"
"""In every key: any form of a key that escapes only punctuation still shows it."""
PLAIN = f"sk-proj-{CORE}-4f9a2b7c"
AWKWARD = f"sk-live'{CORE}\"\\tail"
"""Header-safe, but `repr` and JSON escape it (both quote kinds and a backslash)."""
MARKER = "***"


# --- the echoing server ---------------------------------------------------------------------------


def _app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        key = authorization.removeprefix("Bearer ")
        echo = {"x-echo-authorization": authorization, "x-echo-key": key, "x-request-id": f"req-{key}"}
        body = await request.json()
        prompt = str(body["messages"][-1]["content"])
        if prompt in ("fail", "busy"):
            status, code = (401, "invalid_api_key") if prompt == "fail" else (503, "server_error")
            error = {"message": f"Incorrect API key provided: {key}.", "type": "error", "code": code}
            return JSONResponse({"error": error, "request_id": f"req-{key}"}, status, headers=echo)
        answer = {"id": "chatcmpl-echo", "model": "echo-1"}
        if not body.get("stream"):
            message = {"role": "assistant", "content": f"You said: {prompt}"}
            answer["choices"] = [{"index": 0, "message": message, "finish_reason": "stop"}]
            return JSONResponse(answer, headers=echo)
        delta = {"role": "assistant", "content": f"You said: {prompt}"}
        events = [
            {**answer, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**answer, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        content = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        return StreamingResponse(iter([content.encode()]), media_type="text/event-stream", headers=echo)

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The base URL of the app, served in a child process (see `served.serve`)."""
    yield from serve(Path(__file__))


# --- helpers --------------------------------------------------------------------------------------


def forms(key: str) -> set[str]:
    """The key as text, as `repr` shows a str and bytes, as JSON writes it, and its distinctive core."""
    return {key, repr(key)[1:-1], repr(key.encode())[2:-1], json.dumps(key)[1:-1], CORE}


def leaks(key: str, texts: list[str]) -> list[str]:
    return [text for text in texts if any(form in text for form in forms(key))]


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every captured record as a handler would write it (message, exception, stack), and its args."""
    return [caplog.handler.format(r) + repr(r.args) for r in caplog.records]


class Service:
    async def ask(self, question: str) -> str: ...


def collector() -> tuple[list[object], dict[str, Any]]:
    """A list of events and the `on_request`/`on_response`/`on_error` options that fill it."""
    events: list[object] = []
    return events, {"on_request": events.append, "on_response": events.append, "on_error": events.append}


# --- end to end, over a real server -----------------------------------------------------------------


@pytest.mark.parametrize("key", [PLAIN, AWKWARD], ids=["plain", "awkward"])
@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "whole"])
async def test_an_echoed_key_reaches_no_listener_and_no_log_record(
    server: str, key: str, streaming: bool, caplog: pytest.LogCaptureFixture
) -> None:
    import agentrt
    from agentrt.models import HttpResponseEvent, OpenAIChatModel

    caplog.set_level(logging.DEBUG)
    events, options = collector()
    seen: list[object] = []
    async with OpenAIChatModel(
        "echo", base_url=server, api_key=key, timeout=20.0, streaming=streaming, **options
    ) as model:
        service = agentrt.build(Service, model=model, listeners=[seen.append])
        assert await service.ask("hello") == "You said: hello"

    # The server did echo the key, and httpcore did log the response headers at DEBUG.
    response = next(event for event in events if isinstance(event, HttpResponseEvent))
    assert response.headers["x-echo-authorization"] == f"Bearer {MARKER}"
    assert response.headers["x-echo-key"] == MARKER
    assert response.request_id == f"req-{MARKER}"
    assert response.headers["content-type"].startswith("text/event-stream" if streaming else "application/")
    names = {record.name for record in caplog.records}
    assert {"httpx", "httpcore.http11", "httpcore.connection"} <= names
    assert any("x-echo-key" in text for text in logged(caplog))

    texts = [*map(repr, events), *map(repr, seen), *logged(caplog)]
    assert not leaks(key, texts)


@pytest.mark.parametrize("key", [PLAIN, AWKWARD], ids=["plain", "awkward"])
async def test_an_echoed_key_in_a_failure_reaches_no_error_no_listener_and_no_log_record(
    server: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    import agentrt
    from agentrt import AuthenticationError, ServerError
    from agentrt.models import HttpErrorEvent, OpenAIChatModel, RetryPolicy

    caplog.set_level(logging.DEBUG)
    events, options = collector()
    seen: list[object] = []
    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    async with OpenAIChatModel(
        "echo", base_url=server, api_key=key, timeout=20.0, retry=retry, **options
    ) as model:
        service = agentrt.build(Service, model=model, listeners=[seen.append])
        with pytest.raises(AuthenticationError) as refused:
            await service.ask("fail")
        with pytest.raises(ServerError) as busy:  # retried once: the retry is logged with the error
            await service.ask("busy")

    errors = [refused.value, busy.value]
    assert [error.request_id for error in errors] == [f"req-{MARKER}"] * 2
    assert refused.value.message == f"Incorrect API key provided: {MARKER}."
    assert [event.will_retry for event in events if isinstance(event, HttpErrorEvent)] == [False, True, False]
    assert any("retrying" in text for text in logged(caplog))
    assert any("x-echo-key" in text for text in logged(caplog))

    texts = [
        *map(repr, events),
        *map(repr, seen),
        *logged(caplog),
        *(str(error) for error in errors),
        *(repr(vars(error)) for error in errors),
    ]
    assert not leaks(key, texts)


# --- the pieces -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [PLAIN, AWKWARD, f"sk-it's-{CORE}\\x", f'sk-"{CORE}"'])
def test_the_scrubber_knows_the_escaped_forms_of_a_key(key: str) -> None:
    from agentrt.models._failures import ErrorContext

    context = ErrorContext("https://llm.test/v1/chat/completions", (key,))
    samples = [
        key,
        f"Bearer {key}",
        repr(key),
        repr(f"'{key}"),
        repr(f'"{key}'),
        repr(key.encode()),
        repr(f"'\"{key}".encode()),
        repr([(b"x-echo", f"Bearer {key}".encode())]),
        json.dumps(key),
        json.dumps({"error": {"message": f"bad key {key}"}}),
    ]
    for sample in samples:
        scrubbed = context.scrub(sample)
        assert CORE not in scrubbed, sample
        assert MARKER in scrubbed


async def test_the_http_loggers_are_scrubbed_while_a_model_is_open_and_left_alone_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """HTTP/2 clients log request headers (the `authorization` one too) through hpack at DEBUG; the
    user's own loggers are never touched, and nothing is once the model is closed. Exception texts
    are scrubbed too."""
    from agentrt import ModelRequest
    from agentrt.models import OpenAIChatModel, complete
    from agentrt.models._scrub import _SCRUBBED_LOGGERS

    key = f"sk-scope-{CORE}-closed"
    caplog.set_level(logging.DEBUG)
    body = b"data: [DONE]\n\n"
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    )
    hpack, own = logging.getLogger("hpack.hpack"), logging.getLogger("tests.own")
    assert "hpack.hpack" in _SCRUBBED_LOGGERS
    async with httpx.AsyncClient(transport=transport) as client:
        model = OpenAIChatModel("m", base_url="https://llm.test/v1", api_key=key, client=client)
        await complete(model, ModelRequest(messages=()))
        hpack.debug("HPACK encoding %s", [(b"authorization", f"Bearer {key}".encode())])
        own.debug("mine: %s", key)
        try:
            raise ValueError(f"refused {key}")
        except ValueError:
            logging.getLogger("httpx").exception("failed")
        await model.aclose()
        hpack.debug("closed: %s", key)
    messages = [r.getMessage() for r in caplog.records if r.name in ("hpack.hpack", "tests.own")]
    assert messages == [
        f"HPACK encoding [(b'authorization', b'Bearer {MARKER}')]",
        f"mine: {key}",
        f"closed: {key}",
    ]
    failed = next(r for r in caplog.records if r.getMessage() == "failed")
    assert f"ValueError: refused {MARKER}" in caplog.handler.format(failed)
    assert key not in caplog.handler.format(failed)


async def test_a_model_dropped_unclosed_releases_its_key(caplog: pytest.LogCaptureFixture) -> None:
    from agentrt import ModelRequest
    from agentrt.models import OpenAIChatModel, complete

    key = f"sk-scope-{CORE}-dropped"
    caplog.set_level(logging.DEBUG)
    body = b"data: [DONE]\n\n"
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    )
    httpx_logger = logging.getLogger("httpx")
    async with httpx.AsyncClient(transport=transport) as client:
        model = OpenAIChatModel("m", base_url="https://llm.test/v1", api_key=key, client=client)
        await complete(model, ModelRequest(messages=()))
        httpx_logger.debug("open: %s", key)
        del model
        gc.collect()
        httpx_logger.debug("dropped: %s", key)
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("open:", "dropped:"))]
    assert messages == [f"open: {MARKER}", f"dropped: {key}"]


def test_a_record_that_cannot_be_formatted_is_passed_on_unchanged() -> None:
    from agentrt.models._scrub import _KEY_FILTER

    record = logging.LogRecord("httpx", logging.DEBUG, __file__, 1, "%s and %s", ("one",), None)
    _KEY_FILTER.hold(PLAIN)
    try:
        assert _KEY_FILTER.filter(record)
    finally:
        _KEY_FILTER.release(PLAIN)
    assert (record.msg, record.args) == ("%s and %s", ("one",))


if __name__ == "__main__":
    import uvicorn

    config = uvicorn.Config(_app(), log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=int(sys.argv[1]))])


# --- no piece of the key where a text is cut ----------------------------------------------------------------


# Python's own messages cut what they quote (`int()` quotes 200 characters), a non-JSON error body is
# cut to a message; neither may show a piece of the key, in the error, its traceback or its cause chain.
# `int()` quotes the first 199 characters of a string (its repr cut at 200): padding of these lengths
# cuts the key after 1, 8, half of it, and all but one of its characters.
CUTS = [1, 8, len(ECHOED_KEY) // 2, len(ECHOED_KEY) - 1]


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
    value = "x" * (199 - cut) + ECHOED_KEY
    with pytest.raises(ValueError, match="invalid literal") as quoted:
        int(value)
    assert ECHOED_KEY[:cut] in str(quoted.value) and ECHOED_KEY not in str(
        quoted.value
    )  # the cut this test is about
    error = await raised_by(
        adapter, serving(200, content_type, usage_body(framing, value)), streaming=streaming
    )
    assert isinstance(error, ModelResponseError), repr(error)
    assert error.body is not None and REDACTED in error.body
    assert "ValueError" in error.message  # what went wrong is still said
    assert not fragments(ECHOED_KEY, texts_of(error))


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
async def test_a_malformed_payload_without_the_key_keeps_its_cause_and_message(framing: str) -> None:
    adapter, content_type, streaming = FRAMINGS[framing]
    body = usage_body(framing, "x" * 300)
    error = await raised_by(adapter, serving(200, content_type, body), streaming=streaming)
    assert isinstance(error, ModelResponseError), repr(error)
    assert isinstance(error.__cause__, ValueError)
    assert "invalid literal for int()" in error.message


@pytest.mark.parametrize(
    ("adapter", "content_type", "body"),
    [
        (
            "openai",
            SSE,
            b'data: {"id":"c","choices":[{"delta":{"content":"' + ECHOED_KEY.encode() + b'"}}]\n\n',
        ),
        ("openai", JSON, b'{"id":"c","choices":[{"message":{"content":"' + ECHOED_KEY.encode() + b'"}}]'),
        ("ollama", NDJSON, b'{"model":"m","message":{"content":"' + ECHOED_KEY.encode() + b'"}\n'),
    ],
    ids=["openai-sse", "openai-json", "ollama-ndjson"],
)
async def test_a_payload_that_is_not_json_leaves_no_key_in_the_cause_chain(
    adapter: str, content_type: str, body: bytes
) -> None:
    # orjson's decode error keeps the whole document in its `doc` attribute.
    error = await raised_by(adapter, serving(200, content_type, body), streaming=content_type != JSON)
    assert isinstance(error, ModelResponseError), repr(error)
    assert "not JSON" in error.message
    assert not fragments(ECHOED_KEY, texts_of(error))


@pytest.mark.parametrize("before", [500 - cut for cut in CUTS] + [0, 499, 500, 520])
@pytest.mark.parametrize("adapter", ["openai", "ollama"])
async def test_a_non_json_error_body_cut_to_a_message_leaves_no_fragment(adapter: str, before: int) -> None:
    # An HTML proxy page echoing the key: its start, cut to 500 characters, is the message.
    page = "<html><body>Unauthorized. " + "." * max(before - 26, 0)
    body = (page[:before] + ECHOED_KEY + "</body></html>").encode()
    error = await raised_by(adapter, serving(401, "text/html", body))
    assert isinstance(error, agentrt.AuthenticationError), repr(error)
    assert len(error.message) <= 500
    if before >= 26:
        assert error.message.startswith("<html><body>Unauthorized.")
    assert not fragments(ECHOED_KEY, texts_of(error))


# --- the escaped forms servers write a key in ---------------------------------------------------------------


# JSON `\\/` and `\\uXXXX`, percent-encoding in either case, with or without `/`: scrubbed in error
# bodies and in the headers listeners see.
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
    ECHOED_KEY,
    "sk-live'Zq7SECRETx9\"\\tail",
    "k3y/with+<html>&'quotes'\"=",
    "sk-ünïcödé-Zq7SECRETx9-€𝄞",
]


@pytest.mark.parametrize("key", KEYS)
def test_the_scrubber_knows_the_json_percent_and_repr_forms_of_a_key(key: str) -> None:
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


def test_scrubbing_a_body_full_of_the_escaped_forms_first_characters_changes_nothing() -> None:
    # (How long it takes is benchmarks/bench_scrub.py's: about 0.1 ms for this 16 KiB body.)
    context = ErrorContext(ENDPOINT, (SLASHED_KEY, ECHOED_KEY))
    # JSON-like text full of the characters the escaped forms start with.
    chunk = '{"message":"a\\/b \\u00e9 100%25 sk-proj gw-Ab","type":"invalid_request_error"}, '
    body = (chunk * (16 * 1024 // len(chunk) + 1))[: 16 * 1024]
    assert context.scrub(body) == body


@pytest.mark.parametrize("name", sorted(escaped_forms(SLASHED_KEY)))
async def test_an_escaped_key_reaches_no_error_body_and_no_listener(name: str) -> None:
    form = escaped_forms(SLASHED_KEY)[name]
    body = ('{"error":{"message":"Invalid API key: ' + form + '","type":"invalid_request_error"}}').encode()
    error = await raised_by("openai", serving(401, JSON, body), key=SLASHED_KEY)
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
        await complete(adapter_model("openai", client, key=SLASHED_KEY, **options), REQUEST)
    assert seen[0].headers["x-echo"] == REDACTED
    assert seen[0].request_id == f"req-{REDACTED}"


@pytest.mark.parametrize("name", ["json \\/", "json \\u002B", "json \\u002b"])
async def test_an_escaped_key_in_a_stream_error_event_is_scrubbed(name: str) -> None:
    form = escaped_forms(SLASHED_KEY)[name]
    body = (
        'event: error\ndata: {"error":{"message":"Invalid key ' + form + '"},"echo":"' + form + '"}\n\n'
    ).encode()
    error = await raised_by("openai", serving(200, SSE, body), key=SLASHED_KEY)
    assert isinstance(error, ModelError)
    assert not [text for text in texts_of(error) if form in text or SLASHED_KEY in text]
