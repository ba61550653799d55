"""A tiny OpenAI-compatible Chat Completions server for the integration tests (it echoes; no model).

`POST /v1/chat/completions` answers "You said: <last user message>" (for a JSON schema in
`response_format`: an object with each of its properties, "echo <name>"), streamed as SSE (one word per
event, then the finish chunk, a usage chunk when asked, `[DONE]`) or as one JSON completion. The
prompt `rate limit me` is refused with a 429 (`retry-after: 0`) every other time; the prompt `hang`
streams its first words and then waits until the client goes away. A request with the header
`x-test-stream: <id>` can be watched: `GET /v1/streams/<id>/closed` answers once that response ended.

Run as `python openai_app.py <fd>` to serve on an already listening socket inherited as `<fd>`.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

KEY = "test-key"
_attempts: dict[str, int] = {}
_closed: dict[str, anyio.Event] = {}


def _error(status: int, message: str, code: str, **headers: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers={"x-request-id": f"req_{code}", **headers})


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []
    payload = {
        "id": "chatcmpl-echo",
        "object": "chat.completion.chunk",
        "model": "echo-1",
        "choices": choices,
    }
    return b"data: " + orjson.dumps({**payload, **extra}) + b"\n\n"


async def completions(request: Request) -> Response:
    if request.headers.get("authorization") != f"Bearer {KEY}":
        return _error(401, "Incorrect API key provided.", "invalid_api_key")
    body = await request.json()
    prompt = str(body["messages"][-1]["content"])
    if prompt == "rate limit me":
        attempt = _attempts[prompt] = _attempts.get(prompt, 0) + 1
        if attempt % 2:
            return _error(
                429, "Rate limit reached, slow down.", "rate_limit_exceeded", **{"retry-after": "0"}
            )
    words = f"You said: {prompt}".split(" ")
    pieces = [word if i == 0 else f" {word}" for i, word in enumerate(words)]
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if schema:  # structured output: an object with each of the schema's properties, as text
        pieces = [orjson.dumps({name: f"echo {name}" for name in schema.get("properties", {})}).decode()]
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(pieces), "total_tokens": 0}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if not body.get("stream"):
        message = {"role": "assistant", "content": "".join(pieces)}
        completion = {
            "id": "chatcmpl-echo",
            "object": "chat.completion",
            "model": "echo-1",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage,
        }
        return JSONResponse(completion, headers={"x-request-id": "req_echo"})
    watched = request.headers.get("x-test-stream")
    closed = _closed.setdefault(watched, anyio.Event()) if watched else None
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events() -> AsyncIterator[bytes]:
        try:
            yield _chunk({"role": "assistant", "content": ""})
            for piece in pieces:
                yield _chunk({"content": piece})
            if prompt == "hang":
                await anyio.sleep_forever()
            yield _chunk({}, "stop")
            if include_usage:
                yield _chunk(None, usage=usage)
            yield b"data: [DONE]\n\n"
        finally:
            if closed is not None:
                closed.set()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"x-request-id": "req_echo"})


async def stream_closed(request: Request) -> Response:
    event = _closed.setdefault(request.path_params["id"], anyio.Event())
    with anyio.move_on_after(10):
        await event.wait()
        return JSONResponse({"closed": True})
    return JSONResponse({"closed": False}, status_code=504)


app = Starlette(
    routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/streams/{id}/closed", stream_closed, methods=["GET"]),
    ]
)


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])
