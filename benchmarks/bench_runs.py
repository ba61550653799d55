"""What a run log adds per token to an SSE endpoint (issue 27: in-memory at most +1 µs a token).

One POST to `agentrt.sse.endpoint`, driven over ASGI in process (a `send` that only counts: no
network), for a long answer from a model in memory, with memory on (the turn is stored):

    plain    endpoint(svc.chat)                                   no run log (the baseline)
    cancel   endpoint(svc.chat, runs=Runs())                      MemoryRunLog, on_disconnect="cancel"
    detach   endpoint(svc.chat, runs=Runs(), on_disconnect="detach")
    redis-cancel, redis-detach                                    the same on RedisRunLog (see below)

The model streams its tokens in one of two ways:

    burst    back to back, never waiting
    paced    one loop turn before each token, as tokens from a socket arrive

The response of the client that starts a run reads the run's stream itself and appends each frame
to the log before it sends it (no task switch a token), so a log costs a frame's id and an append.

Each figure is per token: (time for 6N tokens - time for N tokens) / 5N, the best of several runs,
so the request's own cost (routing, validation, the run's start and the turn's commit) cancels out.

    .venv/bin/python benchmarks/bench_runs.py              # µs a token, every variant, both models
    .venv/bin/python benchmarks/bench_runs.py --quick      # fewer tokens and repeats (make bench)
    .venv/bin/python benchmarks/bench_runs.py --redis redis://127.0.0.1:6379/0
    .venv/bin/python benchmarks/bench_runs.py --redis-only     # (or --no-redis)
    BENCH_FEATURES=1 .venv/bin/python benchmarks/bench_runs.py # with an optimistic output guardrail
                                                               # and a 30 s time budget on
    .venv/bin/python benchmarks/bench_callgrind.py runs    # instructions a token (needs valgrind)

With a variant, a model and a token count it runs that one response (what callgrind measures):

    .venv/bin/python benchmarks/bench_runs.py cancel paced 2000

Redis: the `redis-*` variants need `agentrt.runs.RedisRunLog` (the `redis` extra) and a server:
`--redis URL`, or a `redis-server` on PATH, which is started on a free loopback port for the run.
Besides µs a token they report what one run asks of Redis (seen with MONITOR), per run and per
token: the commands sent (round trips; writes are batched, a script at a time) and the commands
those scripts run (an XADD a frame).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.lowlevel
from starlette.applications import Starlette
from starlette.routing import Route

import agentrt
import agentrt.memory
import agentrt.sse
from agentrt import Budget, Capabilities, FinishReason, MemoryId, ModelRequest, TextDelta, TokenStream
from agentrt.guardrails import OutputGuardrailRequest, fatal, output_guardrails, success
from agentrt.models import Finish, ModelChunk
from agentrt.runs import Runs

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request

VARIANTS = ("plain", "cancel", "detach")
REDIS_VARIANTS = ("redis-cancel", "redis-detach")
MODELS = ("burst", "paced")


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def no_secrets(request: OutputGuardrailRequest) -> Any:
    return fatal("a secret") if "SECRET" in request.text else success()


class GuardedChat:
    """`Chat` with the features a production user turns on (`BENCH_FEATURES=1`): an output
    guardrail that releases text as it streams (`optimistic`), and a 30 s time budget (the build's)."""

    @output_guardrails(no_secrets, release="optimistic")
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


class Counting:
    """Streams as many tokens as the user message says, from memory; `paced`: one loop turn before
    each (`anyio.lowlevel.checkpoint`), as a model read from a socket gives them one at a time."""

    name = "counting"
    capabilities = Capabilities(handles_deadline=True)

    def __init__(self, paced: bool) -> None:
        self.paced = paced

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        paced = self.paced
        checkpoint = anyio.lowlevel.checkpoint
        for index in range(int(request.messages[-1].text or "0")):
            if paced:
                await checkpoint()
            yield TextDelta(f"t{index} ")
        yield Finish(FinishReason.STOP)


def user_of(request: Request) -> str:
    return request.headers["x-user"]


def redis_log(url: str) -> Any:
    """`agentrt.runs.RedisRunLog` on `url` (written on branch i27-redis: on main it is not there yet,
    and the `redis-*` variants say so)."""
    import agentrt.runs

    return agentrt.runs.RedisRunLog(url)  # type: ignore[attr-defined]


async def respond(variant: str, tokens: int, paced: bool, redis_url: str | None = None) -> int:
    """One POST answered with `tokens` tokens; the frames sent."""
    if os.environ.get("BENCH_FEATURES"):
        svc: Any = agentrt.build(
            GuardedChat, model=Counting(paced), memory=agentrt.memory.window(), budget=Budget(seconds=30)
        )
    else:
        svc = agentrt.build(Chat, model=Counting(paced), memory=agentrt.memory.window())
    runs: Runs | None = None
    if variant != "plain":
        log = redis_log(redis_url) if variant.startswith("redis-") and redis_url else None
        if variant.startswith("redis-") and log is None:
            raise SystemExit(f"{variant}: give --redis URL (or have redis-server on PATH)")
        runs = Runs(log)
    policy: Any = "detach" if variant.endswith("detach") else "cancel"
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect=policy)
    app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
    body = b'{"question": "%d"}' % tokens
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/chat",
        "raw_path": b"/chat",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"x-user", b"ada")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    read = False
    sent = 0

    async def receive() -> Any:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()

    async def send(message: Any) -> None:
        nonlocal sent
        if message["type"] == "http.response.body" and message.get("body"):
            sent += 1

    try:
        async with runs if runs is not None else contextlib.nullcontext():
            await app(scope, receive, send)
    finally:
        if runs is not None and hasattr(runs.log, "aclose"):
            await runs.log.aclose()
    stored = await agentrt.memory.access(svc).read("ada")
    assert len(stored) == 2, "the turn was stored"
    assert len(stored[1].text or "") > tokens, "the whole answer was stored"
    return sent


def seconds(
    variant: str, tokens: int, paced: bool, redis_url: str | None, repeat: int
) -> tuple[float, float]:
    """The best CPU seconds of this process (all its threads: not the time other processes of a busy
    machine took) and the best wall-clock seconds, of `repeat` runs."""
    cpu = wall = float("inf")
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        anyio.run(respond, variant, tokens, paced, redis_url)
        cpu = min(cpu, time.process_time() - used)
        wall = min(wall, time.perf_counter() - started)
    return cpu, wall


def per_token_us(
    variant: str, n: int, paced: bool, redis_url: str | None, repeat: int
) -> tuple[float, float]:
    """µs a token, CPU and wall clock: (6N tokens - N tokens) / 5N."""
    many = seconds(variant, 6 * n, paced, redis_url, repeat)
    few = seconds(variant, n, paced, redis_url, repeat)
    return (many[0] - few[0]) / (5 * n) * 1e6, (many[1] - few[1]) / (5 * n) * 1e6


def redis_commands(url: str, variant: str, tokens: int, paced: bool) -> tuple[int, int]:
    """What one run of `tokens` tokens asks of Redis, seen by MONITOR: the commands its clients send
    (round trips: a script is one) and the commands its scripts run (an XADD a frame)."""
    import redis

    watcher = redis.Redis.from_url(url)
    sent = scripted = 0
    with watcher.monitor() as monitor:
        done = threading.Event()

        def watch() -> None:
            nonlocal sent, scripted
            while True:
                seen = monitor.next_command()
                if seen["command"] == "ECHO bench_runs:end":
                    done.set()
                    return
                if seen.get("client_type") == "lua":
                    scripted += 1
                else:
                    sent += 1

        watching = threading.Thread(target=watch)
        watching.start()
        try:
            anyio.run(respond, variant, tokens, paced, url)
        finally:
            redis.Redis.from_url(url).echo("bench_runs:end")
            watching.join(30)
    watcher.close()
    return sent, scripted


@contextlib.contextmanager
def redis_server(url: str | None) -> Any:
    """`url`, or a redis-server of our own on a free loopback port (no persistence), or `None`."""
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with tempfile.TemporaryDirectory() as tmp:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        server = subprocess.Popen([*args, "--dir", tmp], stdout=subprocess.DEVNULL)
        try:
            for _ in range(200):
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                    break
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.terminate()
            server.wait()


def redis_available() -> bool:
    import agentrt.runs

    try:
        import redis  # noqa: F401

        agentrt.runs.RedisRunLog  # type: ignore[attr-defined]  # noqa: B018
    except (ImportError, AttributeError):
        return False
    return True


def line(label: str, figures: tuple[float, float], base: tuple[float, float] | None) -> str:
    cpu, wall = figures
    text = f"  {label:22} {cpu:6.2f} µs CPU, {wall:6.2f} µs wall a token"
    if base is not None:
        text += f"  ({cpu - base[0]:+.2f} CPU, {wall - base[1]:+.2f} wall)"
    return text


def main() -> None:
    args = sys.argv[1:]
    url = None
    if "--redis" in args:
        at = args.index("--redis")
        url = args[at + 1]
        del args[at : at + 2]
    if len(args) == 3 and args[0] in VARIANTS + REDIS_VARIANTS:
        anyio.run(respond, args[0], int(args[2]), args[1] == "paced", url)
        return
    quick = "--quick" in args
    n, repeat = (300, 3) if quick else (2_000, 5)
    print(f"SSE endpoint, per token, in process over ASGI ({n} and {6 * n} tokens, best of {repeat})")
    bases = {}
    for model in MODELS:
        paced = model == "paced"
        base = bases[model] = per_token_us("plain", n, paced, None, repeat)
        print(line(f"{model} plain", base, None))
        if "--redis-only" in args:
            continue
        for variant in ("cancel", "detach"):
            print(line(f"{model} memory {variant}", per_token_us(variant, n, paced, None, repeat), base))
    if "--no-redis" in args:
        return
    if not redis_available():
        print("  redis: agentrt.runs.RedisRunLog (branch i27-redis) or redis-py is not here: not measured")
        return
    with redis_server(url) as server:
        if server is None:
            print("  redis: no --redis URL and no redis-server on PATH: not measured")
            return
        for model in MODELS:
            paced = model == "paced"
            for variant in REDIS_VARIANTS:
                figures = per_token_us(variant, n, paced, server, repeat)
                print(line(f"{model} {variant}", figures, bases[model]))
                many = redis_commands(server, variant, 6 * n, paced)
                few = redis_commands(server, variant, n, paced)
                for what, index in (("round trips", 0), ("commands in scripts", 1)):
                    print(
                        f"  {'':22} Redis {what} a run: {few[index]} for {n} tokens, "
                        f"{many[index]} for {6 * n} ({(many[index] - few[index]) / (5 * n):.4f} a token)"
                    )


if __name__ == "__main__":
    main()
