"""Output guardrails: the chain's semantics over answers, re-asks (retry, reprompt), max_retries,
streams holding text back, memory and budgets.

Guardrail doubles record the text they were shown; tests assert the exact requests the model was
sent (`model.requests`), the tokens a stream's reader received, and what memory stored.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    AssistantMessage,
    Budget,
    MemoryId,
    OutputGuardrailError,
    SystemMessage,
    TokenStream,
    ToolResultMessage,
    UserMessage,
    tool,
)
from agentrt.guardrails import (
    GuardrailResult,
    OutputGuardrailRequest,
    Verdict,
    failure,
    fatal,
    output_guardrails,
    reprompt,
    reprompt_with_message_removal,
    retry,
    success,
    success_with,
)
from agentrt.testing import CallTool, Hang, ScriptedModel


class Once:
    """Answers `first` on the first attempt, then `success()`; records what it saw."""

    def __init__(self, name: str, first: GuardrailResult) -> None:
        self.name = name
        self.first = first
        self.seen: list[tuple[int, str]] = []

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        self.seen.append((request.attempt, request.text))
        return self.first if request.attempt == 1 else success()


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


VERDICTS: dict[str, GuardrailResult] = {
    "success": success(),
    "success_with": success_with("rewritten"),
    "failure": failure("not good"),
    "fatal": fatal("never good"),
    "retry": retry("try again"),
    "reprompt": reprompt("not polite", "Say it politely."),
}


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("verdict", list(VERDICTS))
async def test_every_verdict_at_every_position_of_the_chain(verdict: str, position: int) -> None:
    chain = [Once(f"g{i}", VERDICTS[verdict] if i == position else success()) for i in range(3)]
    model = ScriptedModel("first", "second")
    svc = agentrt.build(Chat, model=model, output_guardrails=chain, memory=agentrt.memory.window())
    access = agentrt.memory.access(svc)

    if verdict in ("failure", "fatal"):
        with pytest.raises(OutputGuardrailError) as caught:
            await svc.chat("c", "question")
        assert [(f.guardrail, f.verdict) for f in caught.value.failures] == [(f"g{position}", verdict)]
        assert caught.value.partial.attempts == 1
        assert len(model.requests) == 1  # a failure does not ask again
        ran = position + 1 if verdict == "fatal" else 3
        assert [len(g.seen) for g in chain] == [1] * ran + [0] * (3 - ran)
        assert await access.read("c") == []
        return

    result_text = await svc.chat("c", "question")
    if verdict in ("retry", "reprompt"):
        assert result_text == "second"
        first, second = model.requests
        if verdict == "retry":
            assert second.messages == first.messages
        else:
            assert second.messages == (
                *first.messages,
                AssistantMessage(text="first"),
                UserMessage.of("Say it politely."),
            )
        # The whole chain ran again on the new answer; the ones after the re-ask did not see the first.
        assert [g.seen for g in chain] == [
            [(1, "first"), (2, "second")] if i <= position else [(2, "second")] for i in range(3)
        ]
        # Memory: the question and the accepted answer; no rejected answer, no reprompt text.
        assert await access.read("c") == [UserMessage.of("question"), AssistantMessage(text="second")]
        return

    expected = "rewritten" if verdict == "success_with" else "first"
    assert result_text == expected
    assert [g.seen for g in chain] == [[(1, "first" if i <= position else expected)] for i in range(3)]
    assert await access.read("c") == [UserMessage.of("question"), AssistantMessage(text=expected)]


class Always:
    def __init__(self, result: GuardrailResult) -> None:
        self.result = result
        self.calls = 0

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        self.calls += 1
        return self.result


@pytest.mark.parametrize("max_retries", [0, 1, 2])
async def test_max_retries_counts_re_asks_after_the_first_answer(max_retries: int) -> None:
    stubborn = Always(retry("no"))

    @output_guardrails(stubborn, max_retries=max_retries)
    class Strict:
        async def ask(self, question: str) -> str: ...

    model = ScriptedModel(*[f"answer {i}" for i in range(5)])
    svc = agentrt.build(Strict, model=model)

    with pytest.raises(OutputGuardrailError, match="past max_retries") as caught:
        await svc.ask("q")
    assert len(model.requests) == max_retries + 1
    assert stubborn.calls == max_retries + 1
    assert caught.value.partial.attempts == max_retries + 1
    assert caught.value.partial.text == f"answer {max_retries}"


async def test_a_reprompt_without_memory_keeps_the_original_question() -> None:
    @agentrt.system_message("Be brief.")
    class Brief:
        async def ask(self, question: str) -> str: ...

    model = ScriptedModel("rude answer", "polite answer")
    svc = agentrt.build(
        Brief, model=model, output_guardrails=[Once("polite", reprompt("rude", "Be polite."))]
    )

    result = await svc.ask("What time is it?")

    assert result == "polite answer"
    assert model.requests[1].messages == (
        SystemMessage(text="Be brief."),
        UserMessage.of("What time is it?"),
        AssistantMessage(text="rude answer"),
        UserMessage.of("Be polite."),
    )


async def test_a_reprompt_with_message_removal_leaves_the_rejected_answer_out() -> None:
    model = ScriptedModel("leaky answer", "clean answer")
    svc = agentrt.build(
        Chat,
        model=model,
        output_guardrails=[Once("secrets", reprompt_with_message_removal("leak", "Answer without secrets."))],
    )
    await svc.chat("c", "q")
    assert model.requests[1].messages == (UserMessage.of("q"), UserMessage.of("Answer without secrets."))


class Typed(BaseModel):
    n: int


class Values:
    async def typed(self, question: str) -> Typed: ...


async def test_success_with_a_value_is_the_result_unparsed_and_of_the_return_type() -> None:
    model = ScriptedModel("not json at all", "still not json")
    svc = agentrt.build(Values, model=model, output_guardrails=[lambda r: success_with("{}", Typed(n=7))])
    assert await svc.typed("q") == Typed(n=7)

    wrong = agentrt.build(Values, model=model, output_guardrails=[lambda r: success_with("{}", "a str")])
    with pytest.raises(TypeError, match="not of the method's return type"):
        await wrong.typed("q")


async def test_a_re_ask_counts_against_the_budget() -> None:
    model = ScriptedModel("first", "second")
    svc = agentrt.build(
        Chat, model=model, output_guardrails=[Always(retry("again"))], budget=Budget(model_requests=1)
    )
    with pytest.raises(agentrt.BudgetExceededError) as caught:
        await svc.chat("c", "q")
    assert caught.value.limit == "model_requests"
    assert len(model.requests) == 1


# --- streams ------------------------------------------------------------------------------------


class Lookup:
    def __init__(self) -> None:
        self.calls = 0

    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        self.calls += 1
        return f"found {query}"


async def test_a_stream_re_asked_after_a_tool_releases_only_the_accepted_answer() -> None:
    lookup = Lookup()
    model = ScriptedModel(
        [CallTool("lookup", {"query": "x"}, id="c1")],
        ["rejected ", "text"],
        ["accepted ", "text"],
    )
    svc = agentrt.build(
        Chat,
        model=model,
        tools=[lookup],
        output_guardrails=[Once("check", reprompt("bad", "Again, better."))],
        memory=agentrt.memory.window(),
    )

    stream = await svc.stream("c", "q")
    tokens = [token async for token in stream]
    result = await stream.result()

    assert tokens == ["accepted text"]  # held back, then released once, as one delta
    assert result.text == "accepted text"
    assert result.attempts == 2
    assert lookup.calls == 1  # the tool ran once: the re-ask kept its exchange
    reasked = model.requests[2].messages
    assert reasked[-2:] == (AssistantMessage(text="rejected text"), UserMessage.of("Again, better."))
    stored = await agentrt.memory.access(svc).read("c")
    assert [type(m) for m in stored] == [UserMessage, AssistantMessage, ToolResultMessage, AssistantMessage]
    assert stored[-1] == AssistantMessage(text="accepted text")


async def test_a_stream_reader_never_sees_text_the_result_does_not_contain() -> None:
    model = ScriptedModel(["sec", "ret ", "stuff"], ["fine"])
    svc = agentrt.build(Chat, model=model, output_guardrails=[Once("leak", retry("leak"))])
    stream = await svc.stream("c", "q")
    received = [token async for token in stream]
    result = await stream.result()
    assert received == [result.text] == ["fine"]


async def test_cancelling_a_held_stream_closes_the_model_stream_and_stores_nothing() -> None:
    model = ScriptedModel(["held ", Hang()])
    svc = agentrt.build(
        Chat, model=model, output_guardrails=[Always(success())], memory=agentrt.memory.window()
    )

    received: list[str] = []

    async def read() -> None:
        async for token in await svc.stream("c", "q"):
            received.append(token)

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        with anyio.fail_after(5):
            await anyio.wait_all_tasks_blocked()  # the model sent "held " and hangs
        assert len(model.streams) == 1
        group.cancel_scope.cancel()

    assert received == []  # nothing was released before the chain passed
    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
    assert await agentrt.memory.access(svc).read("c") == []


# --- declaration ---------------------------------------------------------------------------------


def test_bad_output_guardrail_settings_are_configuration_errors() -> None:
    with pytest.raises(agentrt.ConfigurationError, match="max_retries must be an int >= 0"):

        class Negative:
            @output_guardrails(lambda r: success(), max_retries=-1)
            async def ask(self, question: str) -> str: ...

    with pytest.raises(agentrt.ConfigurationError, match="release must be"):

        class Unknown:
            @output_guardrails(lambda r: success(), release="later")  # type: ignore[arg-type]
            async def ask(self, question: str) -> str: ...

    # (release policies: tests/test_guardrails_release.py)


async def test_the_method_s_output_chain_wins_over_the_class_s_and_the_build_s() -> None:
    def tag(name: str) -> Any:
        return lambda request: success_with(f"{request.text}+{name}")

    @output_guardrails(tag("class"))
    class Tagged:
        @output_guardrails(tag("method"))
        async def own(self, question: str) -> str: ...

        async def inherited(self, question: str) -> str: ...

    svc = agentrt.build(Tagged, model=ScriptedModel("a", "b"), output_guardrails=[tag("build")])
    assert await svc.own("q") == "a+method"
    assert await svc.inherited("q") == "b+class"


# --- an outside review ----------------------------------------------------------------------------


class Immediate:
    @tool("The secret, returned as the answer.", immediate=True)
    async def secret(self) -> str:
        return "the secret is 42"


@pytest.mark.parametrize("result", [fatal("a secret"), retry("again")], ids=["fatal", "retry"])
async def test_an_immediate_tool_s_answer_goes_through_the_chain(result: GuardrailResult) -> None:
    model = ScriptedModel([CallTool("secret", {})])
    svc = agentrt.build(Chat, model=model, tools=[Immediate()], output_guardrails=[Always(result)])

    with pytest.raises(OutputGuardrailError):
        await svc.chat("c", "q")
    stream = await agentrt.build(
        Chat,
        model=ScriptedModel([CallTool("secret", {})]),
        tools=[Immediate()],
        output_guardrails=[Always(result)],
    ).stream("c", "q")
    received: list[str] = []

    async def read() -> None:
        async for token in stream:
            received.append(token)

    with pytest.raises(OutputGuardrailError):
        await read()
    assert received == []
    assert len(model.requests) == 1  # no model answer to ask about again


async def test_a_wrong_value_fails_before_a_stream_releases_any_text() -> None:
    class Streams:
        async def stream(self, question: str) -> TokenStream: ...

    svc = agentrt.build(
        Streams, model=ScriptedModel(["a", "b"]), output_guardrails=[lambda r: success_with("x", 5)]
    )
    received: list[str] = []

    async def read() -> None:
        async for token in await svc.stream("q"):
            received.append(token)

    with pytest.raises(TypeError, match="not of the method's return type"):
        await read()
    assert received == []


async def test_a_budget_stop_during_a_re_ask_reports_the_answers_checked() -> None:
    model = ScriptedModel("one", "two", "three", "four")
    svc = agentrt.build(
        Chat,
        model=model,
        output_guardrails=[Always(retry("again"))],
        budget=Budget(model_requests=2),
    )
    with pytest.raises(agentrt.BudgetExceededError) as caught:
        await svc.chat("c", "q")
    assert caught.value.limit == "model_requests"
    assert caught.value.partial.attempts == 2  # two answers checked; the third was never asked for


@pytest.mark.parametrize(
    "make",
    [
        lambda: GuardrailResult(Verdict.REPROMPT, message="m"),
        lambda: GuardrailResult(Verdict.SUCCESS_WITH),
        lambda: GuardrailResult(Verdict.FAILURE),
        lambda: GuardrailResult("success"),  # type: ignore[arg-type]
    ],
    ids=["reprompt without prompt", "success_with without text", "failure without message", "str verdict"],
)
def test_a_result_made_directly_must_carry_what_its_verdict_needs(make: Any) -> None:
    with pytest.raises(TypeError, match="GuardrailResult"):
        make()


async def test_a_pydantic_model_guardrail_is_called_not_validated() -> None:
    class Polite(BaseModel):
        word: str = "please"

        def __call__(self, request: OutputGuardrailRequest) -> GuardrailResult:
            return success_with(f"{request.text}, {self.word}")

    svc = agentrt.build(Chat, model=ScriptedModel("help me"), output_guardrails=[Polite()])
    assert await svc.chat("c", "q") == "help me, please"


async def test_a_held_stream_s_events_show_nothing_of_a_rejected_answer() -> None:
    heard: list[Any] = []
    model = ScriptedModel(
        [CallTool("lookup", {"query": "x"}, id="c1")],
        ["rejected ", "secret"],
        ["accepted ", "text"],
    )
    svc = agentrt.build(
        Chat,
        model=model,
        tools=[Lookup()],
        output_guardrails=[Once("check", reprompt("bad", "Again, better."))],
        listeners=[heard.append],
    )
    stream = await svc.stream("c", "q")
    events = [event async for event in stream.events()]

    assert [type(e).__name__ for e in events] == [
        "Started",
        "GuardrailVerdict",  # attempt 1: reprompt
        "GuardrailVerdict",  # attempt 2: success
        "ResponseReceived",  # the tool call
        "ToolCallRequested",
        "ToolExecuted",
        "TextDelta",
        "ResponseReceived",  # the accepted answer
        "Completed",
    ]
    assert "secret" not in repr(events[:-1])  # only Completed's transcript carries the re-ask
    # Listeners hear everything as it happens, requests and the rejected response included.
    assert [type(e).__name__ for e in heard].count("RequestIssued") == 3
    assert [type(e).__name__ for e in heard].count("ResponseReceived") == 3


@pytest.mark.virtual_clock
async def test_the_time_budget_cuts_a_held_re_ask_and_stores_nothing() -> None:
    model = ScriptedModel(["first"], ["second ", Hang()], handles_deadline=False)
    svc = agentrt.build(
        Chat,
        model=model,
        output_guardrails=[Always(retry("again"))],
        budget=Budget(seconds=5),
        memory=agentrt.memory.window(),
    )
    received: list[str] = []

    async def read() -> None:
        async for token in await svc.stream("c", "q"):
            received.append(token)

    with anyio.fail_after(60), pytest.raises(agentrt.BudgetExceededError) as caught:
        await read()
    assert caught.value.limit == "seconds"
    assert caught.value.partial.attempts == 1
    assert received == []
    with anyio.fail_after(5):
        await model.streams[1].wait_closed()
    assert await agentrt.memory.access(svc).read("c") == []


@pytest.mark.parametrize("streaming", [False, True], ids=["awaited", "stream"])
async def test_a_rewritten_immediate_answer_is_stored_as_the_answer_the_reader_got(streaming: bool) -> None:
    svc = agentrt.build(
        Chat,
        model=ScriptedModel([CallTool("secret", {})]),
        tools=[Immediate()],
        output_guardrails=[lambda r: success_with(r.text.replace("42", "[redacted]"))],
        memory=agentrt.memory.window(),
    )
    if streaming:
        stream = await svc.stream("c", "q")
        assert [token async for token in stream] == ["the secret is [redacted]"]
        text = (await stream.result()).text
    else:
        text = await svc.chat("c", "q")
    assert text == "the secret is [redacted]"
    stored = await agentrt.memory.access(svc).read("c")
    assert [type(m) for m in stored] == [UserMessage, AssistantMessage, ToolResultMessage, AssistantMessage]
    assert stored[-1] == AssistantMessage(text="the secret is [redacted]")


async def test_a_rewritten_answer_is_what_the_result_s_transcript_and_a_held_response_show() -> None:
    model = ScriptedModel(["Mail x@", "y.com now."])
    svc = agentrt.build(
        Chat, model=model, output_guardrails=[lambda r: success_with(r.text.replace("x@y.com", "[email]"))]
    )
    stream = await svc.stream("c", "q")
    events = [event async for event in stream.events()]
    result = await stream.result()
    assert result.text == "Mail [email] now."
    assert result.messages[-1] == AssistantMessage(text="Mail [email] now.")
    responses = [e for e in events if type(e) is agentrt.ResponseReceived]
    assert [r.response.message.text for r in responses] == ["Mail [email] now."]
    assert "x@y.com" not in repr(events)


@pytest.mark.parametrize("returned", [True, None, "success"])
async def test_an_output_guardrail_must_return_a_guardrail_result(returned: object) -> None:
    svc = agentrt.build(Chat, model=ScriptedModel("fine"), output_guardrails=[lambda request: returned])
    with pytest.raises(TypeError, match="must return a GuardrailResult"):
        await svc.chat("c", "q")
