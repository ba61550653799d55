"""A chat page over SSE: `make demo-web`, then open the printed address.

One HTML page (examples/web/index.html: no build step, no CDN) posts a question to `/chat`, an
`agentrt.sse.endpoint` of a streaming method, and shows the tokens as they arrive, the tool calls as
they happen and errors readably. The page's conversation is chosen by a random id it sends in a
header (kept for the tab in `sessionStorage`): a demo's stand-in for the authenticated user a real
app would use. A switch on the page speaks the Vercel AI SDK's UI message stream instead
(`POST /api/chat`, the protocol `useChat` reads), parsed by the page itself.

Each answer is a run of the app's run manager (`agentrt.runs.Runs`, started in the app's lifespan)
that outlives its connection (`on_disconnect="detach"`): reload the page mid-answer and it asks for
the run again and shows the whole answer, from its start (agentrt's protocol: `GET /chat/resume`
with `Last-Event-ID: <run id>:0`; Vercel's: `GET /api/chat/<chat id>/stream`, what
`useChat({resume: true})` asks). The turn is stored once, when the run ends. Stop is a verb of its
own (`POST /chat/stop`, `/api/chat/stop`): the run is cancelled, the model's stream closed, nothing
is stored.

A refund over 100 waits for a human: the turn stops (stored with the conversation's memory) and the
page shows the call with Allow and Deny; the click resumes the turn on the same endpoint (agentrt's
`{"approval": ...}` body, or the assistant message in state `approval-responded` that `useChat`'s
`addToolApprovalResponse` sends) and the rest of the answer streams in.

With `OPENAI_BASE_URL` set the app talks to that endpoint; otherwise it starts the local model
(agentrt.local) for as long as it runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, StringConstraints
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

import agentrt
import agentrt.runs
import agentrt.sse
from agentrt import ChatModel, Description, MemoryId, TokenStream, ToolContext, system_message, tool

from ..support import OrderTools

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request

PAGE = Path(__file__).with_name("index.html")


def over_100(arguments: Mapping[str, Any], context: ToolContext) -> bool:
    """A refund over 100 waits for a human's decision."""
    return bool(arguments["amount"] > 100)


class Refunds:
    """A tool with a side effect: each refund that ran is in `refunded`."""

    def __init__(self) -> None:
        self.refunded: list[tuple[str, float]] = []

    @tool("Refund an amount on an order. Refunds over 100 need a human's approval.", needs_approval=over_100)
    async def refund(
        self,
        order_id: Annotated[
            str, Description("order number, e.g. SO-2026-0001"), StringConstraints(max_length=24)
        ],
        amount: Annotated[float, Description("the amount to refund"), Field(gt=0)],
    ) -> str:
        self.refunded.append((order_id, amount))
        return f"Refunded {amount:.2f} on {order_id}."


@system_message("You are a concise support assistant for Acme Rail.")
class WebChat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def session_of(request: Request) -> str:
    """The conversation of a request: the page's id (a real app: its authenticated user)."""
    return request.headers.get("x-session", "anonymous")[:64]


def session_and_chat(request: Request, chat: str | None) -> str:
    """A Vercel chat's conversation: the page's id and the chat's (never the chat id alone)."""
    return f"{session_of(request)}:{chat}"[:160]


def create_app(model: ChatModel, *, listeners: tuple[agentrt.Listener, ...] = ()) -> Starlette:
    """The app: the page at `/`, the SSE endpoint at `POST /chat` (its resume and stop routes
    beside it), and the same method for Vercel's `useChat` at `POST /api/chat`. Serve it with its
    lifespan (uvicorn's default): the run manager lives there."""
    refunds = Refunds()
    service = agentrt.build(
        WebChat,
        model=model,
        # A model that cannot choose tools itself (the local one) chats without them.
        tools=[OrderTools(), refunds] if model.capabilities.tool_choice_auto else [],
        memory=agentrt.memory.window(max_messages=20),
        # A turn that waits for a decision on a refund is kept in the memory's store; after 15
        # minutes without one, the refund counts as denied.
        approvals=agentrt.Approvals(expires_after=15 * 60),
        budget=agentrt.Budget(seconds=120, total_tokens=20_000),
        listeners=listeners,
    )
    page = PAGE.read_text()

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    # The answers run in the app's run manager: a reader that goes away (a reload) leaves its run
    # going, and comes back for it.
    runs = agentrt.runs.Runs()
    detached: dict[str, Any] = {"ping": 10, "runs": runs, "on_disconnect": "detach"}
    chat = agentrt.sse.endpoint(service.chat, memory_id=session_of, **detached)
    # The same method for a Vercel AI SDK frontend (`useChat`): its UI message stream.
    vercel = agentrt.sse.endpoint(service.chat, memory_id=session_and_chat, protocol="vercel-ui", **detached)
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/chat", chat, methods=["POST"]),
            Route("/chat/resume", chat.resume, methods=["GET"]),
            Route("/chat/stop", chat.stop, methods=["POST"]),
            Route("/api/chat", vercel, methods=["POST"]),
            Route("/api/chat/stop", vercel.stop, methods=["POST"]),
            Route("/api/chat/{id}/stream", vercel.resume, methods=["GET"]),
        ],
        lifespan=runs.lifespan,
    )
    app.state.service = service  # for tests and admin routes (agentrt.memory.access(service))
    app.state.refunds = refunds
    return app


def main() -> None:
    import anyio
    import uvicorn

    from agentrt.local import LocalModelServer
    from agentrt.models import OpenAIChatModel

    port = int(os.environ.get("PORT", "8000"))

    async def serve(model: ChatModel) -> None:
        print(f"agentrt web chat on http://127.0.0.1:{port}/ (Ctrl-C stops it)", file=sys.stderr)
        config = uvicorn.Config(create_app(model), host="127.0.0.1", port=port, log_level="warning")
        await uvicorn.Server(config).serve()

    async def run() -> None:
        if os.environ.get("OPENAI_BASE_URL"):
            async with OpenAIChatModel(os.environ.get("OPENAI_MODEL", "gpt-4o-mini")) as model:
                await serve(model)
            return
        async with LocalModelServer() as server, server.chat_model() as model:
            await serve(model)

    anyio.run(run)


if __name__ == "__main__":
    main()
