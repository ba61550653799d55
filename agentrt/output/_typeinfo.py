"""What a declared return type is, for `TypeParser`: its name as users write it, whether it may be
answered as a bare scalar (and as what kinds of one), the Enums it holds, the envelope names an
answer may wrap it in, and the format instructions a model without a JSON mode is told."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import re
import types
import typing
import uuid
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import orjson
from pydantic import BaseModel

# Keys of a single-field object around the answer, besides the type's own name (normalized: lower
# case, letters and digits only).
_ENVELOPES: Final = frozenset({"value", "result", "answer", "output", "response", "data"})
NOT_ALNUM: Final = re.compile(r"[^0-9a-z]+")


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


def is_scalar(schema: dict[str, Any], defs: dict[str, Any]) -> bool:
    """Whether a schema is a scalar (or a union of scalars): what a bare answer may be."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        return isinstance(target, dict) and is_scalar(target, defs)
    if "enum" in schema or "const" in schema:
        return True
    kind = schema.get("type")
    if kind in ("boolean", "integer", "number", "string", "null"):
        return True
    options = schema.get("anyOf") or schema.get("oneOf") or ()
    return bool(options) and all(is_scalar(option, defs) for option in options)


def format_instructions(annotation: Any, schema: dict[str, Any]) -> str:
    """Short, exact format instructions for a type (what a model without a JSON mode is told)."""
    choices = allowed_values(annotation)
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


def allowed_values(annotation: Any) -> list[str] | None:
    """The values an `Enum` or `Literal` allows, as a model should write them."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    if get_origin(annotation) is Literal:
        return [str(value) for value in get_args(annotation)]
    return None


def enums_in(annotation: Any, seen: set[Any]) -> list[type[enum.Enum]]:
    """The Enums a type can hold: itself, in its arguments, in the fields of its models, dataclasses
    and TypedDicts (each class visited once)."""
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return [annotation]
        if annotation in seen:
            return []
        seen.add(annotation)
        hints: list[Any] = []
        if issubclass(annotation, BaseModel):
            hints = [field.annotation for field in annotation.model_fields.values()]
        elif dataclasses.is_dataclass(annotation) or hasattr(annotation, "__required_keys__"):
            try:
                hints = list(typing.get_type_hints(annotation).values())
            except Exception:  # unresolvable forward references: pydantic resolved what it needed
                hints = []
        found: list[type[enum.Enum]] = []
        for hint in hints:
            found.extend(e for e in enums_in(hint, seen) if e not in found)
        return found
    found = []
    for arg in get_args(annotation):
        found.extend(e for e in enums_in(arg, seen) if e not in found)
    return found


def envelope_names(annotation: Any) -> frozenset[str]:
    """The keys an envelope around the type may have: the generic ones, and the names of the
    classes in it (`Ticket` in `list[Ticket] | None`), singular and plural, normalized."""
    names = set(_ENVELOPES)
    for name in class_names(annotation):
        base = NOT_ALNUM.sub("", name.casefold())
        names.update((base, base + "s", base + "es"))
        if base.endswith("y"):
            names.add(base[:-1] + "ies")
    return frozenset(names)


def class_names(annotation: Any) -> list[str]:
    """The user classes a type is made of, through containers and unions (not a mapping's values)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return class_names(get_args(annotation)[0])
    if origin is not None:
        if isinstance(origin, type) and issubclass(origin, dict):
            return []
        return [name for arg in get_args(annotation) for name in class_names(arg)]
    if isinstance(annotation, type) and annotation.__module__ not in _BUILTIN_MODULES:
        return [annotation.__name__]
    return []


_BUILTIN_MODULES: Final = frozenset({"builtins", "datetime", "decimal", "uuid", "typing", "pathlib"})


def sentence_kinds(schema: dict[str, Any], defs: dict[str, Any]) -> frozenset[str]:
    """What a scalar schema may be read from in a sentence: "boolean", "number"."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        return sentence_kinds(target, defs) if isinstance(target, dict) else frozenset()
    if "enum" in schema or "const" in schema:
        return frozenset()
    kinds: set[str] = set()
    kind = schema.get("type")
    if kind == "boolean":
        kinds.add("boolean")
    elif kind in ("integer", "number"):
        kinds.add("number")
    for option in schema.get("anyOf") or schema.get("oneOf") or ():
        kinds |= sentence_kinds(option, defs)
    return frozenset(kinds)
