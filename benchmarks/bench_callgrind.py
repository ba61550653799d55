"""Instruction counts (callgrind) for what the pipeline adds: the honest figure on a noisy machine.

Each scenario runs twice under `valgrind --tool=callgrind`, with N and 6N units of work; the
difference divided by 5N is the instructions one unit costs, start-up and imports cancelled out:

    per-token       a 5-token vs a many-token stream from memory (`bench_pipeline.MemoryModel`)
    per-call        awaited 5-token calls from memory
    per-token-features
                    per-token with what a production user turns on: chat memory, a time budget
                    and an output-token limit, and a pass-through output guardrail (released
                    `buffer`, then `chunked`); against the same stream without them
    round-trip      one tool round trip over a local HTTP server (`bench_http.serve`): agentrt
                    against a hand-written httpx + orjson loop, async and sync tools
    runs            an SSE endpoint's answer over ASGI (`bench_runs.respond`): without a run log,
                    and with `Runs()` (MemoryRunLog) on "cancel" and "detach", for a model that
                    gives its tokens back to back (burst) and one a loop turn (paced)

    .venv/bin/python benchmarks/bench_callgrind.py [scenario ...]      (needs valgrind)

Each run takes a minute or so under valgrind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_STREAM = """
import sys, anyio, agentrt
sys.path.insert(0, {here!r})
from bench_pipeline import MemoryModel, Service, chunks
n = int(sys.argv[1])
svc = agentrt.build(Service, model=MemoryModel(chunks(n)))
async def main():
    async with await svc.stream("q") as s:
        async for t in s:
            pass
anyio.run(main)
"""

_FEATURES = """
import sys, anyio, agentrt
from typing import Annotated
sys.path.insert(0, {here!r})
from bench_pipeline import MemoryModel, chunks
from agentrt import MemoryId, TokenStream
from agentrt.guardrails import output_guardrails, success
n, release = int(sys.argv[1]), sys.argv[2]
class Passes:
    partial_text = True
    name = "passes"
    def validate(self, request):
        return success()
class Service:
    @output_guardrails(Passes(), release=release)
    async def stream(self, chat: Annotated[str, MemoryId], q: str) -> TokenStream: ...
svc = agentrt.build(Service, model=MemoryModel(chunks(n)), memory=agentrt.memory.window(),
                    budget=agentrt.Budget(seconds=30, output_tokens=10**9))
async def main():
    async with await svc.stream("c", "q") as s:
        async for t in s:
            pass
anyio.run(main)
"""

_CALLS = """
import sys, anyio, agentrt
sys.path.insert(0, {here!r})
from bench_pipeline import MemoryModel, Service, chunks
n = int(sys.argv[1])
svc = agentrt.build(Service, model=MemoryModel(chunks(5)))
async def main():
    for _ in range(n):
        await svc.ask("q")
anyio.run(main)
"""

_TRIP = """
import sys, socket, multiprocessing
sys.path.insert(0, {here!r})
import anyio, httpx, agentrt
from bench_http import KEY, serve, Service, plain_round_trip, get_current_weather, get_current_weather_async
from agentrt.models import OpenAIChatModel, RetryPolicy
n, who, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
async def measure(port):
    base = f"http://127.0.0.1:{{port}}/v1"
    async with httpx.AsyncClient(timeout=30) as client:
        chat = OpenAIChatModel("bench", base_url=base, api_key=KEY, client=client, retry=RetryPolicy.never())
        fn = get_current_weather_async if kind == "async" else get_current_weather
        svc = agentrt.build(Service, model=chat, tools=[fn])
        for _ in range(n):
            if who == "plain":
                await plain_round_trip(client, f"{{base}}/chat/completions", {{"get_current_weather": fn}},
                                       awaited=kind == "async")
            else:
                await svc.ask("What's the weather in Seattle?")
if __name__ == "__main__":
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(64)
    server = multiprocessing.Process(target=serve, args=(sock,), daemon=True); server.start()
    try:
        anyio.run(measure, sock.getsockname()[1])
    finally:
        server.terminate()
"""


_RUNS = """
import sys, anyio
sys.path.insert(0, {here!r})
from bench_runs import respond
anyio.run(respond, sys.argv[2], int(sys.argv[1]), sys.argv[3] == "paced")
"""


def instructions(script: str, *args: str) -> int:
    """The instructions the script's own process ran (not the server it starts)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.py"
        path.write_text(script.format(here=str(HERE)))
        out = Path(tmp) / "callgrind.out.%p"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, str(path), *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=True,
        )
        pid = re.search(r"==(\d+)==", done.stderr)
        assert pid is not None, done.stderr
        summary = (Path(tmp) / f"callgrind.out.{pid.group(1)}").read_text()
        found = re.search(r"^summary: (\d+)", summary, re.M)
        assert found is not None
        return int(found.group(1))


def per_unit(script: str, n: int, *args: str) -> float:
    return (instructions(script, str(6 * n), *args) - instructions(script, str(n), *args)) / (5 * n)


def main() -> None:
    chosen = sys.argv[1:] or ["per-token", "per-token-features", "per-call", "round-trip", "runs"]
    bare = None
    if "per-token" in chosen or "per-token-features" in chosen:
        bare = per_unit(_STREAM, 2000)
        print(f"per streamed token, from memory:  {bare:10,.0f} instructions")
    if "per-token-features" in chosen and bare is not None:
        for release in ("buffer", "chunked"):
            featured = per_unit(_FEATURES, 2000, release)
            print(
                f"  with memory, a time and token budget, a guardrail ({release}): {featured:10,.0f} "
                f"instructions ({featured / bare - 1:+.0%})"
            )
    if "per-call" in chosen:
        print(f"per awaited call, from memory:    {per_unit(_CALLS, 200):10,.0f} instructions")
    if "round-trip" in chosen:
        for kind in ("async", "sync"):
            plain = per_unit(_TRIP, 20, "plain", kind)
            ours = per_unit(_TRIP, 20, "agentrt", kind)
            print(
                f"tool round trip ({kind} tool): plain {plain:12,.0f}, agentrt {ours:12,.0f} "
                f"(+{ours - plain:,.0f} instructions, {ours / plain - 1:+.0%})"
            )
    if "runs" in chosen:
        for model in ("burst", "paced"):
            plain = per_unit(_RUNS, 1000, "plain", model)
            print(f"SSE endpoint per token ({model}), no run log: {plain:10,.0f} instructions")
            for policy in ("cancel", "detach"):
                ours = per_unit(_RUNS, 1000, policy, model)
                print(
                    f"SSE endpoint per token ({model}), MemoryRunLog, {policy:6}: {ours:10,.0f} "
                    f"instructions ({ours - plain:+,.0f}, {ours / plain - 1:+.0%})"
                )


if __name__ == "__main__":
    main()
