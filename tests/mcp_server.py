"""An MCP server for the tests, written with the SDK's server API (`mcp.server.MCPServer`).

    python mcp_server.py [--bad-schema]                  over stdio
    python mcp_server.py --http <fd> [--token T] [...]   over Streamable HTTP, uvicorn on the
                                                         listening socket inherited as <fd>

Its state (notes, the cancellation it saw, how often its tools were listed) lives in the process:
a server that was killed and started again has forgotten it.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import sys
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True)
HARMLESS = ToolAnnotations(read_only_hint=False, destructive_hint=False)
DESTRUCTIVE = ToolAnnotations(destructive_hint=True)
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


class Server(MCPServer):
    listed = 0
    bad_schema = False
    die_listing = False

    async def list_tools(self) -> Any:
        Server.listed += 1
        if Server.die_listing:
            os.kill(os.getpid(), signal.SIGKILL)
        tools = await super().list_tools()
        if Server.bad_schema:
            for tool in tools:
                if tool.name == "add":  # one of a and b: what OpenAI refuses at the top of a schema
                    tool.input_schema = {
                        **tool.input_schema,
                        "required": [],
                        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
                    }
        return tools


mcp = Server("notes", log_level="ERROR")
notes: dict[str, str] = {"groceries": "milk, eggs"}
cancelled = anyio.Event()
meeting: list[anyio.Event] = []


@mcp.tool(annotations=READ_ONLY)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool(annotations=READ_ONLY, structured_output=False)
def echo(text: str) -> str:
    """Say the text back."""
    return text


@mcp.tool(annotations=READ_ONLY)
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@mcp.tool(annotations=READ_ONLY)
def listings() -> int:
    """How often the tools were listed."""
    return Server.listed


@mcp.tool(annotations=READ_ONLY)
def read_note(title: str) -> str:
    """Read a note."""
    if title not in notes:
        raise ToolError(f"no note {title!r} in /srv/notes/private")
    return notes[title]


@mcp.tool(annotations=DESTRUCTIVE)
def delete_note(title: str) -> str:
    """Delete a note."""
    notes.pop(title, None)
    return f"deleted {title}"


@mcp.tool(annotations=HARMLESS)
def add_note(title: str, text: str) -> str:
    """Add a note (never overwrites one)."""
    notes.setdefault(title, text)
    return "ok"


@mcp.tool(annotations=READ_ONLY, structured_output=False)
def picture() -> list[Any]:
    """A picture with a caption."""
    return [
        TextContent(type="text", text="a pixel"),
        ImageContent(type="image", data=PIXEL, mime_type="image/png"),
    ]


@mcp.tool(annotations=READ_ONLY, structured_output=False)
def drawings() -> list[Any]:
    """Images of several types: one every provider takes, an SVG, and one with no type."""
    return [
        ImageContent(type="image", data=PIXEL, mime_type="IMAGE/PNG"),
        ImageContent(type="image", data=base64.b64encode(b"<svg/>").decode(), mime_type="image/svg+xml"),
        ImageContent(type="image", data=PIXEL, mime_type=""),
    ]


parked = anyio.Event()


@mcp.tool(annotations=READ_ONLY)
async def slow() -> str:
    """Wait forever (until cancelled), once the server says it arrived (`is_parked`)."""
    parked.set()
    try:
        await anyio.sleep_forever()
    finally:
        cancelled.set()
    return "never"


@mcp.tool(annotations=READ_ONLY)
async def was_cancelled() -> str:
    """Wait until a slow call was cancelled."""
    await cancelled.wait()
    return "cancelled"


@mcp.tool(annotations=READ_ONLY)
async def meet() -> str:
    """Return once two calls of this tool are running at the same time."""
    if meeting:
        meeting.pop().set()
    else:
        arrived = anyio.Event()
        meeting.append(arrived)
        await arrived.wait()
    return "met"


@mcp.tool(annotations=READ_ONLY)
async def is_parked() -> str:
    """Return once a call of `slow` is running."""
    await parked.wait()
    return "parked"


@mcp.tool(annotations=READ_ONLY)
def crash() -> str:
    """Kill this server's process in the middle of the call."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


def extra(word: str) -> str:
    """Say the word twice."""
    return f"{word} {word}"


@mcp.tool(annotations=HARMLESS)
async def enable_extra(ctx: Context) -> str:
    """Add the tool `extra`."""
    mcp.add_tool(extra, annotations=READ_ONLY)
    await ctx.notify_tools_changed()  # a 2026-07-28 connection: its subscriptions/listen stream
    await ctx.request_context.session.send_tool_list_changed()  # an earlier one: the notification
    return "enabled"


@mcp.tool(annotations=HARMLESS)
async def die_at_next_listing(ctx: Context) -> str:
    """Say the tool list changed, and die when it is read."""
    Server.die_listing = True
    await ctx.notify_tools_changed()
    await ctx.request_context.session.send_tool_list_changed()
    return "armed"


def require(token: str, app: Any) -> Any:
    """`app` for requests with `Authorization: Bearer <token>` only."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    arguments = sys.argv[1:]
    Server.bad_schema = "--bad-schema" in arguments
    if "--http" in arguments:
        import uvicorn

        listener = socket.socket(fileno=int(arguments[arguments.index("--http") + 1]))
        app = mcp.streamable_http_app()
        if "--token" in arguments:
            app = require(arguments[arguments.index("--token") + 1], app)
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listener])
    else:
        mcp.run()
