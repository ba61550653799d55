"""Streams are closed by construction (issue 24): the `async with` form closes a stream however its
block ends; a stream kept after `break` makes its own task's next turn on the conversation fail at
once instead of waiting forever; a stream collected unclosed warns naming its method and is closed
exactly once, by agentrt, wherever the collector runs, whatever the store.
"""

from __future__ import annotations

import gc
import logging
import sys
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx
import orjson
import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    AssistantMessage,
    Capabilities,
    ChatMessage,
    ConversationReentryError,
    MemoryId,
    ModelRequest,
    PartialStream,
    TokenStream,
    UserMessage,
)
from agentrt.memory import ChatMemoryStore, InMemoryStore, RedisStore, SQLiteStore
from agentrt.models import ModelChunk, OpenAIChatModel, RetryPolicy
from agentrt.testing import Hang, ScriptedModel


class Svc:
    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


class Point(BaseModel):
    x: int
    y: int


class Shapes:
    async def points(
        self, conversation: Annotated[str, MemoryId], text: str
    ) -> PartialStream[list[Point]]: ...


def turn(question: str, answer: str) -> list[ChatMessage]:
    return [UserMessage.of(question), AssistantMessage(text=answer)]


def service(*script: Any) -> tuple[Svc, ScriptedModel]:
    model = ScriptedModel(*script)
    return agentrt.build(Svc, model=model, memory=agentrt.memory.window()), model


UNCLOSED = r"Svc\.stream: a stream was collected without being closed or read to its end"


# --- the form to use ---------------------------------------------------------------------------


async def test_async_with_closes_the_stream_on_break_and_frees_the_conversation() -> None:
    svc, model = service(["one ", "two ", Hang()], "second turn")

    async with await svc.stream("c", "hi") as tokens:
        async for token in tokens:
            assert token == "one "
            break

    assert model.streams[0].closed and not model.streams[0].completed
    assert await svc.chat("c", "next") == "second turn"
    assert await agentrt.memory.access(svc).read("c") == turn("next", "second turn")


# --- break and keep: the same task's next turn fails at once -------------------------------------


async def test_a_turn_behind_a_kept_stream_of_the_same_task_fails_at_once() -> None:
    svc, model = service(["one ", "two ", Hang()], "second turn")
    stream = await svc.stream("c", "hi")
    async for _token in stream:
        break

    # Without the check this waits forever: only this task could close the stream.
    with (
        anyio.fail_after(5),
        pytest.raises(ConversationReentryError, match=r"Svc\.chat: conversation 'c'") as info,
    ):
        await svc.chat("c", "next")

    assert (info.value.memory_id, info.value.holder) == ("c", "Svc.stream")
    assert "async with await svc.stream(...)" in str(info.value)
    assert len(model.requests) == 1  # nothing was sent for the refused turn
    # The stream is untouched: closed now, the conversation is free, and nothing of it was stored.
    await stream.aclose()
    assert await svc.chat("c", "next") == "second turn"
    assert await agentrt.memory.access(svc).read("c") == turn("next", "second turn")


async def test_a_turn_behind_a_kept_events_reader_of_the_same_task_fails_at_once() -> None:
    svc, _ = service(["one ", "two ", Hang()], "second turn")
    stream = await svc.stream("c", "hi")
    async for event in stream.events():
        if isinstance(event, agentrt.TextDelta):
            break

    with anyio.fail_after(5), pytest.raises(ConversationReentryError):
        await agentrt.memory.access(svc).replace("c", turn("q", "a"))
    await stream.aclose()


async def test_a_turn_behind_a_kept_partial_stream_of_the_same_task_fails_at_once() -> None:
    model = ScriptedModel(['[{"x": 1, "y": 2}, ', Hang()])
    shapes = agentrt.build(Shapes, model=model, memory=agentrt.memory.window())
    stream = await shapes.points("c", "two points")
    async for points in stream:
        assert points == [Point(x=1, y=2)]
        break

    with anyio.fail_after(5), pytest.raises(ConversationReentryError) as info:
        await shapes.points("c", "more")
    assert info.value.holder == "Shapes.points"
    await stream.aclose()


async def test_a_stream_read_by_another_task_makes_its_opener_wait_not_fail() -> None:
    # The task reading a stream is the one that will close it: the task that opened it may wait.
    svc, _ = service(["one ", "two ", "three"], "second turn")
    stream = await svc.stream("c", "hi")
    reading = anyio.Event()
    go_on = anyio.Event()
    read: list[str] = []

    async def reader() -> None:
        async for token in stream:
            read.append(token)
            if len(read) == 1:
                reading.set()
                await go_on.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        await reading.wait()
        go_on.set()
        with anyio.fail_after(5):
            answer = await svc.chat("c", "next")  # waits for the reader to finish the first turn

    assert read == ["one ", "two ", "three"]
    assert answer == "second turn"
    assert await agentrt.memory.access(svc).read("c") == turn("hi", "one two three") + turn(
        "next", "second turn"
    )


async def test_a_task_that_hands_the_conversation_on_waits_for_it_like_any_other() -> None:
    # Closing its stream hands the conversation to the turn waiting for it; a turn this task starts
    # right after waits behind that one (it no longer holds the conversation), and is not refused.
    svc, _ = service(["one ", Hang()], "waiting turn", "my next turn")
    stream = await svc.stream("c", "hi")
    answers: list[str] = []

    async def waiting() -> None:
        answers.append(await svc.chat("c", "waiting"))

    async with anyio.create_task_group() as group:
        group.start_soon(waiting)
        await anyio.wait_all_tasks_blocked()  # the other turn waits for the conversation
        await stream.aclose()
        with anyio.fail_after(5):
            answers.append(await svc.chat("c", "mine"))

    assert answers == ["waiting turn", "my next turn"]
    assert await agentrt.memory.access(svc).read("c") == turn("waiting", "waiting turn") + turn(
        "mine", "my next turn"
    )


async def test_a_task_that_finished_its_stream_starts_the_next_turn_at_once() -> None:
    svc, _ = service(["one ", "two"], "second turn")
    stream = await svc.stream("c", "hi")
    assert [token async for token in stream] == ["one ", "two"]

    assert await svc.chat("c", "next") == "second turn"
    del stream
    gc.collect()  # read to its end: nothing to warn about


# --- abandoned streams: warned about, closed exactly once ----------------------------------------


@pytest.fixture
def no_automatic_gc() -> Iterator[None]:
    """Collections happen where a test makes them (in the loop thread or in a worker thread)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Hanging(httpx.AsyncByteStream):
    """A streamed response that sends one chunk and then nothing (a class, not an async generator:
    nothing of the test double is left to the garbage collector)."""

    def __init__(self, first: bytes) -> None:
        self._parts = [first]
        self.closed = False

    def __aiter__(self) -> _Hanging:
        return self

    async def __anext__(self) -> bytes:
        if self._parts:
            return self._parts.pop()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True


def _sse(text: str, finish: str | None = None) -> bytes:
    delta = {
        "id": "c-1",
        "model": "m-1",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(delta) + b"\n\n"


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ChatMemoryStore]:
    if request.param == "memory":
        yield InMemoryStore()
    elif request.param == "sqlite":
        sqlite = SQLiteStore(tmp_path / "chat.db")
        yield sqlite
        await sqlite.aclose()
    else:
        url = request.getfixturevalue("redis_url")
        redis = RedisStore(url, prefix=f"test-{uuid.uuid4().hex[:12]}:")
        yield redis
        await redis.aclose()


async def _read_one_token_and_keep_the_error(svc: Svc) -> None:
    """A reader that keeps the exception it caught: the exception's traceback holds this frame,
    which holds the exception and the stream, so the stream ends up in cyclic garbage."""

    class Seen(Exception):
        pass

    stream = await svc.stream("c", "hi")
    try:
        async for token in stream:
            raise Seen(token)
    except Seen as exc:
        kept = exc
    assert kept.args == ("one ",)


async def collect(where: str) -> None:
    if where == "loop thread":
        gc.collect()
    else:
        await anyio.to_thread.run_sync(gc.collect)


@pytest.mark.parametrize("collector", ["loop thread", "worker thread"])
@pytest.mark.usefixtures("no_automatic_gc")
async def test_a_stream_in_cyclic_garbage_warns_and_is_closed_exactly_once(
    store: ChatMemoryStore, collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    bodies: list[_Hanging] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if not bodies:
            bodies.append(_Hanging(_sse("one ")))
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=bodies[0])
        answer = _sse("second turn", "stop") + b"data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=answer)

    caplog.set_level(logging.DEBUG)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("m", base_url="https://llm.test/v1", client=client, retry=RetryPolicy.never())
        svc = agentrt.build(Svc, model=model, memory=agentrt.memory.window(store=store))
        await _read_one_token_and_keep_the_error(svc)

        with pytest.warns(ResourceWarning) as warned:
            await collect(collector)
        # The close runs in a task of the stream's own loop; the next turn waits for it.
        with anyio.fail_after(5):
            assert await svc.chat("c", "next") == "second turn"

        assert bodies[0].closed
        assert await agentrt.memory.access(svc).read("c") == turn("next", "second turn")
    gc.collect()  # what a failed close leaves (an asyncio task whose error nobody read) logs now

    assert [str(w.message) for w in warned] == [
        "Svc.stream: a stream was collected without being closed or read to its end; closing it now. "
        "Use `async with await service.method(...) as stream:`"
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.usefixtures("no_automatic_gc")
async def test_a_dropped_partial_stream_warns_naming_its_method() -> None:
    model = ScriptedModel(['[{"x": 1, "y": 2}, ', Hang()], "[]")
    shapes = agentrt.build(Shapes, model=model, memory=agentrt.memory.window())
    stream = await shapes.points("c", "two points")
    assert await stream.__anext__() == [Point(x=1, y=2)]

    with pytest.warns(ResourceWarning, match=r"^Shapes\.points: a stream was collected"):
        del stream
    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
    async with await shapes.points("c", "none") as values:  # the conversation is free again
        assert [value async for value in values] == [[]]


async def test_closed_finished_and_completed_streams_do_not_warn() -> None:
    # filterwarnings=error: a ResourceWarning here fails the test.
    svc, _ = service(["one ", "two"], ["three"], ["four ", Hang()])
    finished = await svc.stream("a", "hi")
    assert [token async for token in finished] == ["one ", "two"]
    completed = await svc.stream("b", "hi")
    async for event in completed.events():
        if isinstance(event, agentrt.Completed):
            break  # read up to Completed: its turn is stored and its conversation released
    closed = await svc.stream("c", "hi")
    await closed.aclose()
    del finished, completed, closed
    gc.collect()


async def test_a_warning_raised_as_an_error_does_not_keep_the_stream_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under an "error" filter (this suite's own), the finalizer's warning is raised: the stream is
    # closed and its conversation handed on all the same.
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    svc, model = service(["one ", Hang()], "second turn")
    stream = await svc.stream("c", "hi")
    assert await stream.__anext__() == "one "

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del stream

    assert [type(u.exc_value) for u in unraisable] == [ResourceWarning]
    with anyio.fail_after(5):
        assert await svc.chat("c", "next") == "second turn"
    assert model.streams[0].closed


# --- the reader a loop resumes --------------------------------------------------------------------


async def test_a_stream_iterated_without_a_name_is_read_to_its_end_without_a_warning() -> None:
    # `async for` holds the stream while it runs: the stream's one reader of its events holds it
    # only weakly, so without that the stream would be collected (and closed) at the loop's start.
    svc, _ = service(["one ", "two"])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        tokens = [token async for token in await svc.stream("c", "hi")]
        gc.collect()
    assert tokens == ["one ", "two"]
    assert [w for w in warned if issubclass(w.category, ResourceWarning)] == []
    assert await agentrt.memory.access(svc).read("c") == turn("hi", "one two")


async def test_tokens_then_events_then_tokens_read_on_where_the_last_stopped() -> None:
    svc, _ = service(["one ", "two ", "three ", "four"])
    async with await svc.stream("c", "hi") as stream:
        async for token in stream:
            assert token == "one "
            break
        assert await anext(stream) == "two "  # `anext` and `async for` share the reader
        events = stream.events()
        assert await anext(events) == agentrt.TextDelta("three ")
        assert [token async for token in stream] == ["four"]
        result = await stream.result()
    assert result.text == "one two three four"
    assert await agentrt.memory.access(svc).read("c") == turn("hi", "one two three four")


async def test_a_stream_dropped_after_break_is_closed_and_frees_its_conversation_at_once() -> None:
    svc, model = service(["one ", "two ", Hang()], "second turn")
    stream = await svc.stream("c", "hi")
    async for _token in stream:
        break
    with pytest.warns(ResourceWarning, match=UNCLOSED):
        del stream  # (no cycle: the reader does not hold the stream)
    with anyio.fail_after(5):
        assert await svc.chat("c", "next") == "second turn"
    assert model.streams[0].closed
    assert await agentrt.memory.access(svc).read("c") == turn("next", "second turn")


async def test_the_iterator_of_a_stream_closes_the_stream() -> None:
    # `aiter(stream)` is not the stream itself (see `_Tokens`): closing it closes the stream.
    svc, model = service(["one ", "two ", Hang()], "second turn")
    stream = await svc.stream("c", "hi")
    tokens = aiter(stream)
    assert await anext(tokens) == "one "
    await tokens.aclose()  # type: ignore[attr-defined]
    assert model.streams[0].closed
    with anyio.fail_after(5):
        assert await svc.chat("c", "next") == "second turn"
    with pytest.raises(RuntimeError, match="closed before the invocation completed"):
        await stream.result()


async def test_anext_holds_the_stream_while_it_waits_for_the_token() -> None:
    # `anext(stream)` is an awaitable of the stream's reader: it must hold the stream as `async for`
    # does, or a stream not named elsewhere is collected (and its reader closed) before the token
    # comes: an empty stream, where the first token was due.
    svc, model = service(["one ", "two ", Hang()], "second turn")
    with pytest.warns(ResourceWarning, match=UNCLOSED):  # dropped after its first token
        first = await anext(await svc.stream("c", "hi"))
    assert first == "one "
    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
        assert await svc.chat("c", "next") == "second turn"


class _GatedText:
    """A model that streams "one ", then "two " once `gate` is set (a class: nothing of the test
    double is left to the garbage collector)."""

    name = "gated"
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.gate = anyio.Event()

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return _GatedChunks(self.gate)


class _GatedChunks:
    def __init__(self, gate: anyio.Event) -> None:
        self._gate = gate
        self._sent = 0

    def __aiter__(self) -> _GatedChunks:
        return self

    async def __anext__(self) -> ModelChunk:
        self._sent += 1
        if self._sent == 1:
            return agentrt.TextDelta("one ")
        if self._sent == 2:
            await self._gate.wait()
            return agentrt.TextDelta("two")
        raise StopAsyncIteration


async def test_a_stream_dropped_while_another_task_awaits_its_next_token_is_not_closed_under_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The task awaiting `anext(stream)` reads the stream: the stream is not abandoned under it (no
    # warning, no close racing the read: "aclose(): asynchronous generator is already running").
    caplog.set_level(logging.DEBUG)
    model = _GatedText()
    svc = agentrt.build(Svc, model=model, memory=agentrt.memory.window())
    stream = await svc.stream("c", "hi")
    assert await anext(stream) == "one "
    got: list[str] = []

    async def read(next_token: Awaitable[str]) -> None:
        got.append(await next_token)

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        async with anyio.create_task_group() as group:
            group.start_soon(read, anext(stream))
            await anyio.wait_all_tasks_blocked()  # the reader waits in the model for "two"
            del stream
            gc.collect()
            await anyio.wait_all_tasks_blocked()  # (a close the collection started has run)
            model.gate.set()
        gc.collect()

    assert got == ["two"]
    # Abandoned once that read let go of it (not read up to `Completed`): warned about once, then.
    assert [str(w.message) for w in warned if w.category is ResourceWarning] == [
        "Svc.stream: a stream was collected without being closed or read to its end; closing it now. "
        "Use `async with await service.method(...) as stream:`"
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
