"""agentrt against a local OpenAI-compatible server, next to a plain httpx + orjson client.

A minimal HTTP/1.1 server (its own process, asyncio streams) answers every chat completion with a
pre-built SSE stream of N one-token events, written event by event. Both clients talk to it over
loopback with keep-alive; the difference is what agentrt adds per call and per streamed token (its
service binding, pipeline, events, adapter, accounting). Prints milliseconds per call and microseconds
per token for asyncio and trio; compare with the brief's budget (0.2 ms a call, 10 µs a token, and
0.3 ms a tool round trip).

The tool round trip row: a request that offers one tool is answered with a streamed call of it (in
OpenAI's chunk format: the call's id and name first, its arguments in fragments, then usage), the
request that carries the tool's result with a short streamed answer. agentrt runs a service with one
sync `@tool` function, which runs in a worker thread as users write them. The hand-written loop does
the same work: it streams request 1, assembles the call, runs the same sync function in a worker thread
with `anyio.to_thread.run_sync` (what a hand-written async app does with blocking code, too; calling it
on the event loop would not be the same program), sends request 2 with the assistant's tool-call
message and the tool result, and streams the answer. The row is the median per round trip (both
requests and the tool call) over many round trips, the two clients interleaved in blocks. The async
tool row does the same with an `async def` tool, awaited on the loop by both (the target is for it).

On a noisy machine the wall-clock rows move by more than they measure; callgrind's instruction
counts are steadier: `benchmarks/bench_callgrind.py round-trip` counts a round trip both ways.

    .venv/bin/python benchmarks/bench_http.py
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import socket
import statistics
import time
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import httpx
import orjson
from bench_pipeline import guarded_by  # benchmarks/ is on the path of a script run from it

import agentrt
from agentrt import Description, LifecycleEvent, ModelSettings, TokenStream, tool
from agentrt.models import OpenAIChatModel, RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

CALLS = 300
TOKENS = 2000
ROUND_TRIPS = 100  # per block; the tool row interleaves BLOCKS blocks of each client
BLOCKS = 10


def _event(delta: dict[str, object], finish: str | None = None) -> bytes:
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream(tokens: int) -> list[bytes]:
    events = [_event({"role": "assistant", "content": ""})]
    # a sentence every 20 tokens (where a `chunked` output guardrail checks the answer so far)
    events += [_event({"content": f" tok{i}." if i % 20 == 19 else f" tok{i}"}) for i in range(tokens)]
    events.append(_event({}, "stop"))
    events.append(b"data: [DONE]\n\n")
    return _chunked(events)


def _chunked(events: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def _openai_event(delta: dict[str, object] | None, finish: str | None = None, usage: object = None) -> bytes:
    """A chunk as OpenAI streams it (cassette 12 of the conformance tests)."""
    payload = {
        "id": "chatcmpl-ASv9l0RKJrq2fTx2dK5jhJoIr4rMI",
        "object": "chat.completion.chunk",
        "created": 1731456257,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_0ba0d124f1",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


_USAGE = {
    "prompt_tokens": 75,
    "completion_tokens": 17,
    "total_tokens": 92,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}
CALL_ID = "call_hqkL24CLEwnniv4GDrjk14Iu"


def _tool_call_stream() -> list[bytes]:
    """The first answer of a round trip: one streamed call of `get_current_weather`."""
    function = {"name": "get_current_weather", "arguments": ""}
    call = {"index": 0, "id": CALL_ID, "type": "function", "function": function}
    events = [_openai_event({"role": "assistant", "content": None})]
    events.append(_openai_event({"tool_calls": [call]}))
    for fragment in ('{"lo', "catio", 'n": "S', "eatt", "le, W", 'A"}'):
        events.append(_openai_event({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}))
    events.append(_openai_event({}, "tool_calls"))
    events.append(_openai_event(None, usage=_USAGE))
    events.append(b"data: [DONE]\n\n")
    return _chunked(events)


def _answer_stream() -> list[bytes]:
    """The second answer of a round trip: a short text streamed token by token."""
    events = [_openai_event({"role": "assistant", "content": ""})]
    for token in ("It", "'s", " sunny", " in", " Seattle", ",", " 18", " °C", "."):
        events.append(_openai_event({"content": token}))
    events.append(_openai_event({}, "stop"))
    events.append(_openai_event(None, usage=_USAGE))
    events.append(b"data: [DONE]\n\n")
    return _chunked(events)


def serve(sock: socket.socket) -> None:
    cache: dict[int, list[bytes]] = {}
    tool_call, answer = _tool_call_stream(), _answer_stream()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = orjson.loads(await reader.readexactly(length))
                if body.get("tools"):  # the tool round trip: call the tool, then answer with its result
                    chunks = answer if body["messages"][-1]["role"] == "tool" else tool_call
                else:
                    tokens = int(body.get("max_tokens", 1))
                    chunks = cache.get(tokens) or cache.setdefault(tokens, _stream(tokens))
                writer.write(head)
                for chunk in chunks:
                    writer.write(chunk)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


@tool("Get the current weather in a given location")
def get_current_weather(location: Annotated[str, Description("The city and state, e.g. Boston, MA")]) -> str:
    """A sync tool, as users write them: agentrt runs it in a worker thread."""
    return f"Sunny, 18 °C in {location}"


@tool("Get the current weather in a given location", name="get_current_weather")
async def get_current_weather_async(
    location: Annotated[str, Description("The city and state, e.g. Boston, MA")],
) -> str:
    """The same tool, async: it runs on the event loop."""
    return f"Sunny, 18 °C in {location}"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. Boston, MA"}
            },
            "required": ["location"],
            "additionalProperties": False,
        },
    },
}


# What every client of a real endpoint sends, agentrt's and the hand-written loop's alike: the key
# (a realistic one: "x" would be found, and scrubbed, in every `text/event-stream` content type) and
# the body's type.
KEY = "sk-bench-4f9c2e7a1b3d5f60"
PLAIN_HEADERS = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}


async def plain(client: httpx.AsyncClient, url: str, tokens: int) -> str:
    """The floor: httpx streaming bytes, split on blank lines, orjson per event; nothing else."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["max_tokens"] = tokens
    parts: list[str] = []
    loads = orjson.loads
    async with client.stream("POST", url, content=orjson.dumps(body), headers=PLAIN_HEADERS) as response:
        buffer = b""
        async for raw in response.aiter_bytes():
            buffer = buffer + raw if buffer else raw
            start = 0
            while (end := buffer.find(b"\n\n", start)) >= 0:
                data = buffer[start + 6 : end]
                start = end + 2
                if data != b"[DONE]":
                    choices = loads(data)["choices"]
                    if choices and (content := choices[0]["delta"].get("content")):
                        parts.append(content)
            buffer = buffer[start:]
    return "".join(parts)


async def _stream_turn(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed response of a hand-written loop: its text and its tool calls by index."""
    parts: list[str] = []
    calls: dict[int, list[str]] = {}
    loads = orjson.loads
    async with client.stream("POST", url, content=orjson.dumps(body), headers=PLAIN_HEADERS) as response:
        buffer = b""
        async for raw in response.aiter_bytes():
            buffer = buffer + raw if buffer else raw
            start = 0
            while (end := buffer.find(b"\n\n", start)) >= 0:
                data = buffer[start + 6 : end]
                start = end + 2
                if data == b"[DONE]":
                    continue
                choices = loads(data)["choices"]
                if not choices:
                    continue
                delta = choices[0]["delta"]
                if content := delta.get("content"):
                    parts.append(content)
                for fragment in delta.get("tool_calls") or ():
                    call = calls.setdefault(fragment["index"], ["", "", ""])
                    function = fragment.get("function") or {}
                    call[0] = call[0] or fragment.get("id") or ""
                    call[1] = call[1] or function.get("name") or ""
                    call[2] += function.get("arguments") or ""
            buffer = buffer[start:]
    return {"text": "".join(parts), "calls": [calls[i] for i in sorted(calls)]}


async def plain_round_trip(
    client: httpx.AsyncClient, url: str, functions: dict[str, Any], awaited: bool = False
) -> str:
    """The floor of a tool round trip: stream, run the called tool (a sync one in a thread, an async
    one awaited), stream again."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What's the weather in Seattle?"}]
    body = {
        "model": "bench",
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    turn = await _stream_turn(client, url, body)
    calls = turn["calls"]
    messages.append(
        {
            "role": "assistant",
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
            ],
        }
    )
    for call_id, name, arguments in calls:
        function = functools.partial(functions[name], **orjson.loads(arguments))
        result = await function() if awaited else await anyio.to_thread.run_sync(function)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return str((await _stream_turn(client, url, body))["text"])


async def median_of(runs: int, body: Callable[[], Awaitable[object]]) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await body()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


# A budget that never binds but is checked all the way: a deadline (each network read under a cancel
# scope) and a total-token limit (the stream metered chunk by chunk).
BUDGET = agentrt.Budget(seconds=600, total_tokens=10**9)


async def measure(port: int) -> tuple[float, float, float, float, float]:
    base = f"http://127.0.0.1:{port}/v1"
    events: list[LifecycleEvent] = []
    async with httpx.AsyncClient(timeout=30) as client:
        one = OpenAIChatModel(
            "bench",
            base_url=base,
            api_key=KEY,
            client=client,
            retry=RetryPolicy.never(),
            settings=ModelSettings(max_tokens=1),
        )
        many = OpenAIChatModel(
            "bench",
            base_url=base,
            api_key=KEY,
            client=client,
            retry=RetryPolicy.never(),
            settings=ModelSettings(max_tokens=TOKENS),
        )
        chat = OpenAIChatModel("bench", base_url=base, api_key=KEY, client=client, retry=RetryPolicy.never())
        ask = agentrt.build(Service, model=one, listeners=[events.append])
        stream = agentrt.build(Service, model=many, listeners=[events.append])
        weather = agentrt.build(Service, model=chat, listeners=[events.append], tools=[get_current_weather])
        ask_budget = agentrt.build(Service, model=one, listeners=[events.append], budget=BUDGET)
        stream_budget = agentrt.build(Service, model=many, listeners=[events.append], budget=BUDGET)
        guarded = {
            release: agentrt.build(guarded_by(release, Service), model=many, listeners=[events.append])
            for release in ("buffer", "chunked")
        }
        url = f"{base}/chat/completions"
        functions = {"get_current_weather": get_current_weather}
        async_functions = {"get_current_weather": get_current_weather_async}
        weather_async = agentrt.build(
            Service, model=chat, listeners=[events.append], tools=[get_current_weather_async]
        )
        answer = "It's sunny in Seattle, 18 °C."

        async def plain_calls() -> None:
            for _ in range(CALLS):
                await plain(client, url, 1)

        async def agentrt_calls() -> None:
            for _ in range(CALLS):
                await ask.ask("hi")
            events.clear()

        async def plain_tokens() -> None:
            await plain(client, url, TOKENS)

        async def agentrt_tokens() -> None:
            async for _ in await stream.stream("hi"):
                pass
            events.clear()

        def guarded_tokens(release: str) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                async for _ in await guarded[release].stream("hi"):
                    pass
                events.clear()

            return read

        async def budget_calls() -> None:
            for _ in range(CALLS):
                await ask_budget.ask("hi")
            events.clear()

        async def budget_tokens() -> None:
            async for _ in await stream_budget.stream("hi"):
                pass
            events.clear()

        await plain_calls()  # warm up both paths and the connection pool
        await agentrt_calls()
        floor_call = await median_of(5, plain_calls) / CALLS
        call = await median_of(5, agentrt_calls) / CALLS
        floor_token = await median_of(9, plain_tokens) / TOKENS
        token = await median_of(9, agentrt_tokens) / TOKENS
        await budget_calls()
        budget_call = await median_of(5, budget_calls) / CALLS
        budget_token = await median_of(9, budget_tokens) / TOKENS
        guarded_token = {release: await median_of(9, guarded_tokens(release)) / TOKENS for release in guarded}

        for _ in range(20):  # warm up both loops (and the worker threads)
            assert await plain_round_trip(client, url, functions) == answer
            assert await weather.ask("What's the weather in Seattle?") == answer
        floor_samples: list[float] = []
        samples: list[float] = []
        for _ in range(BLOCKS):
            for _ in range(ROUND_TRIPS):
                started = time.perf_counter()
                await plain_round_trip(client, url, functions)
                floor_samples.append(time.perf_counter() - started)
            for _ in range(ROUND_TRIPS):
                started = time.perf_counter()
                await weather.ask("What's the weather in Seattle?")
                samples.append(time.perf_counter() - started)
            events.clear()
        floor_trip, trip = statistics.median(floor_samples), statistics.median(samples)
        for _ in range(20):
            assert await plain_round_trip(client, url, async_functions, awaited=True) == answer
            assert await weather_async.ask("What's the weather in Seattle?") == answer
        floor_samples, samples = [], []
        for _ in range(BLOCKS):
            for _ in range(ROUND_TRIPS):
                started = time.perf_counter()
                await plain_round_trip(client, url, async_functions, awaited=True)
                floor_samples.append(time.perf_counter() - started)
            for _ in range(ROUND_TRIPS):
                started = time.perf_counter()
                await weather_async.ask("What's the weather in Seattle?")
                samples.append(time.perf_counter() - started)
            events.clear()
        floor_async, trip_async = statistics.median(floor_samples), statistics.median(samples)
    print(
        f"    plain httpx+orjson: {floor_call * 1e3:6.3f} ms a call, {floor_token * 1e6:5.2f} µs a token, "
        f"{floor_trip * 1e3:6.3f} ms a tool round trip"
    )
    print(
        f"    agentrt           : {call * 1e3:6.3f} ms a call, {token * 1e6:5.2f} µs a token, "
        f"{trip * 1e3:6.3f} ms a tool round trip"
    )
    print(
        f"    async tool round trip: plain {floor_async * 1e3:6.3f} ms, agentrt {trip_async * 1e3:6.3f} ms "
        f"(adds {(trip_async - floor_async) * 1e3:6.3f} ms; target 0.3)"
    )
    print(f"    agentrt, budget   : {budget_call * 1e3:6.3f} ms a call, {budget_token * 1e6:5.2f} µs a token")
    for release, cost in guarded_token.items():
        print(
            f"    agentrt, a pass-through output guardrail, {release:7}: {cost * 1e6:5.2f} µs a token "
            f"({cost / token:.2f}x no guardrail)"
        )
    return (
        call - floor_call,
        token - floor_token,
        trip - floor_trip,
        budget_call - floor_call,
        budget_token - floor_token,
    )


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = multiprocessing.Process(target=serve, args=(sock,), daemon=True)
    server.start()
    try:
        print(
            f"agentrt over a local OpenAI-compatible server ({CALLS} one-token calls; "
            f"{TOKENS}-token streams; {BLOCKS * ROUND_TRIPS} tool round trips with a sync tool; listeners on)"
        )
        for backend in ("asyncio", "trio"):
            print(f"  {backend}")
            call, token, trip, budget_call, budget_token = anyio.run(measure, port, backend=backend)
            print(
                f"    agentrt adds      : {call * 1e3:6.3f} ms a call, {token * 1e6:5.2f} µs a token, "
                f"{trip * 1e3:6.3f} ms a tool round trip"
            )
            print(
                f"    with a budget     : {budget_call * 1e3:6.3f} ms a call, "
                f"{budget_token * 1e6:5.2f} µs a token"
            )
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
