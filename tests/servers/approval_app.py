"""A test app for approval over the frontend protocols (tests/test_frontends_node.py): a refund that
needs a human's approval and a look-up that does not, asked for in one round, behind a `vercel-ui`
and an `ag-ui` endpoint (memory per `x-user` and conversation id) and an agentrt one at `/chat`
(memory per `x-user`). `/refunds` is the refund tool's
side-effect counter (each refund that ran), `/stored?id=` a conversation's history. Served by
uvicorn on the socket given as the first argument."""

from __future__ import annotations

import socket
import sys
from typing import Any

import uvicorn
from approval_tools import Desk, Shop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import ModelRequest
from agentrt.testing import CallTool, FunctionModel


def answer(request: ModelRequest) -> Any:
    """A round that asks for both calls; after it, an answer that repeats what the tools said."""
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
        ]
    )


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])
