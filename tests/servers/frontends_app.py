"""A test app for the frontend protocols (tests/test_frontends_node.py): one scripted conversation
(a retrieved source, reasoning, two tool calls in one round, a guardrail reprompt, a final answer)
behind a `vercel-ui` and an `ag-ui` endpoint, and under `.../refusing` an answer whose first
sentences pass a `chunked` guardrail that then refuses it whole; memory per `x-user` and
conversation id. Served by uvicorn on the socket given as the first argument."""

from __future__ import annotations

import socket
import sys
from typing import Annotated, Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import MemoryId, ModelRequest, ThinkingDelta, TokenStream, tool
from agentrt.guardrails import fatal, output_guardrails, partial_text, reprompt, success
from agentrt.rag import Content, Query, Retrieval
from agentrt.testing import CallTool, FunctionModel


class Orders:
    @tool("Look up an order.")
    def order(self, order_id: str) -> str:
        return f"{order_id}: shipped"


@partial_text
def polite(request: Any) -> Any:
    if request.partial or "please" in request.text:
        return success()
    return reprompt("impolite", "Say please.")


@partial_text
def no_phone_numbers(request: Any) -> Any:
    """Passes each sentence, then refuses the whole answer."""
    return success() if request.partial else fatal("a phone number")


class Desk:
    @output_guardrails(polite, release="chunked")
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    @output_guardrails(no_phone_numbers, release="chunked")
    async def refusing(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def answer(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.text.startswith("How do I reach you?"):
        return [ThinkingDelta("Share it. "), "Call me at 555-0100. ", "Or write."]
    if last.role == "tool":
        return [ThinkingDelta("Both are known. "), "Both ", "shipped."]
    if "Say please." in last.text:
        return ["Both shipped, ", "please."]
    return [
        CallTool("order", {"order_id": "A"}, id="call_1"),
        CallTool("order", {"order_id": "B"}, id="call_2"),
    ]


async def handbook(query: Query) -> list[Content]:
    return [Content("Orders ship within two days.", {"source": "shipping.md"}, 1.0, "shipping#0")]


def user_and_thread(request: Request, thread: str | None) -> str:
    return f"{request.headers.get('x-user', 'anonymous')}:{thread}"


def app() -> Starlette:
    service = agentrt.build(
        Desk,
        model=FunctionModel(answer),
        tools=[Orders()],
        memory=agentrt.memory.window(),
        retrieval=Retrieval(retrievers=[handbook]),
    )
    options: dict[str, Any] = {
        "memory_id": user_and_thread,
        "thinking": True,
        "tool_details": True,
        "ping": 1,
    }
    vercel = agentrt.sse.endpoint(service.chat, protocol="vercel-ui", **options)
    agui = agentrt.sse.endpoint(service.chat, protocol="ag-ui", **options)
    refusing = {
        protocol: agentrt.sse.endpoint(service.refusing, protocol=protocol, **options)  # type: ignore[arg-type]
        for protocol in ("vercel-ui", "ag-ui")
    }

    async def stored(request: Request) -> JSONResponse:
        messages = await agentrt.memory.access(service).read(request.query_params["id"])
        return JSONResponse([{"role": m.role, "text": m.text} for m in messages])

    return Starlette(
        routes=[
            Route("/vercel", vercel, methods=["POST"]),
            Route("/agui", agui, methods=["POST"]),
            Route("/vercel/refusing", refusing["vercel-ui"], methods=["POST"]),
            Route("/agui/refusing", refusing["ag-ui"], methods=["POST"]),
            Route("/stored", stored),
        ]
    )


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])
