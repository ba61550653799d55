"""The API key stays out of listener events and out of every log record, also when a server echoes it.

A server that repeats the `Authorization` header (in response headers, in the request id, in an error
body) must not make the key reach `on_response`/`on_error` listeners, lifecycle listeners, errors, or
the DEBUG records of httpx and httpcore (`receive_response_headers.complete return_value=(...,
[(b'x-echo', b'sk-...')])`). `httpx.MockTransport` bypasses httpcore, so the end-to-end tests use a real
server on loopback: this file, run as a script, serves the small echoing app below (the way
tests/servers/openai_app.py is served in test_models_server.py).
"""

from __future__ import annotations

import gc
import json
import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import serve

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
    from agentrt.models import ModelRequest, OpenAIChatModel, complete
    from agentrt.models._http import _SCRUBBED_LOGGERS

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
    from agentrt.models import ModelRequest, OpenAIChatModel, complete

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
    from agentrt.models._http import _KEY_FILTER

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
