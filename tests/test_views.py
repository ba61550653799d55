"""Acceptance 3: the awaited value, Result and TokenStream are folds of one event stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    Completed,
    ContentRefusedError,
    FinishReason,
    MemoryId,
    OutputParsingError,
    RefusalDelta,
    RequestIssued,
    ResponseReceived,
    Result,
    Started,
    TextDelta,
    ThinkingDelta,
    TokenStream,
    Usage,
)
from agentrt.models import Finish, ResponseMeta
from agentrt.testing import Raise, ScriptedModel


class City(BaseModel):
    name: str
    population: int


class Service:
    async def text(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def result(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    async def iterator(self, question: str) -> AsyncIterator[str]: ...

    async def city(self, question: str) -> City: ...

    async def city_result(self, question: str) -> Result[City]: ...


SCRIPT = [
    ResponseMeta(id="resp-1", model="scripted-2026"),
    ThinkingDelta("The user greets; "),
    ThinkingDelta("answer kindly.", signature="sig-1"),
    "Hel",
    "lo, ",
    "world",
    Usage(input_tokens=12, output_tokens=3),
    Finish(FinishReason.STOP, raw="stop"),
]


def service(*responses: object) -> tuple[Service, ScriptedModel]:
    model = ScriptedModel(*responses)  # type: ignore[arg-type]
    return agentrt.build(Service, model=model), model


async def test_awaited_str_returns_the_text() -> None:
    svc, _ = service(SCRIPT)
    assert await svc.text("c", "hi") == "Hello, world"


async def test_result_carries_value_usage_finish_reason_thinking_and_model() -> None:
    svc, _ = service(SCRIPT)

    result = await svc.result("c", "hi")

    assert result.value == "Hello, world"
    assert result.text == "Hello, world"
    assert result.usage == Usage(input_tokens=12, output_tokens=3)
    assert result.finish_reason is FinishReason.STOP
    assert result.thinking == "The user greets; answer kindly."
    assert result.model == "scripted-2026"
    assert result.tool_executions == () and result.sources == () and result.attempts == 1
    assert len(result.invocation_id) == 32


async def test_stream_yields_the_deltas_in_order_and_its_result_equals_the_awaited_one() -> None:
    svc, _ = service(SCRIPT, SCRIPT)

    stream = await svc.stream("c", "hi")
    tokens = [token async for token in stream]
    streamed = await stream.result()
    awaited = await svc.result("c", "hi")

    assert tokens == ["Hel", "lo, ", "world"]
    assert streamed == awaited
    assert streamed.invocation_id != awaited.invocation_id


async def test_events_are_the_one_stream_every_view_folds() -> None:
    svc, model = service(SCRIPT)

    stream = await svc.stream("c", "hi")
    events = [event async for event in stream.events()]

    kinds = [type(e) for e in events]
    assert kinds == [
        Started,
        RequestIssued,
        ThinkingDelta,
        ThinkingDelta,
        TextDelta,
        TextDelta,
        TextDelta,
        Usage,
        ResponseReceived,
        Completed,
    ]
    started, issued = events[0], events[1]
    assert isinstance(started, Started) and started.method == "Service.stream"
    assert started.memory_id == "c"
    assert isinstance(issued, RequestIssued) and issued.request is model.requests[0]
    completed = events[-1]
    assert isinstance(completed, Completed)
    assert completed.result == await stream.result()
    ids = {e.invocation_id for e in events if hasattr(e, "invocation_id")}
    assert ids == {started.invocation_id}


async def test_reading_some_tokens_then_the_result_continues_the_same_stream() -> None:
    svc, model = service(SCRIPT)

    stream = await svc.stream("c", "hi")
    first = await stream.__anext__()
    result = await stream.result()

    assert first == "Hel"
    assert result.text == "Hello, world"
    assert len(model.requests) == 1 and model.streams[0].completed


async def test_async_iterator_return_is_a_token_stream() -> None:
    svc, _ = service(["a", "b"])

    tokens = await svc.iterator("hi")

    assert isinstance(tokens, TokenStream)
    assert [t async for t in tokens] == ["a", "b"]


async def test_callback_sugar_over_the_events() -> None:
    svc, _ = service(SCRIPT, [*SCRIPT[:4], Raise(RuntimeError("boom"))])
    partial: list[str] = []
    thinking: list[str] = []
    completed: list[Result[str]] = []
    errors: list[Exception] = []

    stream = await svc.stream("c", "hi")
    result = await stream.run(
        on_partial=partial.append,
        on_thinking=thinking.append,
        on_complete=completed.append,
        on_error=errors.append,
    )
    failing = await svc.stream("c", "hi")
    nothing = await failing.run(on_partial=partial.append, on_error=errors.append)

    assert partial == ["Hel", "lo, ", "world", "Hel"]
    assert thinking == ["The user greets; ", "answer kindly."]
    assert completed == [result]
    assert nothing is None
    assert [str(e) for e in errors] == ["boom"]


async def test_stream_errors_are_raised_not_yielded_and_result_raises_them_again() -> None:
    svc, _ = service(["a", Raise(RuntimeError("upstream broke"))])

    stream = await svc.stream("c", "hi")
    tokens: list[str] = []

    async def read() -> None:
        async for token in stream:
            tokens.append(token)

    with pytest.raises(RuntimeError, match="upstream broke"):
        await read()

    assert tokens == ["a"]
    with pytest.raises(RuntimeError, match="upstream broke"):
        await stream.result()


async def test_pydantic_model_value_and_result() -> None:
    payload = '{"name": "Bern", "population": 134000}'
    svc, _ = service(payload, payload)

    assert await svc.city("capital?") == City(name="Bern", population=134000)
    result = await svc.city_result("capital?")
    assert result.value == City(name="Bern", population=134000)
    assert result.text == payload


async def test_unparseable_answer_raises_output_parsing_error_with_the_text() -> None:
    svc, _ = service('{"name": "Bern"}', '{"name": "Bern!"}')  # the answer and its repair

    with pytest.raises(OutputParsingError) as info:
        await svc.city("capital?")

    assert info.value.text == '{"name": "Bern!"}'
    assert info.value.target == "City"


async def test_refusal_without_text_raises_content_refused() -> None:
    svc, _ = service([RefusalDelta("I can't "), RefusalDelta("help with that.")])

    with pytest.raises(ContentRefusedError) as info:
        await svc.city("how do I build a bomb")

    assert info.value.refusal == "I can't help with that."


async def test_usage_is_estimated_and_marked_when_the_model_reports_none() -> None:
    svc, _ = service("four char toke")

    result = await svc.result("c", "hi")

    assert result.usage.estimated
    assert result.usage.output_tokens == 4
    assert result.usage.input_tokens >= 1


async def test_async_with_closes_the_stream() -> None:
    svc, model = service(["a", "b", "c"])

    async with await svc.stream("c", "hi") as stream:
        assert await stream.__anext__() == "a"

    assert model.streams[0].closed and not model.streams[0].completed
    with pytest.raises(RuntimeError, match="closed before the invocation completed"):
        await stream.result()
