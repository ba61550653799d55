"""What a tool call costs through an MCP server, over the same call to a local tool.

One invocation makes one tool call (`add(a, b)`) and then answers: two model requests (a model that
answers from memory) around one tool round. The tool is a local `async def`, then the same tool of
tests/mcp_server.py over stdio and over Streamable HTTP on loopback (uvicorn), on each protocol era
the SDK speaks (2026-07-28, negotiated with this server, and the legacy 2025-11-25 handshake). The
difference per invocation is the MCP round trip: the SDK's client, the transport, the server.

Prints milliseconds per invocation (median of interleaved batches) and the overhead over the local
tool; and, to split it, the same invocation with a local tool that awaits the SDK's own
`Client.call_tool` on the same connection (no `agentrt.mcp` in the way) and that `call_tool` alone.
What `agentrt.mcp` adds is the first minus the second (its source, the JSON-schema check of the
arguments, the result's conversion); the rest is the SDK, the transport and the server. It never
asserts.

    .venv/bin/python benchmarks/bench_mcp.py [--quick]    (--quick: fewer calls, asyncio only)
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

import agentrt
from agentrt import ToolResultMessage, tool
from agentrt.mcp import HTTPServer, MCPTools, StdioServer
from agentrt.testing import CallTool, FunctionModel

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_server.py"
TOKEN = "bench"


class Desk:
    async def ask(self, question: str) -> str: ...


@tool("Add two integers.")
async def add(a: int, b: int) -> int:
    return a + b


def answer(request: agentrt.ModelRequest) -> Any:
    """Call `add` first, then answer with its result."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return last.text
    return [CallTool("add", {"a": 2, "b": 3}, id="c1")]


async def per_call(*calls: Callable[[], Awaitable[object]], times: int, batches: int) -> list[float]:
    """Median seconds per call of each of `calls`, their batches of `times` interleaved (so that
    a machine busy with something else slows them alike), after a warm-up."""
    for call in calls:
        for _ in range(20):
            await call()
    timings: list[list[float]] = [[] for _ in calls]
    for _ in range(batches):
        for call, taken in zip(calls, timings, strict=True):
            started = time.perf_counter()
            for _ in range(times):
                await call()
            taken.append((time.perf_counter() - started) / times)
    return [statistics.median(taken) for taken in timings]


class HTTP:
    """tests/mcp_server.py over Streamable HTTP on a loopback socket opened here."""

    def __enter__(self) -> str:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        fd = self.listener.fileno()
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "--http", str(fd), "--token", TOKEN],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
        )
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/mcp"

    def __exit__(self, *exc_info: object) -> None:
        self.process.kill()
        self.process.wait()
        self.listener.close()


# The test server's other tools, left out: each invocation offers `add` alone, as the local build does.
OTHERS = ("echo", "pid", "listings", "read_note", "delete_note", "add_note", "picture", "slow")
OTHERS += ("was_cancelled", "meet", "crash", "enable_extra")


def servers(url: str) -> Iterator[tuple[str, StdioServer | HTTPServer]]:
    for mode in ("auto", "legacy"):
        era = "2026-07-28" if mode == "auto" else "2025-11-25"
        yield f"stdio, {era}", StdioServer(sys.executable, [str(SERVER)], mode=mode, exclude=OTHERS)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        yield f"Streamable HTTP, {era}", HTTPServer(url, headers=headers, mode=mode, exclude=OTHERS)


async def main(quick: bool) -> None:
    times, batches = (50, 3) if quick else (100, 15)
    local = agentrt.build(Desk, model=FunctionModel(answer), tools=[add])
    with HTTP() as url:
        for label, server in servers(url):
            source = MCPTools(server)
            service = agentrt.build(Desk, model=FunctionModel(answer), tools=[source])
            async with source:
                assert list(source.tools) == ["add"]
                link = source._states[0].link  # the same connection, without agentrt.mcp
                assert link is not None
                client = link.client
                assert client is not None

                @tool("Add two integers.", name="add")
                async def add_by_sdk(a: int, b: int) -> Any:
                    return (await client.call_tool("add", {"a": a, "b": b})).structured_content  # noqa: B023

                by_sdk = agentrt.build(Desk, model=FunctionModel(answer), tools=[add_by_sdk])
                base, took, wrapped, sdk = await per_call(
                    lambda: local.ask("2 + 3?"),
                    lambda: service.ask("2 + 3?"),  # noqa: B023 (called before the next loop)
                    lambda: by_sdk.ask("2 + 3?"),  # noqa: B023
                    lambda: client.call_tool("add", {"a": 2, "b": 3}),  # noqa: B023
                    times=times,
                    batches=batches,
                )
            print(
                f"  {label:<28} local {base * 1000:.3f} ms, MCP {took * 1000:.3f} ms per invocation "
                f"(+{(took - base) * 1000:.3f} ms); a local tool awaiting the SDK's call_tool "
                f"{wrapped * 1000:.3f} ms (the call alone {sdk * 1000:.3f} ms): agentrt.mcp "
                f"{(took - wrapped) * 1000:+.3f} ms"
            )


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    for backend in ("asyncio",) if quick else ("asyncio", "trio"):
        print(f"{backend}: one invocation = two model requests around one call of add(a, b)")
        anyio.run(main, quick, backend=backend)
