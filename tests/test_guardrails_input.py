"""Input guardrails: the chain's semantics, where they are declared, and what reaches the model.

Each guardrail double records the text it was shown, so the tests see what every position of the
chain saw, what the model was sent (`model.requests`) and what memory stored.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest

import agentrt
from agentrt import (
    AssistantMessage,
    GuardrailVerdict,
    ImageContent,
    InputGuardrailError,
    MemoryId,
    RequestIssued,
    Started,
    TextContent,
    UserMessage,
)
from agentrt.guardrails import (
    GuardrailResult,
    InputGuardrailRequest,
    failure,
    fatal,
    input_guardrails,
    reprompt,
    retry,
    success,
    success_with,
)
from agentrt.testing import ScriptedModel


class Recorder:
    """A guardrail that answers `result` and records the text it was shown."""

    def __init__(self, name: str, result: GuardrailResult) -> None:
        self.name = name
        self.result = result
        self.seen: list[str] = []

    def validate(self, request: InputGuardrailRequest) -> GuardrailResult:
        self.seen.append(request.text)
        return self.result


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


VERDICTS: dict[str, GuardrailResult] = {
    "success": success(),
    "success_with": success_with("rewritten"),
    "failure": failure("not allowed"),
    "fatal": fatal("never allowed"),
}


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("verdict", list(VERDICTS))
async def test_every_verdict_at_every_position_of_the_chain(verdict: str, position: int) -> None:
    chain = [Recorder(f"g{i}", VERDICTS[verdict] if i == position else success()) for i in range(3)]
    model = ScriptedModel("answer")
    svc = agentrt.build(Chat, model=model, input_guardrails=chain, memory=agentrt.memory.window())

    if verdict in ("failure", "fatal"):
        with pytest.raises(InputGuardrailError) as caught:
            await svc.chat("c", "question")
        assert [f.guardrail for f in caught.value.failures] == [f"g{position}"]
        assert caught.value.failures[0].verdict == verdict
        assert f"g{position}: {VERDICTS[verdict].message}" in str(caught.value)
        assert model.requests == []  # before any model request
        assert await agentrt.memory.access(svc).read("c") == []
        ran = position + 1 if verdict == "fatal" else 3  # fatal stops the chain, failure does not
        assert [len(g.seen) for g in chain] == [1] * ran + [0] * (3 - ran)
        return

    assert await svc.chat("c", "question") == "answer"
    sent = "rewritten" if verdict == "success_with" else "question"
    # Later guardrails see the rewrite; earlier ones the original.
    assert [g.seen for g in chain] == [["question"] if i <= position else [sent] for i in range(3)]
    assert model.requests[0].messages[-1] == UserMessage.of(sent)
    stored = await agentrt.memory.access(svc).read("c")
    assert stored == [UserMessage.of(sent), AssistantMessage(text="answer")]


async def test_failures_accumulate_until_the_end_of_the_chain_or_a_fatal() -> None:
    chain = [
        Recorder("a", failure("first")),
        Recorder("b", success()),
        Recorder("c", failure("second")),
        Recorder("d", fatal("stop")),
        Recorder("e", failure("never run")),
    ]
    model = ScriptedModel()
    svc = agentrt.build(Chat, model=model, input_guardrails=chain)

    with pytest.raises(InputGuardrailError) as caught:
        await svc.chat("c", "q")

    assert [(f.guardrail, f.verdict, f.message) for f in caught.value.failures] == [
        ("a", "failure", "first"),
        ("c", "failure", "second"),
        ("d", "fatal", "stop"),
    ]
    assert chain[4].seen == []


@pytest.mark.parametrize("result", [retry("again"), reprompt("again", "say it better")])
async def test_an_input_guardrail_cannot_ask_the_model_again(result: GuardrailResult) -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(), input_guardrails=[lambda request: result])
    with pytest.raises(TypeError, match="only output guardrails can ask the model again"):
        await svc.chat("c", "q")


async def test_a_guardrail_must_return_a_guardrail_result() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(), input_guardrails=[lambda request: True])
    with pytest.raises(TypeError, match="must return a GuardrailResult"):
        await svc.chat("c", "q")


async def test_functions_objects_sync_and_async_all_run_in_order() -> None:
    order: list[str] = []

    def plain(request: InputGuardrailRequest) -> GuardrailResult:
        order.append("plain")
        return success()

    async def coroutine(request: InputGuardrailRequest) -> GuardrailResult:
        order.append("coroutine")
        return success_with(request.text.upper())

    class Async:
        async def validate(self, request: InputGuardrailRequest) -> GuardrailResult:
            order.append(f"object saw {request.text}")
            return success()

    model = ScriptedModel("ok")
    svc = agentrt.build(Chat, model=model, input_guardrails=[plain, coroutine, Async()])
    await svc.chat("c", "quiet")

    assert order == ["plain", "coroutine", "object saw QUIET"]
    assert model.requests[0].messages[-1] == UserMessage.of("QUIET")


async def test_a_rewrite_keeps_the_attachments() -> None:
    class Pictures:
        async def describe(self, question: str, image: ImageContent) -> str: ...

    image = ImageContent.from_url("https://example.com/cat.png")
    model = ScriptedModel("a cat")
    svc = agentrt.build(Pictures, model=model, input_guardrails=[lambda r: success_with("What is this?")])
    await svc.describe("wat", image)

    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage)
    assert [type(c) for c in sent.contents] == [TextContent, ImageContent]
    assert sent.text == "What is this?"


# --- where guardrails are declared --------------------------------------------------------------


def tagging(tag: str) -> Any:
    return lambda request: success_with(f"{request.text}+{tag}")


@input_guardrails(tagging("class"))
class Declared:
    @input_guardrails(tagging("method"))
    async def own(self, question: str) -> str: ...

    async def inherited(self, question: str) -> str: ...

    @input_guardrails()
    async def none(self, question: str) -> str: ...


class Undeclared:
    async def chat(self, question: str) -> str: ...


async def test_the_method_s_chain_wins_over_the_class_s_which_wins_over_the_build_s() -> None:
    model = ScriptedModel("1", "2", "3", "4")
    svc = agentrt.build(Declared, model=model, input_guardrails=[tagging("build")])
    await svc.own("q")
    await svc.inherited("q")
    await svc.none("q")
    plain = agentrt.build(Undeclared, model=model, input_guardrails=[tagging("build")])
    await plain.chat("q")

    assert [r.messages[-1] for r in model.requests] == [
        UserMessage.of("q+method"),
        UserMessage.of("q+class"),
        UserMessage.of("q"),  # an empty chain on the method: no guardrails
        UserMessage.of("q+build"),
    ]


@pytest.mark.parametrize(
    ("guardrail", "match"),
    [(3, "not callable"), (Recorder, "is a class"), ("text", "not callable")],
    ids=["int", "class", "str"],
)
def test_a_guardrail_that_cannot_be_called_is_a_configuration_error(guardrail: Any, match: str) -> None:
    with pytest.raises(agentrt.ConfigurationError, match=match):
        agentrt.build(Chat, model=ScriptedModel(), input_guardrails=[guardrail])
    with pytest.raises(agentrt.ConfigurationError, match=rf"^Broken\.chat: @input_guardrails: .*{match}"):

        class Broken:
            @input_guardrails(guardrail)
            async def chat(self, question: str) -> str: ...


# --- what guardrails see, and events --------------------------------------------------------------


async def test_a_guardrail_sees_the_method_the_memory_id_and_the_history() -> None:
    seen: list[InputGuardrailRequest] = []

    def look(request: InputGuardrailRequest) -> GuardrailResult:
        seen.append(request)
        return success()

    svc = agentrt.build(
        Chat, model=ScriptedModel("one", "two"), input_guardrails=[look], memory=agentrt.memory.window()
    )
    await svc.chat("c", "first")
    await svc.chat("c", "second")

    assert seen[1].method == "Chat.chat"
    assert seen[1].memory_id == "c"
    assert seen[1].history == (UserMessage.of("first"), AssistantMessage(text="one"))


async def test_verdicts_are_events_before_the_first_request_and_reach_listeners() -> None:
    heard: list[Any] = []
    svc = agentrt.build(
        Chat,
        model=ScriptedModel(["a", "b"]),
        input_guardrails=[Recorder("first", success()), Recorder("second", success_with("x"))],
        listeners=[heard.append],
    )

    class Streams:
        async def stream(self, question: str) -> agentrt.TokenStream: ...

    stream_svc = agentrt.build(
        Streams,
        model=ScriptedModel(["a", "b"]),
        input_guardrails=[Recorder("first", success()), Recorder("second", success_with("x"))],
    )
    stream = await stream_svc.stream("q")
    events = [event async for event in stream.events()]
    kinds = [type(e) for e in events[:4]]
    assert kinds == [Started, GuardrailVerdict, GuardrailVerdict, RequestIssued]
    verdicts = [e for e in events if isinstance(e, GuardrailVerdict)]
    assert [(v.guardrail, v.kind, v.verdict, v.attempt) for v in verdicts] == [
        ("first", "input", "success", 1),
        ("second", "input", "success_with", 1),
    ]
    assert all(v.seconds >= 0 for v in verdicts)

    await svc.chat("c", "q")
    assert [type(e) for e in heard[:4]] == [Started, GuardrailVerdict, GuardrailVerdict, RequestIssued]


async def test_a_refused_call_is_a_failed_event_for_listeners() -> None:
    heard: list[Any] = []
    svc = agentrt.build(
        Chat, model=ScriptedModel(), input_guardrails=[Recorder("no", fatal("x"))], listeners=[heard.append]
    )
    with pytest.raises(InputGuardrailError):
        await svc.chat("c", "q")
    assert isinstance(heard[-1], agentrt.FailedEvent)
    assert isinstance(heard[-1].error, InputGuardrailError)
