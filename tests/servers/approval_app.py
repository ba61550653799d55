"""A test app for approval over the frontend protocols (tests/test_frontends_node.py): a refund that
needs a human's approval and a look-up that does not, asked for in one round, behind a `vercel-ui`
and an `ag-ui` endpoint (memory per `x-user` and conversation id) and an agentrt one at `/chat`
(memory per `x-user`). `/refunds` is the refund tool's
side-effect counter (each refund that ran), `/stored?id=` a conversation's history. Served by
uvicorn on the socket given as the first argument.

Under `/runs/vercel` the `vercel-ui` endpoint runs in a run manager (`agentrt.runs.Runs`, detached
from its connection; resumed with `GET /runs/vercel/{id}/stream`). A question "Hold <ticket>" (or
"Hold <ticket> twice") is answered in rounds: the refund (waits for approval) and the look-up, then a
look-up of C (with "twice": a refund of C, which waits for approval too, then a look-up of D), then
an answer that waits until `POST /open?ticket=<ticket>` (a run still going when a client resumes it)."""

from __future__ import annotations

import re
import socket
import sys
from typing import Any

import anyio
import uvicorn
from approval_tools import Desk, Shop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentrt
import agentrt.runs
import agentrt.sse
from agentrt import ModelRequest
from agentrt.testing import CallTool, FunctionModel

GATES: dict[str, anyio.Event] = {}
"""A "Hold <ticket>" question's answer waits for its gate (`POST /open?ticket=`)."""


async def answer(request: ModelRequest) -> Any:
    """A round that asks for both calls; after it, an answer that repeats what the tools said
    (a "Hold" question: one more round first, and the answer waits for its gate)."""
    turn = max(i for i, m in enumerate(request.messages) if m.role == "user")
    held = re.fullmatch(r"Hold (\S+)( twice)?", request.messages[turn].text)
    if held is not None and request.messages[-1].role == "tool":
        rounds = sum(1 for m in request.messages[turn:] if m.role == "assistant" and m.tool_calls)
        if rounds == 1:
            second = "refund" if held[2] else "look"
            return ["Then C. ", CallTool(second, {"order": "C"}, id="call_3")]
        if rounds == 2 and held[2]:
            return ["Then D. ", CallTool("look", {"order": "D"}, id="call_4")]
        # (a model that has not answered holds the response back: the gate is after a round)
        await GATES.setdefault(held[1], anyio.Event()).wait()
    results = []
    for message in reversed(request.messages):
        if message.role != "tool":
            break
        results.insert(0, message.text)
    if results:
        return ["Done: ", "; ".join(results)]
    return [
        "Checking. ",
        CallTool("refund", {"order": "A"}, id="call_1"),
        CallTool("look", {"order": "B"}, id="call_2"),
    ]


def user_and_thread(request: Request, thread: str | None) -> str:
    return f"{request.headers.get('x-user', 'anonymous')}:{thread}"


def user(request: Request) -> str:
    return request.headers.get("x-user", "anonymous")


def app() -> Starlette:
    shop = Shop()
    service = agentrt.build(Desk, model=FunctionModel(answer), tools=[shop], memory=agentrt.memory.window())
    options: dict[str, Any] = {"memory_id": user_and_thread, "tool_details": True, "ping": 1}
    vercel = agentrt.sse.endpoint(service.chat, protocol="vercel-ui", **options)
    agui = agentrt.sse.endpoint(service.chat, protocol="ag-ui", **options)
    native = agentrt.sse.endpoint(service.chat, memory_id=user, tool_details=True, ping=1)
    runs = agentrt.runs.Runs()
    vercel_runs = agentrt.sse.endpoint(
        service.chat, protocol="vercel-ui", runs=runs, on_disconnect="detach", **options
    )

    async def open_gate(request: Request) -> JSONResponse:
        GATES.setdefault(request.query_params["ticket"], anyio.Event()).set()
        return JSONResponse({"opened": request.query_params["ticket"]})

    async def refunds(request: Request) -> JSONResponse:
        return JSONResponse(shop.refunds)

    async def stored(request: Request) -> JSONResponse:
        messages = await agentrt.memory.access(service).read(request.query_params["id"])
        return JSONResponse([{"role": m.role, "text": m.text} for m in messages])

    return Starlette(
        routes=[
            Route("/vercel", vercel, methods=["POST"]),
            Route("/agui", agui, methods=["POST"]),
            Route("/chat", native, methods=["POST"]),
            Route("/refunds", refunds),
            Route("/stored", stored),
            Route("/runs/vercel", vercel_runs, methods=["POST"]),
            Route("/runs/vercel/{id}/stream", vercel_runs.resume, methods=["GET"]),
            Route("/open", open_gate, methods=["POST"]),
        ],
        lifespan=runs.lifespan,
    )


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    # A client's connection may sit idle in its pool for seconds between requests on a loaded
    # machine: closed by the server meanwhile (uvicorn's default: after 5 s), the client's next
    # request on it races the close (ECONNRESET).
    config = uvicorn.Config(app(), log_level="warning", lifespan="on", timeout_keep_alive=60)
    uvicorn.Server(config).run(sockets=[listener])
