"""A time budget over a real socket: one watchdog per response, not a cancel scope per read.

An HTTP/1.1 server on loopback (in the test's own event loop) streams OpenAI chunks as each test
scripts them. The deadline cuts a silent body, a body whose every gap is short but which outlasts
the deadline, and a body read on after the deadline from what is already buffered; it is met within
50 ms of virtual time, and after the stream ends no timer or task of the watchdog is left.
"""

from __future__ import annotations

import asyncio
import gc
import math
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx
import orjson
import pytest

import agentrt
from agentrt import Budget, BudgetExceededError, TokenStream, _backend
from agentrt._watchdog import Watchdog
from agentrt.models import OpenAIChatModel, RetryPolicy

pytestmark = pytest.mark.virtual_clock

# A script: what the server does for one request, in order (bytes: an SSE event; float: a pause of
# that many seconds, `math.inf` for silence until the test ends).
Script = list[bytes | float]


class Chat:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


def event(content: str) -> bytes:
    payload = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def answer(*tokens: str) -> Script:
    return [*(event(t) for t in tokens), b"data: [DONE]\n\n"]


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def _serve_one(stream: anyio.abc.ByteStream, scripts: list[Script]) -> None:
    buffer = b""
    while True:
        while b"\r\n\r\n" not in buffer:
            try:
                buffer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(buffer) < length:
            buffer += await stream.receive()
        buffer = buffer[length:]
        await stream.send(_HEAD)
        for step in scripts.pop(0):
            if isinstance(step, bytes):
                await stream.send(b"%x\r\n%s\r\n" % (len(step), step))
            elif math.isinf(step):
                await anyio.sleep_forever()
            else:
                await anyio.sleep(step)
        await stream.send(b"0\r\n\r\n")


@asynccontextmanager
async def served(*scripts: Script, budget: Budget) -> AsyncIterator[Chat]:
    """A service whose model talks HTTP/1.1 to a loopback server playing `scripts`, one a request."""
    queue = list(scripts)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                await _serve_one(stream, queue)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, handle)
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=100) as client:
                model = OpenAIChatModel(
                    "gpt-test",
                    base_url=f"http://127.0.0.1:{port}/v1",
                    api_key="sk-test",
                    client=client,
                    retry=RetryPolicy.never(),
                )
                yield agentrt.build(Chat, model=model, budget=budget)
        finally:
            group.cancel_scope.cancel()


def watchdogs() -> int:
    """The watchdog timers still armed in this event loop: asyncio's timer handles; on trio, the
    entries of the run's heap that are not closed (then its task must sleep until the earliest)."""
    if "trio" in sys.modules and sys.modules["trio"].lowlevel.in_trio_run():
        timers = _backend._TRIO_TIMERS.get(None) if _backend._TRIO_TIMERS is not None else None
        if timers is None:
            return 0
        armed = sorted(deadline for deadline, _, dog in timers._heap if not dog.closed)
        if timers._scope is not None:  # the task sleeps until the earliest armed deadline, or forever
            assert timers._scope.deadline == (armed[0] if armed else math.inf)
        return len(armed)
    loop: Any = asyncio.get_running_loop()
    return sum(
        not handle.cancelled() and getattr(handle._callback, "__func__", None) is Watchdog.fire
        for handle in loop._scheduled
    )


async def settled() -> None:
    """Let cancelled tasks finish (trio runs a cancelled system task once more to end it)."""
    if "trio" in sys.modules and sys.modules["trio"].lowlevel.in_trio_run():
        import trio.testing

        await trio.testing.wait_all_tasks_blocked()


async def read(stream: TokenStream, texts: list[str], pause: Callable[[int], float] = lambda n: 0) -> None:
    async for delta in stream:
        texts.append(delta)
        if pause(len(texts)):
            await anyio.sleep(pause(len(texts)))


@pytest.mark.parametrize("view", ["ask", "stream"])
async def test_a_silent_body_is_cut_at_the_deadline(view: str) -> None:
    async with served([event("Hel"), event("lo"), math.inf], budget=Budget(seconds=12)) as service:
        start = anyio.current_time()
        texts: list[str] = []

        async def call() -> None:
            if view == "ask":
                await service.ask("hi")
            else:
                async with await service.stream("hi") as stream:
                    await read(stream, texts)

        with pytest.raises(BudgetExceededError) as info:
            await call()
        late = anyio.current_time() - start - 12
    assert 0 <= late <= 0.05
    assert info.value.limit == "seconds"
    assert info.value.partial.text == "Hello"
    assert texts == ([] if view == "ask" else ["Hel", "lo"])


async def test_a_body_that_outlasts_the_deadline_in_short_gaps_is_cut() -> None:
    # Every gap (1 s) is well within the budget; the stream as a whole is not.
    script: Script = [event("t0")]
    for i in range(1, 10):
        script += [1.0, event(f" t{i}")]
    async with served([*script, b"data: [DONE]\n\n"], budget=Budget(seconds=3.5)) as service:
        start = anyio.current_time()
        texts: list[str] = []
        with pytest.raises(BudgetExceededError) as info:
            async with await service.stream("hi") as stream:
                await read(stream, texts)
        late = anyio.current_time() - start - 3.5
    assert 0 <= late <= 0.05
    assert texts == ["t0", " t1", " t2", " t3"]
    assert info.value.partial.text == "t0 t1 t2 t3"


async def test_a_body_read_on_past_the_deadline_is_cut_at_the_next_read() -> None:
    # The whole answer is sent at once; the reader pauses past the deadline after its first token.
    # What is buffered is not read on: the deadline has passed.
    async with served(answer("a", "b", "c", "d"), budget=Budget(seconds=5)) as service:
        texts: list[str] = []
        with pytest.raises(BudgetExceededError):
            async with await service.stream("hi") as stream:
                await read(stream, texts, pause=lambda n: 10.0 if n == 1 else 0)
    assert texts == ["a"]


async def test_no_watchdog_outlives_its_stream() -> None:
    async with served(
        answer("a", "b"), [event("x"), math.inf], answer("c"), budget=Budget(seconds=30)
    ) as svc:
        texts: list[str] = []
        async with await svc.stream("hi") as stream:
            async for delta in stream:
                texts.append(delta)
                assert watchdogs() == 1  # armed while the body streams
        await settled()
        assert watchdogs() == 0  # read to its end

        # Read in one task, closed by another, mid-body.
        opened = await svc.stream("hi")
        assert await anext(aiter(opened)) == "x"
        async with anyio.create_task_group() as group:
            group.start_soon(opened.aclose)
        await settled()
        assert watchdogs() == 0

        # The connection a watchdog never cut still serves: the next call answers.
        assert await svc.ask("hi") == "c"
        await settled()
        assert watchdogs() == 0
    assert texts == ["a", "b"]


async def test_an_abandoned_stream_leaves_no_watchdog() -> None:
    async with served([event("x"), math.inf], answer("next"), budget=Budget(seconds=30)) as service:

        async def read_one() -> None:
            async for delta in await service.stream("hi"):
                assert delta == "x"
                assert watchdogs() == 1
                break
            gc.collect()

        # Nothing holds the stream after the loop: it warns, and its finalizer closes it from
        # another task.
        with pytest.warns(ResourceWarning, match="a stream was collected without being closed"):
            await read_one()
        assert await service.ask("hi") == "next"
        await settled()
        assert watchdogs() == 0


async def test_a_connection_cut_at_the_deadline_is_not_reused() -> None:
    async with served([event("x"), math.inf], answer("again"), budget=Budget(seconds=2)) as service:
        with pytest.raises(BudgetExceededError):
            await service.ask("hi")
        assert await service.ask("hi") == "again"
        await settled()
        assert watchdogs() == 0


async def test_a_watchdog_closed_before_its_deadline_never_interrupts() -> None:
    fired: list[str] = []
    closed = Watchdog(anyio.current_time() + 1, lambda: fired.append("closed"))
    armed = Watchdog(anyio.current_time() + 2, lambda: fired.append("armed"))
    closed.close()
    closed.close()  # idempotent
    await anyio.sleep(3)
    assert fired == ["armed"]
    assert armed.fired and not closed.fired


async def test_watchdogs_fire_in_deadline_order_whatever_the_order_they_were_armed_in() -> None:
    start = anyio.current_time()
    fired: list[tuple[str, float]] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: fired.append((name, anyio.current_time() - start))

    late = Watchdog(start + 3, note("late"))
    await anyio.sleep(0.5)  # the timer now sleeps until the late deadline
    early = Watchdog(start + 1, note("early"))  # armed after, due before: the timer wakes for it
    dropped = Watchdog(start + 2, note("dropped"))
    await anyio.sleep(1)
    dropped.close()  # after the early one fired, before its own deadline
    await anyio.sleep(3)
    assert fired == [("early", 1.0), ("late", 3.0)]
    assert early.fired and late.fired and not dropped.fired
    assert watchdogs() == 0
