"""A service method's parameters besides its template variables, for `_spec`: contents (which
classes, one or many, and the model capability each needs), call options (parameters typed `Budget`
or `ModelSettings`, and the method's own options their defaults make), and the function that binds
a call's arguments by name."""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Final, get_args, get_origin

from ._budget import Budget
from ._errors import ConfigurationError
from ._messages import AudioContent, ImageContent, PdfContent, TextContent, VideoContent
from ._options import CallOptions, method_options_of
from .models._protocol import ModelSettings

if typing.TYPE_CHECKING:
    from collections.abc import Callable

CONTENT_CLASSES: Final[dict[type[Any], str]] = {
    TextContent: "text",
    ImageContent: "image",
    AudioContent: "audio",
    VideoContent: "video",
    PdfContent: "pdf",
}
_SEQUENCES: Final = (list, tuple, collections.abc.Sequence)
CAPABILITY_FOR: Final = {
    "image": "image_input",
    "audio": "audio_input",
    "video": "video_input",
    "pdf": "pdf_input",
}


def content_type(annotation: Any) -> tuple[tuple[type[Any], ...], bool] | None:
    """(content classes, is_sequence) when the annotation declares a content parameter."""
    annotation, _ = unwrap(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in _SEQUENCES and args:
        inner = content_type(args[0])
        return (inner[0], True) if inner is not None and not inner[1] else None
    if origin in (typing.Union, types.UnionType):
        found: list[type[Any]] = []
        for member in args:
            if member is type(None):
                continue
            inner = content_type(member)
            if inner is None or inner[1]:
                return None
            found.extend(inner[0])
        return (tuple(found), False) if found else None
    if isinstance(annotation, type) and annotation in CONTENT_CLASSES:
        return (annotation,), False
    return None


@dataclass(frozen=True, slots=True)
class ContentParam:
    name: str
    classes: tuple[type[Any], ...]
    many: bool


def method_options(
    qualname: str, function: Callable[..., Any], signature: inspect.Signature, params: list[tuple[str, str]]
) -> CallOptions | None:
    """The method's own options: the defaults of its option parameters, under `@method_options`.

    A default written in the stub belongs to the method, not to each call: an enclosing
    `call_options(...)` block overrides it.
    """
    budget = settings = None
    for param, kind in params:
        default = signature.parameters[param].default
        if default is inspect.Parameter.empty or default is None:
            continue
        if kind == "budget" and isinstance(default, Budget):
            budget = default
        elif kind == "settings" and isinstance(default, ModelSettings):
            settings = default
        else:
            raise ConfigurationError(f"{qualname}: parameter {param!r} has a default of the wrong type")
    decorated = method_options_of(function)
    if budget is None and settings is None:
        return decorated
    own = CallOptions(budget, settings)
    return decorated.over(own) if decorated is not None else own


def binder(parameters: list[inspect.Parameter]) -> Callable[..., dict[str, Any]]:
    """A function with the stub's parameters (after `self`) that returns the arguments by name.

    Python binds a call's arguments several times faster than `inspect.Signature.bind`; on a
    `TypeError` the caller binds again with `inspect` for its message. Names are identifiers and
    defaults are the stub's own objects, passed in, never written into the source.
    """
    params: list[str] = []
    defaults: dict[str, Any] = {}
    marker = None
    for parameter in parameters:
        name = parameter.name
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and marker is None:
            params.append("*")
            marker = "*"
        text = name
        if parameter.default is not inspect.Parameter.empty:
            defaults[f"_default_{name}"] = parameter.default
            text = f"{name}=_default_{name}"
        params.append(text)
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            last_positional_only = len(params)
    positional_only = [p for p in parameters if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only:
        params.insert(last_positional_only, "/")
    names = ", ".join(f"{p.name!r}: {p.name}" for p in parameters)
    source = f"def bind({', '.join(params)}):\n    return {{{names}}}\n"
    namespace: dict[str, Any] = dict(defaults)
    exec(compile(source, "<agentrt binder>", "exec"), namespace)
    binder: Callable[..., dict[str, Any]] = namespace["bind"]
    return binder


def option_kind(annotation: Any) -> str | None:
    """ "budget" or "settings" for a parameter typed `Budget` / `ModelSettings` (or optional)."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        members = [m for m in get_args(annotation) if m is not type(None)]
        if len(members) != 1:
            return None
        annotation = members[0]
    if annotation is Budget:
        return "budget"
    if annotation is ModelSettings:
        return "settings"
    return None


def unwrap(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    if get_origin(annotation) is Annotated:
        base, *metadata = get_args(annotation)
        return base, tuple(metadata)
    return annotation, ()
