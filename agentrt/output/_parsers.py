"""Parsers for declared return types: `str`, `None`, and every type pydantic validates.

A parser contributes to the request (a JSON-schema response format when the model declares the
capability, otherwise short format instructions for the user message) and turns the final answer
text into the value. Parsing errors become `OutputParsingError` carrying the raw text.

`TypeParser` reads any type through a pydantic `TypeAdapter`: scalars (`bool`, `int`, `float`,
`Decimal`, `Enum`, `Literal`, dates and times, `UUID`), containers of them, models, dataclasses,
`TypedDict`s and unions. It accepts what models answer: the JSON alone, in a fenced block, with prose
around it, after a `<think>` block, a bare scalar ("yes", "42", "POSITIVE"), a scalar wrapped in an
object (`{"value": 42}`, which is how a schema that is not an object is asked for on providers that
require one at the top), a single-field envelope named for the type or the answer (`{"ticket": {...}}`,
`{"tickets": [...]}`, `{"result": ...}`), and a number or a yes/no in one short sentence ("The answer
is 42.", "Yes, it is."). Where two readings are possible (two numbers, "yes and no", an envelope with a
second field) the answer is refused: a wrong value is worse than a repair.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final, Protocol, get_origin

import orjson
from pydantic import PydanticUserError, TypeAdapter, ValidationError

from .._errors import OutputParsingError
from ..models._protocol import JsonObjectFormat, JsonSchemaFormat
from ._extract import SLICE, array_chunks, candidates, span_end, trim
from ._lenient import bare_scalar, member_named, replaced, said_in
from ._typeinfo import (
    NOT_ALNUM,
    enums_in,
    envelope_names,
    format_instructions,
    is_scalar,
    sentence_kinds,
    type_name,
)

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

NOTHING: Final = object()
"""What `TypeParser.by_name` returns when it changed nothing."""
_NOTHING: Final = NOTHING
WRAPPER: Final = "value"
"""The property a schema that is not an object is wrapped in."""
# Candidates validated at most per answer: each one that fails costs a few µs in pydantic, and an
# answer made of thousands of small spans ("[0] [1] [2] ...") is no answer to search for long.
_MAX_TRIED: Final = 256
_NONE_WORDS: Final = frozenset({"none", "null", "nil"})
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]+")
_FIRST_KEY: Final = re.compile(r'\{\s*"([^"\\]{1,64})"\s*:')


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


class TypeParser:
    """`-> T` for any type pydantic validates: JSON (or a bare scalar) validated by a `TypeAdapter`."""

    __slots__ = (
        "_chunked",
        "_defs",
        "_enums",
        "_envelopes",
        "_fields",
        "_kinds",
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
        self._scalar = is_scalar(schema, defs)
        self._enums = tuple(enums_in(annotation, set()))
        self._envelopes = envelope_names(annotation)
        properties = schema.get("properties") if self._object else None
        # An object type's own fields (`None`: a mapping, which any single-field object already is).
        self._fields = frozenset(properties) if isinstance(properties, dict) else None
        self._kinds = sentence_kinds(schema, defs) if self._scalar else frozenset()
        # A plain `list[X]`: a long answer is validated a slice of items at a time (one pydantic call
        # over a 10 MB list holds the GIL, so the event loop, for a fifth of a second or more).
        self._chunked = get_origin(annotation) is list
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
        return format_instructions(self.annotation, self._schema)

    def accepts(self, value: Any) -> bool:
        try:
            self.adapter.validate_python(value, strict=True)
        except ValidationError:
            return False
        return True

    def parse(self, text: str) -> Any:
        error = None  # what the first JSON-looking candidate got wrong says the most
        tried = 0
        for candidate in candidates(text):
            if error is not None and self._object and candidate[:1] == "[":
                continue  # an array is never an object (said once, by the first one's error)
            if len(candidate) > SLICE and candidate[:1] not in ("{", "[", '"'):
                continue  # prose around JSON: not read whole by pydantic (one long call) to fail
            tried += 1
            if tried > _MAX_TRIED:
                break  # an answer with this many JSON-like parts gets a repair, not a guess
            try:
                return self._from_json(candidate)
            except ValidationError as exc:
                if error is None and candidate[:1] in ("{", "[", '"'):
                    error = exc
        bare = bare_scalar(text)  # "yes", "POSITIVE", 2026-12-01: not JSON, but clear
        if bare is not None and self._scalar:
            try:
                return self._from_python(bare)
            except ValidationError as exc:
                error = error or exc
            said = self._in_sentence(bare)  # "The answer is 42.", "Yes, it is."
            if said is not _NOTHING:
                return said
        elif bare is not None and bare.casefold() in _NONE_WORDS:
            try:
                return self.adapter.validate_python(None)  # "None" for an `Optional[Model]`
            except ValidationError:
                pass
        raise _parse_error(text, self.target, error)

    def _from_python(self, value: str) -> Any:
        """A bare scalar, as written (lax: "42" is an int, "yes" a bool; an Enum also by name;
        "None" is `None` where the type allows it)."""
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            fixed = self.by_name(value, exc)
            if fixed is _NOTHING:
                if value.casefold() in _NONE_WORDS:
                    try:
                        return self.adapter.validate_python(None)
                    except ValidationError:
                        pass
                raise
            try:
                return self.adapter.validate_python(fixed)
            except ValidationError:
                raise exc from None

    def _from_json(self, candidate: str) -> Any:
        if len(candidate) > SLICE:
            if self._chunked:
                value = self._in_chunks(candidate)
                if value is not _NOTHING:
                    return value
            # Not handed to pydantic whole unless it may be JSON: jiter reads a 10 MB array to its
            # end before it finds the prose after it, in one call that holds the GIL.
            end = span_end(candidate) if candidate[:1] in ("{", "[") else len(candidate)
            if end != len(candidate):
                raise _not_json(candidate, end)
            if self._object and candidate[:1] == "[":
                self.adapter.validate_json("[]")  # what a long array gets: it is no object
        wrapped = None  # what was wrong with a wrapped answer's value
        envelope = self._envelope(candidate)
        # A wrapped answer ({"value": ...}, as a schema that is not an object is asked for) is read
        # unwrapped first: a type that also accepts the wrapper itself (a model whose fields all
        # have defaults, a dict, `Any`) would otherwise take it as the answer. So is an envelope
        # around a model ({"ticket": {...}}), which a model ignoring unknown fields would accept.
        first = envelope is not None and (envelope[0] == WRAPPER or self._object)
        if envelope is not None and first:
            try:
                return self._unwrapped(envelope[1])
            except ValidationError as exc:
                wrapped = exc  # then the object as it is
        try:
            return self.adapter.validate_json(candidate)
        except ValidationError as exc:
            if envelope is not None and not first:
                try:
                    return self._unwrapped(envelope[1])  # {"tickets": [...]}, {"result": 42}
                except ValidationError:
                    pass
            if wrapped is not None:
                raise wrapped from None  # it says more than that the object is no int
            return self._named(_loads(candidate) if self._enums else _NOTHING, exc)

    def _in_chunks(self, candidate: str) -> Any:
        """A long list, bare or in an envelope, validated a chunk of items at a time; `_NOTHING` when
        it cannot be cut (nested items) or does not validate (then it is validated whole, for the
        error that names the item)."""
        array = candidate
        if candidate[:1] == "{":
            head = _FIRST_KEY.match(candidate, 0, 256)
            if head is None or NOT_ALNUM.sub("", head.group(1).casefold()) not in self._envelopes:
                return _NOTHING
            body = candidate.rstrip()
            if body[-1:] != "}":
                return _NOTHING
            array = body[head.end() : -1].strip()  # the only field's value reaches the end
        chunks = array_chunks(array)
        if chunks is None:
            return _NOTHING
        values: list[Any] = []
        try:
            for chunk in chunks:
                values.extend(self.adapter.validate_json(chunk))
        except ValidationError:
            return _NOTHING
        return values

    def _envelope(self, candidate: str) -> tuple[str, Any] | None:
        """(key, value) of a single-field object around the answer: `{"value": ...}` for a type
        that is not an object, or a key naming the type or the answer (`ticket`, `tickets`,
        `result`, ...) that is none of its fields. Only such a first key makes the whole candidate
        be read a second time."""
        if candidate[:1] != "{":
            return None
        head = _FIRST_KEY.match(candidate, 0, 256)
        if head is None:
            return None
        key = head.group(1)
        if key == WRAPPER and not self._object:
            pass
        elif self._object and (self._fields is None or key in self._fields):
            return None  # a mapping, or a field: the object as it is
        elif NOT_ALNUM.sub("", key.casefold()) not in self._envelopes:
            return None
        data = _loads(candidate)
        if isinstance(data, dict) and len(data) == 1 and key in data:
            return key, data[key]
        return None

    def _unwrapped(self, inner: Any) -> Any:
        if isinstance(inner, str) and self._scalar:
            return self._from_python(inner)
        return self._from_data(inner)

    def _in_sentence(self, sentence: str) -> Any:
        """The one number, or the yes or no it starts with, of a short sentence, as the type
        (`_NOTHING` when there is none, or more than one reading)."""
        found = said_in(sentence, self._kinds)
        if found is None:
            return _NOTHING
        try:
            return self.adapter.validate_python(found)
        except ValidationError:
            return _NOTHING

    def _from_data(self, data: Any) -> Any:
        """A value read from JSON, validated as JSON (Enums also by name)."""
        try:
            return self.adapter.validate_json(orjson.dumps(data))
        except ValidationError as exc:
            return self._named(data, exc)

    def _named(self, data: Any, error: ValidationError) -> Any:
        """What `data` (read from JSON) validates to once the Enum members it names are read; raises
        `error` (what was wrong with it as it is) when it names none, or still does not validate."""
        fixed = self.by_name(data, error) if self._enums and data is not _NOTHING else _NOTHING
        if fixed is _NOTHING:
            raise error
        try:
            return self.adapter.validate_json(orjson.dumps(fixed))
        except ValidationError:
            raise error from None

    def by_name(self, data: Any, error: ValidationError) -> Any:
        """`data` (read from JSON, changed in place) with each string that failed as an Enum
        replaced by the member it names: by value, then by name, case-insensitively, wherever the
        Enum is in the type (in a list, an `Optional`, a model's field, ...). `_NOTHING` when no
        string named a member."""
        changed = False
        for problem in error.errors(include_url=False):
            if problem["type"] != "enum" or not isinstance(problem["input"], str):
                continue
            member = member_named(
                self._enums, problem["input"], str(problem.get("ctx", {}).get("expected", ""))
            )
            if member is not None:
                data, put = replaced(data, problem["loc"], problem["input"], member.value)
                changed = changed or put
        return data if changed else _NOTHING


def _not_json(text: str, end: int) -> ValidationError:
    """The error pydantic gives a text that is not one JSON value, without reading it whole: after
    a balanced span that ends at `end`, the trailing characters' place, as pydantic says it."""
    if end < 0:
        detail = "no complete JSON value at line 1 column 1"
    else:
        at = trim(text, end, len(text))[0]
        line_start = text.rfind("\n", 0, at) + 1
        detail = f"trailing characters at line {text.count(chr(10), 0, at) + 1} column {at - line_start + 1}"
    return ValidationError.from_exception_data(
        "json", [{"type": "json_invalid", "loc": (), "input": text, "ctx": {"error": detail}}]
    )


def _loads(candidate: str) -> Any:
    """The candidate's JSON value; `_NOTHING` when it is not JSON."""
    try:
        return orjson.loads(candidate)
    except orjson.JSONDecodeError:
        return _NOTHING


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
