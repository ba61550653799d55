"""Release policies of a guarded stream: `chunked` (each chunk released once the chain passed it) and
`optimistic` (released at once, withdrawn with a `Reset` when the answer is refused), next to `buffer`
(tests/test_guardrails_output.py).

Every test reads the stream as a user would and checks the one promise all policies keep: the text
after the reader's last `RESET` is `Result.text`, which is what memory stored. Guardrail doubles record
the requests they were shown; the model double records the requests it got and whether each stream
ran to its end or was closed.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest

import agentrt
from agentrt import (
    RESET,
    AssistantMessage,
    Budget,
    MemoryId,
    OutputGuardrailError,
    Reset,
    ResetReason,
    TextDelta,
    ThinkingDelta,
    TokenStream,
    UserMessage,
    tool,
)
from agentrt.guardrails import (
    GuardrailResult,
    OutputGuardrailRequest,
    Verdict,
    failure,
    output_guardrails,
    partial_text,
    reprompt,
    retry,
    success,
    success_with,
)
from agentrt.testing import CallTool, Hang, ScriptedModel


class Seen:
    """A partial-text guardrail that records what it was asked and answers `decide(request)`."""

    partial_text = True

    def __init__(self, decide: Any = None, name: str = "seen") -> None:
        self.name = name
        self.decide = decide or (lambda request: success())
        self.requests: list[OutputGuardrailRequest] = []

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        self.requests.append(request)
        result: GuardrailResult = self.decide(request)
        return result

    @property
    def checks(self) -> list[tuple[int, bool, str, int]]:
        return [(r.attempt, r.partial, r.text, r.released) for r in self.requests]


def service(model: ScriptedModel, guardrail: object, release: str, **options: Any) -> Any:
    chunk = options.pop("chunk", None)

    class Chat:
        @output_guardrails(guardrail, release=release, chunk=chunk)  # type: ignore[arg-type]
        async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    return agentrt.build(Chat, model=model, memory=agentrt.memory.window(), **options)


async def read(stream: TokenStream) -> list[str]:
    return [token async for token in stream]


async def read_into(tokens: list[str], svc: Any) -> None:
    """Read a stream into `tokens`, which keep what arrived before an error."""
    async for token in await svc.stream("c", "q"):
        tokens.append(token)


def after_last_reset(tokens: list[str]) -> str:
    last = max((i for i, t in enumerate(tokens) if t is RESET), default=-1)
    return "".join(tokens[last + 1 :])


async def assert_consistent(svc: Any, tokens: list[str], result: agentrt.Result[str]) -> None:
    """The reader's text after its last reset is the result's text, which memory stored."""
    assert after_last_reset(tokens) == result.text
    stored = await agentrt.memory.access(svc).read("c")
    assert stored[-1] == AssistantMessage(text=result.text, thinking=result.thinking)


# --- chunked ------------------------------------------------------------------------------------


async def test_chunked_releases_each_sentence_once_the_chain_passed_it() -> None:
    guardrail = Seen()
    model = ScriptedModel(["Hello", " world.", " How", " are", " you?", " Fine"])
    svc = service(model, guardrail, "chunked")

    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    result = await stream.result()

    assert tokens == ["Hello world.", " How are you?", " Fine"]
    assert guardrail.checks == [
        (1, True, "Hello world.", 0),
        (1, True, "Hello world. How are you?", 12),
        (1, False, "Hello world. How are you? Fine", 0),  # the whole answer, checked once more
    ]
    assert guardrail.requests[1].chunk == " How are you?"
    assert result.attempts == 1
    await assert_consistent(svc, tokens, result)


async def test_chunked_by_characters_checks_after_at_least_that_many() -> None:
    guardrail = Seen()
    model = ScriptedModel(["ab", "cd", "ef", "gh", "ij", "k"])
    svc = service(model, guardrail, "chunked", chunk=5)
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    assert tokens == ["abcdef", "ghijk"]
    assert [c[2] for c in guardrail.checks] == ["abcdef", "abcdefghijk", "abcdefghijk"]
    await assert_consistent(svc, tokens, await stream.result())


async def test_chunked_streams_while_the_model_is_still_answering() -> None:
    model = ScriptedModel(["First sentence.", " Second", Hang()])
    svc = service(model, Seen(), "chunked")
    received: list[str] = []

    async def reader() -> None:
        async for token in await svc.stream("c", "q"):
            received.append(token)

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        with anyio.fail_after(5):
            await anyio.wait_all_tasks_blocked()  # the model hangs after " Second"
        assert received == ["First sentence."]  # released before the answer ended; " Second" not yet
        group.cancel_scope.cancel()

    with anyio.fail_after(5):
        await model.streams[0].wait_closed()
    assert await agentrt.memory.access(svc).read("c") == []


async def test_a_refused_chunk_stops_the_answer_and_the_re_ask_is_replayed_stream_to_sync() -> None:
    def decide(request: OutputGuardrailRequest) -> GuardrailResult:
        return retry("a secret") if "secret" in request.text else success()

    guardrail = Seen(decide)
    model = ScriptedModel(
        ["Fine.", " The secret", " is.", " More", " text."],
        ["Good.", " Answer."],
    )
    svc = service(model, guardrail, "chunked")
    stream = await svc.stream("c", "q")
    events = [event async for event in stream.events()]
    result = await stream.result()

    released = [e for e in events if type(e) in (TextDelta, Reset)]
    assert released == [
        TextDelta("Fine."),
        Reset(result.invocation_id, ResetReason.REJECTED, 1),
        TextDelta("Good. Answer."),  # the re-ask was held until it passed: one delta
    ]
    # The refused response stopped at the chunk: its stream was closed before " More text." was read.
    assert model.streams[0].closed and not model.streams[0].completed
    first, second = model.requests
    assert second.messages == first.messages  # a retry asks the same request again
    assert guardrail.checks == [
        (1, True, "Fine.", 0),
        (1, True, "Fine. The secret is.", 5),
        (2, False, "Good. Answer.", 0),  # the re-ask is checked whole, not in chunks
    ]
    assert result.attempts == 2
    assert result.text == "Good. Answer."
    assert await agentrt.memory.access(svc).read("c") == [
        UserMessage.of("q"),
        AssistantMessage(text="Good. Answer."),
    ]


async def test_a_reprompt_at_a_chunk_shows_the_model_its_answer_as_far_as_it_got() -> None:
    def decide(request: OutputGuardrailRequest) -> GuardrailResult:
        if request.attempt == 1 and "rude" in request.text:
            return reprompt("rude", "Politely, please.")
        return success()

    model = ScriptedModel(["Go away.", " You are rude.", " Bye."], ["Happy to help."])
    svc = service(model, Seen(decide), "chunked")
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    result = await stream.result()

    assert tokens == ["Go away.", RESET, "Happy to help."]
    assert model.requests[1].messages == (
        *model.requests[0].messages,
        AssistantMessage(text="Go away. You are rude."),  # cut where the chain refused it
        UserMessage.of("Politely, please."),
    )
    await assert_consistent(svc, tokens, result)


async def test_a_chunk_failure_raises_with_the_text_so_far_and_stores_nothing() -> None:
    model = ScriptedModel(["Fine.", " Bad words.", " More", Hang()])
    svc = service(model, Seen(lambda r: failure("bad") if "Bad" in r.text else success()), "chunked")
    tokens: list[str] = []
    with pytest.raises(OutputGuardrailError) as caught:
        await read_into(tokens, svc)
    assert tokens == ["Fine."]
    assert [f.verdict for f in caught.value.failures] == ["failure"]
    assert caught.value.failures[0].partial
    assert caught.value.partial.text == "Fine. Bad words."
    assert model.streams[0].closed
    assert await agentrt.memory.access(svc).read("c") == []


async def test_a_chunk_rewrite_is_what_the_reader_gets_and_what_is_stored() -> None:
    def redact(request: OutputGuardrailRequest) -> GuardrailResult:
        return success_with(request.text.replace("x@y.com", "[email]"))

    guardrail = Seen(redact)
    model = ScriptedModel(["Mail x@", "y.com now.", " Bye", " x@y.com."])
    svc = service(model, guardrail, "chunked")
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    result = await stream.result()
    assert tokens == ["Mail [email] now.", " Bye [email]."]
    # Later checks see the rewrite of what was released, then the model's new text.
    assert guardrail.checks[1][2] == "Mail [email] now. Bye x@y.com."
    assert result.text == "Mail [email] now. Bye [email]."
    await assert_consistent(svc, tokens, result)


async def test_a_rewrite_of_released_text_resets_and_releases_the_whole_answer() -> None:
    def decide(request: OutputGuardrailRequest) -> GuardrailResult:
        return success() if request.partial else success_with("Replaced.")

    model = ScriptedModel(["One.", " Two."])
    svc = service(model, Seen(decide), "chunked")
    stream = await svc.stream("c", "q")
    events = [e async for e in stream.events()]
    result = await stream.result()
    released = [e for e in events if type(e) in (TextDelta, Reset)]
    assert released == [
        TextDelta("One."),
        TextDelta(" Two."),
        Reset(result.invocation_id, ResetReason.REWRITTEN, 1),
        TextDelta("Replaced."),
    ]
    assert result.text == "Replaced."


class Lookup:
    def __init__(self) -> None:
        self.calls = 0

    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        self.calls += 1
        return f"found {query}"


@pytest.mark.parametrize("release", ["chunked", "optimistic"])
async def test_text_that_came_with_tool_calls_is_withdrawn(release: str) -> None:
    lookup = Lookup()
    model = ScriptedModel(
        ["Let me look.", CallTool("lookup", {"query": "x"}, id="c1")],
        ["Found it."],
    )
    svc = service(model, Seen(), release, tools=[lookup])
    stream = await svc.stream("c", "q")
    events = [e async for e in stream.events()]
    result = await stream.result()
    names = [type(e).__name__ for e in events if type(e).__name__ not in ("GuardrailVerdict", "Usage")]
    if release == "chunked":
        assert names == [
            "Started",
            "TextDelta",  # "Let me look." passed its check
            "Reset",  # ... and came with a tool call: not the answer
            "ResponseReceived",  # the tool round, held until the next chunk passed
            "ToolCallRequested",
            "ToolExecuted",
            "TextDelta",
            "ResponseReceived",
            "Completed",
        ]
    else:
        assert names == [
            "Started",
            "RequestIssued",
            "TextDelta",
            "ResponseReceived",
            "Reset",
            "ToolCallRequested",
            "ToolExecuted",
            "RequestIssued",
            "TextDelta",
            "ResponseReceived",
            "Completed",
        ]
    reset = next(e for e in events if type(e) is Reset)
    assert reset.reason is ResetReason.TOOL_CALLS
    tokens = [e.text if type(e) is TextDelta else RESET for e in events if type(e) in (TextDelta, Reset)]
    assert tokens == ["Let me look.", RESET, "Found it."]
    assert lookup.calls == 1
    await assert_consistent(svc, tokens, result)


async def test_chunked_thinking_is_released_with_the_text_that_passed_after_it() -> None:
    guardrail = Seen()
    model = ScriptedModel([ThinkingDelta("plan "), "A.", ThinkingDelta("more"), " B"])
    svc = service(model, guardrail, "chunked")
    stream = await svc.stream("c", "q")
    events = [e async for e in stream.events()]
    result = await stream.result()
    shown = [e for e in events if type(e) in (TextDelta, ThinkingDelta)]
    assert shown == [ThinkingDelta("plan "), TextDelta("A."), ThinkingDelta("more"), TextDelta(" B")]
    assert [r.thinking for r in guardrail.requests] == ["plan ", "plan more"]
    assert result.thinking == "plan more"


# --- optimistic ---------------------------------------------------------------------------------


async def test_optimistic_releases_every_token_at_once() -> None:
    guardrail = Seen()
    model = ScriptedModel(["Hel", "lo", " there."])
    svc = service(model, guardrail, "optimistic")
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    assert tokens == ["Hel", "lo", " there."]
    assert guardrail.checks == [(1, False, "Hello there.", 0)]  # checked once, whole
    await assert_consistent(svc, tokens, await stream.result())


async def test_optimistic_resets_a_refused_answer_and_streams_the_re_ask() -> None:
    heard: list[Any] = []
    model = ScriptedModel(["Bad", " answer."], ["Good", " answer."])
    svc = service(
        model,
        Seen(lambda r: retry("bad") if r.attempt == 1 else success()),
        "optimistic",
        listeners=[heard.append],
    )
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    result = await stream.result()
    assert tokens == ["Bad", " answer.", RESET, "Good", " answer."]  # the re-ask streams too
    assert result.attempts == 2
    assert Reset(result.invocation_id, ResetReason.REJECTED, 1) in heard  # listeners hear it
    await assert_consistent(svc, tokens, result)


@pytest.mark.parametrize(
    ("rewrite", "expected"),
    [
        (lambda text: text + " Bye.", ["Hi", " there.", " Bye."]),  # extends: only the rest
        (lambda text: "Hello.", ["Hi", " there.", RESET, "Hello."]),  # changes what was shown
    ],
)
async def test_optimistic_rewrites_release_the_rest_or_reset(rewrite: Any, expected: list[str]) -> None:
    model = ScriptedModel(["Hi", " there."])
    svc = service(model, Seen(lambda r: success_with(rewrite(r.text))), "optimistic")
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    assert tokens == expected
    await assert_consistent(svc, tokens, await stream.result())


async def test_run_calls_on_reset() -> None:
    model = ScriptedModel(["Bad."], ["Good."])
    svc = service(model, Seen(lambda r: retry("bad") if r.attempt == 1 else success()), "optimistic")
    shown: list[str] = []
    stream = await svc.stream("c", "q")
    result = await stream.run(on_partial=shown.append, on_reset=shown.clear)
    assert result is not None
    assert "".join(shown) == result.text == "Good."


# --- every policy: the reader's text is the result's -------------------------------------------


SCENARIOS: dict[str, tuple[list[Any], Any]] = {
    "passes": ([["One.", " Two."]], lambda r: success()),
    "retried at the end": (
        [["One.", " Two."], ["Three."]],
        lambda r: retry("no") if r.attempt == 1 and not r.partial else success(),
    ),
    "retried at a chunk": (
        [["One.", " Two.", " Three."], ["Four."]],
        lambda r: retry("no") if r.attempt == 1 and "Two" in r.text else success(),
    ),
    "rewritten": ([["One.", " Two."]], lambda r: success_with(r.text.upper())),
    "refused twice": (
        [["A."], ["B."], ["C."]],
        lambda r: reprompt("no", "again") if r.attempt < 3 and not r.partial else success(),
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("release", ["buffer", "chunked", "optimistic"])
async def test_the_reader_s_text_after_its_last_reset_is_the_result_s(release: str, scenario: str) -> None:
    script, decide = SCENARIOS[scenario]
    model = ScriptedModel(*script)
    svc = service(model, Seen(decide), release)
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    result = await stream.result()
    await assert_consistent(svc, tokens, result)
    if release == "buffer":
        assert RESET not in tokens and len(tokens) == 1  # nothing shown before the chain passed


# --- budgets and cancellation -------------------------------------------------------------------


@pytest.mark.virtual_clock
async def test_the_time_budget_cuts_a_stream_to_sync_replay_and_stores_nothing() -> None:
    model = ScriptedModel(["One.", " Bad."], ["Second", Hang()], handles_deadline=False)
    guardrail = Seen(lambda r: retry("bad") if "Bad" in r.text else success())
    svc = service(model, guardrail, "chunked", budget=Budget(seconds=5))
    tokens: list[str] = []
    with anyio.fail_after(60), pytest.raises(agentrt.BudgetExceededError) as caught:
        await read_into(tokens, svc)
    assert caught.value.limit == "seconds"
    assert tokens == ["One.", RESET]  # withdrawn; the replay released nothing before the deadline
    assert model.streams[0].closed and model.streams[1].closed
    assert await agentrt.memory.access(svc).read("c") == []


@pytest.mark.virtual_clock
async def test_the_time_budget_cuts_a_chunk_check_and_closes_the_model_stream() -> None:
    class Slow:
        partial_text = True

        async def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
            await anyio.sleep(3600)
            return success()

    model = ScriptedModel(["One.", " Two."], handles_deadline=False)
    svc = service(model, Slow(), "chunked", budget=Budget(seconds=5))
    with anyio.fail_after(60), pytest.raises(agentrt.BudgetExceededError) as caught:
        await read(await svc.stream("c", "q"))
    assert caught.value.limit == "seconds"
    assert model.streams[0].closed
    assert await agentrt.memory.access(svc).read("c") == []


async def test_cancelling_during_a_chunk_check_closes_the_model_stream_and_stores_nothing() -> None:
    checking = anyio.Event()

    class Stuck:
        partial_text = True

        async def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
            checking.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    model = ScriptedModel(["One.", " Two."])
    svc = service(model, Stuck(), "chunked")
    async with anyio.create_task_group() as group:

        async def reader() -> None:
            await read(await svc.stream("c", "q"))

        group.start_soon(reader)
        with anyio.fail_after(5):
            await checking.wait()
        group.cancel_scope.cancel()
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(svc).read("c") == []


# --- declaration --------------------------------------------------------------------------------


def test_chunked_needs_guardrails_that_judge_partial_text() -> None:
    def whole(request: OutputGuardrailRequest) -> GuardrailResult:
        return success()

    class Chat:
        @output_guardrails(whole, Seen(), release="chunked")
        async def stream(self, question: str) -> TokenStream: ...

    with pytest.raises(agentrt.ConfigurationError, match=r"Chat\.stream: release 'chunked' .*whole cannot"):
        agentrt.build(Chat, model=ScriptedModel())

    class Marked:
        @output_guardrails(partial_text(whole), Seen(), release="chunked")  # now it says it can
        async def stream(self, question: str) -> TokenStream: ...

    assert agentrt.build(Marked, model=ScriptedModel()) is not None


def test_a_release_policy_declared_on_a_method_that_does_not_stream_is_a_configuration_error() -> None:
    class Chat:
        @output_guardrails(Seen(), release="optimistic")
        async def ask(self, question: str) -> str: ...

    with pytest.raises(
        agentrt.ConfigurationError, match=r"Chat\.ask: release 'optimistic' is for methods that stream"
    ):
        agentrt.build(Chat, model=ScriptedModel())


async def test_a_class_s_release_policy_leaves_its_awaited_methods_checking_whole_answers() -> None:
    guardrail = Seen()

    @output_guardrails(guardrail, release="chunked")
    class Chat:
        async def ask(self, question: str) -> str: ...

        async def stream(self, question: str) -> TokenStream: ...

    svc = agentrt.build(Chat, model=ScriptedModel("One. Two."))
    assert await svc.ask("q") == "One. Two."
    assert guardrail.checks == [(1, False, "One. Two.", 0)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"release": "chunked", "chunk": 0}, "chunk must be a positive int"),
        ({"release": "chunked", "chunk": True}, "chunk must be a positive int"),
        ({"release": "buffer", "chunk": 10}, "chunk=10 needs release='chunked'"),
    ],
)
def test_bad_chunk_settings_are_configuration_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(agentrt.ConfigurationError, match=message):

        class Chat:
            @output_guardrails(Seen(), **options)
            async def stream(self, question: str) -> TokenStream: ...


async def test_a_value_given_for_part_of_an_answer_is_an_error() -> None:
    model = ScriptedModel(["One.", " Two."])
    svc = service(model, Seen(lambda r: success_with(r.text, "value")), "chunked")
    with pytest.raises(TypeError, match="gave a value for part of an answer"):
        await read(await svc.stream("c", "q"))
    assert model.streams[0].closed


async def test_chunked_checks_text_that_comes_before_tool_calls_since_it_would_be_shown() -> None:
    lookup = Lookup()
    model = ScriptedModel(["Let me look up the secret.", CallTool("lookup", {"query": "x"})], ["Done."])
    svc = service(model, Seen(lambda r: failure("secret") if "secret" in r.text else success()), "chunked")
    tokens: list[str] = []
    with pytest.raises(OutputGuardrailError):
        await read_into(tokens, svc)
    assert tokens == []  # the reader never saw it
    assert lookup.calls == 0  # the refused response's calls are not run
    assert model.streams[0].closed


async def test_a_bound_validate_of_an_object_that_judges_partial_text_may_run_chunked() -> None:
    guardrail = Seen()
    model = ScriptedModel(["これは文です。", "次の文。"])
    svc = service(model, guardrail.validate, "chunked")
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    assert tokens == ["これは文です。", "次の文。"]  # CJK full stops end chunks too
    await assert_consistent(svc, tokens, await stream.result())


class Subclassed(GuardrailResult):
    """A result of a subclass of `GuardrailResult`."""


async def later(result: GuardrailResult) -> GuardrailResult:
    await anyio.lowlevel.checkpoint()
    return result


@pytest.mark.parametrize(
    "returns",
    [
        pytest.param(lambda request: Subclassed(Verdict.SUCCESS), id="a result of a subclass"),
        pytest.param(lambda request: later(success()), id="an awaitable of a result"),
    ],
)
@pytest.mark.parametrize("release", ["buffer", "chunked", "optimistic"])
async def test_a_guardrail_may_return_a_result_of_a_subclass_or_an_awaitable_of_one(
    returns: Any, release: str
) -> None:
    guardrail = Seen(returns)
    model = ScriptedModel(["One. ", "Two."])
    svc = service(model, guardrail, release)
    stream = await svc.stream("c", "q")
    tokens = await read(stream)
    result = await stream.result()
    assert result.text == "One. Two."
    await assert_consistent(svc, tokens, result)
    partial = [check for check in guardrail.checks if check[1]]
    assert (len(partial) > 0) is (release == "chunked")


def test_reset_is_equal_only_to_itself_and_empty_as_text() -> None:
    """`RESET` is never mistaken for an empty text delta (by `==`, `in`, a dict or a `match`), joins
    as nothing, and stays the one object through copies and pickling."""
    import copy
    import pickle

    assert RESET == RESET and RESET is agentrt.RESET
    assert RESET != "" and "" != RESET and not (RESET == "")
    assert "" not in [RESET] and RESET not in ["", "a"] and RESET in ["", RESET]
    assert {RESET: "reset"}.get("") is None and {"": "empty"}.get(RESET) is None
    assert "".join(["a", RESET, "b"]) == "ab" and isinstance(RESET, str) and repr(RESET) == "agentrt.RESET"
    assert copy.copy(RESET) is RESET and copy.deepcopy(RESET) is RESET
    assert pickle.loads(pickle.dumps(RESET)) is RESET
    match "":
        case agentrt.RESET:
            matched = "reset"
        case _:
            matched = "text"
    assert matched == "text"
