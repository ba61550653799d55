"""A chat page over SSE: `make demo-web`, then open the printed address.

One HTML page (examples/web/index.html: no build step, no CDN) posts a question to `/chat`, an
`agentrt.sse.endpoint` of a streaming method, and shows the tokens as they arrive, the tool calls as
they happen and errors readably; its Stop button aborts the request, which cancels the invocation on
the server (the model's stream is closed, nothing is stored). The page's conversation is chosen by a
random id it sends in a header: a demo's stand-in for the authenticated user a real app would use.
A switch on the page speaks the Vercel AI SDK's UI message stream instead (`POST /api/chat`, the
protocol `useChat` reads), parsed by the page itself.

With `OPENAI_BASE_URL` set the app talks to that endpoint; otherwise it starts the local model
(agentrt.local) for as long as it runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import ChatModel, MemoryId, TokenStream, system_message

from ..support import OrderTools

if TYPE_CHECKING:
    from starlette.requests import Request

PAGE = Path(__file__).with_name("index.html")


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
    """The app: the page at `/`, the SSE endpoint at `POST /chat`, and the same method for
    Vercel's `useChat` at `POST /api/chat`."""
    service = agentrt.build(
        WebChat,
        model=model,
        # A model that cannot choose tools itself (the local one) chats without them.
        tools=[OrderTools()] if model.capabilities.tool_choice_auto else [],
        memory=agentrt.memory.window(max_messages=20),
        budget=agentrt.Budget(seconds=120, total_tokens=20_000),
        listeners=listeners,
    )
    page = PAGE.read_text()

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    chat = agentrt.sse.endpoint(service.chat, memory_id=session_of, ping=10)
    # The same method for a Vercel AI SDK frontend (`useChat`): its UI message stream.
    vercel = agentrt.sse.endpoint(service.chat, memory_id=session_and_chat, ping=10, protocol="vercel-ui")
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/chat", chat, methods=["POST"]),
            Route("/api/chat", vercel, methods=["POST"]),
        ]
    )
    app.state.service = service  # for tests and admin routes (agentrt.memory.access(service))
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
