"""A scripted OpenAI-compatible model for the runs-across-workers test (tests/test_runs_processes.py).

`POST /v1/chat/completions` (streamed) answers by the conversation's last message:

- the user's question `WORD`: "Let me look WORD up." and a call of `lookup` with `{"word": WORD}`;
- a tool result: an answer that says WRONG (the app's output guardrail refuses it and reprompts);
- the guardrail's reprompt: the right answer, which repeats the tool's result word by word;
- the question `hang`: a few words, then nothing until the client goes away.

Each chunk is sent `DELAY` seconds after the last (the answers take a while, so that a client cuts
its connection while the run goes on). Run as `python runs_model_app.py <fd>` on an inherited socket.
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
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

DELAY = 0.002
REPROMPT = "Answer again, without WRONG."


def _event(delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
    choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []
    payload = {"id": "chatcmpl-runs", "object": "chat.completion.chunk", "model": "runs", "choices": choices}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _words(text: str) -> list[dict[str, Any]]:
    words = text.split(" ")
    return [{"content": word if i == 0 else f" {word}"} for i, word in enumerate(words)]


async def completions(request: Request) -> Response:
    body = await request.json()
    last = body["messages"][-1]
    content = str(last.get("content") or "")
    finish = "stop"
    hang = False
    if last["role"] == "tool":
        deltas = _words(f"The answer: {content}, WRONG.")
    elif content == REPROMPT:
        result = next(m for m in reversed(body["messages"]) if m["role"] == "tool")["content"]
        deltas = _words(f"The answer: {result}.")
    elif content == "hang":
        deltas, hang = _words("Wait for it"), True
    else:
        call = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": orjson.dumps({"word": content}).decode()},
        }
        deltas = [*_words(f"Let me look {content} up."), {"tool_calls": [call]}]
        finish = "tool_calls"

    async def events() -> AsyncIterator[bytes]:
        yield _event({"role": "assistant", "content": ""})
        for delta in deltas:
            await anyio.sleep(DELAY)
            yield _event(delta)
        if hang:
            await anyio.sleep_forever()
        yield _event({}, finish)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])
