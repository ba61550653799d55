"""agentrt.testing: scripted and function models record what tests need to assert."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

import agentrt
from agentrt import Capabilities, FinishReason, ModelRequest, TextDelta, TokenStream, ToolCall
from agentrt.models import Finish, complete
from agentrt.testing import (
    CallTool,
    Delay,
    FunctionModel,
    ScriptedModel,
    ScriptExhausted,
)


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


@pytest.mark.virtual_clock
async def test_delays_run_on_the_virtual_clock() -> None:
    model = ScriptedModel(["a", Delay(30), "b"])
    svc = agentrt.build(Service, model=model)
    start = anyio.current_time()
    stamps: list[float] = []

    async for _token in await svc.stream("hi"):
        stamps.append(anyio.current_time() - start)

    assert stamps == [pytest.approx(0, abs=0.01), pytest.approx(30, abs=0.01)]


async def test_running_out_of_script_fails_the_test_clearly() -> None:
    model = ScriptedModel("only one")
    svc = agentrt.build(Service, model=model)
    await svc.ask("1")

    with pytest.raises(ScriptExhausted, match="request 2 has no scripted response"):
        await svc.ask("2")
    assert model.remaining == 0


async def test_call_tool_steps_become_tool_call_deltas_with_a_tool_calls_finish() -> None:
    model = ScriptedModel([CallTool("lookup", {"q": "x"}), CallTool("time", id="t-1")])
    request = ModelRequest(messages=(agentrt.UserMessage.of("?"),))

    response = await complete(model, request)

    assert response.message.tool_calls == (
        ToolCall(id="call_0", name="lookup", arguments='{"q":"x"}'),
        ToolCall(id="t-1", name="time", arguments="{}"),
    )
    assert response.finish_reason is FinishReason.TOOL_CALLS


async def test_function_model_answers_from_the_request_sync_or_async() -> None:
    def echo(request: ModelRequest) -> str:
        return f"you said: {agentrt.UserMessage.of(*request.messages[-1].contents).text}"  # type: ignore[union-attr]

    async def shout(request: ModelRequest) -> list[object]:
        await anyio.lowlevel.checkpoint()
        return [TextDelta("LOUD")]

    echo_model = FunctionModel(echo)
    shout_model = FunctionModel(shout)  # type: ignore[arg-type]

    assert await agentrt.build(Service, model=echo_model).ask("hi") == "you said: hi"
    assert await agentrt.build(Service, model=shout_model).ask("hi") == "LOUD"
    assert len(echo_model.requests) == 1 and echo_model.streams[0].closed
    assert shout_model.streams[0].completed


@pytest.mark.parametrize("make", [ScriptedModel, lambda *s: FunctionModel(lambda _r: s[0])])
async def test_closed_records_only_an_explicit_close_by_the_consumer(make: object) -> None:
    request = ModelRequest(messages=(agentrt.UserMessage.of("?"),))
    model = make(["a", "b"], ["a", "b"])  # type: ignore[operator]

    drained = model.stream(request)
    assert [c async for c in drained] == [TextDelta("a"), TextDelta("b"), Finish(FinishReason.STOP)]
    assert model.streams[0].completed and model.streams[0].ended
    assert not model.streams[0].closed  # ran to its end: nobody closed it

    closed = model.stream(request)
    await closed.__anext__()
    await closed.aclose()
    assert model.streams[1].closed and model.streams[1].ended and not model.streams[1].completed


def test_the_test_models_declare_what_they_do_with_deadlines_in_their_capabilities() -> None:
    # `handles_deadline=` says what the model does (its `Delay` and `Hang` stop at the deadline or
    # not), so it is what the capabilities declare, whatever capabilities are passed.
    own = Capabilities(json_schema=False, provider="acme")
    assert ScriptedModel().capabilities.handles_deadline
    assert FunctionModel(lambda request: "x", handles_deadline=False).capabilities.handles_deadline is False
    assert ScriptedModel(capabilities=own).capabilities == dataclasses.replace(own, handles_deadline=True)
    assert ScriptedModel(capabilities=own, handles_deadline=False).capabilities is own
