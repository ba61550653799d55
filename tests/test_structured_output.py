"""Structured output: every return type, on the schema path, the instructions path and in tool mode
(the answer as a forced `final_answer` call's arguments), from every answer shape a model gives
(clean JSON, a fenced block, prose around it, a `<think>` block with braces, a wrapped scalar, a bare
scalar).

The model double records each request: tests assert the schema or the instructions it was sent, and
the value the call returned.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

import orjson
import pytest
from pydantic import BaseModel, Field, TypeAdapter
from typing_extensions import TypedDict

import agentrt
from agentrt import Capabilities, OutputParsingError, PartialStream, Result, TokenStream
from agentrt.models import JsonObjectFormat, JsonSchemaFormat, ToolCallDelta
from agentrt.output import ANSWER_TOOL, extract_json, parser_for
from agentrt.testing import ScriptedModel


class Sentiment(enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"


class Ticket(BaseModel):
    title: str
    priority: int


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Span:
    start: int
    end: int


ID = uuid.UUID("12345678-1234-5678-1234-567812345678")

# (type, the value, its JSON, a bare form a model might write, or None when the type has none)
CASES: list[tuple[str, Any, Any, str, str | None]] = [
    ("bool", bool, True, "true", "Yes."),
    ("int", int, 42, "42", "42"),
    ("float", float, 2.5, "2.5", "2.5"),
    ("Decimal", decimal.Decimal, decimal.Decimal("1.25"), '"1.25"', "1.25"),
    ("Enum", Sentiment, Sentiment.POSITIVE, '"positive"', "POSITIVE"),
    ("Literal", Literal["red", "green"], "green", '"green"', "`green`"),
    ("date", datetime.date, datetime.date(2026, 12, 1), '"2026-12-01"', "2026-12-01"),
    (
        "datetime",
        datetime.datetime,
        datetime.datetime(2026, 12, 1, 10, 30),
        '"2026-12-01T10:30:00"',
        "2026-12-01T10:30:00",
    ),
    ("time", datetime.time, datetime.time(10, 30), '"10:30:00"', "10:30:00"),
    ("UUID", uuid.UUID, ID, f'"{ID}"', str(ID)),
    ("Optional[int]", Optional[int], 5, "5", "5"),  # noqa: UP045 (the spelling users write too)
    ("int | str", Union[int, str], 7, "7", None),  # noqa: UP007
    ("list[int]", list[int], [1, 2], "[1, 2]", None),
    ("set[str]", set[str], {"a"}, '["a"]', None),
    ("tuple[int, str]", tuple[int, str], (1, "a"), '[1, "a"]', None),
    ("list[Ticket]", list[Ticket], [Ticket(title="t", priority=1)], '[{"title": "t", "priority": 1}]', None),
    ("dict[str, int]", dict[str, int], {"a": 1}, '{"a": 1}', None),
    ("Ticket", Ticket, Ticket(title="t", priority=2), '{"title": "t", "priority": 2}', None),
    (
        "Cat | Dog",
        Annotated[Union[Cat, Dog], Field(discriminator="kind")],  # noqa: UP007
        Dog(kind="dog", good=True),
        '{"kind": "dog", "good": true}',
        None,
    ),
    (
        "Cat | Dog (no discriminator)",
        Union[Cat, Dog],  # noqa: UP007
        Cat(kind="cat", lives=9),
        '{"kind": "cat", "lives": 9}',
        None,
    ),
    ("TypedDict", Point, {"x": 1, "y": 2}, '{"x": 1, "y": 2}', None),
    ("dataclass", Span, Span(1, 2), '{"start": 1, "end": 2}', None),
]

SHAPES = ["clean", "fenced", "prose", "think", "wrapped", "bare"]


def is_object(annotation: Any) -> bool:
    return TypeAdapter(annotation).json_schema().get("type") == "object"


def shaped(shape: str, annotation: Any, json: str, bare: str | None) -> str | None:
    """The answer text of a shape, or None when the shape does not apply to the type."""
    wrapped = f'{{"value": {json}}}'
    structured = json[:1] in "{["
    if shape == "clean":
        return json
    if shape == "fenced":
        return f"Here you go:\n```json\n{json}\n```\nHope this helps!"
    if shape == "prose":
        return f"Sure! {json if structured else wrapped} Hope this helps {{or not}}!"
    if shape == "think":
        return f"<think>The user wants {{json}} or [a list], fine.</think>\n{json}"
    if shape == "wrapped":
        return None if is_object(annotation) else wrapped
    return bare


def service_for(annotation: Any, result: bool = False) -> type:
    async def ask(self: object, question: str) -> Any: ...

    ask.__annotations__["return"] = Result[annotation] if result else annotation  # type: ignore[valid-type]
    return type("Service", (), {"ask": ask})


# Every type with every shape it has (objects are not wrapped; only scalars have a bare form).
MATRIX = [
    pytest.param(annotation, value, text, id=f"{name}-{shape}")
    for name, annotation, value, json, bare in CASES
    for shape in SHAPES
    if (text := shaped(shape, annotation, json, bare)) is not None
]


def answered(path: str, text: str) -> list[Any]:
    """The model's answer: the text, or (tool mode) the `final_answer` call with the text as its
    arguments, split in two fragments as providers stream them."""
    if path != "tool":
        return [text]
    half = len(text) // 2
    return [ToolCallDelta(0, "call_1", ANSWER_TOOL, text[:half]), ToolCallDelta(0, None, None, text[half:])]


@pytest.mark.parametrize("path", ["schema", "instructions", "tool"])
@pytest.mark.parametrize(("annotation", "value", "text"), MATRIX)
async def test_every_type_from_every_answer_shape(annotation: Any, value: Any, text: str, path: str) -> None:
    capabilities = Capabilities(json_schema=path == "schema")
    model = ScriptedModel(answered(path, text), answered(path, text), capabilities=capabilities)
    mode = "tool" if path == "tool" else "auto"
    svc = agentrt.build(service_for(annotation), model=model, output_mode=mode)
    got = await svc.ask("q")
    assert got == value
    assert type(got) is type(value)
    result = await agentrt.build(service_for(annotation, result=True), model=model, output_mode=mode).ask("q")
    assert result.value == value and result.text == text

    request = model.requests[0]
    schema = TypeAdapter(annotation).json_schema()
    if path == "tool":  # the answer tool, forced by name; its parameters are the (wrapped) schema
        assert request.response_format is None
        assert [tool.name for tool in request.tools] == [ANSWER_TOOL]
        assert request.tool_choice == ANSWER_TOOL
        sent = request.tools[0].parameters
        if is_object(annotation):
            assert sent == schema
        else:
            assert sent["type"] == "object" and sent["required"] == ["value"]
            assert sent["properties"]["value"] == {k: v for k, v in schema.items() if k != "$defs"}
        assert request.messages[-1].text == "q"
    elif path == "schema":
        assert isinstance(request.response_format, JsonSchemaFormat)
        sent = request.response_format.schema
        if is_object(annotation):
            assert sent == schema
        else:  # wrapped in an object, its definitions at the top
            assert sent["type"] == "object" and sent["required"] == ["value"]
            assert sent["properties"]["value"] == {k: v for k, v in schema.items() if k != "$defs"}
        assert request.messages[-1].text == "q"  # no instructions besides the schema
    else:
        assert request.response_format is None
        instructions = request.messages[-1].text.removeprefix("q\n")  # appended to the question
        assert instructions.startswith("You must answer strictly with")
        assert instructions == parser_for(annotation).instructions("instructions")
        if "JSON schema" in instructions:
            assert orjson.loads(instructions.split("\n", 1)[1]) == schema


def test_format_instructions_are_short_and_exact() -> None:
    assert parser_for(bool).instructions("instructions") == (
        'You must answer strictly with "true" or "false", and nothing else.'
    )
    assert parser_for(Sentiment).instructions("instructions") == (
        "You must answer strictly with one of these values, and nothing else:\npositive\nnegative"
    )
    assert parser_for(datetime.date).instructions("instructions") == (
        "You must answer strictly with a date in the format YYYY-MM-DD, and nothing else."
    )
    ticket = parser_for(list[Ticket]).instructions("instructions")
    assert ticket is not None and ticket.startswith("You must answer strictly with a JSON array that matches")


def test_json_mode_asks_for_the_wrapped_object() -> None:
    parser = parser_for(int)
    response_format = parser.response_format("json")
    assert isinstance(response_format, JsonObjectFormat)
    assert response_format.schema == {
        "type": "object",
        "properties": {"value": {"type": "integer"}},
        "required": ["value"],
        "additionalProperties": False,
    }
    instructions = parser.instructions("json")
    assert instructions is not None and '"value" is the answer' in instructions


async def test_none_returns_nothing_and_keeps_the_text() -> None:
    model = ScriptedModel("Done, noted.", "Done, noted.")
    assert await agentrt.build(service_for(None), model=model).ask("q") is None
    result = await agentrt.build(service_for(None, result=True), model=model).ask("q")
    assert result.value is None and result.text == "Done, noted."
    assert model.requests[0].response_format is None


@pytest.mark.parametrize(
    ("annotation", "text", "fragment"),
    [
        (Ticket, '{"title": "t", "priority": "high"}', "priority"),
        (list[int], "[1, 2, 3", "EOF while parsing a list"),
        (bool, "perhaps", "valid boolean"),
        (Sentiment, "meh", "positive"),
        (Ticket, "I cannot help with that.", "no JSON found"),
    ],
)
async def test_an_answer_that_does_not_parse_raises_with_the_text_and_the_reason(
    annotation: Any, text: str, fragment: str
) -> None:
    svc = agentrt.build(service_for(annotation), model=ScriptedModel(text), max_repairs=0)
    with pytest.raises(OutputParsingError) as caught:
        await svc.ask("q")
    assert caught.value.text == text
    assert str(caught.value).startswith(f"Service.ask: the answer is not a valid {caught.value.target}: ")
    assert fragment in caught.value.detail


def test_the_fenced_block_that_validates_wins() -> None:
    text = 'First:\n```python\nprint("{not json}")\n```\nThen:\n```\n{"title": "t", "priority": 3}\n```'
    assert parser_for(Ticket).parse(text) == Ticket(title="t", priority=3)


def test_braces_in_prose_and_in_strings_do_not_confuse_extraction() -> None:
    text = 'Use {braces} like this: {"title": "a } b {", "priority": 1} -- ok'
    assert parser_for(Ticket).parse(text) == Ticket(title="a } b {", priority=1)
    assert parser_for(Ticket).parse('stray { then {"title": "x", "priority": 1}') == Ticket(
        title="x", priority=1
    )
    assert extract_json('Sure! {"a": 1} Hope this helps!') == '{"a": 1}'


def test_an_immediate_value_of_the_return_type_is_accepted_as_it_is() -> None:
    parser = parser_for(list[int])
    assert parser.accepts([1, 2])
    assert not parser.accepts(["1"])
    assert parser_for(Sentiment).accepts(Sentiment.NEGATIVE)


class Opaque:
    """A class pydantic has no schema for."""


@pytest.mark.parametrize(
    ("annotation", "reason"),
    [(Opaque, "has no JSON schema"), (dict[str, Opaque], "has no JSON schema")],
)
def test_a_type_without_a_schema_is_a_configuration_error_naming_the_method(
    annotation: Any, reason: str
) -> None:
    with pytest.raises(agentrt.ConfigurationError, match=rf"Service\.ask: return type .*{reason}"):
        agentrt.build(service_for(annotation), model=ScriptedModel())


# --- found by an outside review ------------------------------------------------------------------------


class Prefs(BaseModel):
    theme: str = "light"
    size: int = 10


class Color(enum.Enum):
    RED = "r"
    GREEN = "g"


class Paint(BaseModel):
    color: Color
    extra: list[Color] = []


@pytest.mark.parametrize(
    ("annotation", "text", "value"),
    [
        # A type that would also accept the wrapper itself: the wrapped value is the answer.
        (Optional[Prefs], '{"value": {"theme": "dark", "size": 3}}', Prefs(theme="dark", size=3)),  # noqa: UP045
        (Any, '{"value": 5}', 5),
        (Optional[dict[str, Any]], '{"value": {"a": 1}}', {"a": 1}),  # noqa: UP045
        # An object type is not unwrapped: {"value": 5} is a dict with a key "value".
        (dict[str, int], '{"value": 5}', {"value": 5}),
    ],
)
async def test_a_wrapped_answer_is_read_unwrapped_first(annotation: Any, text: str, value: Any) -> None:
    model = ScriptedModel(text)
    assert await agentrt.build(service_for(annotation), model=model).ask("q") == value


@pytest.mark.parametrize(
    ("annotation", "text", "value"),
    [
        (Optional[Color], "RED", Color.RED),  # noqa: UP045
        (Optional[Color], '{"value": "GREEN"}', Color.GREEN),  # noqa: UP045
        (list[Color], '["RED", "g", "green"]', [Color.RED, Color.GREEN, Color.GREEN]),
        (Paint, '{"color": "Green", "extra": ["RED"]}', Paint(color=Color.GREEN, extra=[Color.RED])),
        (Union[int, Color], '"red"', Color.RED),  # noqa: UP007
        (dict[str, Color], '{"a": "RED"}', {"a": Color.RED}),
    ],
)
async def test_enums_are_read_by_name_wherever_they_are_in_the_type(
    annotation: Any, text: str, value: Any
) -> None:
    model = ScriptedModel(text)
    assert await agentrt.build(service_for(annotation), model=model).ask("q") == value
    assert len(model.requests) == 1  # no repair was needed


async def test_a_word_that_names_no_member_still_fails_with_what_was_wrong() -> None:
    model = ScriptedModel('["RED", "blue"]', '["RED", "blue"]')
    with pytest.raises(OutputParsingError, match=r"1: Input should be 'r' or 'g'"):
        await agentrt.build(service_for(list[Color]), model=model).ask("q")


T = TypeVar("T")


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (PartialStream[Result[int]], r"a Result\[int\] cannot be part of the value a model answers"),
        (Result[Result[int]], r"a Result\[int\] cannot be part of the value a model answers"),
        (list[TokenStream], r"a TokenStream cannot be part of the value a model answers"),
        (PartialStream[T], r"return type ~T is a type variable"),  # type: ignore[valid-type]
        (list[T], r"return type ~T is a type variable"),  # type: ignore[valid-type]
    ],
)
def test_values_that_hold_results_streams_or_type_variables_are_refused_at_build(
    annotation: Any, message: str
) -> None:
    async def ask(self: object, question: str) -> Any: ...

    ask.__annotations__["return"] = annotation
    with pytest.raises(agentrt.ConfigurationError, match=rf"Service\.ask: {message}"):
        agentrt.build(type("Service", (), {"ask": ask}), model=ScriptedModel())
