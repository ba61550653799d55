"""Declaring tools: `@tool`, parameter descriptions, JSON schemas from type hints.

A tool is a function or a method of an object passed to `build(..., tools=[...])`. Its arguments are
described by a pydantic model generated from the signature, once, at build time; the model's arguments
are validated against it before every call. Parameters the model never sees (the memory id, the
`ToolContext`) are injected by agentrt.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import inspect
import re
import typing
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Final,
    TypeVar,
    get_args,
    get_origin,
    overload,
)

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticSchemaGenerationError,
    RootModel,
    TypeAdapter,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .._errors import ConfigurationError
from .._spec import MemoryId
from ..models._protocol import ToolSpec
from ._docstrings import _docstring_parts

if TYPE_CHECKING:
    from .._pipeline._runtime import ToolRequest

__all__ = [
    "ApprovalPredicate",
    "Description",
    "NeedsApproval",
    "SchemaArguments",
    "ToolContext",
    "ToolDefinition",
    "ToolSource",
    "collect_tools",
    "schema_tool",
    "tool",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_TOOL_ATTR: Final = "__agentrt_tool__"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Description:
    """Describes a tool parameter for the model: `Annotated[str, Description("order number, e.g. SO-1")]`."""

    description: str


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Injected into a tool parameter annotated `ToolContext`: where this call comes from."""

    invocation_id: str
    method: str
    memory_id: Any
    call_id: str
    round: int


ApprovalPredicate = Callable[[Mapping[str, Any], ToolContext], bool | Awaitable[bool]]
"""Whether one call needs a human's approval, from its validated arguments (by parameter name) and
its `ToolContext`; may be async. One that raises counts as a refusal: the call is not run."""

NeedsApproval = bool | ApprovalPredicate
"""`True`: every call needs approval; `False`: none; a predicate: the calls it says."""


def check_needs_approval(value: object, where: str) -> None:
    """`ConfigurationError` unless `value` is a bool or a callable."""
    if not isinstance(value, bool) and not callable(value):
        raise ConfigurationError(f"{where}: needs_approval must be True, False or a predicate, got {value!r}")


@dataclass(frozen=True, slots=True)
class _ToolMarker:
    description: str | None
    name: str | None
    immediate: bool
    timeout: float | None
    needs_approval: NeedsApproval = False
    idempotent: bool = False


@overload
def tool(function: _F, /) -> _F: ...


@overload
def tool(
    description: str | None = None,
    /,
    *,
    name: str | None = None,
    immediate: bool = False,
    timeout: float | None = None,
    needs_approval: NeedsApproval = False,
    idempotent: bool = False,
) -> Callable[[_F], _F]: ...


def tool(
    description: str | Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    immediate: bool = False,
    timeout: float | None = None,
    needs_approval: NeedsApproval = False,
    idempotent: bool = False,
) -> Any:
    """Mark a function or method as a tool.

    - `description`: what the tool does, for the model (default: the docstring's first paragraph).
    - `name`: the name the model uses (default: the function name).
    - `immediate`: when every tool the model calls in a round is immediate, the invocation ends with
      their results instead of asking the model again.
    - `timeout`: seconds before the call counts as timed out (overrides `ToolSettings.timeout`).
    - `needs_approval`: `True` when every call waits for a human's approval before it runs, or a
      predicate `(arguments, context) -> bool` (sync or async) over the call's validated arguments
      (by parameter name) and its `ToolContext`: e.g. `lambda args, ctx: args["amount"] > 100`.
      A predicate that raises refuses the call (it is not run; the model is told). See
      `agentrt.Approvals` and `agentrt.resume`.
    - `idempotent`: running the call again has no further effect (its annotation `idempotentHint`).
      A durable turn (`agentrt.durable`) runs such a call again after a worker died inside it; any
      other call that started in a dead worker is reported to the model as of unknown outcome.
    """
    if callable(description):
        setattr(description, _TOOL_ATTR, _ToolMarker(None, None, False, None))
        return description
    check_needs_approval(needs_approval, f"@tool {name or description!r}")
    marker = _ToolMarker(description, name, immediate, timeout, needs_approval, idempotent)

    def decorate(function: _F) -> _F:
        if not callable(function):
            raise ConfigurationError(f"@tool applies to functions and methods, not {function!r}")
        setattr(function, _TOOL_ATTR, marker)
        return function

    return decorate


# --- schemas -------------------------------------------------------------------------------------


def _strip_titles(node: Any) -> Any:
    """A JSON schema without pydantic's `title` keys (they cost tokens and tell the model nothing)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                out[key] = {name: _strip_titles(schema) for name, schema in value.items()}
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    return node


_NO_ANNOTATIONS: Final[Mapping[str, Any]] = MappingProxyType({})
_IDEMPOTENT: Final[Mapping[str, Any]] = MappingProxyType({"idempotentHint": True})


class _Injected:
    MEMORY_ID: Final = "memory_id"
    CONTEXT: Final = "context"


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A tool ready to run: its spec for the model, its arguments model, and how to call it."""

    name: str
    description: str
    function: Callable[..., Any]
    arguments: type[BaseModel]
    parameters: Mapping[str, Any]
    injected: Mapping[str, str]
    is_async: bool
    fields: tuple[tuple[str, str], ...] = ()
    """(field of `arguments`, parameter name): fields have neutral names, the parameter is the alias,
    so a parameter may be called `json`, `schema` or `model_config` without clashing with pydantic."""
    immediate: bool = False
    timeout: float | None = None
    needs_approval: NeedsApproval = False
    """Whether a call waits for a human's approval (see `tool`)."""
    raw: bool = False
    """`function` takes the validated arguments as one dict, `arguments=`, as the model sent them
    (a tool declared by a JSON schema, `schema_tool`), not one keyword per parameter."""
    annotations: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _NO_ANNOTATIONS)
    """What the tool's owner says about it, as they said it (an MCP server's tool annotations:
    `readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`)."""
    _spec: ToolSpec = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Built once: every request of every invocation offers this same spec.
        spec = ToolSpec(name=self.name, description=self.description, parameters=self.parameters)
        object.__setattr__(self, "_spec", spec)

    @property
    def spec(self) -> ToolSpec:
        return self._spec


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether calling `function` (the callable itself, not what it wraps) gives a coroutine."""
    if inspect.iscoroutinefunction(function):
        return True
    if inspect.isroutine(function) or not callable(function):
        return False
    return inspect.iscoroutinefunction(type(function).__call__)  # an object with `async def __call__`


def _unwrap(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    if get_origin(annotation) is Annotated:
        base, *metadata = get_args(annotation)
        return base, tuple(metadata)
    return annotation, ()


def define_tool(function: Callable[..., Any], *, owner: str | None = None) -> ToolDefinition:
    """The definition of one tool (`ConfigurationError` naming the tool when it cannot be one)."""
    marker: _ToolMarker = getattr(function, _TOOL_ATTR, None) or _ToolMarker(None, None, False, None)
    label = f"tool {owner + '.' if owner else ''}{getattr(function, '__name__', function)!r}"
    name: str = marker.name or str(getattr(function, "__name__", ""))
    if not _NAME.match(name):
        raise ConfigurationError(f"{label}: name {name!r} must match [a-zA-Z0-9_-]{{1,64}}")
    summary, param_docs = _docstring_parts(inspect.getdoc(function))
    description = marker.description or summary
    if not description:
        raise ConfigurationError(f"{label}: give a description (@tool('...') or a docstring)")
    if marker.timeout is not None and marker.timeout <= 0:
        raise ConfigurationError(f"{label}: timeout must be positive, got {marker.timeout}")
    target = inspect.unwrap(function)
    if not inspect.isroutine(target) and not isinstance(target, functools.partial):
        target = type(target).__call__  # a callable object: its `__call__` carries the annotations
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(f"{label}: cannot resolve its annotations: {exc}") from exc

    fields: dict[str, Any] = {}
    names: list[tuple[str, str]] = []
    injected: dict[str, str] = {}
    for parameter in inspect.signature(function).parameters.values():
        pname = parameter.name
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigurationError(f"{label}: parameter {pname!r}: *args/**kwargs are not supported")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"{label}: parameter {pname!r} is positional-only; tools are called by keyword"
            )
        if pname not in hints:
            raise ConfigurationError(f"{label}: parameter {pname!r} needs a type annotation")
        base, metadata = _unwrap(hints[pname])
        if any(m is MemoryId for m in metadata):
            injected[pname] = _Injected.MEMORY_ID
            continue
        if base is ToolContext:
            injected[pname] = _Injected.CONTEXT
            continue
        described = [m.description for m in metadata if isinstance(m, Description)]
        kept = [m for m in metadata if not isinstance(m, Description)]
        annotation: Any = Annotated[(base, *kept)] if kept else base
        try:
            TypeAdapter[Any](annotation).json_schema()
        except (PydanticSchemaGenerationError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{label}: parameter {pname!r} of type {base!r} has no JSON schema: {exc}"
            ) from exc
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        about = described[0] if described else param_docs.get(pname)
        field_name = f"p{len(fields)}"
        fields[field_name] = (annotation, Field(default, description=about, alias=pname))
        names.append((field_name, pname))

    model_name = "".join(part.capitalize() for part in re.split(r"[_-]", name)) + "Arguments"
    arguments: type[BaseModel] = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
    schema = _strip_titles(arguments.model_json_schema(by_alias=True))
    schema.setdefault("properties", {})
    return ToolDefinition(
        name=name,
        description=description,
        function=function,
        arguments=arguments,
        parameters=schema,
        injected=injected,
        is_async=_is_async(function),
        fields=tuple(names),
        immediate=marker.immediate,
        timeout=marker.timeout,
        needs_approval=marker.needs_approval,
        annotations=_IDEMPOTENT if marker.idempotent else _NO_ANNOTATIONS,
    )


# --- tools declared by a JSON schema ----------------------------------------------------------------

_ARGUMENT: Final = "argument:"
"""Prefix of the `fields` of a `SchemaArguments` model: `getattr(arguments, "argument:path")` is the
argument `path` (`None` when the model left it out)."""


class SchemaArguments(RootModel[dict[str, Any]]):
    """The arguments of a tool declared by a JSON schema (`schema_tool`): the JSON object the model
    sent, checked by the tool's own `check` (which raises `ValueError` saying what is wrong), kept
    as it was. Each tool gets a subclass with its `check`."""

    check: ClassVar[Callable[[dict[str, Any]], None]]

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise PydanticCustomError("arguments_type", "the arguments must be a JSON object")
        try:
            cls.check(data)
        except ValueError as error:  # the message as it is (not "Value error, ...")
            raise PydanticCustomError("arguments_schema", str(error)) from None
        return data

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # The values an approval predicate sees, by parameter name (the tool's `fields`).
            if name.startswith(_ARGUMENT):
                return self.root.get(name[len(_ARGUMENT) :])
            return super().__getattr__(name)


def schema_tool(
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    function: Callable[..., Awaitable[Any]],
    *,
    check: Callable[[dict[str, Any]], None],
    timeout: float | None = None,
    needs_approval: NeedsApproval = False,
    annotations: Mapping[str, Any] | None = None,
) -> ToolDefinition:
    """A tool that is not a Python function's signature: its `parameters` JSON schema goes to the
    model as given, `check(arguments)` validates the model's arguments against it (raising
    `ValueError`), and `await function(arguments=...)` runs a call with them as one dict.

    Approval predicates see the arguments by the schema's property names (`None` for one the model
    left out)."""
    where = f"tool {name!r}"
    if not _NAME.match(name):
        raise ConfigurationError(f"{where}: name {name!r} must match [a-zA-Z0-9_-]{{1,64}}")
    check_needs_approval(needs_approval, where)
    if timeout is not None and timeout <= 0:
        raise ConfigurationError(f"{where}: timeout must be positive, got {timeout}")
    properties = parameters.get("properties")
    names = tuple(properties) if isinstance(properties, Mapping) else ()
    model_name = "".join(part.capitalize() for part in re.split(r"[_-]", name)) + "Arguments"
    arguments = type(model_name, (SchemaArguments,), {"check": staticmethod(check), "__module__": __name__})
    return ToolDefinition(
        name=name,
        description=description,
        function=function,
        arguments=arguments,
        parameters=parameters,
        injected={},
        is_async=True,
        fields=tuple((f"{_ARGUMENT}{key}", key) for key in names),
        timeout=timeout,
        needs_approval=needs_approval,
        raw=True,
        annotations=MappingProxyType(dict(annotations or {})),
    )


class ToolSource(abc.ABC):
    """Tools known only when a call runs, not when the service is built (an MCP server's).

    `build(..., tools=[source])` asks the source at each invocation, as it asks a `tool_provider`
    (which a source also is: `tool_provider=source`); its tools must not clash with the build's.
    """

    @abc.abstractmethod
    async def __call__(self, request: ToolRequest) -> Sequence[ToolDefinition]:
        """The source's tools for this invocation."""


_DEFINITIONS: weakref.WeakKeyDictionary[Any, ToolDefinition] = weakref.WeakKeyDictionary()


def _definition(item: Callable[..., Any], owner: str | None = None) -> ToolDefinition:
    """`define_tool`, computed once per underlying function and rebound to `item`."""
    function = getattr(item, "__func__", item)
    try:
        cached = _DEFINITIONS.get(function)
    except TypeError:
        cached = None
    if cached is None:
        cached = define_tool(item, owner=owner)
        with contextlib.suppress(TypeError):
            _DEFINITIONS[function] = cached
    return cached if cached.function is item else dataclasses.replace(cached, function=item)


def collect_tools(items: Iterable[object], *, where: str) -> dict[str, ToolDefinition]:
    """Tool definitions by name from functions, objects with `@tool` methods, and the definitions
    a `ToolSource` gives.

    Raises `ConfigurationError` for duplicate names, an object without tools, or something that is
    neither.
    """
    tools: dict[str, ToolDefinition] = {}

    def add(definition: ToolDefinition) -> None:
        if definition.name in tools:
            raise ConfigurationError(f"{where}: two tools are named {definition.name!r}")
        tools[definition.name] = definition

    for item in items:
        if isinstance(item, ToolDefinition):  # a tool source's
            add(item)
            continue
        if (
            inspect.isroutine(item)
            or isinstance(item, functools.partial)
            or (callable(item) and not inspect.isclass(item) and hasattr(item, _TOOL_ATTR))
        ):
            add(_definition(item))
            continue
        if inspect.isclass(item) or not hasattr(type(item), "__dict__"):
            raise ConfigurationError(
                f"{where}: {item!r} is not a tool: pass functions or objects with @tool methods"
            )
        found = False
        for attr in dir(type(item)):
            member = inspect.getattr_static(type(item), attr, None)
            function = getattr(member, "__func__", member)
            if function is None or not hasattr(function, _TOOL_ATTR):
                continue
            found = True
            add(_definition(getattr(item, attr), owner=type(item).__name__))
        if not found:
            raise ConfigurationError(f"{where}: {type(item).__name__} object has no @tool methods")
    return tools
