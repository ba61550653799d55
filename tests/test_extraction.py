"""Finding JSON in answers (`agentrt.output._extract`): what a model wraps its JSON in, reasoning
that is never the answer, adversarial inputs that used to take seconds, and random text (hypothesis).

Most are synchronous: extraction is plain computation, no event loop involved. How fast it is, that
10 MB take about ten times as long as 1 MB, and how long a parse in a worker thread stops the event
loop, is measured by benchmarks/bench_extract.py and benchmarks/bench_parse_gap.py, not here.
"""

from __future__ import annotations

import json
import re
import sys
from decimal import Decimal
from typing import Annotated, Any

import httpx
import orjson
import pytest
from cassettes import Parts
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import agentrt
from agentrt import AssistantMessage, MemoryId, OutputParsingError, Result
from agentrt.models import OpenAIChatModel, RetryPolicy
from agentrt.output import _extract, _parsers, parser_for
from agentrt.output._extract import SLICE, candidates, strip_thinking


class Ticket(BaseModel):
    title: str
    tags: list[str]


def test_leading_think_blocks_are_dropped_even_unclosed_ones() -> None:
    assert strip_thinking("<think>a {b}</think> <think>c</think>xy") == "xy"
    assert strip_thinking("  <think>never closed {") == ""
    # Markers after the answer began are its text, as in a streamed answer's partial values.
    assert strip_thinking("x<think>c</think>y") == "x<think>c</think>y"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', ['{"a": 1}']),
        ('```json\n{"a": 1}\n```\nThanks', ['```json\n{"a": 1}\n```\nThanks', '{"a": 1}']),
        ("a {b} c [1] d", ["a {b} c [1] d", "[1]"]),  # JSON has no "{b}"
        ('x {"s": "} ]"} y', ['x {"s": "} ]"} y', '{"s": "} ]"}']),
        ('{"s": "\\\\"} {"t": "\\""}', ['{"s": "\\\\"} {"t": "\\""}', '{"s": "\\\\"}', '{"t": "\\""}']),
        ("[[[[{}", ["[[[[{}", "{}"]),
        ("}}]] [2]", ["}}]] [2]", "[2]"]),
        ("{[}]", ["{[}]"]),  # neither "{[" nor "[}" can be JSON
        # A bracket JSON cannot have ends the spans open around it; those closed inside are found.
        ('[{"a": 1}, {b} {"c": [2]}', ['[{"a": 1}, {b} {"c": [2]}', '{"a": 1}', '{"c": [2]}']),
        ('{"a": [1}, "b": 2}', ['{"a": [1}, "b": 2}']),
        ('x {"k": "v"} and a}b{c]d [ ]', ['x {"k": "v"} and a}b{c]d [ ]', '{"k": "v"}', "[ ]"]),
    ],
)
def test_candidates_in_order(text: str, expected: list[str]) -> None:
    assert list(candidates(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "```json" + " " * 20_000,  # an unclosed fence: seconds with a backtracking regex
        "[" * 100_000,
        "{" * 50_000 + "}" * 49_999,
        '{"a": "' + "x" * 100_000,
        "{]" * 50_000,
    ],
    ids=["unclosed fence", "brackets", "unbalanced braces", "unclosed string", "mismatched"],
)
def test_adversarial_answers_fail_with_an_output_parsing_error(text: str) -> None:
    with pytest.raises(OutputParsingError):
        parser_for(Ticket).parse(text)


PROSE = st.text(alphabet=st.characters(blacklist_characters='{}[]"\\`<'), max_size=200)
TICKETS = st.builds(Ticket, title=st.text(max_size=30), tags=st.lists(st.text(max_size=10), max_size=4))


# The bound: no case over 1 s (each takes microseconds; the margin is for a loaded machine).
@settings(max_examples=300, deadline=1000)
@given(before=PROSE, ticket=TICKETS, after=PROSE, fenced=st.booleans())
def test_random_prose_around_valid_json_parses(before: str, ticket: Ticket, after: str, fenced: bool) -> None:
    json = orjson.dumps(ticket.model_dump()).decode()
    body = f"```json\n{json}\n```" if fenced else json
    assert parser_for(Ticket).parse(f"{before}\n{body}\n{after}") == ticket


@settings(max_examples=500, deadline=1000)
@given(text=st.text(max_size=400))
@pytest.mark.parametrize("annotation", [Ticket, list[int], bool, int])
def test_random_text_parses_or_fails_only_with_an_output_parsing_error(annotation: object, text: str) -> None:
    failed: OutputParsingError | None = None
    try:
        parser_for(annotation).parse(text)
    except OutputParsingError as error:
        failed = error
    assert failed is None or failed.text == text


def test_reasoning_before_a_close_tag_that_nothing_opened_is_dropped() -> None:
    # Servers whose chat template opens the think block in the prompt send only its end.
    assert strip_thinking('ok so maybe {"a": 9}\n</think>\n{"a": 1}') == '\n{"a": 1}'
    assert strip_thinking("x</think><think>z</think>w") == "w"
    assert strip_thinking("x</think>y<think>z</think>w") == "y<think>z</think>w"
    assert parser_for(int).parse("it is 3 or 4\n</think>\n4") == 4


@pytest.mark.parametrize(
    ("annotation", "text", "value"),
    [
        (int, "42.", 42),  # a full stop after a number
        (float, "2.5.", 2.5),
        (int | None, "None", None),
        (int | None, "null", None),
        (Ticket | None, "None", None),
    ],
)
def test_bare_answers_a_model_writes(annotation: object, text: str, value: object) -> None:
    assert parser_for(annotation).parse(text) == value


def test_none_is_no_answer_where_the_type_has_no_none() -> None:
    with pytest.raises(OutputParsingError):
        parser_for(int).parse("None")


@pytest.mark.parametrize("marker", ["<think>", "</think>", "<think>x</think>", "</think><think>"])
@pytest.mark.parametrize(
    "around",
    ["{}", "Here it is:\n{}\nDone.", "```json\n{}\n```", "<think>plan</think>{}", "plan</think>\n{}"],
)
def test_think_markers_inside_the_json_are_text(marker: str, around: str) -> None:
    # Found by hypothesis on Python 3.13: a title "<think>" was taken for a think block.
    ticket = Ticket(title=marker, tags=["a"])
    text = around.replace("{}", orjson.dumps(ticket.model_dump()).decode())
    assert parser_for(Ticket).parse(text) == ticket


# --- reasoning is never the answer ---------------------------------------------------------------------


class Trip(BaseModel):
    origin: str
    destination: str


DRAFT = '{"origin": "Bern", "destination": "Basel"}'


@pytest.mark.parametrize(
    "text",
    [
        f"<think>Draft: {DRAFT}</think>\nSorry, I cannot help.",
        f"<think>Draft:\n```json\n{DRAFT}\n```\n</think>\nSorry, I cannot help.",
        f"<think>a</think> <think>Draft: {DRAFT}</think> Sorry, I cannot help.",
        f"<think>Draft: {DRAFT} and never closed",
        # The chat template opened the block in the prompt: only its end comes back.
        f"Draft: {DRAFT}\n</think>\nSorry, I cannot help.",
        f"Draft: [{DRAFT}]</think>Sorry.",
    ],
)
def test_json_inside_a_think_block_is_no_candidate(text: str) -> None:
    assert DRAFT not in list(candidates(text))
    with pytest.raises(OutputParsingError, match="no JSON found"):
        parser_for(Trip).parse(text)


def test_the_answer_after_a_think_block_is_found_not_the_draft() -> None:
    text = f'<think>Draft: {DRAFT}</think>\nHere: {{"origin": "Bern", "destination": "Chur"}}'
    assert parser_for(Trip).parse(text) == Trip(origin="Bern", destination="Chur")
    fenced = f'x {DRAFT}\n</think>\n```json\n{{"origin": "Bern", "destination": "Chur"}}\n```'
    assert parser_for(Trip).parse(fenced) == Trip(origin="Bern", destination="Chur")


class Planner:
    async def trip(self, conversation: Annotated[str, MemoryId], text: str) -> Result[Trip]: ...


def _sse(content: str) -> bytes:
    payloads = [
        {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
        },
        {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("lead", ["<think>", ""])
async def test_a_draft_in_reasoning_from_an_openai_server_is_repaired_not_returned(lead: str) -> None:
    # Served without a reasoning parser; with lead "" the chat template opened the block in the
    # prompt, so only "</think>" comes back and the whole reasoning arrives as content.
    refusal = f"{lead}Draft: {DRAFT}</think>\nSorry, I cannot help."
    final = '{"origin": "Bern", "destination": "Chur"}'
    bodies = [_sse(refusal), _sse(final)]
    sent: list[dict[str, Any]] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Parts([bodies.pop(0)])
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = OpenAIChatModel("m", base_url="https://llm.test/v1", client=client, retry=RetryPolicy.never())
        svc = agentrt.build(Planner, model=model, memory=agentrt.memory.window())
        result = await svc.trip("c", "Bern to Chur, please")

    assert result.value == Trip(origin="Bern", destination="Chur")
    assert result.attempts == 2
    repair = sent[1]["messages"]
    assert repair[-1]["role"] == "user"
    assert repair[-1]["content"].startswith("Your answer could not be read as Trip: no JSON found in it.")
    stored = await agentrt.memory.access(svc).read("c")
    assert stored[-1] == AssistantMessage(text=final)


# --- shapes real models answer, and the ambiguous ones that are still refused ---------------------------


TRIP = Trip(origin="Bern", destination="Basel")


class Settings(BaseModel):
    theme: str = "light"  # every field has a default: the envelope itself would validate


@pytest.mark.parametrize(
    ("annotation", "text", "value"),
    [
        (Trip, f'{{"trip": {DRAFT}}}', TRIP),
        (Trip, f'Here you go: {{"Trip": {DRAFT}}}', TRIP),
        (list[Trip], f'{{"trips": [{DRAFT}]}}', [TRIP]),
        (list[Trip] | None, f'```json\n{{"trip": [{DRAFT}]}}\n```', [TRIP]),
        (Trip, f'{{"result": {DRAFT}}}', TRIP),
        (list[int], '{"answer": [1, 2]}', [1, 2]),
        (int, '{"result": 42}', 42),
        (Settings, '{"settings": {"theme": "dark"}}', Settings(theme="dark")),
    ],
)
def test_a_single_field_envelope_around_the_type_is_read(annotation: Any, text: str, value: Any) -> None:
    assert parser_for(annotation).parse(text) == value


@pytest.mark.parametrize(
    ("annotation", "text"),
    [
        (Trip, f'{{"trip": {DRAFT}, "note": "one way"}}'),  # two fields: which one is the answer?
        (list[Trip], f'{{"trips": [{DRAFT}], "count": 1}}'),
        (Trip, f'{{"error": {DRAFT}}}'),  # a key that names neither the type nor the answer
        (int, '{"error": 500}'),
        (int, '{"count": 3}'),
    ],
)
def test_an_envelope_that_may_be_something_else_is_refused(annotation: Any, text: str) -> None:
    with pytest.raises(OutputParsingError):
        parser_for(annotation).parse(text)


def test_a_field_or_a_mapping_key_is_no_envelope() -> None:
    class Wrapper(BaseModel):
        trip: Trip

    assert parser_for(Wrapper).parse(f'{{"trip": {DRAFT}}}') == Wrapper(trip=TRIP)
    assert parser_for(dict[str, Trip]).parse(f'{{"trip": {DRAFT}}}') == {"trip": TRIP}


@pytest.mark.parametrize(
    ("annotation", "text", "value"),
    [
        (int, "The answer is 42.", 42),
        (int, "There are 3 trains.", 3),
        (float, "It costs -2.5 francs.", -2.5),
        (Decimal, "CHF 1250.50.", Decimal("1250.50")),
        (bool, "Yes, it is.", True),
        (bool, "No, it is not.", False),
        (bool, "True, the train runs.", True),
        (int | None, "The answer is 7", 7),
    ],
)
def test_a_scalar_in_a_short_sentence_is_read(annotation: Any, text: str, value: Any) -> None:
    assert parser_for(annotation).parse(text) == value


@pytest.mark.parametrize(
    ("annotation", "text"),
    [
        (int, "Between 3 and 4."),  # two numbers
        (int, "It left at 10:15."),
        (int, "On 2026-12-01."),
        (int, "It is the 3rd."),  # a number with letters stuck to it
        (float, "About 42%."),
        (Decimal, "CHF 1,250.50."),  # a thousands separator, or a decimal comma?
        (int, "The answer is 42.5."),  # a number, but no int
        (bool, "Yes and no."),
        (bool, "Well, yes."),  # it does not start with the answer
        (bool, "No, yes."),
        (bool | int, "Yes, 3 of them."),  # a bool and a number: which one?
        (int, 'I would say {"n": 5}'),  # JSON that did not validate is no sentence
        (int, "The answer is 42.\nOr 43."),  # more than one line is no short sentence
    ],
)
def test_a_sentence_with_more_than_one_reading_is_refused(annotation: Any, text: str) -> None:
    with pytest.raises(OutputParsingError):
        parser_for(annotation).parse(text)


def test_an_answer_made_of_thousands_of_small_spans_is_refused_not_searched_to_its_end() -> None:
    # 256 candidates are validated at most: the span after them is not looked for.
    noise = " ".join(f'{{"n": {i}}}' for i in range(300))
    with pytest.raises(OutputParsingError):
        parser_for(Trip).parse(f"{noise} {DRAFT}")
    assert parser_for(Trip).parse(f"{noise[:2000]} {DRAFT}") == TRIP
    # Arrays are no object: they do not count (a list of citations before the JSON).
    citations = " ".join(f"[{i}]" for i in range(1000))
    assert parser_for(Trip).parse(f"As said in {citations}: {DRAFT}") == TRIP


class Recording:
    """A compiled pattern that records how many characters each call may read."""

    def __init__(self, pattern: re.Pattern[str], windows: list[int]) -> None:
        self._pattern = pattern
        self._windows = windows

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._pattern, name)

        def call(text: str, pos: int = 0, endpos: int = sys.maxsize) -> Any:
            self._windows.append(min(endpos, len(text)) - pos)
            return method(text, pos, endpos)

        return call


@pytest.mark.parametrize(
    "noise",
    ["x" * 200_000, "{a" * 100_000, "{}" * 100_000, '{"' * 100_000, "[" * 200_000, '{"s": "' + "y" * 200_000],
    ids=["prose", "brace every other", "empty objects", "quotes", "brackets", "unclosed string"],
)
def test_no_search_reads_more_than_a_slice(monkeypatch: pytest.MonkeyPatch, noise: str) -> None:
    # A worker thread's parse holds the GIL for one regex call at a time: a whole-text pass over
    # 10 MB stopped the event loop for ~100 ms. Every search is bounded to SLICE characters.
    windows: list[int] = []
    for name, value in vars(_extract).items():
        if isinstance(value, re.Pattern):
            monkeypatch.setattr(_extract, name, Recording(value, windows))
    text = f"<think>{noise}</think>\n{noise}\n```json\n{DRAFT}\n```\n{noise} {DRAFT}"
    assert parser_for(Trip).parse(text) == TRIP
    found = list(candidates(text))
    assert DRAFT in found
    assert windows
    assert max(windows) <= SLICE + 1


class RecordingAdapter:
    """A `TypeAdapter` that records the length of every JSON text it validates."""

    def __init__(self, adapter: Any, lengths: list[int]) -> None:
        self._adapter = adapter
        self._lengths = lengths

    def validate_json(self, data: str | bytes) -> Any:
        self._lengths.append(len(data))
        return self._adapter.validate_json(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)


@pytest.mark.parametrize(
    "shape",
    ["Here they are:\n```json\n{}\n```", '{{"value": {}}}', '{{"trips": {}}}', "{}"],
    ids=["fenced", "wrapped", "envelope", "bare"],
)
def test_a_long_list_is_validated_a_slice_of_items_at_a_time(shape: str) -> None:
    # One pydantic call over a 10 MB list of models held the GIL (so the event loop) for seconds.
    trips = [Trip(origin=f"Bern, [{i}]", destination='Basel "SBB"') for i in range(5_000)]
    array = orjson.dumps([trip.model_dump() for trip in trips], option=orjson.OPT_INDENT_2).decode()
    parser = parser_for(list[Trip])
    lengths: list[int] = []
    parser.adapter = RecordingAdapter(parser.adapter, lengths)  # type: ignore[attr-defined]
    assert parser.parse(shape.format(array)) == trips
    assert len(array) > 10 * SLICE
    assert max(lengths) <= SLICE + 2


def test_a_long_list_that_does_not_validate_names_the_item_that_is_wrong() -> None:
    items = [{"origin": "Bern", "destination": "Basel"}] * 3_000 + [{"origin": "Bern"}]
    with pytest.raises(OutputParsingError, match=r"3000\.destination: Field required"):
        parser_for(list[Trip]).parse(orjson.dumps(items).decode())


@pytest.mark.parametrize("annotation", [list[int], Trip])
def test_a_long_array_with_prose_after_it_is_not_read_whole_by_pydantic(annotation: Any) -> None:
    # jiter read all of a 10 MB array before it found the sentence after it: one call, the GIL held.
    array = orjson.dumps(list(range(20_000))).decode()
    text = f"{array}\n  Hope this helps!"
    parser = parser_for(annotation)
    lengths: list[int] = []
    parser.adapter = RecordingAdapter(parser.adapter, lengths)  # type: ignore[attr-defined]
    if annotation is Trip:
        # The first JSON-looking candidate's error, as pydantic words it for the whole answer.
        with pytest.raises(OutputParsingError, match="Invalid JSON: trailing characters at line 2 column 3"):
            parser.parse(text)
    else:
        assert parser.parse(text) == list(range(20_000))  # the array alone, the next candidate
    assert max(lengths, default=0) <= SLICE + 2
    with pytest.raises(OutputParsingError, match=r"trailing characters at line 2 column 3"):
        parser_for(list[Trip]).parse(f"{array}\n  Hope this helps!")


_MARKERS = ["<think>", "</think>", "```", "```json\n", "true", "[1, 2]"]
PIECES = st.sampled_from(["{", "}", "[", "]", '"', "\\", " ", "\n", ",", ":", "1", "a", *_MARKERS])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(PIECES, max_size=60), size=st.integers(1, 12))
def test_where_a_slice_ends_changes_nothing(pieces: list[str], size: int) -> None:
    # Each search reads at most SLICE characters: tiny slices must find what one slice finds.
    text = "".join(pieces)
    expected = list(candidates(text))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_extract, "SLICE", size)
        assert list(candidates(text)) == expected


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(st.builds(Trip, origin=st.text(max_size=8), destination=st.text(max_size=8))),
    size=st.integers(1, 200),
    indent=st.booleans(),
)
def test_a_list_read_in_slices_is_the_list_read_whole(items: list[Trip], size: int, indent: bool) -> None:
    array = orjson.dumps([item.model_dump() for item in items], option=orjson.OPT_INDENT_2 if indent else 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_extract, "SLICE", size)
        patch.setattr(_parsers, "SLICE", size)
        assert parser_for(list[Trip]).parse(array.decode()) == items
        assert parser_for(list[Trip]).parse(f'{{"trips": {array.decode()}}}') == items
