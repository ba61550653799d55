"""Parsers for declared return types (`str` and pydantic models, for now).

A parser contributes to the request (a JSON-schema response format when the model declares the
capability, otherwise format instructions for the user message) and turns the final answer text into
the value. Parsing errors become `OutputParsingError` carrying the raw text.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from pydantic import BaseModel, PydanticUserError, ValidationError

from .._errors import OutputParsingError
from ..models._protocol import JsonObjectFormat, JsonSchemaFormat

if TYPE_CHECKING:
    from ..models._protocol import Capabilities, ResponseFormat

__all__ = ["ModelParser", "OutputParser", "TextParser", "extract_json", "parser_for"]


class OutputParser(Protocol):
    """Turns the final answer text into the declared type."""

    @property
    def target(self) -> str:
        """The declared type, as users wrote it (for error messages)."""
        ...

    def response_format(self, capabilities: Capabilities) -> ResponseFormat | None: ...

    def instructions(self, capabilities: Capabilities) -> str | None: ...

    def parse(self, text: str) -> Any: ...

    def accepts(self, value: Any) -> bool:
        """Whether `value` already is of the declared type (e.g. an immediate tool's return value)."""
        ...


class TextParser:
    """`-> str`: the answer text as it is."""

    target = "str"

    def response_format(self, capabilities: Capabilities) -> ResponseFormat | None:
        return None

    def instructions(self, capabilities: Capabilities) -> str | None:
        return None

    def parse(self, text: str) -> str:
        return text

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def extract_json(text: str) -> str:
    """The JSON part of an answer: the text itself, a fenced ```json block, or the outermost braces."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        return stripped
    fenced = _FENCE.search(stripped)
    if fenced:
        return fenced.group(1).strip()
    start, end = stripped.find("{"), stripped.rfind("}")
    if 0 <= start < end:
        return stripped[start : end + 1]
    return stripped


class ModelParser:
    """`-> SomeModel`: JSON validated by the pydantic model."""

    __slots__ = ("_schema", "model", "target")

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.target = model.__name__
        self._schema = model.model_json_schema()  # may raise; `parser_for` reports it

    def response_format(self, capabilities: Capabilities) -> ResponseFormat | None:
        if capabilities.json_schema:
            return JsonSchemaFormat(name=self.model.__name__, schema=self._schema)
        if capabilities.json_object:
            return JsonObjectFormat(schema=self._schema)
        return None

    def instructions(self, capabilities: Capabilities) -> str | None:
        if capabilities.json_schema:
            return None
        schema = orjson.dumps(self._schema).decode()
        return (
            "You must answer strictly with a JSON object that matches this JSON schema, "
            f"and nothing else:\n{schema}"
        )

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.model)

    def parse(self, text: str) -> BaseModel:
        try:
            return self.model.model_validate_json(extract_json(text))
        except ValidationError as exc:
            raise OutputParsingError(
                f"the answer is not a valid {self.target}: {exc.error_count()} error(s), "
                f"first: {exc.errors()[0]['msg']}",
                text=text,
                target=self.target,
            ) from exc


def parser_for(annotation: Any) -> OutputParser | None:
    """The parser for a return annotation, or `None` when the type is not supported."""
    if annotation is str:
        return TextParser()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        try:
            return ModelParser(annotation)
        except PydanticUserError as exc:
            raise SchemaError(f"{annotation.__name__} has no JSON schema: {exc}") from exc
    return None


class SchemaError(ValueError):
    """A declared return type has no JSON schema (reported by the caller with its method name)."""
