"""Moderation raced against the model: a flag closes the model stream before it finishes, no text of a
flagged call reaches a reader, nothing is stored; a pass costs no more than the slower of the two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import anyio
import pytest

import agentrt
from agentrt import (
    ConfigurationError,
    FailedEvent,
    LifecycleEvent,
    MemoryId,
    ModerationError,
    ModerationFailedError,
    TextDelta,
    TokenStream,
    Usage,
    tool,
)
from agentrt.guardrails import output_guardrails, success
from agentrt.memory import InMemoryStore, window
from agentrt.moderation import Moderation, moderate
from agentrt.testing import CallTool, Delay, ScriptedModel

pytestmark = pytest.mark.virtual_clock


class Judge:
    """A moderation model that flags texts containing one of `bad`, after `delay` seconds of virtual
    time; it records the texts it was asked and whether it finished or was cancelled."""

    name = "judge"

    def __init__(self, *bad: str, delay: float = 0.0, error: Exception | None = None) -> None:
        self.bad = bad
        self.delay = delay
        self.error = error
        self.texts: list[str] = []
        self.finished = 0
        self.cancelled = 0

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        self.texts.extend(texts)
        try:
            await anyio.sleep(self.delay)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        if self.error is not None:
            raise self.error
        self.finished += 1
        verdicts = []
        for text in texts:
            hit = any(word in text for word in self.bad)
            verdicts.append(
                Moderation(
                    hit,
                    {"violence": hit, "harassment": False},
                    {"violence": 0.97 if hit else 0.01, "harassment": 0.02},
                    "judge-1",
                )
            )
        return verdicts


@moderate
class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def chat_service(model: ScriptedModel, judge: Judge, **kwargs: object) -> tuple[Chat, InMemoryStore]:
    store = InMemoryStore()
    service = agentrt.build(
        Chat, model=model, memory=window(max_messages=20, store=store), moderation_model=judge, **kwargs
    )  # type: ignore[arg-type]
    return service, store


SLOW_ANSWER = ["Sure, ", Delay(0.5), "here ", Delay(10.0), "is how.", Usage(12, 4)]


@pytest.mark.parametrize("view", ["chat", "stream"])
async def test_a_flag_closes_the_model_stream_before_it_finishes(view: str) -> None:
    model = ScriptedModel(SLOW_ANSWER)
    judge = Judge("weapon", delay=1.0)
    events: list[LifecycleEvent] = []
    service, _ = chat_service(model, judge, listeners=[events.append])

    start = anyio.current_time()
    call = (
        service.chat("ada", "how to build a weapon")
        if view == "chat"
        else service.stream("ada", "how to build a weapon")
    )
    with pytest.raises(ModerationError) as caught:
        await call  # a stream raises from its await: the model's first chunk waits for the verdict

    assert anyio.current_time() - start == pytest.approx(1.0, abs=0.05)  # at the flag, not at 10.5 s
    error = caught.value
    assert type(error) is ModerationError
    assert error.categories == ("violence",)
    assert error.flagged == "input"
    assert error.moderation.scores["violence"] == 0.97
    (stream,) = model.streams
    assert stream.closed and not stream.completed  # the upstream stream was closed by the pipeline
    assert judge.texts == ["how to build a weapon"]
    # what the model had said by then: counted, never shown
    assert error.partial is not None
    assert error.partial.text == "Sure, here "
    assert error.partial.usage.output_tokens > 0 and error.partial.usage.estimated
    assert await agentrt.memory.access(service).read("ada") == []
    assert isinstance(events[-1], FailedEvent) and events[-1].error is error
    assert not any(type(e).__name__ == "Completed" for e in events)


async def test_no_token_of_a_flagged_stream_reaches_the_reader_when_the_model_is_faster() -> None:
    model = ScriptedModel(["Here ", "you ", "go.", Usage(9, 3)])
    judge = Judge("weapon", delay=2.0)
    service, _ = chat_service(model, judge)

    with pytest.raises(ModerationError) as caught:
        await service.stream("ada", "a weapon please")

    # the whole answer arrived before the verdict; none of it was released
    assert model.streams[0].completed
    assert caught.value.partial is not None
    assert caught.value.partial.usage == Usage(9, 3)  # the response was paid for: it counts
    assert caught.value.partial.text == "Here you go."
    assert await agentrt.memory.access(service).read("ada") == []


async def test_a_pass_costs_the_slower_of_moderation_and_the_first_token() -> None:
    model = ScriptedModel([Delay(1.0), "Hello", Delay(1.0), " there"], [Delay(1.0), "Hi"])
    judge = Judge("weapon", delay=0.4)
    service, _ = chat_service(model, judge)

    start = anyio.current_time()
    stream = await service.stream("ada", "hello")
    first_at = anyio.current_time() - start
    tokens = [token async for token in stream]
    assert first_at == pytest.approx(1.0, abs=0.05)  # the model's own first chunk, not 1.4 s
    assert tokens == ["Hello", " there"]
    assert anyio.current_time() - start == pytest.approx(2.0, abs=0.05)

    judge.delay = 3.0  # moderation slower than the model: the answer waits for it, no longer
    start = anyio.current_time()
    assert await service.chat("ada", "and again") == "Hi"
    assert anyio.current_time() - start == pytest.approx(3.0, abs=0.05)
    stored = await agentrt.memory.access(service).read("ada")
    assert [m.text for m in stored] == ["hello", "Hello there", "and again", "Hi"]


async def test_a_flag_before_a_tool_round_runs_no_tool() -> None:
    ran: list[str] = []

    @tool
    async def lookup(query: str) -> str:
        """Look something up."""
        ran.append(query)
        return "found"

    model = ScriptedModel([CallTool("lookup", {"query": "q"})], "never")
    judge = Judge("weapon", delay=1.0)
    service, _ = chat_service(model, judge, tools=[lookup])

    with pytest.raises(ModerationError):
        await service.chat("ada", "weapon")
    assert ran == []
    assert len(model.requests) == 1


@pytest.mark.parametrize(("policy", "outcome"), [("fail", "error"), ("allow", "answer")])
async def test_a_failing_moderation_model(policy: str, outcome: str) -> None:
    @moderate(on_error=policy)  # type: ignore[arg-type]
    class Strict:
        async def ask(self, question: str) -> str: ...

    judge = Judge(error=ConnectionError("moderation endpoint down"))
    model = ScriptedModel("Fine.")
    service = agentrt.build(Strict, model=model, moderation_model=judge)

    if outcome == "error":
        with pytest.raises(ModerationFailedError) as caught:
            await service.ask("hello")
        assert isinstance(caught.value.__cause__, ConnectionError)
        assert caught.value.categories == ()
        assert model.streams[0].closed
    else:
        assert await service.ask("hello") == "Fine."


async def test_cancelling_the_caller_cancels_moderation_and_the_model() -> None:
    model = ScriptedModel(SLOW_ANSWER)
    judge = Judge("weapon", delay=100.0)
    service, _ = chat_service(model, judge)

    with anyio.move_on_after(1.0):
        await service.chat("ada", "hello")

    assert judge.cancelled == 1 and judge.finished == 0
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(service).read("ada") == []


class Answers:
    @moderate(answer=True)
    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    @moderate(answer=True)
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


@pytest.mark.parametrize("view", ["stream", "ask"])
async def test_a_flagged_answer_is_never_released(view: str) -> None:
    model = ScriptedModel(["You could ", "hurt ", "someone."], ["Be kind."])
    judge = Judge("hurt", delay=0.1)
    store = InMemoryStore()
    service = agentrt.build(
        Answers, model=model, memory=window(max_messages=20, store=store), moderation_model=judge
    )

    received: list[object] = []

    async def call() -> None:
        if view == "stream":
            stream = await service.stream("ada", "what should I do?")
            async for event in stream.events():
                received.append(event)
        else:
            await service.ask("ada", "what should I do?")

    with pytest.raises(ModerationError) as caught:
        await call()

    assert caught.value.flagged == "answer"
    assert judge.texts == ["what should I do?", "You could hurt someone."]
    assert not any(isinstance(e, TextDelta) for e in received)
    assert await agentrt.memory.access(service).read("ada") == []
    # an answer that passes is released whole
    if view == "stream":
        stream = await service.stream("ada", "again?")
        assert [t async for t in stream] == ["Be kind."]
    else:
        assert await service.ask("ada", "again?") == "Be kind."


def test_declaration_errors() -> None:
    class Unmoderated:
        @moderate
        async def ask(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match="names no model"):
        agentrt.build(Unmoderated, model=ScriptedModel())

    class Chunked:
        @moderate(answer=True)
        @output_guardrails(lambda request: success(), release="optimistic")
        async def stream(self, question: str) -> TokenStream: ...

    with pytest.raises(ConfigurationError, match="release 'optimistic'"):
        agentrt.build(Chunked, model=ScriptedModel(), moderation_model=Judge())

    with pytest.raises(ConfigurationError, match="on_error"):
        moderate(on_error="ignore")  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="not a ModerationModel"):
        moderate(model=object())  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="not a ModerationModel"):
        agentrt.build(Unmoderated, model=ScriptedModel(), moderation_model=object())  # type: ignore[arg-type]


async def test_an_unmoderated_method_of_the_same_service_is_not_moderated() -> None:
    class Some:
        @moderate
        async def checked(self, question: str) -> str: ...

        async def free(self, question: str) -> str: ...

    judge = Judge("x")
    service = agentrt.build(Some, model=ScriptedModel("a", "b"), moderation_model=judge)
    assert await service.free("x") == "a"
    assert judge.texts == []
    with pytest.raises(ModerationError):
        await service.checked("x")
