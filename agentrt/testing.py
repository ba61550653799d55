"""Test doubles for agentrt services: run your own services without a network.

`ScriptedModel` plays a list of scripted responses, one per request. `FunctionModel` lets a function
decide each response from the request. Both record every request (`requests`) and every stream they
opened (`streams`, with `closed` and `completed`), so tests can assert exact transcripts and that
streams were released.

A response is a `str` (one text chunk, then `Finish(STOP)`) or a sequence of steps: model chunks
(`TextDelta`, `ThinkingDelta`, `Usage`, `Finish`, ...), plain strings (text chunks), `CallTool(...)`,
and the directives `Delay(seconds)` (an `anyio.sleep`, so a virtual clock makes it instant),
`Raise(error)` and `Hang()`. Without an explicit `Finish`, one is added: `TOOL_CALLS` when the response
called tools, else `STOP`.

    model = ScriptedModel(
        "Hello!",
        ["Hel", "lo", Usage(input_tokens=3, output_tokens=2)],
        [CallTool("order_status", {"order_id": "SO-1"})],
    )

`virtual_clock(backend)` runs a test on virtual time on asyncio or trio, so that budgets, timeouts and
`Delay`s take no real time:

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(request):
        return request.param, virtual_clock(request.param)
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import selectors
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from . import _events
from ._errors import ModelTimeoutError
from ._events import Finish, FinishReason, TextDelta, ToolCallDelta
from .models._protocol import Capabilities, ModelRequest

__all__ = [
    "CallTool",
    "Delay",
    "FunctionModel",
    "Hang",
    "Raise",
    "ResponseFunction",
    "Script",
    "ScriptExhausted",
    "ScriptedModel",
    "Step",
    "StreamRecord",
    "VirtualTimeEventLoop",
    "virtual_clock",
]


@dataclass(frozen=True, slots=True)
class CallTool:
    """A whole tool call in a script; `arguments` is a mapping (encoded as JSON) or JSON text."""

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Delay:
    """Wait `seconds` (with `anyio.sleep`) before the next step."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Raise:
    """Raise `error` from the stream at this point."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Hang:
    """Block forever at this point (until cancelled or closed)."""


Step = _events.ModelChunk | str | CallTool | Delay | Raise | Hang
Script = str | Sequence[Step]


class ScriptExhausted(AssertionError):
    """The model received more requests than it has scripted responses."""


class StreamRecord:
    """One stream a test model opened: was it read to its end, and did its consumer close it?

    `closed` records an explicit `aclose()` by whoever consumed the stream (the pipeline), nothing
    else: a stream that ran to its end, raised, or was dropped and garbage-collected is not `closed`.
    `ended` is true once the stream's body stopped running for any reason.
    """

    __slots__ = ("_closed_event", "closed", "completed", "ended", "index", "request")

    def __init__(self, index: int, request: ModelRequest) -> None:
        self.index = index
        self.request = request
        self.completed = False
        self.ended = False
        self.closed = False
        self._closed_event: anyio.Event | None = None

    def _close(self) -> None:
        self.closed = True
        if self._closed_event is not None:
            self._closed_event.set()

    async def wait_closed(self) -> None:
        """Return once the stream is closed (for closes that happen in another task)."""
        if self.closed:
            return
        if self._closed_event is None:
            self._closed_event = anyio.Event()
        await self._closed_event.wait()

    def __repr__(self) -> str:
        return (
            f"<StreamRecord {self.index} completed={self.completed} ended={self.ended} closed={self.closed}>"
        )


def _steps(script: Script) -> list[Step]:
    steps: list[Step] = [script] if isinstance(script, str) else list(script)
    return steps


def _guard(request: ModelRequest, handles_deadline: bool) -> float | None:
    """The deadline a test model stops its waits at: the request's, if it handles deadlines."""
    return request.deadline if handles_deadline else None


async def _wait(seconds: float, deadline: float | None) -> None:
    """Sleep (forever for `inf`), stopping at the request's deadline as the HTTP adapters do."""
    if deadline is None:
        await anyio.sleep(seconds)
        return
    with anyio.CancelScope(deadline=deadline) as scope:
        await anyio.sleep(seconds)
    if scope.cancelled_caught:
        raise ModelTimeoutError("the request reached its deadline while the response streamed")


async def _play(
    script: Script, record: StreamRecord, deadline: float | None
) -> AsyncGenerator[_events.ModelChunk, None]:
    index = 0
    finished = called = False
    try:
        for step in _steps(script):
            if isinstance(step, str):
                yield TextDelta(step)
            elif isinstance(step, CallTool):
                arguments = step.arguments
                if not isinstance(arguments, str):
                    arguments = orjson.dumps(arguments).decode()
                yield ToolCallDelta(index, step.id or f"call_{index}", step.name, arguments)
                index += 1
                called = True
            elif isinstance(step, Delay):
                await _wait(step.seconds, deadline)
            elif isinstance(step, Raise):
                raise step.error
            elif isinstance(step, Hang):
                await _wait(math.inf, deadline)
            else:
                if isinstance(step, ToolCallDelta):
                    called = True
                elif isinstance(step, Finish):
                    finished = True
                yield step
        if not finished:
            yield Finish(FinishReason.TOOL_CALLS if called else FinishReason.STOP)
        record.completed = True
    finally:
        record.ended = True


class _RecordedStream:
    """The stream handed to the pipeline: closing it marks the record closed, started or not."""

    __slots__ = ("_chunks", "_record")

    def __init__(self, chunks: AsyncGenerator[_events.ModelChunk, None], record: StreamRecord) -> None:
        self._chunks = chunks
        self._record = record

    def __aiter__(self) -> _RecordedStream:
        return self

    async def __anext__(self) -> _events.ModelChunk:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            self._record._close()


class _RecordingModel:
    def __init__(self, name: str, capabilities: Capabilities | None, handles_deadline: bool) -> None:
        self._name = name
        declared = capabilities or Capabilities(
            json_schema=True,
            image_input=True,
            audio_input=True,
            video_input=True,
            pdf_input=True,
            thinking=True,
        )
        # (the capabilities declare what this model does with deadlines: `handles_deadline`)
        if declared.handles_deadline is not handles_deadline:
            declared = dataclasses.replace(declared, handles_deadline=handles_deadline)
        self._capabilities = declared
        self.requests: list[ModelRequest] = []
        self.streams: list[StreamRecord] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def _record(self, request: ModelRequest) -> StreamRecord:
        record = StreamRecord(len(self.streams), request)
        self.requests.append(request)
        self.streams.append(record)
        return record

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r} requests={len(self.requests)}>"


class ScriptedModel(_RecordingModel):
    """Plays `responses` in order, one per request; `ScriptExhausted` when they run out.

    The default capabilities declare everything (JSON schema, all media inputs); pass `capabilities`
    to test a less able model. Like the HTTP adapters, `Delay` and `Hang` stop at the request's
    deadline with `ModelTimeoutError` (`handles_deadline`, which sets `Capabilities.handles_deadline`
    whatever `capabilities` say); pass `handles_deadline=False` to play a model that knows nothing
    of deadlines, which the pipeline then enforces itself.
    """

    def __init__(
        self,
        *responses: Script,
        name: str = "scripted",
        capabilities: Capabilities | None = None,
        handles_deadline: bool = True,
    ) -> None:
        super().__init__(name, capabilities, handles_deadline)
        self._responses = list(responses)

    @property
    def remaining(self) -> int:
        """Scripted responses not yet played."""
        return max(0, len(self._responses) - len(self.streams))

    def stream(self, request: ModelRequest) -> AsyncIterator[_events.ModelChunk]:
        record = self._record(request)
        if record.index >= len(self._responses):
            record.ended = True
            raise ScriptExhausted(
                f"{self.name}: request {record.index + 1} has no scripted response "
                f"(only {len(self._responses)} scripted)"
            )
        deadline = _guard(request, self._capabilities.handles_deadline)
        return _RecordedStream(_play(self._responses[record.index], record, deadline), record)


ResponseFunction = Callable[[ModelRequest], Script | Awaitable[Script]]


class FunctionModel(_RecordingModel):
    """Answers each request with `function(request)` (sync or async), which returns a script."""

    def __init__(
        self,
        function: ResponseFunction,
        *,
        name: str = "function",
        capabilities: Capabilities | None = None,
        handles_deadline: bool = True,
    ) -> None:
        super().__init__(name, capabilities, handles_deadline)
        self._function = function

    def stream(self, request: ModelRequest) -> AsyncIterator[_events.ModelChunk]:
        record = self._record(request)
        return _RecordedStream(self._respond(request, record), record)

    async def _respond(
        self, request: ModelRequest, record: StreamRecord
    ) -> AsyncGenerator[_events.ModelChunk, None]:
        deadline = _guard(request, self._capabilities.handles_deadline)
        answer = self._function(request)
        script: Script | None = None
        if not inspect.isawaitable(answer):
            script = answer
        elif deadline is None:
            script = await answer
        else:
            with anyio.CancelScope(deadline=deadline):
                script = await answer
            if script is None:
                raise ModelTimeoutError("the request reached its deadline before a response arrived")
        played = _play(script, record, deadline)
        try:
            async for chunk in played:
                yield chunk
        finally:
            await played.aclose()


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on virtual time: whenever it would wait for its next timer with no I/O
    ready, its clock jumps to that timer instead. Its time starts at 0.

    Sleeps, deadlines and budgets then take no real time, in the order they would have fired. The
    loop never waits for real I/O while a timer is pending, so a test on it must not wait for a real
    server (serve it in-process: `ScriptedModel`, `httpx.MockTransport`, an ASGI transport). With no
    timer pending it waits for I/O as any loop does.
    """

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 0.0
        selector: Any = self._selector  # type: ignore[attr-defined]
        real_select = selector.select

        def select(timeout: float | None = None) -> list[Any]:
            ready: list[Any] = real_select(0)
            if ready or timeout == 0:
                return ready
            if timeout is None:  # no timer: only I/O (or another thread) can wake the loop
                return real_select(None)  # type: ignore[no-any-return]
            self._virtual_now += timeout
            return []

        selector.select = select

    def time(self) -> float:
        return self._virtual_now

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Join the default executor's threads (a DNS lookup's, `run_in_executor`'s) without a
        timeout: on virtual time a join timeout (Python 3.12+ closes a runner with 300 s) would
        expire at once, since nothing else is scheduled while the threads finish."""
        await super().shutdown_default_executor()


def virtual_clock(backend: str) -> dict[str, Any]:
    """Backend options that run on virtual time, for `backend` "asyncio" or "trio": the second item of
    the anyio pytest plugin's `anyio_backend` fixture, or `anyio.run(..., backend_options=...)`.

    asyncio gets a `VirtualTimeEventLoop`, trio a `trio.testing.MockClock(autojump_threshold=0)`
    (which jumps to the next deadline whenever every task is blocked). Each call returns a new clock.
    `ValueError` for another backend.
    """
    if backend == "asyncio":
        return {"loop_factory": VirtualTimeEventLoop}
    if backend == "trio":
        from trio.testing import MockClock

        return {"clock": MockClock(autojump_threshold=0)}
    raise ValueError(f"virtual_clock: backend must be 'asyncio' or 'trio', got {backend!r}")
