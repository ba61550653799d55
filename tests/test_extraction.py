"""Finding JSON in answers (`agentrt.output._extract`): what a model wraps its JSON in, adversarial
inputs that used to take seconds, and random text (hypothesis).

These are synchronous: extraction is plain computation, no event loop involved. How fast it is, and
that 10 MB take about ten times as long as 1 MB, is measured by benchmarks/bench_extract.py, not here.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentrt import OutputParsingError
from agentrt.output import parser_for
from agentrt.output._extract import candidates, strip_thinking


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
        ("a {b} c [1] d", ["a {b} c [1] d", "{b}", "[1]"]),
        ('x {"s": "} ]"} y', ['x {"s": "} ]"} y', '{"s": "} ]"}']),
        ('{"s": "\\\\"} {"t": "\\""}', ['{"s": "\\\\"} {"t": "\\""}', '{"s": "\\\\"}', '{"t": "\\""}']),
        ("[[[[{}", ["[[[[{}", "{}"]),
        ("}}]] [2]", ["}}]] [2]", "[2]"]),
        ("{[}]", ["{[}]", "{[}"]),  # the stray "[" is unwound: "{[}" balances its braces
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
