"""The SSE response loop per token, by protocol: agentrt's own events, the Vercel UI message stream
and AG-UI, each a whole ASGI response (sse-starlette included) over a scripted model, in process,
with a `send` that only counts. No network: this is the part agentrt adds per token.

    .venv/bin/python benchmarks/bench_sse_protocols.py            # microseconds a token, best of 5
    .venv/bin/python benchmarks/bench_sse_protocols.py vercel 12000

With a protocol and a token count it runs that one response, for an instruction count that does
not depend on the machine's noise:

    valgrind --tool=callgrind python benchmarks/bench_sse_protocols.py vercel 2000
    valgrind --tool=callgrind python benchmarks/bench_sse_protocols.py vercel 12000

(the difference / 10,000 is the instructions a token). Add `spaced` for a model that takes a
millisecond a token, as a real one does (the response then waits for each token).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio

import agentrt
import agentrt.sse
from agentrt.sse import _agui, _encoder, _response, _vercel
from agentrt.testing import Delay, ScriptedModel


class Chat:
    async def stream(self, question: str) -> agentrt.TokenStream: ...


async def respond(protocol: str, tokens: int, spaced: bool = False) -> int:
    script: list[Any] = [f"t{i} " for i in range(tokens)]
    if spaced:  # a model that takes a millisecond a token: the response waits for each
        script = [step for token in script for step in (Delay(0.001), token)]
    service = agentrt.build(Chat, model=ScriptedModel(script))
    stream = await service.stream("go")
    if protocol == "agentrt":
        response = agentrt.sse.stream_response(stream)
    else:
        encoder: _encoder.Encoder
        if protocol == "vercel":
            encoder = _vercel.VercelUI("m", thinking=False, tool_details=False, hold=False, structured=False)
        else:
            encoder = _agui.AgUI("t", "r", [], thinking=False, tool_details=False, structured=False)
        response = _response.respond(
            stream,
            encoder,
            _response.Run(),
            ping=None,
            headers=None,
            send_timeout=None,
        )
    sent = 0

    async def receive() -> Any:
        await anyio.sleep_forever()

    async def send(message: Any) -> None:
        nonlocal sent
        sent += 1

    await response({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)
    return sent


def main() -> None:
    if len(sys.argv) in (3, 4):
        anyio.run(respond, sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["spaced"])
        return
    tokens = 5_000
    for protocol in ("agentrt", "vercel", "ag-ui"):
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            anyio.run(respond, protocol, tokens)
            best = min(best, time.perf_counter() - started)
        print(f"{protocol:8} {best / tokens * 1e6:6.2f} µs a token (whole response, {tokens} tokens)")


if __name__ == "__main__":
    main()
