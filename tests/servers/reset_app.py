"""An agentrt SSE endpoint served by uvicorn whose client resets the connection mid-stream
(tests/test_sse_server.py): does the server keep writing to the dead socket?

`POST /chat` streams one token, `first`, and then a burst of 50 that the model has ready at once.
Between the two the server is made busy: right after `first` went out, the app blocks (the whole
event loop, as a long synchronous step would) until the test, which has reset the connection by
then, says go on the control socket whose port is the second argument. So the reset is certain to
have reached the server's socket before the burst, and certain not to have been seen by the event
loop yet: the race in which asyncio's transport logs "socket.send() raised exception." for every
write after the fifth to a lost connection, made deterministic.

`GET /log` answers once the streamed response has ended: the `asyncio` log records of the process
(their messages, as JSON).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import TokenStream
from agentrt.testing import ScriptedModel


class Desk:
    async def chat(self, question: str) -> TokenStream: ...


class Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def app(control_port: int, protocol: agentrt.sse.Protocol) -> Any:
    recorded = Recorded()
    logging.getLogger("asyncio").addHandler(recorded)
    ended = asyncio.Event()
    model = ScriptedModel(["first", *(f" t{n}" for n in range(50))])
    chat = agentrt.sse.endpoint(agentrt.build(Desk, model=model).chat, protocol=protocol, ping=None)

    async def log(request: Request) -> JSONResponse:
        await ended.wait()
        return JSONResponse(recorded.messages)

    inner = Starlette(routes=[Route("/chat", chat, methods=["POST"]), Route("/log", log)])

    async def served(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/chat":
            await inner(scope, receive, send)
            return
        held = False

        async def sending(message: Any) -> None:
            nonlocal held
            await send(message)
            if not held and b"first" in message.get("body", b""):
                held = True  # `first` is on the wire: wait, blocking, for the client's reset
                with socket.create_connection(("127.0.0.1", control_port)) as control:
                    control.recv(1)

        try:
            await inner(scope, receive, sending)
        finally:
            ended.set()

    return served


if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app(int(sys.argv[2]), sys.argv[3]), log_level="warning", lifespan="off")  # type: ignore[arg-type]
    uvicorn.Server(config).run(sockets=[listener])
