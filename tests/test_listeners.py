"""Acceptance 5: listeners see lifecycle events in order, with one invocation id, and cannot break
the invocation by raising."""

from __future__ import annotations

import logging

import pytest

import agentrt
from agentrt import (
    Completed,
    FailedEvent,
    LifecycleEvent,
    RequestIssued,
    ResponseReceived,
    Started,
    TokenStream,
)
from agentrt.testing import Raise, ScriptedModel


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


async def test_lifecycle_events_arrive_in_order_with_one_invocation_id() -> None:
    seen: list[LifecycleEvent] = []
    model = ScriptedModel(["Hel", "lo"])
    svc = agentrt.build(Service, model=model, listeners=[seen.append])

    assert await svc.ask("hi") == "Hello"

    assert [type(e) for e in seen] == [Started, RequestIssued, ResponseReceived, Completed]
    assert len({e.invocation_id for e in seen}) == 1
    issued, received, completed = seen[1], seen[2], seen[3]
    assert isinstance(issued, RequestIssued) and issued.request is model.requests[0]
    assert isinstance(received, ResponseReceived) and received.response.message.text == "Hello"
    assert isinstance(completed, Completed) and completed.result.value == "Hello"
    assert completed.result.invocation_id == seen[0].invocation_id


async def test_two_invocations_have_distinct_ids() -> None:
    seen: list[LifecycleEvent] = []
    svc = agentrt.build(Service, model=ScriptedModel("a", "b"), listeners=[seen.append])

    await svc.ask("one")
    await svc.ask("two")

    first, second = seen[:4], seen[4:]
    assert len({e.invocation_id for e in first}) == 1
    assert len({e.invocation_id for e in second}) == 1
    assert first[0].invocation_id != second[0].invocation_id


async def test_errors_reach_listeners_as_failed_and_are_raised() -> None:
    seen: list[LifecycleEvent] = []
    error = RuntimeError("model down")
    svc = agentrt.build(Service, model=ScriptedModel([Raise(error)]), listeners=[seen.append])

    with pytest.raises(RuntimeError, match="model down"):
        await svc.ask("hi")

    assert [type(e) for e in seen] == [Started, RequestIssued, FailedEvent]
    failed = seen[-1]
    assert isinstance(failed, FailedEvent) and failed.error is error


async def test_a_raising_listener_is_logged_and_does_not_break_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[LifecycleEvent] = []

    def broken(event: LifecycleEvent) -> None:
        raise ValueError(f"listener bug on {type(event).__name__}")

    svc = agentrt.build(Service, model=ScriptedModel(["a", "b"]), listeners=[broken, seen.append])

    with caplog.at_level(logging.ERROR, logger="agentrt"):
        stream = await svc.stream("hi")
        tokens = [t async for t in stream]

    assert tokens == ["a", "b"]
    # Later listeners still receive every event.
    assert [type(e) for e in seen] == [Started, RequestIssued, ResponseReceived, Completed]
    assert len(caplog.records) == 4
    assert all("listener" in r.getMessage() for r in caplog.records)
    assert caplog.records[0].exc_info is not None


async def test_a_reader_that_stops_at_completed_and_closes_is_not_a_cancellation() -> None:
    seen: list[LifecycleEvent] = []
    svc = agentrt.build(Service, model=ScriptedModel(["a"]), listeners=[seen.append])

    stream = await svc.stream("hi")
    async for event in stream.events():
        if isinstance(event, Completed):
            break
    await stream.aclose()

    assert [type(e) for e in seen] == [Started, RequestIssued, ResponseReceived, Completed]
