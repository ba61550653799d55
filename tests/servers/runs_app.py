"""One worker of an app whose runs outlive their connection, for tests/test_runs_processes.py: the
runs' logs and the chat memory in Redis, so that any worker reads on any run and sees every turn.

`POST /chat` streams `Desk.chat` (memory per `x-user`) with `on_disconnect="detach"`: a run goes on
when its client leaves. `GET /chat/resume` reads a run on (`Last-Event-ID`). The model is the scripted
server at the given URL (tests/servers/runs_model_app.py): a tool round, then an answer the output
guardrail refuses once (released optimistically, so the client sees it, then a `reset`), then the
reprompted answer. `GET /pid` is the worker's process id.

Run as `python runs_app.py <fd> <model URL> <redis URL> <key prefix>` on an inherited socket.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Annotated

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import MemoryId, TokenStream, tool
from agentrt.guardrails import GuardrailResult, OutputGuardrailRequest, output_guardrails, reprompt, success
from agentrt.memory import ChatMemory, RedisStore
from agentrt.models import OpenAIChatModel, RetryPolicy
from agentrt.runs import RedisRunLog, Runs

NAMESPACE = "runs"
REPROMPT = "Answer again, without WRONG."
HEARTBEAT = 0.1
LOST_AFTER = 1.0


class NoWrong:
    name = "no_wrong"

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        if "WRONG" in request.text:
            return reprompt("the answer says WRONG", REPROMPT)
        return success()


class Desk:
    @output_guardrails(NoWrong(), release="optimistic")
    async def chat(self, user: Annotated[str, MemoryId], question: str) -> TokenStream: ...


class Words:
    @tool("Look a word up.")
    async def lookup(self, word: str) -> str:
        return f"{word} backwards is {word[::-1]}"


def user(request: Request) -> str:
    return request.headers["x-user"]


def app(model_url: str, redis_url: str, prefix: str) -> Starlette:
    model = OpenAIChatModel("runs", base_url=model_url, api_key="test-key", retry=RetryPolicy(max_attempts=1))
    memory = ChatMemory(RedisStore(redis_url, prefix=prefix), namespace=NAMESPACE)
    service = agentrt.build(Desk, model=model, tools=[Words()], memory=memory)
    log = RedisRunLog(redis_url, prefix=prefix, heartbeat=HEARTBEAT, lost_after=LOST_AFTER)
    runs = Runs(log)
    chat = agentrt.sse.endpoint(service.chat, memory_id=user, runs=runs, on_disconnect="detach")

    async def pid(request: Request) -> JSONResponse:
        return JSONResponse(os.getpid())

    return Starlette(
        routes=[
            Route("/chat", chat, methods=["POST"]),
            Route("/chat/resume", chat.resume, methods=["GET"]),
            Route("/chat/stop", chat.stop, methods=["POST"]),
            Route("/pid", pid, methods=["GET"]),
        ],
        lifespan=runs.lifespan,
    )


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(*sys.argv[2:5]), log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])
