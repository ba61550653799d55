"""Moderation raced against the model: a flag closes the model stream before it finishes, no text of a
flagged call reaches a reader, nothing is stored; a pass costs no more than the slower of the two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import anyio
import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    Budget,
    BudgetExceededError,
    ConfigurationError,
    FailedEvent,
    LifecycleEvent,
    MemoryId,
    ModerationError,
    ModerationFailedError,
    PartialStream,
    TextDelta,
    TokenStream,
    Usage,
    tool,
)
from agentrt.guardrails import output_guardrails, partial_text, success
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


# --- a model that flags one word, and can answer junk -------------------------------------------------------


class Answer(BaseModel):
    answer: str


class BadWordJudge:
    """A moderation model that flags texts containing `bad`, after `delay` seconds (virtual time);
    `answer`, when given, is returned as it is (a moderation model that returns junk)."""

    name = "judge"

    def __init__(self, bad: str = "bad", *, delay: float = 0.0, answer: Any = None) -> None:
        self.bad = bad
        self.delay = delay
        self.answer = answer

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        await anyio.sleep(self.delay)
        if self.answer is not None:
            return self.answer  # type: ignore[no-any-return]
        return [Moderation(self.bad in text, {"hate": self.bad in text}) for text in texts]


@moderate
class Moderated:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt / SystemExit raised inside a moderation model."""


# --- a pass releases the held text with the model's next chunk ----------------------------------------------


async def test_a_pass_while_a_chunk_is_awaited_releases_the_held_text_with_the_next_chunk() -> None:
    # A pass does not release the held first chunk at once when the model is
    # between chunks: the race is waiting for the model's next chunk, and a read of a model stream
    # cannot be interrupted without closing it (DESIGN §3: nothing is held across the pipeline's
    # `yield`, so the read cannot go on in a task of its own). That is the documented bound (README
    # "Moderation"): a pass releases what was held with the model's next chunk, or its end. Here the
    # first chunk comes at once, the verdict after 1 s, the second chunk after 10 s.
    model = ScriptedModel(["Hel", Delay(10.0), "lo"])
    service = agentrt.build(Moderated, model=model, moderation_model=BadWordJudge(delay=1.0))

    start = anyio.current_time()
    stream = await service.stream("hello")
    assert anyio.current_time() - start == pytest.approx(10.0, abs=0.05)
    assert [token async for token in stream] == ["Hel", "lo"]


# --- budgets while the verdict is pending: time, usage paid for, tokens -------------------------------------


@pytest.mark.parametrize("view", ["stream", "partial"])
async def test_a_stream_is_cut_at_its_time_budget_while_moderation_is_pending(view: str) -> None:
    # The model answers at once; the moderation endpoint hangs (100 s). The budget is 5 s.
    # Expected (as for the awaited view, and as the README's "Budgets are checked ... during
    # streaming" says): BudgetExceededError at 5 s. Actual: the stream is handed over at 100 s, when
    # the verdict finally comes. Over SSE the endpoint's `budget=` cap is bypassed the same way.
    @moderate
    class Streams:
        async def stream(self, question: str) -> TokenStream: ...

        async def partial(self, question: str) -> PartialStream[Answer]: ...

    script = ["Here you go."] if view == "stream" else ['{"answer": "Here you go."}']
    model = ScriptedModel(script)  # handles_deadline=True, as the HTTP adapters
    service = agentrt.build(
        Streams, model=model, moderation_model=BadWordJudge(delay=100.0), budget=Budget(seconds=5)
    )

    start = anyio.current_time()
    with pytest.raises(BudgetExceededError) as caught:
        await getattr(service, view)("hello")
    assert caught.value.limit == "seconds"
    assert anyio.current_time() - start == pytest.approx(5.0, abs=0.05)


async def test_a_budget_that_runs_out_during_the_race_counts_the_response_already_paid_for() -> None:
    # The issue: "usage counted when the model was already paid for". The whole response, with the
    # provider's usage, arrived before the verdict; the 5 s budget runs out waiting for the verdict.
    # Expected: partial.usage == Usage(9, 3), as for a flag (test_moderation.py). Actual: Usage().
    model = ScriptedModel(["Here ", "you ", "go.", Usage(9, 3)])
    service = agentrt.build(
        Moderated, model=model, moderation_model=BadWordJudge(delay=100.0), budget=Budget(seconds=5)
    )

    with pytest.raises(BudgetExceededError) as caught:
        await service.ask("hello")
    assert caught.value.partial is not None
    assert caught.value.partial.usage == Usage(9, 3)


@pytest.mark.parametrize("view", ["ask", "stream"])
async def test_a_token_budget_stops_the_response_during_the_race(view: str) -> None:
    # DESIGN §3 / README: token budgets are checked during streaming; the response stops within one
    # chunk of the limit. Without @moderate this holds (the model's stream is closed after ~5 tokens).
    # With @moderate and a moderation model slower than the model, the whole 200-token response is
    # read into the race's buffer (completed=True), the provider's Usage(5, 200) with it, and the
    # BudgetExceededError then reports about 7 estimated output tokens.
    model = ScriptedModel([*(["word "] * 200), Usage(5, 200)])
    service = agentrt.build(
        Moderated, model=model, moderation_model=BadWordJudge(delay=2.0), budget=Budget(output_tokens=5)
    )

    async def call() -> None:
        result = await getattr(service, view)("hello")
        if view == "stream":
            async for _ in result:
                pass

    with pytest.raises(BudgetExceededError) as caught:
        await call()
    assert caught.value.limit == "output_tokens"
    assert not model.streams[0].completed  # stopped near its limit, not read to its end


# --- a moderation model that fails: junk verdicts, a BaseException, a class ---------------------------------


@pytest.mark.parametrize("answer", [[None], [{"flagged": True}], ["flagged"]])
@pytest.mark.parametrize("which", ["input", "answer"])
async def test_junk_verdicts_are_a_moderation_failure(answer: Any, which: str) -> None:
    # Wrong counts and raised exceptions are ModerationFailedError (on_error="fail"); junk verdicts
    # of the right count should be too, never an exception group reaching the caller.
    class Answers:
        @moderate(answer=True)
        async def ask(self, question: str) -> str: ...

    class Inputs:
        @moderate
        async def ask(self, question: str) -> str: ...

    judge = BadWordJudge(answer=answer)
    if which == "answer":  # the user's message passes; the answer's verdict is junk

        class Sequenced(BadWordJudge):
            calls = 0

            async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
                Sequenced.calls += 1
                return [Moderation(False)] if Sequenced.calls == 1 else answer  # type: ignore[no-any-return]

        judge = Sequenced()
    service = agentrt.build(
        Answers if which == "answer" else Inputs, model=ScriptedModel("Fine."), moderation_model=judge
    )
    with pytest.raises(ModerationFailedError):
        await service.ask("hello")


async def test_a_base_exception_from_the_moderation_model_is_not_wrapped_in_a_group() -> None:
    class Raising:
        name = "raising"

        async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
            await anyio.sleep(0.5)
            raise Interrupt

    service = agentrt.build(Moderated, model=ScriptedModel([Delay(1.0), "x"]), moderation_model=Raising())
    with pytest.raises(Interrupt):
        await service.ask("hello")


def test_a_moderation_model_class_is_refused_at_build() -> None:
    # DESIGN §3, definition-time validation. `@moderate(model=BadWordJudge, on_error="allow")` builds, and
    # then `await service.ask("bad")` returns the model's answer unmoderated (BadWordJudge.moderate([text])
    # is a TypeError, which "allow" lets through).
    with pytest.raises(ConfigurationError, match="a class"):
        moderate(model=BadWordJudge, on_error="allow")  # type: ignore[call-overload]

    class Careless:
        @moderate
        async def ask(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match="a class"):
        agentrt.build(Careless, model=ScriptedModel("unmoderated"), moderation_model=BadWordJudge)  # type: ignore[arg-type]


# --- no text of a flagged call reaches a reader or listener, on any streaming shape -------------------------


@pytest.mark.parametrize("delay", [0.0, 0.5, 5.0])
@pytest.mark.parametrize("method", ["plain", "chunked", "optimistic", "partial", "tool_round"])
async def test_no_text_of_a_flagged_call_reaches_a_reader_or_listener(method: str, delay: float) -> None:
    # Regression: flagged input on every streaming shape (release policies, PartialStream, a first
    # response that calls a tool), with moderation faster than, about as fast as, and slower than the
    # model: nothing of the answer reaches the reader or listeners, the model stream is closed,
    # nothing is stored, and the conversation is released for the next turn.
    @partial_text
    def passes(request: object) -> agentrt.guardrails.GuardrailResult:
        return success()

    @agentrt.tool
    async def lookup(query: str) -> str:
        """Look something up."""
        ran.append(query)
        return "SECRET tool result"

    class Shapes:
        @moderate
        async def plain(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

        @moderate
        @output_guardrails(passes, release="chunked")
        async def chunked(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

        @moderate
        @output_guardrails(passes, release="optimistic")
        async def optimistic(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

        @moderate
        async def partial(self, c: Annotated[str, MemoryId], q: str) -> PartialStream[Answer]: ...

        @moderate
        async def tool_round(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

    ran: list[str] = []
    scripts: dict[str, list[Any]] = {
        "plain": ["SECRET one. ", "SECRET two.", Usage(5, 5)],
        "chunked": ["SECRET one. ", "SECRET two.", Usage(5, 5)],
        "optimistic": ["SECRET one. ", "SECRET two.", Usage(5, 5)],
        "partial": ['{"answer": "SECR', 'ET"}', Usage(5, 5)],
        "tool_round": ["SECRET ", agentrt.testing.CallTool("lookup", {"query": "q"})],
    }
    events: list[object] = []
    model = ScriptedModel([Delay(1.0), *scripts[method]], "fine")
    store = InMemoryStore()
    service = agentrt.build(
        Shapes,
        model=model,
        memory=window(max_messages=20, store=store),
        moderation_model=BadWordJudge(delay=delay),
        tools=[lookup],
        listeners=[events.append],
    )

    with pytest.raises(ModerationError) as caught:
        await getattr(service, method)("ada", "bad things")
    assert caught.value.flagged == "input"
    assert "SECRET" not in repr(events)
    assert ran == []
    assert model.streams[0].closed
    assert await agentrt.memory.access(service).read("ada") == []
    with anyio.fail_after(50):  # the conversation was released (the verdict takes up to 5 s)
        with pytest.raises(ModerationError):
            await service.plain("ada", "bad again")
