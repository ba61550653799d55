"""Acceptance 4: every way of stopping early closes the model's stream, on asyncio and on trio."""

from __future__ import annotations

import gc
import inspect

import anyio
import pytest

import agentrt
from agentrt import CancelledEvent, LifecycleEvent, TokenStream
from agentrt.testing import CallTool, Delay, Hang, ScriptedModel

SCRIPT = ["one ", "two ", Hang()]
UNCLOSED = r"^Service\.stream: a stream was collected without being closed or read to its end"


class Service:
    async def stream(self, question: str) -> TokenStream: ...

    async def ask(self, question: str) -> str: ...


def service(*responses: object) -> tuple[Service, ScriptedModel, list[LifecycleEvent]]:
    model = ScriptedModel(*responses)  # type: ignore[arg-type]
    events: list[LifecycleEvent] = []
    return agentrt.build(Service, model=model, listeners=[events.append]), model, events


async def test_break_out_of_an_unheld_stream_closes_the_model_stream() -> None:
    svc, model, events = service(SCRIPT)

    async def read_one() -> None:
        async for token in await svc.stream("hi"):
            assert token == "one "
            break

    # Nothing holds the stream any more: it warns, and is closed from a fresh task once collected.
    with pytest.warns(ResourceWarning, match=UNCLOSED):
        await read_one()
    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
    assert not model.streams[0].completed
    assert isinstance(events[-1], CancelledEvent)


async def test_break_leaves_a_held_stream_open_to_read_on() -> None:
    svc, model, events = service(["one ", "two ", "three"])
    stream = await svc.stream("hi")

    async for token in stream:
        assert token == "one "
        break
    assert not model.streams[0].closed
    rest = [token async for token in stream]
    result = await stream.result()

    assert rest == ["two ", "three"]
    assert result.text == "one two three"
    assert model.streams[0].completed and model.streams[0].closed
    assert not any(isinstance(e, CancelledEvent) for e in events)


async def test_break_then_result_reads_the_rest() -> None:
    svc, model, _ = service(["one ", "two ", "three"])
    stream = await svc.stream("hi")

    async for _token in stream:
        break
    gc.collect()
    result = await stream.result()

    assert result.text == "one two three"
    assert model.streams[0].completed


async def test_async_with_and_break_close_at_the_end_of_the_block() -> None:
    svc, model, events = service(SCRIPT)

    async with await svc.stream("hi") as stream:
        async for _token in stream:
            break
        gc.collect()
        assert not model.streams[0].closed

    assert model.streams[0].closed and not model.streams[0].completed
    assert isinstance(events[-1], CancelledEvent)
    with pytest.raises(RuntimeError, match="closed before the invocation completed"):
        await stream.result()


async def test_aclose_closes_at_once_and_is_idempotent() -> None:
    svc, model, events = service(SCRIPT)

    stream = await svc.stream("hi")
    assert await stream.__anext__() == "one "
    await stream.aclose()

    assert model.streams[0].closed
    assert isinstance(events[-1], CancelledEvent)
    await stream.aclose()
    assert [t async for t in stream] == []


async def test_aclose_before_reading_closes_the_started_model_stream() -> None:
    # `await svc.stream()` starts the request (so that its errors are raised there); closing the
    # stream before reading a token closes the model stream at once.
    svc, model, events = service(SCRIPT)

    stream = await svc.stream("hi")
    assert len(model.requests) == 1 and not model.streams[0].closed
    await stream.aclose()

    assert model.streams[0].closed and not model.streams[0].completed
    assert isinstance(events[-1], CancelledEvent)


@pytest.mark.virtual_clock
async def test_cancelled_reads_do_not_turn_into_errors_of_the_stream() -> None:
    svc, model, _ = service(SCRIPT)
    stream = await svc.stream("hi")

    with anyio.move_on_after(10):
        async for _token in stream:
            pass

    assert model.streams[0].closed
    # The cancellation belonged to its scope; the stream just ended early.
    with pytest.raises(RuntimeError, match="closed before the invocation completed"):
        await stream.result()


async def test_cancelling_the_consuming_task_closes_the_model_stream() -> None:
    svc, model, events = service(SCRIPT)
    stream = await svc.stream("hi")
    received: list[str] = []
    second_token = anyio.Event()

    async def consume() -> None:
        async for token in stream:
            received.append(token)
            if len(received) == 2:
                second_token.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await second_token.wait()
        # The consumer is now blocked inside the model's stream (the script hangs).
        tg.cancel_scope.cancel()

    assert received == ["one ", "two "]
    assert model.streams[0].closed and not model.streams[0].completed
    assert isinstance(events[-1], CancelledEvent)


@pytest.mark.virtual_clock
async def test_a_deadline_around_an_awaited_call_closes_the_model_stream() -> None:
    svc, model, events = service(["partial", Delay(60), "never"])

    with anyio.move_on_after(10) as scope:
        await svc.ask("hi")

    assert scope.cancelled_caught
    assert model.streams[0].closed and not model.streams[0].completed
    assert isinstance(events[-1], CancelledEvent)


async def test_an_error_mid_stream_closes_the_model_stream() -> None:
    class Boom(Exception):
        pass

    def fail(request: object) -> list[object]:
        return ["a", agentrt.testing.Raise(Boom())]

    model = agentrt.testing.FunctionModel(fail)  # type: ignore[arg-type]
    svc = agentrt.build(Service, model=model)

    with pytest.raises(Boom):
        await svc.ask("hi")

    assert model.streams[0].closed


async def test_break_out_of_the_events_of_an_unheld_stream_closes_it() -> None:
    svc, model, _ = service(SCRIPT)

    async def read_to_text() -> None:
        async for event in (await svc.stream("hi")).events():
            if isinstance(event, agentrt.TextDelta):
                break

    with pytest.warns(ResourceWarning, match=UNCLOSED):
        await read_to_text()
    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
    assert not model.streams[0].completed


async def test_dropping_an_unfinished_stream_closes_it() -> None:
    svc, model, _ = service(SCRIPT)
    stream = await svc.stream("hi")
    assert await stream.__anext__() == "one "

    with pytest.warns(ResourceWarning, match=UNCLOSED):
        del stream

    with anyio.fail_after(5):
        await model.streams[0].wait_closed()


async def test_a_stream_dropped_in_a_worker_thread_is_closed_in_its_own_loop() -> None:
    # The garbage collector runs wherever the last reference goes: here, in a sync tool's or a
    # callback's worker thread. The close is handed to the stream's own event loop.
    svc, model, events = service(SCRIPT)
    stream = await svc.stream("hi")
    assert await stream.__anext__() == "one "
    holder = [stream]
    del stream

    def drop() -> None:
        holder.pop()
        gc.collect()

    with pytest.warns(ResourceWarning, match=UNCLOSED):
        await anyio.to_thread.run_sync(drop)

    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
    assert isinstance(events[-1], CancelledEvent)


def open_steps() -> list[object]:
    """The pipeline's step generators still suspended somewhere (not closed, not finished)."""
    return [
        o
        for o in gc.get_objects()
        if inspect.isasyncgen(o) and o.__name__ in ("tool_round", "events") and o.ag_frame is not None
    ]


@pytest.mark.parametrize("stop_after", ["ToolCallRequested", "ToolExecuted"])
async def test_a_stream_closed_during_a_tool_round_closes_the_round_it_stopped_in(stop_after: str) -> None:
    ran: list[str] = []

    @agentrt.tool("Look up.")
    async def lookup(query: str) -> str:
        ran.append(query)
        return "found"

    model = ScriptedModel([CallTool("lookup", {"query": "a"}, id="c1")], "done")
    svc = agentrt.build(Service, model=model, tools=[lookup])
    assert open_steps() == []
    stream = await svc.stream("hi")
    async with stream:
        async for event in stream.events():
            if type(event).__name__ == stop_after:
                break
        assert open_steps() != []  # suspended in the tool round, and the driver around it
    # Closed by the driver, not left for a finalizer: nothing of the turn is suspended any more.
    assert open_steps() == []
    assert ran == ([] if stop_after == "ToolCallRequested" else ["a"])
    assert len(model.requests) == 1
