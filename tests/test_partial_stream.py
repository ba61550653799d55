"""Partial streaming of structured output: `-> PartialStream[T]` / `-> AsyncIterator[T]` yields validated
partial snapshots as the JSON streams in, then the final value; an answer that does not parse is
repaired and replayed stream-to-sync; closing or cancelling the stream closes the model stream.

Tests assert the snapshots a reader gets (each one valid under partial validation, each a prefix of the
final value), the events in order, the requests sent and what the model double saw closed.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

import agentrt
from agentrt import (
    AssistantMessage,
    Capabilities,
    Completed,
    ConfigurationError,
    MemoryId,
    OutputParsingError,
    PartialStream,
    Reset,
    ResetReason,
    ResponseReceived,
    Result,
    TextDelta,
    UserMessage,
)
from agentrt.guardrails import OutputGuardrailRequest, success
from agentrt.output import parser_for
from agentrt.output._partial import Snapshots
from agentrt.testing import CallTool, Hang, ScriptedModel


class Ticket(BaseModel):
    title: str
    priority: int
    tags: list[str] = []


class Level(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Desk:
    async def tickets(
        self, conversation: Annotated[str, MemoryId], text: str
    ) -> AsyncIterator[list[Ticket]]: ...

    async def ticket(self, text: str) -> PartialStream[Ticket]: ...

    async def level(self, text: str) -> AsyncIterator[Level]: ...

    async def numbers(self, text: str) -> PartialStream[list[int]]: ...


TICKETS = [Ticket(title="a", priority=1), Ticket(title="b", priority=22), Ticket(title="c", priority=3)]
CHUNKS = [
    '[{"title": "a',
    '", "priority": 1',
    '}, {"title": "b", "prio',
    'rity": 2',
    '2}, {"title"',
    ': "c", "priority": 3}]',
]


def is_prefix(part: Any, whole: Any) -> bool:
    """`part` is the start of `whole`: lists by a prefix of items, objects by some of their fields,
    every value in it final (a scalar equals the final one)."""
    if isinstance(part, BaseModel):
        part, whole = part.model_dump(exclude_unset=True), whole.model_dump()
    if isinstance(part, list):
        return (
            isinstance(whole, list)
            and len(part) <= len(whole)
            and all(is_prefix(p, w) for p, w in zip(part, whole, strict=False))
        )
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and is_prefix(v, whole[k]) for k, v in part.items())
    return bool(part == whole)


async def test_list_items_are_yielded_as_each_completes_then_the_final_value() -> None:
    model = ScriptedModel(CHUNKS)
    svc = agentrt.build(Desk, model=model)

    stream = await svc.tickets("c", "three tickets")
    snapshots = [snapshot async for snapshot in stream]

    assert snapshots == [[], TICKETS[:1], TICKETS[:2], TICKETS]
    result = await stream.result()
    assert result.value == TICKETS
    assert snapshots[-1] == result.value  # the last item is the final value, not repeated
    adapter = TypeAdapter(list[Ticket])
    for snapshot in snapshots:
        assert (
            adapter.validate_python(adapter.dump_python(snapshot), experimental_allow_partial=True)
            == snapshot
        )
        assert is_prefix(snapshot, result.value)


async def test_a_number_is_shown_only_once_it_cannot_grow() -> None:
    # "priority": 2 then 2 more: 22, never 2.
    svc = agentrt.build(Desk, model=ScriptedModel(CHUNKS))
    seen = [snapshot async for snapshot in await svc.tickets("c", "q")]
    assert all(t.priority != 2 for snapshot in seen for t in snapshot)


async def test_an_object_grows_by_whole_values() -> None:
    chunks = ['{"title": "Printer', ' on fire", "priority": 1', ', "tags": ["hardware"', ', "urgent"', "]}"]
    stream = await agentrt.build(Desk, model=ScriptedModel(chunks)).ticket("q")
    snapshots = [snapshot async for snapshot in stream]
    assert snapshots == [
        Ticket(title="Printer on fire", priority=1, tags=["hardware"]),
        Ticket(title="Printer on fire", priority=1, tags=["hardware", "urgent"]),
    ]
    assert (await stream.result()).value == snapshots[-1]


@pytest.mark.parametrize(
    ("chunks", "capabilities"),
    [
        (["```json\n[1, ", "2, ", "3]\n```"], Capabilities()),  # a fenced block
        (["<think>{not json}</think>\n", "[1, ", "2, ", "3]"], Capabilities()),  # a think block
        (['{"value": [1, ', "2, ", "3]}"], Capabilities(json_object=True)),  # wrapped, unwrapped here
    ],
)
async def test_snapshots_from_fenced_thinking_and_wrapped_answers(
    chunks: list[str], capabilities: Capabilities
) -> None:
    model = ScriptedModel(chunks, capabilities=capabilities)
    snapshots = [s async for s in await agentrt.build(Desk, model=model).numbers("q")]
    assert snapshots == [[1], [1, 2], [1, 2, 3]]


async def test_prose_first_gives_only_the_final_value() -> None:
    model = ScriptedModel(["Here you go: ", "[1, ", "2, ", "3]", " Hope this helps!"])
    snapshots = [s async for s in await agentrt.build(Desk, model=model).numbers("q")]
    assert snapshots == [[1, 2, 3]]


async def test_a_scalar_stream_yields_the_final_value_only() -> None:
    model = ScriptedModel(['"hi', 'gh"'])
    stream = await agentrt.build(Desk, model=model).level("q")
    assert [s async for s in stream] == [Level.HIGH]


async def test_an_answer_that_does_not_parse_is_reset_and_repaired_stream_to_sync() -> None:
    bad = ['[{"title": "a", "priority": 1}, ', '{"title": "b", "priority": "high"}]']
    good = '[{"title": "a", "priority": 1}, {"title": "b", "priority": 2}]'
    model = ScriptedModel(bad, [good[:20], good[20:]])
    svc = agentrt.build(Desk, model=model, memory=agentrt.memory.window())

    stream = await svc.tickets("c", "two tickets")
    events = [event async for event in stream.events()]

    kinds = [type(e) for e in events if type(e) in (TextDelta, Reset, ResponseReceived, Completed)]
    # The first answer as it came, withdrawn; the repaired one whole, then its response.
    assert kinds == [TextDelta, TextDelta, ResponseReceived, Reset, TextDelta, ResponseReceived, Completed]
    reset = next(e for e in events if isinstance(e, Reset))
    assert (reset.reason, reset.attempt) == (ResetReason.UNPARSED, 1)
    replayed = [e for e in events if isinstance(e, TextDelta)][-1]
    assert replayed.text == good
    result = await stream.result()
    assert result.value == [Ticket(title="a", priority=1), Ticket(title="b", priority=2)]
    assert result.attempts == 2
    repair = model.requests[1].messages[-2:]
    assert repair[0] == AssistantMessage(text="".join(bad))
    assert isinstance(repair[1], UserMessage) and repair[1].text is not None
    assert repair[1].text.startswith("Your answer could not be read as list[Ticket]: 1.priority: ")
    stored = await agentrt.memory.access(svc).read("c")
    assert stored == [UserMessage.of("two tickets"), AssistantMessage(text=good)]


async def test_the_reader_of_snapshots_gets_the_repaired_value_last() -> None:
    bad = ['[{"title": "a", "priority": 1}, ', '{"title": "b", "priority": "high"}]']
    good = '[{"title": "a", "priority": 1}, {"title": "b", "priority": 2}]'
    svc = agentrt.build(Desk, model=ScriptedModel(bad, good))
    snapshots = [s async for s in await svc.tickets("c", "q")]
    # The first answer's first item, then (after the reset) the repaired answer's value, once.
    assert snapshots == [
        [Ticket(title="a", priority=1)],
        [Ticket(title="a", priority=1), Ticket(title="b", priority=2)],
    ]


async def test_repairs_exhausted_raise_from_the_stream_with_the_partial_result() -> None:
    svc = agentrt.build(Desk, model=ScriptedModel(["[1, ", '"x"]'], '["y"]'))
    stream = await svc.numbers("q")
    with pytest.raises(OutputParsingError) as caught:
        async for _ in stream:
            pass
    assert str(caught.value).startswith("Desk.numbers: the answer is not a valid list[int]: ")
    assert caught.value.partial is not None and caught.value.partial.attempts == 2
    with pytest.raises(OutputParsingError):
        await stream.result()


async def test_closing_mid_stream_closes_the_model_stream() -> None:
    model = ScriptedModel(['[{"title": "a", "priority": 1}, ', '{"title": "b", "priority": 2}, ', Hang()])
    stream = await agentrt.build(Desk, model=model).tickets("c", "q")
    assert await anext(stream) == TICKETS[:1]
    assert await anext(stream) == [TICKETS[0], Ticket(title="b", priority=2)]
    assert not model.streams[0].closed
    await stream.aclose()
    assert model.streams[0].closed and not model.streams[0].completed
    with pytest.raises(RuntimeError, match="closed before the invocation completed"):
        await stream.result()


async def test_cancelling_the_reader_mid_stream_closes_the_model_stream() -> None:
    model = ScriptedModel(['[{"title": "a", "priority": 1}, ', '{"title": "b", "priority": 2}, ', Hang()])
    svc = agentrt.build(Desk, model=model, memory=agentrt.memory.window())
    seen: list[Any] = []
    with anyio.CancelScope() as scope:
        async for snapshot in await svc.tickets("c", "q"):
            seen.append(snapshot)
            if len(seen) == 2:
                scope.cancel()
    assert seen == [TICKETS[:1], [TICKETS[0], Ticket(title="b", priority=2)]]
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(svc).read("c") == []


class Counting:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def validate(self, request: OutputGuardrailRequest) -> Any:
        self.seen.append(request.text)
        return success()


async def test_under_a_buffering_output_guardrail_the_value_comes_once_it_passed() -> None:
    guard = Counting()
    svc = agentrt.build(Desk, model=ScriptedModel(CHUNKS), output_guardrails=[guard])
    stream = await svc.tickets("c", "q")
    snapshots = [s async for s in stream]
    assert guard.seen == ["".join(CHUNKS)]
    assert snapshots == [TICKETS]


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (PartialStream, r"say what it streams"),
        (PartialStream[str], r"a stream of str is a TokenStream"),
        (AsyncIterator[None], r"a stream of None has no values to stream"),  # type: ignore[misc]
        (Result[PartialStream[int]], r"return type Result\[PartialStream\[int\]\] is not supported"),
    ],
)
def test_declaration_errors_name_the_method(annotation: Any, message: str) -> None:
    async def ask(self: object, question: str) -> Any: ...

    ask.__annotations__["return"] = annotation
    with pytest.raises(ConfigurationError, match=rf"Service\.ask: {message}"):
        agentrt.build(type("Service", (), {"ask": ask}), model=ScriptedModel())


# --- the snapshots alone, over any chunking ------------------------------------------------------------

FINAL = [
    Ticket(title='Printer, "on" fire', priority=12, tags=["a", "b]"]),
    Ticket(title="x}", priority=3),
    Ticket(title="y", priority=-45, tags=[]),
]
TEXT = TypeAdapter(list[Ticket]).dump_json(FINAL).decode()


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(TEXT) - 1), unique=True))
def test_any_chunking_gives_prefixes_of_the_final_value_each_new(cuts: list[int]) -> None:
    snapshots = Snapshots(parser_for(list[Ticket]))  # type: ignore[arg-type]
    bounds = [0, *sorted(cuts), len(TEXT)]
    seen: list[Any] = []
    for start, end in itertools.pairwise(bounds):
        if snapshots.feed(TEXT[start:end]):
            seen.append(snapshots.value)
    for before, after in itertools.pairwise(seen):
        assert before != after
        assert is_prefix(before, after)
    for snapshot in seen:
        assert is_prefix(snapshot, FINAL)
    assert seen[-1] == FINAL  # the whole text parses to the final value
    assert not snapshots.final(FINAL)


def test_a_long_answer_is_read_a_bounded_number_of_times() -> None:
    # 20,000 items streamed one per chunk: reading every chunk would be quadratic; the snapshots are
    # taken at most about 16 times per doubling of the answer, so this stays linear.
    parser = parser_for(list[int])
    snapshots = Snapshots(parser)  # type: ignore[arg-type]
    taken = 0
    snapshots.feed("[")
    for i in range(20_000):
        taken += snapshots.feed(f"{i}, ")
    assert taken < 16 * 16
    snapshots.feed("0]")
    assert snapshots.value[:100] == list(range(100))


# --- found by an outside review ------------------------------------------------------------------------


class Lookup:
    @agentrt.tool("Numbers for a key.")
    def nums(self, key: str) -> str:
        return "3,4"


class Counted:
    async def numbers(self, text: str) -> PartialStream[list[int]]: ...

    async def levels(self, text: str) -> PartialStream[list[Level]]: ...


@pytest.mark.parametrize(
    "before",
    [
        ["Let me look that up. "],  # prose: the answer after the tool round still gets snapshots
        ["[1, 2, "],  # JSON that turned out to be no answer: its snapshots are not the answer's
    ],
)
async def test_snapshots_start_over_after_a_response_that_called_tools(before: list[Any]) -> None:
    model = ScriptedModel([*before, CallTool("nums", {"key": "x"}, id="c1")], ["[3, ", "4, ", "5]"])
    stream = await agentrt.build(Counted, model=model, tools=[Lookup()]).numbers("q")
    snapshots = [snapshot async for snapshot in stream]
    final = [3, 4, 5]
    assert snapshots[-1] == final
    after = snapshots[snapshots.index([3]) :]  # the answer's own snapshots, each a prefix of it
    assert after == [[3], [3, 4], final]


async def test_enum_names_give_snapshots_too() -> None:
    model = ScriptedModel(['["LOW", ', '"High"', "]"])
    snapshots = [s async for s in await agentrt.build(Counted, model=model).levels("q")]
    # Partial validation drops an unfinished last item that does not validate, so a last item given
    # by name shows once an item follows it (or the answer ends).
    assert snapshots == [[], [Level.LOW], [Level.LOW, Level.HIGH]]


LEAD = "<think>Maybe {a} or [b], then ``` and </thin>k. Fine.</think>\n  ```json\n"
BODY = "[10, 20, 30, 40]"


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(LEAD + BODY) - 1), unique=True))
def test_the_json_is_found_after_think_and_fence_however_the_text_is_cut(cuts: list[int]) -> None:
    text = LEAD + BODY
    snapshots = Snapshots(parser_for(list[int]))  # type: ignore[arg-type]
    bounds = [0, *sorted(cuts), len(text)]
    seen = []
    for start, end in itertools.pairwise(bounds):
        if snapshots.feed(text[start:end]):
            seen.append(snapshots.value)
    assert seen  # found, whatever the cuts
    assert seen[-1] == [10, 20, 30, 40]
    assert all(is_prefix(snapshot, [10, 20, 30, 40]) for snapshot in seen)


@pytest.mark.parametrize(
    "lead",
    ["Sure! [1]", "<thinking>[1]", "``` [1]", "<think>x</think> Here: [1]"],
)
def test_an_answer_that_starts_with_prose_gives_no_snapshots(lead: str) -> None:
    snapshots = Snapshots(parser_for(list[int]))  # type: ignore[arg-type]
    assert not any(snapshots.feed(char) for char in lead)
