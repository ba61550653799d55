"""Parsers for declared return types: `str`, `None`, and every type pydantic validates.

A parser contributes to the request (a JSON-schema response format when the model declares the
capability, otherwise short format instructions for the user message) and turns the final answer
text into the value. Parsing errors become `OutputParsingError` carrying the raw text.

`TypeParser` reads any type through a pydantic `TypeAdapter`: scalars (`bool`, `int`, `float`,
`Decimal`, `Enum`, `Literal`, dates and times, `UUID`), containers of them, models, dataclasses,
`TypedDict`s and unions. It accepts what models answer: the JSON alone, in a fenced block, with prose
around it, after a `<think>` block, a bare scalar ("yes", "42", "POSITIVE"), or a scalar wrapped in an
object (`{"value": 42}`, which is how a schema that is not an object is asked for on providers that
require one at the top).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import re
import types
import uuid
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Protocol, Union, get_args, get_origin

import orjson
from pydantic import PydanticUserError, TypeAdapter, ValidationError

from .._errors import OutputParsingError
from ..models._protocol import JsonObjectFormat, JsonSchemaFormat
from ._extract import candidates, strip_thinking

if TYPE_CHECKING:
    from ..models._protocol import ResponseFormat

__all__ = [
    "NoneParser",
    "OutputParser",
    "SchemaError",
    "TextParser",
    "TypeParser",
    "extract_json",
    "parser_for",
]

WRAPPER: Final = "value"
"""The property a schema that is not an object is wrapped in."""
_BARE_MAX: Final = 200  # a longer answer is not a bare scalar
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]+")


class OutputParser(Protocol):
    """Turns the final answer text into the declared type."""

    @property
    def target(self) -> str:
        """The declared type, as users wrote it (for error messages)."""
        ...

    def response_format(self, mode: str) -> ResponseFormat | None:
        """The response format a request asks for in output `mode` (see `agentrt.output._modes`)."""
        ...

    def instructions(self, mode: str) -> str | None:
        """The format instructions for the user message in output `mode`."""
        ...

    def parse(self, text: str) -> Any: ...

    def accepts(self, value: Any) -> bool:
        """Whether `value` already is of the declared type (e.g. an immediate tool's return value)."""
        ...


class TextParser:
    """`-> str`: the answer text as it is."""

    target = "str"

    def response_format(self, mode: str) -> ResponseFormat | None:
        return None

    def instructions(self, mode: str) -> str | None:
        return None

    def parse(self, text: str) -> str:
        return text

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)


class NoneParser:
    """`-> None`: the call returns nothing (the answer's text is still in its `Result`)."""

    target = "None"

    def response_format(self, mode: str) -> ResponseFormat | None:
        return None

    def instructions(self, mode: str) -> str | None:
        return None

    def parse(self, text: str) -> None:
        return None

    def accepts(self, value: Any) -> bool:
        return value is None


def extract_json(text: str) -> str:
    """The likeliest JSON part of an answer: the first fenced block or balanced `{...}`/`[...]`
    span when the answer is not JSON itself (see `_extract.candidates`)."""
    found = candidates(text)
    answer = next(found)
    if answer[:1] in ("{", "[", '"') or answer in ("true", "false", "null"):
        return answer
    return next(found, answer)


def type_name(annotation: Any) -> str:
    """A type as users write it: `Ticket`, `list[Ticket]`, `Literal['a', 'b']`, `int | None`; the
    metadata of `Annotated` left out (it may hold validators, whose reprs are no type name)."""
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(arg) for arg in args)
    if isinstance(annotation, type) and not args:
        return annotation.__qualname__
    if origin is not None and args:
        name = getattr(annotation, "__name__", None) or type_name(origin)
        return f"{name}[{', '.join(type_name(arg) for arg in args)}]"
    return re.sub(
        r"\b(typing|typing_extensions|collections\.abc|datetime|decimal|uuid)\.", "", repr(annotation)
    )


def _is_scalar(schema: dict[str, Any], defs: dict[str, Any]) -> bool:
    """Whether a schema is a scalar (or a union of scalars): what a bare answer may be."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        return isinstance(target, dict) and _is_scalar(target, defs)
    if "enum" in schema or "const" in schema:
        return True
    kind = schema.get("type")
    if kind in ("boolean", "integer", "number", "string", "null"):
        return True
    options = schema.get("anyOf") or schema.get("oneOf") or ()
    return bool(options) and all(_is_scalar(option, defs) for option in options)


def _instructions(annotation: Any, schema: dict[str, Any]) -> str:
    """Short, exact format instructions for a type (what a model without a JSON mode is told)."""
    choices = _choices(annotation)
    if choices is not None:
        listed = "\n".join(choices)
        return f"You must answer strictly with one of these values, and nothing else:\n{listed}"
    simple = {
        bool: 'You must answer strictly with "true" or "false", and nothing else.',
        int: "You must answer strictly with an integer number, and nothing else.",
        float: "You must answer strictly with a number, and nothing else.",
        decimal.Decimal: "You must answer strictly with a number, and nothing else.",
        datetime.date: "You must answer strictly with a date in the format YYYY-MM-DD, and nothing else.",
        datetime.datetime: (
            "You must answer strictly with a date and time in ISO 8601 format "
            "(YYYY-MM-DDTHH:MM:SS), and nothing else."
        ),
        datetime.time: "You must answer strictly with a time in the format HH:MM:SS, and nothing else.",
        uuid.UUID: "You must answer strictly with a UUID, and nothing else.",
    }.get(annotation)
    if simple is not None:
        return simple
    kind = {"object": "a JSON object", "array": "a JSON array"}.get(schema.get("type", ""), "JSON")
    text = orjson.dumps(schema).decode()
    return f"You must answer strictly with {kind} that matches this JSON schema, and nothing else:\n{text}"


def _choices(annotation: Any) -> list[str] | None:
    """The values an `Enum` or `Literal` allows, as a model should write them."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    if get_origin(annotation) is Literal:
        return [str(value) for value in get_args(annotation)]
    return None


class TypeParser:
    """`-> T` for any type pydantic validates: JSON (or a bare scalar) validated by a `TypeAdapter`."""

    __slots__ = (
        "_defs",
        "_enum",
        "_object",
        "_scalar",
        "_schema",
        "_wrapped",
        "adapter",
        "annotation",
        "target",
    )

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.target = type_name(annotation)
        try:
            self.adapter: TypeAdapter[Any] = TypeAdapter(annotation)
            schema = self.adapter.json_schema()
        except PydanticUserError as exc:
            reason = str(exc).split("\n", 1)[0].split(". ", 1)[0]  # pydantic's first sentence
            raise SchemaError(f"{self.target} has no JSON schema ({reason})") from exc
        self._schema = schema
        defs = dict(schema.get("$defs", {}))
        self._defs = defs
        self._object = schema.get("type") == "object"
        self._scalar = _is_scalar(schema, defs)
        self._enum = (
            annotation if isinstance(annotation, type) and issubclass(annotation, enum.Enum) else None
        )
        if self._object:
            self._wrapped = schema
        else:
            inner = {key: value for key, value in schema.items() if key != "$defs"}
            wrapped: dict[str, Any] = {
                "type": "object",
                "properties": {WRAPPER: inner},
                "required": [WRAPPER],
                "additionalProperties": False,
            }
            if defs:
                wrapped["$defs"] = defs
            self._wrapped = wrapped

    @property
    def is_object(self) -> bool:
        """Whether the type's schema is an object (asked for as it is, not wrapped)."""
        return self._object

    @property
    def is_scalar(self) -> bool:
        """Whether the type is a scalar or a union of scalars (may be answered bare)."""
        return self._scalar

    @property
    def schema(self) -> dict[str, Any]:
        """The type's JSON schema (as asked for: wrapped in an object when it is not one)."""
        return self._wrapped

    def response_format(self, mode: str) -> ResponseFormat | None:
        if mode == "schema":
            name = _NAME.sub("_", self.target).strip("_")[:64] or "answer"
            return JsonSchemaFormat(name=name, schema=self._wrapped)
        if mode == "json":
            return JsonObjectFormat(schema=self._wrapped)
        return None  # instructions, or the answer tool's parameters

    def instructions(self, mode: str) -> str | None:
        if mode in ("schema", "tool"):
            return None
        if mode == "json" and not self._object:
            # JSON mode answers an object: the wrapped schema, said plainly.
            text = orjson.dumps(self._wrapped).decode()
            return (
                f'You must answer strictly with a JSON object whose "{WRAPPER}" is the answer, matching '
                f"this JSON schema, and nothing else:\n{text}"
            )
        return _instructions(self.annotation, self._schema)

    def accepts(self, value: Any) -> bool:
        try:
            self.adapter.validate_python(value, strict=True)
        except ValidationError:
            return False
        return True

    def parse(self, text: str) -> Any:
        error = None  # what the first JSON-looking candidate got wrong says the most
        for candidate in candidates(text):
            try:
                return self._from_json(candidate)
            except ValidationError as exc:
                if error is None and candidate[:1] in ("{", "[", '"'):
                    error = exc
        if self._scalar:
            bare = _bare(strip_thinking(text))  # "yes", "POSITIVE", 2026-12-01: not JSON, but clear
            if bare is not None:
                try:
                    return self._from_python(bare)
                except ValidationError as exc:
                    error = error or exc
        raise _parse_error(text, self.target, error)

    def _from_python(self, value: str) -> Any:
        """A bare scalar, as written (lax: "42" is an int, "yes" a bool); an Enum also by name."""
        try:
            return self.adapter.validate_python(value)
        except ValidationError:
            member = self._member(value)
            if member is None:
                raise
            return member

    def _from_json(self, candidate: str) -> Any:
        try:
            return self.adapter.validate_json(candidate)
        except ValidationError:
            if self._object and self._enum is None:
                raise
            data = _loads(candidate)
            if isinstance(data, dict) and len(data) == 1 and WRAPPER in data:
                data = data[WRAPPER]  # a wrapped answer
                if isinstance(data, str) and self._scalar:
                    return self._from_python(data)
                return self.adapter.validate_json(orjson.dumps(data))
            if isinstance(data, str) and self._enum is not None:
                member = self._member(data)
                if member is not None:
                    return member
            raise

    def _member(self, word: str) -> enum.Enum | None:
        """An Enum member by its value, then its name, case-insensitively."""
        if self._enum is None:
            return None
        folded = word.strip().casefold()
        for member in self._enum:
            if str(member.value).casefold() == folded:
                return member
        for member in self._enum:
            if member.name.casefold() == folded:
                return member
        return None


def _bare(text: str) -> str | None:
    """A short answer as a bare scalar: without quotes, backticks and a final full stop."""
    answer = text.strip()
    if not answer or len(answer) > _BARE_MAX or "\n" in answer:
        return None
    answer = answer.strip("`").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "\"'":
        answer = answer[1:-1]
    if answer.endswith(".") and not answer[:-1].replace(".", "").isdigit():
        answer = answer[:-1]
    return answer.strip() or None


def _loads(candidate: str) -> Any:
    try:
        return orjson.loads(candidate)
    except orjson.JSONDecodeError:
        return None


def _parse_error(text: str, target: str, error: ValidationError | None) -> OutputParsingError:
    """The error for an answer that is not a `target`: what was wrong, short and exact (at most three
    validation errors, each with where it was)."""
    if error is None:
        detail = "no JSON found in it"
    else:
        problems = []
        for problem in error.errors(include_url=False)[:3]:
            where = ".".join(str(part) for part in problem["loc"])
            problems.append(f"{where}: {problem['msg']}" if where else problem["msg"])
        more = error.error_count() - len(problems)
        detail = "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
    return OutputParsingError(
        f"the answer is not a valid {target}: {detail}", text=text, target=target, detail=detail
    )


def parser_for(annotation: Any) -> OutputParser:
    """The parser for a return annotation (`SchemaError` when pydantic cannot read the type)."""
    if annotation is str:
        return TextParser()
    if annotation is None or annotation is type(None):
        return NoneParser()
    return TypeParser(annotation)


class SchemaError(ValueError):
    """A declared return type has no JSON schema (reported by the caller with its method name)."""
