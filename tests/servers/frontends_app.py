"""A test app for the frontend protocols (tests/test_frontends_node.py): one scripted conversation
(a retrieved source, reasoning, two tool calls in one round, a guardrail reprompt, a final answer)
behind a `vercel-ui` and an `ag-ui` endpoint, and under `.../refusing` an answer whose first
sentences pass a `chunked` guardrail that then refuses it whole; memory per `x-user` and
conversation id. Served by uvicorn on the socket given as the first argument.

Under `/runs/...` a method without guardrails (its events stream as they are made) runs in a run
manager (`agentrt.runs.Runs`, detached from its connection): `POST /runs/vercel` and its resume
`GET /runs/vercel/{id}/stream` (what `useChat`'s transport asks for), `POST /runs/agui` and
`GET /runs/agui/resume` (`Last-Event-ID`). A question "Hold <ticket>" is answered with reasoning,
text and a look-up; the answer after it waits until `POST /open?ticket=<ticket>` (a run still going
when a client resumes it)."""

from __future__ import annotations

import re
import socket
import sys
from typing import Annotated, Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentrt
import agentrt.runs
import agentrt.sse
from agentrt import MemoryId, ModelRequest, ThinkingDelta, TokenStream, tool
from agentrt.guardrails import fatal, output_guardrails, partial_text, reprompt, success
from agentrt.rag import Content, Query, Retrieval
from agentrt.testing import CallTool, FunctionModel


class Orders:
    @tool("Look up an order.")
    def order(self, order_id: str) -> str:
        return f"{order_id}: shipped"


GATES: dict[str, anyio.Event] = {}
"""A "Hold <ticket>" question's answer waits for its gate (`POST /open?ticket=`)."""


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

    async def held(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


async def answer(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.text.startswith("How do I reach you?"):
        return [ThinkingDelta("Share it. "), "Call me at 555-0100. ", "Or write."]
    asked = next(
        m.text for m in reversed(request.messages) if m.role == "user" and "Say please." not in m.text
    )
    held = re.search(r"Hold (\S+)", asked)  # the question (the retrieved sources follow it)
    if held and last.role == "tool":  # the answer after the look-up waits for the test
        await GATES.setdefault(held[1], anyio.Event()).wait()
        return [ThinkingDelta("Known. "), "It ", "shipped ", "on time."]
    if last.role == "tool":
        return [ThinkingDelta("Both are known. "), "Both ", "shipped."]
    if "Say please." in last.text:
        return ["Both shipped, ", "please."]
    if held:
        return [ThinkingDelta("Plan. "), "Checking. ", CallTool("order", {"order_id": "A"}, id="call_1")]
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

    runs = agentrt.runs.Runs()
    detached: dict[str, Any] = {**options, "runs": runs, "on_disconnect": "detach"}
    vercel_runs = agentrt.sse.endpoint(service.held, protocol="vercel-ui", **detached)  # type: ignore[arg-type]
    agui_runs = agentrt.sse.endpoint(service.held, protocol="ag-ui", **detached)  # type: ignore[arg-type]

    async def open_gate(request: Request) -> JSONResponse:
        GATES.setdefault(request.query_params["ticket"], anyio.Event()).set()
        return JSONResponse({"opened": request.query_params["ticket"]})

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
            Route("/runs/vercel", vercel_runs, methods=["POST"]),
            Route("/runs/vercel/{id}/stream", vercel_runs.resume, methods=["GET"]),
            Route("/runs/vercel/stop", vercel_runs.stop, methods=["POST"]),
            Route("/runs/agui", agui_runs, methods=["POST"]),
            Route("/runs/agui/resume", agui_runs.resume, methods=["GET"]),
            Route("/open", open_gate, methods=["POST"]),
        ],
        lifespan=runs.lifespan,
    )


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])
