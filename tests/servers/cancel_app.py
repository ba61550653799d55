"""SSE endpoints served by uvicorn whose clients hang up while the server's event loop is blocked
(tests/test_sse_cancel_rule.py): is a turn stored exactly when the answer's final frame was written
to the client's connection?

Six endpoints, `POST /{plain|runs}/{agentrt|vercel-ui|ag-ui}`: each protocol without a run manager
and with one (`runs=Runs()`, `on_disconnect="cancel"`). One service: a model that streams a few
tokens (`k0x k1x ... <cid>-end`), an output guardrail, a memory whose store is this app's, a
listener. The same six under `.../open` have no output guardrail (the tokens stream as they come).
The memory id is the request's `x-cid` header (one conversation per client).

The question says what the server does: `"<cid> <point> [tokens] [pace ms]"`. At `point` the server
*holds*: it blocks its event loop (a synchronous wait, as a long synchronous step would), tells the
test on the control socket (its port is the second argument) and waits until the test, which then
closes the client's socket, says go; then it waits (still blocking) until that close reached the
server's socket. So the hang-up is at the socket before the loop runs on, and the loop has not seen
it. Points:

- `token`: in the model, before the last token; `tokened`: after it, before the model's end
- `guardrail`: in the output guardrail
- `loop:K`: K + 1 event-loop iterations after the model was about to send its last token, which it
  sends `LEAD` iterations later, and its end `TAIL` after that (a `call_soon` chain): a sweep across
  the final send
- `send`: in the ASGI `send`, just before the final frame is handed to uvicorn; `sent`: just after
- `store`: in the memory store's write of the turn (the commit)
- `none`: nowhere (the 200-client test: `tokens` tokens `pace` ms apart)

`POST /blocks {"every": s, "for": s}` makes the server block its loop for `for` seconds every `every`
seconds (`every` 0: stop).

The truth is uvicorn's, not agentrt's: the server's HTTP protocol is uvicorn's h11 protocol with its
transport tapped (`Recording`). A connection's final frame was *written* when its bytes reached
`transport.write` while the transport was open and the socket took them; else it was *dropped*
(asyncio's transport drops writes once it read the end of file, and closes on a write the socket
refuses, e.g. EPIPE after the client's reset), or never reached the transport (uvicorn drops sends
once `connection_lost` ran). `GET /result/{cid}` answers once the connection is closed, the
response ended and the invocation ended (its listener had `Completed`, `CancelledEvent` or
`FailedEvent`): the truth and what memory holds for the client, and for a held request a trace of
what happened in which loop iteration (counted from the last token).

Run as `python cancel_app.py <fd> <control port>` to serve on an already listening socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import select
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

import agentrt
import agentrt.sse
from agentrt import (
    CancelledEvent,
    Capabilities,
    Completed,
    FailedEvent,
    FinishReason,
    MemoryId,
    ModelRequest,
    TextDelta,
    TokenStream,
)
from agentrt.guardrails import OutputGuardrailRequest, output_guardrails, success
from agentrt.memory import InMemoryStore
from agentrt.models import Finish, ModelChunk
from agentrt.runs import Runs

FINAL = (b"event: done", b'"type":"finish"', b'"type":"RUN_FINISHED"')
"""The answer's final frame, per protocol (Vercel's `finish`, not `finish-step`)."""

LEAD = 6
"""Loop iterations between the start of a `loop:K` sweep and the last token."""
TAIL = 3
"""Loop iterations between the last token and the model's end, in a sweep: the final frame is then
the first write of its step (a hang-up read in that very iteration is read after it)."""

CID: ContextVar[str | None] = ContextVar("cid", default=None)
order = itertools.count(1)
ticks = [0, 0]  # loop iterations counted since the last guardrail, iterations left to count
trace: list[tuple[int, str]] = []


def ticker() -> None:
    ticks[0] += 1
    ticks[1] -= 1
    if ticks[1] > 0:
        asyncio.get_running_loop().call_soon(ticker)


def note(what: str) -> None:
    trace.append((ticks[0], what))


class Connection:
    """What uvicorn did with one client connection, in the order it happened (`order`)."""

    def __init__(self) -> None:
        self.written = 0  # when the final frame reached transport.write with the transport open
        self.dropped = 0  # ... with the transport closing (asyncio drops it)
        self.eof = 0  # when the client's end of file was read
        self.lost = 0  # when connection_lost ran
        self.closed = asyncio.Event()
        self.socket: Any = None


class Tap:
    """A transport whose writes are recorded."""

    def __init__(self, inner: Any, connection: Connection) -> None:
        self._inner = inner
        self._connection = connection

    def write(self, data: bytes) -> None:
        if not any(mark in data for mark in FINAL):
            self._inner.write(data)
            return
        closing = self._inner.is_closing()
        self._inner.write(data)
        # A write the socket refused (the client reset the connection: EPIPE) closes the transport.
        if closing or self._inner.is_closing():
            self._connection.dropped = next(order)
            note("final dropped")
        else:
            self._connection.written = next(order)
            note("final written")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


connections: dict[Any, Connection] = {}


class Recording(H11Protocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self._recorded = connection = Connection()
        connection.socket = transport.get_extra_info("socket")
        super().connection_made(Tap(transport, connection))
        connections[tuple(self.client) if self.client else None] = connection

    def eof_received(self) -> None:
        self._recorded.eof = next(order)
        note("eof")
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._recorded.lost = next(order)
        note(f"lost {exc!r}")
        super().connection_lost(exc)
        self._recorded.closed.set()


class Client:
    """One client's request, by its cid."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.point = "none"
        self.ended: str | None = None  # the invocation's last lifecycle event
        self.invocation = asyncio.Event()
        self.response = asyncio.Event()


clients: dict[str, Client] = {}
control_port = 0


def hold(cid: str, point: str) -> None:
    """Block the event loop until the test closed the client's socket and the close reached ours."""
    with socket.create_connection(("127.0.0.1", control_port)) as control:
        control.sendall(f"{cid} {point}\n".encode())
        assert control.recv(1) == b"g"
    readable, _, _ = select.select([clients[cid].connection.socket.fileno()], [], [], 10)
    assert readable, "the client's close did not reach the server's socket"


def hold_later(cid: str, point: str, turns: int) -> None:
    """Hold `turns` + 1 loop iterations from now (a `call_soon` chain)."""
    loop = asyncio.get_running_loop()

    def tick(left: int) -> None:
        if left:
            loop.call_soon(tick, left - 1)
        else:
            note("hold")
            hold(cid, point)

    loop.call_soon(tick, turns)


def plan(text: str) -> tuple[str, str, int, float]:
    cid, point, *rest = text.split()
    tokens = int(rest[0]) if rest else 4
    pace = float(rest[1]) / 1000 if len(rest) > 1 else 0.0
    return cid, point, tokens, pace


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


class Open:
    """`Chat` without its output guardrail."""

    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


class Model:
    name = "tokens"
    capabilities = Capabilities(handles_deadline=True)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        cid, point, tokens, pace = plan(request.messages[-1].text or "")
        for index in range(tokens):
            last = index == tokens - 1
            if last and point != "none":
                trace.clear()
                if not ticks[1]:
                    asyncio.get_running_loop().call_soon(ticker)
                ticks[:] = [0, 60]
                note("last token")
                if point == "token":
                    hold(cid, point)
                elif point.startswith("loop:"):
                    hold_later(cid, point, int(point[5:]))
                    for _ in range(LEAD):  # the last token comes LEAD iterations later
                        await anyio.lowlevel.checkpoint()
            if pace:
                await anyio.sleep(pace)
            yield TextDelta(f"{cid}-end" if last else f"k{index}x ")
        if point == "tokened":
            hold(cid, point)
        elif point.startswith("loop:"):
            for _ in range(TAIL):  # the end comes in a read of its own, as over a network
                await anyio.lowlevel.checkpoint()
        yield Finish(FinishReason.STOP)


async def checked(request: OutputGuardrailRequest) -> Any:
    cid, point, _, _ = plan(request.user_message.text or "")
    note("guardrail")
    if point == "guardrail":
        hold(cid, point)
    return success()


class Store(InMemoryStore):
    __slots__ = ()

    async def commit(
        self, key: str, messages: Sequence[Any], *, drop: int = 0, owner: str | None = None
    ) -> None:
        cid = CID.get()
        note("commit")
        if cid is not None and clients[cid].point == "store":
            hold(cid, "store")
            # A store's write over the network: the hang-up lands meanwhile, and the write goes on
            # (the memory runs a store's write to its end, and the invocation shields the commit).
            for _ in range(8):
                await anyio.lowlevel.checkpoint()
        await super().commit(key, messages, drop=drop, owner=owner)


def ended(event: Any) -> None:
    cid = CID.get()
    if cid is not None and type(event) in (Completed, CancelledEvent, FailedEvent):
        client = clients[cid]
        client.ended = type(event).__name__
        note(client.ended)
        client.invocation.set()


def app(control: int) -> Any:
    global control_port
    control_port = control
    store = Store()
    memory = agentrt.memory.window(store=store, namespace="t")
    service = agentrt.build(
        output_guardrails(checked)(Chat),
        model=Model(),
        memory=memory,
        listeners=[ended],
    )
    runs = Runs()
    blocking = {"every": 0.0, "for": 0.0, "changed": asyncio.Event()}

    def user(request: Request) -> str:
        return request.headers["x-cid"]

    # the same without an output guardrail: its tokens stream as they come
    unguarded = agentrt.build(Open, model=Model(), memory=memory, listeners=[ended])
    routes = []
    for protocol in ("agentrt", "vercel-ui", "ag-ui"):
        for path, manager in (("plain", None), ("runs", runs)):
            for suffix, chat in (("", service.chat), ("/open", unguarded.chat)):
                handler = agentrt.sse.endpoint(
                    chat, memory_id=user, protocol=protocol, runs=manager, ping=None
                )  # type: ignore[call-overload]
                routes.append(Route(f"/{path}/{protocol}{suffix}", handler, methods=["POST"]))

    async def result(request: Request) -> JSONResponse:
        cid = request.path_params["cid"]
        client = clients[cid]
        with anyio.fail_after(20):
            await client.connection.closed.wait()
            await client.response.wait()
            await client.invocation.wait()
        connection = client.connection
        stored = await store.load(f't:"{cid}"')
        return JSONResponse(
            {
                "written": connection.written,
                "dropped": connection.dropped,
                "eof": connection.eof,
                "lost": connection.lost,
                "ended": client.ended,
                "stored": [[message.role, message.text] for message in stored],
                "trace": trace,
            }
        )

    async def blocks(request: Request) -> JSONResponse:
        asked = await request.json()
        blocking["every"], blocking["for"] = asked["every"], asked["for"]
        blocking["changed"].set()  # type: ignore[union-attr]
        return JSONResponse({})

    async def blocker() -> None:
        while True:
            changed: asyncio.Event = blocking["changed"]  # type: ignore[assignment]
            if not blocking["every"]:
                await changed.wait()
                changed.clear()
                continue
            await anyio.sleep(blocking["every"])  # type: ignore[arg-type]
            time.sleep(blocking["for"])  # type: ignore[arg-type]  # noqa: ASYNC251 (the point: a blocked loop)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with runs, anyio.create_task_group() as group:
            group.start_soon(blocker)
            yield
            group.cancel_scope.cancel()

    inner = Starlette(
        routes=[*routes, Route("/result/{cid}", result), Route("/blocks", blocks, methods=["POST"])],
        lifespan=lifespan,
    )

    async def served(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(("/plain/", "/runs/")):
            await inner(scope, receive, send)
            return
        headers = dict(scope["headers"])
        cid = headers[b"x-cid"].decode()
        client = clients[cid] = Client(connections[tuple(scope["client"])])
        client.point = headers.get(b"x-point", b"none").decode()
        CID.set(cid)

        async def receiving() -> Any:
            message = await receive()
            note(f"received {message['type']}")
            return message

        async def sending(message: Any) -> None:
            final = any(mark in message.get("body", b"") for mark in FINAL)
            if final and client.point == "send":
                hold(cid, "send")
            await send(message)
            if final and client.point == "sent":
                hold(cid, "sent")

        try:
            await inner(scope, receiving, sending)
        finally:
            client.response.set()

    return served


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(int(sys.argv[2])), log_level="warning", http=Recording, lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])
