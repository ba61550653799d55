"""Edges of the turn as data: checkpoints of structured values, tampered checkpoints, memory ids of
every type, a turn stopped inside a step, restoring off the event loop; and the guarantees that
share the driver's response step (text with tool calls at a loop limit, moderated answers) and its
meter (output tokens of deltas of mixed sizes).

Checkpoints are driven as tests/test_checkpoint.py drives them: stop at a step boundary, save the turn
through JSON text, restore it in a fresh build sharing the conversation store, read it on.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Annotated, Any

import anyio
import orjson
import pytest
from pydantic import BaseModel, ConfigDict, Field

import agentrt
from agentrt import (
    Budget,
    BudgetExceededError,
    MemoryId,
    PartialStream,
    ResponseReceived,
    Result,
    TextDelta,
    TokenStream,
    ToolContext,
    ToolSettings,
    tool,
)
from agentrt._pipeline import Invocation
from agentrt._pipeline._checkpoint import CheckpointError
from agentrt._service import _RUNTIMES
from agentrt.guardrails import OutputGuardrailRequest, failure, output_guardrails, success
from agentrt.testing import CallTool, ScriptedModel

# --- helpers -------------------------------------------------------------------------------------


class Stop(Exception):
    pass


class Lookup:
    def __init__(self) -> None:
        self.memory_ids: list[Any] = []

    @tool("Look something up.")
    async def lookup(self, query: str, context: ToolContext) -> str:
        self.memory_ids.append(context.memory_id)
        return f"found {query}"


async def read(invocation: Invocation) -> Any:
    if invocation._turn.plan.streams:
        result = None
        events = invocation.events()
        try:
            async for event in events:
                if type(event).__name__ == "Completed":
                    result = event.result  # type: ignore[attr-defined]
        finally:
            await events.aclose()
        return result
    return await invocation.result()


def built(cls: type, script: list[Any], store: Any, tools: Any = None, **options: Any) -> Any:
    return agentrt.build(
        cls,
        model=ScriptedModel(*script),
        memory=agentrt.memory.window(store=store),
        tools=[tools if tools is not None else Lookup()],
        **options,
    )


async def saved_at(
    cls: type, name: str, arguments: dict[str, Any], script: list[Any], phase: str, **options: Any
) -> tuple[dict[str, Any], Any, Any, Any]:
    """The checkpoint at the first boundary of `phase`, and a fresh build (same store) to restore it
    in, with the rest of the script; and the method's spec."""
    store = agentrt.memory.InMemoryStore()
    service = built(cls, script, store, **options)
    runtime, spec = _RUNTIMES[type(service)], getattr(service, name).__agentrt_spec__
    invocation = Invocation(runtime, spec, dict(arguments))
    saved: list[dict[str, Any]] = []

    def boundary(at: Any) -> None:
        if at.value == phase:
            saved.append(orjson.loads(orjson.dumps(invocation.checkpoint())))
            raise Stop

    invocation.on_boundary(boundary)
    with pytest.raises(Stop):
        await read(invocation)
    sent = len(runtime.model.requests)
    fresh = built(cls, script[sent:], store, **options)
    return saved[0], _RUNTIMES[type(fresh)], spec, fresh


# --- 1. a structured value that does not round-trip through JSON python mode breaks COMMIT ------


class Person(BaseModel):
    first_name: str = Field(alias="firstName")
    age: int


class Dated(BaseModel):
    model_config = ConfigDict(strict=True)
    when: datetime.date


class People:
    async def person(self, conversation: Annotated[str, MemoryId], question: str) -> Result[Person]: ...

    async def partial(
        self, conversation: Annotated[str, MemoryId], question: str
    ) -> PartialStream[Person]: ...

    async def dated(self, conversation: Annotated[str, MemoryId], question: str) -> Result[Dated]: ...


@pytest.mark.parametrize(
    ("name", "answer", "value"),
    [
        ("person", '{"firstName": "Ann", "age": 3}', Person(firstName="Ann", age=3)),
        ("partial", '{"firstName": "Ann", "age": 3}', Person(firstName="Ann", age=3)),
        ("dated", '{"when": "2020-01-02"}', Dated(when=datetime.date(2020, 1, 2))),
    ],
)
async def test_a_structured_value_is_restored_at_commit(name: str, answer: str, value: Any) -> None:
    # _checkpoint._value dumps with dump_python(mode="json") (by field name, dates as strings) and
    # _revalue validates with validate_python (by alias, strict types): restore raises pydantic's
    # ValidationError (not even CheckpointError) for a model with aliases or a strict model. (Fields
    # with exclude=True come back as their defaults, silently.)
    checkpoint, runtime, spec, _ = await saved_at(
        People, name, {"conversation": "c", "question": "q"}, [[answer]], "commit"
    )
    with anyio.fail_after(5):
        result = await read(Invocation.restore(runtime, spec, checkpoint))
    assert result.value == value


# --- 2. the output meter stops a response the budget allows -------------------------------------


class Chat:
    async def ask(self, question: str) -> str: ...

    async def ask_result(self, question: str) -> Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...


@pytest.mark.parametrize("view", ["await", "stream"])
async def test_the_meter_and_the_usage_count_deltas_of_mixed_sizes_alike(view: str) -> None:
    # 10 deltas of 1 and 7 characters: each delta counts at least a token (4 characters), so the
    # response counts 14 output tokens (55 characters) in the meter and in the result's usage alike.
    deltas = ["a", "bbbbbbb"] * 5

    async def run(limit: int) -> str:
        service = agentrt.build(Chat, model=ScriptedModel(deltas), budget=Budget(output_tokens=limit))
        if view == "await":
            text: str = await service.ask("q")
            return text
        async with await service.stream("q") as tokens:
            return "".join([t async for t in tokens])

    assert await run(14) == "abbbbbbb" * 5  # a budget of N allows a response the usage counts as N
    unlimited = agentrt.build(Chat, model=ScriptedModel(deltas))
    assert (await unlimited.ask_result("q")).usage.output_tokens == 14
    with pytest.raises(BudgetExceededError) as caught:
        await run(13)
    spent = caught.value.partial.spent
    assert spent is not None
    assert spent.output_tokens > 13  # what the error reports agrees with the limit it names
    assert caught.value.partial.usage.output_tokens == spent.output_tokens


# --- 3. text sent with tool calls past a loop limit is never checked ------------------------------

SECRET = "ALPHA-7731"


class Refuses:
    name = "refuses"
    partial_text = True

    def __init__(self) -> None:
        self.seen: list[str] = []

    def validate(self, request: OutputGuardrailRequest) -> Any:
        self.seen.append(request.text)
        return failure("a code") if SECRET in request.text else success()


@pytest.mark.parametrize("release", ["buffer", "chunked", "optimistic"])
async def test_text_with_tool_calls_that_hit_a_loop_limit_passes_the_chain(release: str) -> None:
    # _loop.after_response returns Step.ASK for a round past a loop limit (on_limit="final_answer"),
    # and _steps.respond only checks text when the step is TOOLS. Under `buffer` the reader still
    # gets the response (ResponseReceived, released with the answer) carrying the unchecked text;
    # under `optimistic` it was shown as text; `chunked` checks it while it streams and refuses the
    # turn. The policies drift apart again, which issue 24 point 2 set out to end.
    guard = Refuses()

    class Guarded:
        @output_guardrails(guard, release=release)  # type: ignore[arg-type]
        async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    model = ScriptedModel(
        [CallTool("lookup", {"query": "a"}, id="x1")],
        [f"The code is {SECRET}. ", CallTool("lookup", {"query": "b"}, id="x2")],
        ["Fine."],
    )
    service = agentrt.build(
        Guarded,
        model=model,
        memory=agentrt.memory.window(),
        tools=[Lookup()],
        tool_settings=ToolSettings(max_rounds=1, on_limit="final_answer"),
    )
    shown: list[str] = []
    with anyio.fail_after(5):
        try:
            async with await service.stream("c", "q") as stream:
                async for event in stream.events():
                    if type(event) is TextDelta:
                        shown.append(event.text)
                    elif type(event) is ResponseReceived:
                        shown.append(event.response.message.text or "")
        except agentrt.OutputGuardrailError:
            pass
    assert any(SECRET in text for text in guard.seen), (guard.seen, shown)


# --- 4. restore takes checkpoints it cannot resume -------------------------------------------------


class Guard:
    name = "pass"
    partial_text = True

    def validate(self, request: OutputGuardrailRequest) -> Any:
        return success()


class Plain:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    async def number(self, conversation: Annotated[str, MemoryId], question: str) -> Result[int]: ...

    @output_guardrails(Guard(), release="buffer")
    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


TAMPERED = {
    # (method, boundary, key, value): what runs instead is an AssertionError, KeyError, TypeError or
    # pydantic ValidationError, after the conversation was locked again (or at restore, not typed).
    "loop-state": ("ask", "tools", "loop", {}),
    "release-mode": ("stream", "request", "mode", "chunked"),
    "no-response-to-decide": ("ask", "response", "received", None),
    "no-request-to-send": ("ask", "request", "request", None),
    "no-response-at-tools": ("ask", "tools", "response", None),
    "answer-that-does-not-parse": ("number", "commit", "text", "not a number"),
    "memory-id-null": ("ask", "request", "memory_id", None),
}


@pytest.mark.parametrize("case", list(TAMPERED))
async def test_restore_refuses_a_checkpoint_it_cannot_resume(case: str) -> None:
    name, phase, key, value = TAMPERED[case]
    script = [["Look. ", CallTool("lookup", {"query": "a"}, id="x1")], ["42"]]
    checkpoint, runtime, spec, _ = await saved_at(
        Plain, name, {"conversation": "c", "question": "q"}, script, phase
    )
    checkpoint[key] = value
    with pytest.raises(CheckpointError):
        Invocation.restore(runtime, spec, checkpoint)  # refused at once, before anything is locked


# --- 5. a restored turn's memory id is not the id the turn had ------------------------------------


class Nested:
    async def ask(
        self, conversation: Annotated[tuple[tuple[str, int], str], MemoryId], question: str
    ) -> Result[str]: ...


class ByUuid:
    async def ask(self, conversation: Annotated[uuid.UUID, MemoryId], question: str) -> Result[str]: ...


@pytest.mark.parametrize(
    ("cls", "memory_id"),
    [(Nested, (("a", 1), "b")), (ByUuid, uuid.UUID(int=7))],
    ids=["nested-tuple", "uuid"],
)
async def test_a_restored_turn_keeps_its_memory_id(cls: type, memory_id: Any) -> None:
    # _checkpoint.dump saves the id as JSON (a UUID becomes a str, an inner tuple a list) and load only
    # turns the outer list back into a tuple: a nested tuple id is unhashable (TypeError at the memory
    # stage), a UUID id reaches tools (ToolContext), guardrails and providers as a str.
    script = [[CallTool("lookup", {"query": "a"}, id="x1")], ["Done."]]
    lookup = Lookup()
    checkpoint, runtime, spec, _ = await saved_at(
        cls, "ask", {"conversation": memory_id, "question": "q"}, script, "tools", tools=lookup
    )
    invocation = Invocation.restore(runtime, spec, checkpoint)
    with anyio.fail_after(5):
        result = await read(invocation)
    assert result.text == "Done."
    assert lookup.memory_ids == [memory_id]
    assert type(lookup.memory_ids[0]) is type(memory_id)


# --- 6. checkpoint() takes a turn stopped in the middle of a step ---------------------------------


class Streams:
    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


class Counted:
    def __init__(self) -> None:
        self.ran: list[str] = []

    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        self.ran.append(query)
        return f"found {query}"


@pytest.mark.parametrize("stop_after", ["ToolExecuted", "ResponseReceived"])
async def test_checkpoint_of_a_turn_stopped_inside_a_step_is_refused_or_resumes_once(stop_after: str) -> None:
    # `checkpoint()` is documented for "once the events stopped there" (at a boundary), "CheckpointError
    # elsewhere", but _checkpoint.dump only checks `turn.phase in BOUNDARIES`. A reader that stops
    # inside a step (the tool round after ToolExecuted; `respond` after ResponseReceived) leaves the
    # phase at TOOLS / RESPONSE, half done: the saved turn runs the tools again on restore (and counts
    # the round twice), or has `received` already consumed and fails an assert in `_steps.respond`.
    store = agentrt.memory.InMemoryStore()
    lookup = Counted()
    script = [["Look. ", CallTool("lookup", {"query": "a"}, id="x1")], ["Done."]]
    service = built(Streams, script, store, tools=lookup)
    runtime, spec = _RUNTIMES[type(service)], service.stream.__agentrt_spec__
    invocation = Invocation(runtime, spec, {"conversation": "c", "question": "q"})
    events = invocation.events()
    async for event in events:
        if type(event).__name__ == stop_after:
            break
    await events.aclose()
    try:
        checkpoint = orjson.loads(orjson.dumps(invocation.checkpoint()))
    except CheckpointError:
        return  # refused: what the docstring promises
    fresh = built(Streams, script[len(runtime.model.requests) :], store, tools=lookup)
    with anyio.fail_after(5):
        result = await read(Invocation.restore(_RUNTIMES[type(fresh)], spec, checkpoint))
    assert result.text == "Done."
    assert lookup.ran == ["a"]  # the tool ran once
    assert len(result.tool_executions) == 1


# --- 7. @moderate(answer=True) does not see text sent with tool calls -----------------------------


class Flags:
    name = "flags"

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def moderate(self, texts: Any) -> list[Any]:
        from agentrt.moderation import Moderation

        self.texts.extend(texts)
        return [Moderation("weapon" in t, {"violence": "weapon" in t}, {"violence": 0.0}, "m") for t in texts]


@pytest.mark.parametrize("view", ["await", "stream"])
async def test_moderated_answers_also_moderate_text_sent_with_tool_calls(view: str) -> None:
    # Issue 24 point 2 made the output chain see every assistant text that reaches memory or a reader;
    # moderation of answers (`_steps.answer` only) was left behind: text sent with tool calls is
    # stored and shown (ResponseReceived) without the moderation model seeing it.
    from agentrt.moderation import moderate

    @moderate(answer=True)
    class Moderated:
        async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

        async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    flags = Flags()
    model = ScriptedModel(["To build a weapon, start here. ", CallTool("lookup", {"query": "a"})], ["Fine."])
    service = agentrt.build(
        Moderated, model=model, memory=agentrt.memory.window(), tools=[Lookup()], moderation_model=flags
    )
    with anyio.fail_after(5):
        try:
            if view == "await":
                await service.ask("c", "hello")
            else:
                async with await service.stream("c", "hello") as stream:
                    await stream.result()
        except agentrt.ModerationError:
            pass
    assert any("weapon" in text for text in flags.texts), flags.texts


# --- 9. a turn with a time budget cannot be restored outside the event loop -----------------------


async def test_a_checkpoint_with_a_time_budget_is_restored_off_the_event_loop() -> None:
    # Invocation.restore is a plain (sync) function, but with a budget _checkpoint.load (and Turn)
    # read the event loop's clock (`_budget.now()`, falling back to anyio.current_time()): called where
    # no loop runs (a worker thread deserializing saved turns, a sync setup step) it raises
    # NoEventLoopError. The clock could be read when the restored events start instead.
    store = agentrt.memory.InMemoryStore()
    service = built(Plain, [["Done."]], store, budget=Budget(seconds=30))
    runtime, spec = _RUNTIMES[type(service)], service.ask.__agentrt_spec__
    invocation = Invocation(runtime, spec, {"conversation": "c", "question": "q"}, budget=Budget(seconds=30))
    saved: list[dict[str, Any]] = []

    def stop(phase: Any) -> None:
        saved.append(orjson.loads(orjson.dumps(invocation.checkpoint())))
        raise Stop

    invocation.on_boundary(stop)
    with pytest.raises(Stop):
        await invocation.result()
    fresh = built(Plain, [["Done."]], store)
    restored = await anyio.to_thread.run_sync(Invocation.restore, _RUNTIMES[type(fresh)], spec, saved[0])
    with anyio.fail_after(5):
        result = await read(restored)
    assert result.text == "Done."
