"""Cancellation and budget expiry at every checkpoint of an invocation (stream → tool round → stream).

On the virtual clock, the scripted model waits one second before each of its steps and the tool one
second, so every instant of the call is a distinct checkpoint: the sweep stops the call at each
quarter second past a step, and, reading the stream event by event, at every `yield`. Each time:

- only cancellation (or `BudgetExceededError`) escapes;
- every model stream that was opened was closed by the pipeline (`StreamRecord.closed` records an
  explicit `aclose`, not the generator ending);
- a tool that started and did not finish saw the cancellation;
- no task is left running;
- listeners saw exactly one terminal event, and the right one.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import agentrt
from agentrt import (
    Budget,
    BudgetExceededError,
    CancelledEvent,
    Completed,
    FailedEvent,
    LifecycleEvent,
    TokenStream,
    tool,
)
from agentrt.testing import CallTool, Delay, ScriptedModel

END = 5.0  # seconds the whole call takes: 2 s of the first response, 1 s of tool, 2 s of the second
STOPS = [k / 2 + 0.25 for k in range(12)]  # 0.25 … 5.75: inside every step, and after the end


class Chat:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


class Probe:
    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.finished = 0

    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        self.started += 1
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        self.finished += 1
        return "found"


def scenario(**build: Any) -> tuple[Chat, ScriptedModel, Probe, list[LifecycleEvent]]:
    model = ScriptedModel(
        ["a", Delay(1), "b", Delay(1), CallTool("lookup", {"query": "q"})],
        ["c", Delay(1), "d", Delay(1), "e"],
    )
    probe = Probe()
    events: list[LifecycleEvent] = []
    service = agentrt.build(Chat, model=model, tools=[probe], listeners=[events.append], **build)
    return service, model, probe, events


async def run(service: Chat, view: str) -> str:
    if view == "ask":
        return await service.ask("go")
    return "".join([t async for t in await service.stream("go")])


def check_released(model: ScriptedModel, probe: Probe, tasks_before: int) -> None:
    assert model.streams, "the call reached the model"
    assert all(s.closed for s in model.streams), model.streams
    assert probe.cancelled == probe.started - probe.finished
    assert len(anyio.get_running_tasks()) == tasks_before


def terminal(events: list[LifecycleEvent]) -> list[LifecycleEvent]:
    return [e for e in events if isinstance(e, Completed | FailedEvent | CancelledEvent)]


@pytest.mark.virtual_clock
@pytest.mark.parametrize("view", ["ask", "stream"])
@pytest.mark.parametrize("stop", STOPS)
async def test_cancellation_at_every_instant(view: str, stop: float) -> None:
    service, model, probe, events = scenario()
    tasks_before = len(anyio.get_running_tasks())

    with anyio.move_on_after(stop) as scope:  # anything but cancellation fails the test
        answer = await run(service, view)

    check_released(model, probe, tasks_before)
    if stop < END:
        assert scope.cancelled_caught
        assert [type(e) for e in terminal(events)] == [CancelledEvent]
    else:
        assert answer == ("cde" if view == "ask" else "abcde")  # a stream shows every response
        assert [type(e) for e in terminal(events)] == [Completed]
    assert probe.started == (1 if stop > 2 else 0)


@pytest.mark.virtual_clock
@pytest.mark.parametrize("view", ["ask", "stream"])
@pytest.mark.parametrize("stop", STOPS)
async def test_a_time_budget_expiring_at_every_instant(view: str, stop: float) -> None:
    service, model, probe, events = scenario(budget=Budget(seconds=stop))
    tasks_before = len(anyio.get_running_tasks())
    start = anyio.current_time()

    if stop < END:
        with pytest.raises(BudgetExceededError) as info:
            await run(service, view)
        assert anyio.current_time() - start == pytest.approx(stop)
        assert info.value.limit == "seconds"
        assert [type(e) for e in terminal(events)] == [FailedEvent]
        partial = info.value.partial
        # The text of the response under way (during the tool round, the first one's).
        assert partial.text == ("ab"[: int(stop) + 1] if stop < 3 else "cd"[: int(stop) - 2])
        assert len(partial.tool_executions) == (1 if stop > 3 else 0)
    else:
        assert await run(service, view) == ("cde" if view == "ask" else "abcde")
        assert [type(e) for e in terminal(events)] == [Completed]
    check_released(model, probe, tasks_before)


@pytest.mark.virtual_clock
async def test_a_reader_that_stops_after_every_event() -> None:
    # Count the events of a full run, then stop a reader after each of them in turn: the stop is
    # delivered at the pipeline's next checkpoint.
    service, _, _, _ = scenario()
    total = len([e async for e in (await service.stream("go")).events()])
    assert total > 10

    for k in range(total):
        service, model, probe, events = scenario()
        tasks_before = len(anyio.get_running_tasks())
        seen = 0
        with anyio.CancelScope() as scope:
            async for _ in (await service.stream("go")).events():
                seen += 1
                if seen == k + 1:
                    scope.cancel()
        check_released(model, probe, tasks_before)
        kinds = [type(e) for e in terminal(events)]
        # A stop after the last checkpoint (nothing left that waits) lets the call complete, and the
        # reader then sees every event; any earlier stop cancels it.
        assert kinds in ([CancelledEvent], [Completed]), (k, kinds)
        assert (kinds == [Completed]) == (seen == total), (k, kinds, seen)
        assert scope.cancelled_caught == (kinds == [CancelledEvent])
