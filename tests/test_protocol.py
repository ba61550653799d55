"""The model protocol: a non-streaming call is the fold of the stream, implemented once."""

from __future__ import annotations

import pytest

from agentrt import (
    AssistantMessage,
    Capabilities,
    FinishReason,
    ModelRequest,
    ModelSettings,
    SystemMessage,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
    UserMessage,
)
from agentrt.models import Finish, ResponseAccumulator, ResponseMeta, ToolCallDelta, complete
from agentrt.testing import ScriptedModel

REQUEST = ModelRequest(messages=(SystemMessage(text="s"), UserMessage.of("hello there")))


async def test_complete_folds_text_thinking_usage_finish_and_metadata() -> None:
    model = ScriptedModel(
        [
            ResponseMeta(id="r1", model="m-1"),
            ThinkingDelta("hmm"),
            TextDelta("Hi"),
            TextDelta("!"),
            Usage(input_tokens=5, output_tokens=2),
            Usage(input_tokens=5, output_tokens=3),
            Finish(FinishReason.LENGTH, raw="length"),
        ]
    )

    response = await complete(model, REQUEST)

    assert response.message == AssistantMessage(text="Hi!", thinking="hmm")
    assert response.usage == Usage(input_tokens=5, output_tokens=3)
    assert response.finish_reason is FinishReason.LENGTH
    assert (response.id, response.model) == ("r1", "m-1")
    assert model.streams[0].closed and model.streams[0].completed


async def test_tool_call_fragments_assemble_by_index_in_order_of_first_appearance() -> None:
    accumulator = ResponseAccumulator()
    for chunk in [
        ToolCallDelta(1, "call_b", "weather", '{"ci'),
        ToolCallDelta(0, "call_a", "time", ""),
        ToolCallDelta(1, None, None, 'ty": "Bern"}'),
        ToolCallDelta(0, None, None, "{}"),
        ToolCallDelta(2, None, "noid"),
    ]:
        accumulator.add(chunk)

    response = accumulator.build(REQUEST)

    assert response.message.tool_calls == (
        ToolCall(id="call_b", name="weather", arguments='{"city": "Bern"}'),
        ToolCall(id="call_a", name="time", arguments="{}"),
        ToolCall(id="call_2", name="noid", arguments=""),
    )
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.message.text is None


async def test_usage_is_estimated_when_none_was_reported() -> None:
    accumulator = ResponseAccumulator()
    accumulator.add(TextDelta("x" * 40))

    usage = accumulator.build(REQUEST).usage

    assert usage.estimated
    assert usage.output_tokens == 10
    assert usage.input_tokens == 3  # "s" + "hello there" = 12 characters, 4 a token


async def test_a_chunk_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a model chunk"):
        ResponseAccumulator().add("text")  # type: ignore[arg-type]


async def test_usage_adds_up_and_keeps_the_estimated_mark() -> None:
    total = Usage(1, 2, 3, 4) + Usage(10, 20, estimated=True)
    assert total == Usage(11, 22, 3, 4, estimated=True)
    assert total.total_tokens == 33


async def test_settings_merge_and_capabilities_are_overridable() -> None:
    base = ModelSettings(temperature=0.2, max_tokens=100)
    assert base.merge(ModelSettings(max_tokens=5, seed=1)) == ModelSettings(
        temperature=0.2, max_tokens=5, seed=1
    )
    assert base.merge(None) is base
    import dataclasses

    assert dataclasses.replace(Capabilities(), json_schema=True).json_schema
