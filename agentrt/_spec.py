"""Declaring services: markers, decorators, and the method specs computed once per class.

Everything a call needs that does not depend on its arguments is worked out here, when a class is
built: which parameter is the memory id, which are contents, which feed templates, what the return type
asks of the model. Every mistake is a `ConfigurationError` naming `Class.method` and the parameter.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, get_args, get_origin

from ._budget import Budget
from ._errors import ConfigurationError
from ._events import Result
from ._messages import (
    TextContent,
    UserContent,
    UserMessage,
)
from ._options import CallOptions
from ._spec_params import (
    CAPABILITY_FOR,
    CONTENT_CLASSES,
    ContentParam,
    binder,
    content_type,
    method_options,
    option_kind,
    unwrap,
)
from ._stream import PartialStream, TokenStream
from ._stubs import is_stub
from ._templates import Template, format_value
from .models._protocol import ModelSettings
from .output import OutputParser, TextParser, parser_for
from .output._parsers import SchemaError, TypeParser
from .output._typeinfo import type_name

if typing.TYPE_CHECKING:
    from .models._protocol import Capabilities

__all__ = [
    "MemoryId",
    "MethodSpec",
    "ServiceSpec",
    "TemplateName",
    "service_spec",
    "system_message",
    "user_message",
]

_T = TypeVar("_T")

_USER_ATTR: Final = "__agentrt_user_message__"
_SYSTEM_ATTR: Final = "__agentrt_system_message__"


class _MemoryIdMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MemoryId"


MemoryId: Final = _MemoryIdMarker()
"""Marks the parameter that selects the conversation: `Annotated[str, MemoryId]`."""


@dataclass(frozen=True, slots=True)
class TemplateName:
    """Names a parameter for templates: `Annotated[str, TemplateName("topic")]` is `{{topic}}`."""

    name: str


def _decorate(attr: str, template: str, decorator: str) -> Callable[[_T], _T]:
    parsed = Template(template, where=f"@{decorator}")

    def decorate(target: _T) -> _T:
        if inspect.isclass(target):
            if attr == _USER_ATTR:
                raise ConfigurationError(
                    f"{target.__qualname__}: @user_message applies to methods, not classes"
                )
        elif inspect.isfunction(target):
            if not inspect.iscoroutinefunction(target):
                raise ConfigurationError(
                    f"{target.__qualname__}: a service method must be declared `async def`"
                )
        else:
            raise ConfigurationError(f"@{decorator} applies to a class or an `async def` method")
        setattr(target, attr, parsed)
        return target

    return decorate


def system_message(template: str, /) -> Callable[[_T], _T]:
    """The system message of a class (all its methods) or of one method (which takes priority).

    The template may use the method's variables (`{{name}}`) and the `variables=` given to `build`.
    """
    return _decorate(_SYSTEM_ATTR, template, "system_message")


def user_message(template: str, /) -> Callable[[_T], _T]:
    """The user message template of a method. `{{it}}` is the only parameter when there is one."""
    return _decorate(_USER_ATTR, template, "user_message")


# --- method specs ------------------------------------------------------------------------------


class OutputKind:
    VALUE: Final = "value"
    RESULT: Final = "result"
    STREAM: Final = "stream"
    PARTIAL: Final = "partial"
    """A `PartialStream`: snapshots of a structured value as it streams in."""


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """What agentrt knows about one service method before it is ever called."""

    qualname: str
    name: str
    function: Callable[..., Any]
    signature: inspect.Signature
    memory_param: str | None
    variables: tuple[tuple[str, str], ...]
    """(parameter, template variable name) for every parameter that feeds templates."""
    contents: tuple[ContentParam, ...]
    user_template: Template | None
    user_param: str | None
    """Without a user template: the parameter whose value is the user message."""
    system_template: Template | None
    output_kind: str
    parser: OutputParser
    unbound: tuple[tuple[str, str], ...]
    """Parameters no template uses (reported by `check`, after unknown template variables)."""
    binder: Callable[..., dict[str, Any]] = dict
    """The stub's parameters as a function that returns them by name (see `_spec_params.binder`)."""
    option_params: tuple[tuple[str, str], ...] = ()
    """(parameter, "budget" or "settings") for parameters that carry the call's options."""
    options: CallOptions | None = None
    """The method's own options (`@method_options`)."""

    def call_options(self, arguments: Mapping[str, Any]) -> CallOptions | None:
        """The options this call's arguments carry (typed parameters), if any."""
        budget = settings = None
        defaults = self.signature.parameters
        for param, kind in self.option_params:
            value = arguments[param]
            if value is None or value is defaults[param].default:
                continue  # a stub's default is the method's option (see `_spec_params.method_options`)
            if kind == "budget":
                if not isinstance(value, Budget):
                    raise TypeError(f"{self.qualname}(): {param!r} must be a Budget, got {value!r}")
                budget = value
            else:
                if not isinstance(value, ModelSettings):
                    raise TypeError(f"{self.qualname}(): {param!r} must be ModelSettings, got {value!r}")
                settings = value
        return CallOptions(budget, settings) if budget is not None or settings is not None else None

    def check(self, static: Mapping[str, str], capabilities: Capabilities, model: str) -> None:
        """Build-time checks that depend on the build's configuration."""
        own = {variable for _, variable in self.variables}
        if len(self.variables) == 1:
            own.add("it")
        for variable in static:
            if variable in own:
                raise ConfigurationError(
                    f"{self.qualname}: build variable {variable!r} has the same name as a parameter"
                )
        for label, template in (
            ("@user_message", self.user_template),
            ("@system_message", self.system_template),
        ):
            if template is None:
                continue
            for variable in template.variables:
                if variable not in own and variable not in static:
                    raise ConfigurationError(
                        f"{self.qualname}: template variable {{{{{variable}}}}} in {label} matches "
                        "no parameter and no build variable"
                    )
        for param, variable in self.unbound:
            raise ConfigurationError(
                f"{self.qualname}: parameter {param!r} binds to nothing: no template uses {{{{{variable}}}}}"
            )
        for content in self.contents:
            for cls in content.classes:
                flag = CAPABILITY_FOR.get(CONTENT_CLASSES[cls])
                if flag and not getattr(capabilities, flag):
                    raise ConfigurationError(
                        f"{self.qualname}: parameter {content.name!r} takes {cls.__name__}, but "
                        f"model {model!r} does not declare Capabilities.{flag}"
                    )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied (`TypeError` like a call)."""
        try:
            return self.binder(*args, **kwargs)
        except TypeError:
            pass
        try:  # the binder's own message names the binder; say it as `inspect` does
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.qualname}(): {exc}") from None
        bound.apply_defaults()
        return bound.arguments

    def template_values(self, arguments: Mapping[str, Any], static: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = dict(static) if static else {}
        for param, variable in self.variables:
            values[variable] = arguments[param]
        if len(self.variables) == 1:
            values["it"] = arguments[self.variables[0][0]]
        return values

    def render_user(self, arguments: Mapping[str, Any], values: Mapping[str, Any]) -> UserMessage:
        contents: list[UserContent] = []
        if self.user_template is not None:
            contents.append(TextContent(text=self.user_template.render(values)))
        elif self.user_param is not None:
            contents.append(TextContent(text=format_value(arguments[self.user_param])))
        for param in self.contents:
            value = arguments[param.name]
            if value is None:
                continue
            items = value if param.many else (value,)
            if param.many and not isinstance(value, list | tuple):
                raise TypeError(f"{self.qualname}(): {param.name!r} must be a list of contents")
            for item in items:
                if not isinstance(item, param.classes):
                    expected = " or ".join(c.__name__ for c in param.classes)
                    raise TypeError(
                        f"{self.qualname}(): {param.name!r} must be {expected}, got {type(item).__name__}"
                    )
                contents.append(item)
        if not contents:
            raise ValueError(f"{self.qualname}(): the user message is empty")
        return UserMessage(contents=tuple(contents))


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    cls: type[Any]
    methods: Mapping[str, MethodSpec]


def _output(qualname: str, hints: Mapping[str, Any]) -> tuple[str, OutputParser]:
    try:
        return _output_kind(qualname, hints)
    except SchemaError as exc:
        raise ConfigurationError(f"{qualname}: return type {exc}") from exc


def _output_kind(qualname: str, hints: Mapping[str, Any]) -> tuple[str, OutputParser]:
    if "return" not in hints:
        raise ConfigurationError(f"{qualname}: declare a return type (str, a pydantic model, ...)")
    annotation, _ = unwrap(hints["return"])
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is TokenStream or (
        origin in (collections.abc.AsyncIterator, collections.abc.AsyncIterable) and args == (str,)
    ):
        return OutputKind.STREAM, TextParser()
    if (
        annotation is PartialStream
        or origin is PartialStream
        or (origin in (collections.abc.AsyncIterator, collections.abc.AsyncIterable))
    ):
        if not args:
            raise ConfigurationError(
                f"{qualname}: say what it streams: PartialStream[Ticket], TokenStream, ..."
            )
        item = args[0]
        if item is str or unwrap(item)[0] is str:
            raise ConfigurationError(f"{qualname}: a stream of str is a TokenStream (or AsyncIterator[str])")
        _check_value_type(qualname, item)
        parser = parser_for(item)
        if not isinstance(parser, TypeParser):
            raise ConfigurationError(f"{qualname}: a stream of {type_name(item)} has no values to stream")
        return OutputKind.PARTIAL, parser
    if annotation is Result or origin is Result:
        inner = args[0] if args else str
        if inner is TokenStream or get_origin(inner) in (
            collections.abc.AsyncIterator,
            collections.abc.AsyncIterable,
            PartialStream,
        ):
            raise ConfigurationError(
                f"{qualname}: return type Result[{type_name(inner)}] is not supported: "
                "a stream's Result is `await stream.result()`"
            )
        _check_value_type(qualname, inner)
        return OutputKind.RESULT, parser_for(inner)
    # The declared type as it is: `Annotated` metadata (a discriminator, constraints) is validation.
    _check_value_type(qualname, annotation)
    return OutputKind.VALUE, parser_for(annotation if annotation is str else hints["return"])


def _check_value_type(qualname: str, annotation: Any) -> None:
    """A value the model answers cannot hold a `Result`, a stream or a type variable (which would be
    asked for as agentrt's own classes, or as anything)."""
    if isinstance(annotation, typing.TypeVar):
        raise ConfigurationError(
            f"{qualname}: return type {annotation} is a type variable; declare the type it stands for"
        )
    if annotation is Result or annotation is TokenStream or annotation is PartialStream:
        raise ConfigurationError(
            f"{qualname}: a {annotation.__name__} cannot be part of the value a model answers"
        )
    origin = get_origin(annotation)
    if origin in (Result, PartialStream, collections.abc.AsyncIterator, collections.abc.AsyncIterable):
        raise ConfigurationError(
            f"{qualname}: a {type_name(annotation)} cannot be part of the value a model answers"
        )
    for arg in get_args(annotation):
        if isinstance(arg, type) or get_origin(arg) is not None or isinstance(arg, typing.TypeVar):
            _check_value_type(qualname, arg)


def _method_spec(cls: type[Any], function: Callable[..., Any]) -> MethodSpec:
    qualname = f"{cls.__name__}.{function.__name__}"
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(f"{qualname}: cannot resolve its annotations: {exc}") from exc
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(f"{qualname}: a service method takes `self` first")
    parameters = parameters[1:]

    memory: str | None = None
    variables: list[tuple[str, str]] = []
    contents: list[ContentParam] = []
    options: list[tuple[str, str]] = []
    for parameter in parameters:
        name = parameter.name
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigurationError(
                f"{qualname}: parameter {name!r}: *args and **kwargs cannot bind to a prompt"
            )
        base, metadata = unwrap(hints.get(name, Any))
        is_memory = any(m is MemoryId for m in metadata)
        aliases = [m.name for m in metadata if isinstance(m, TemplateName)]
        content = content_type(base)
        option = option_kind(base)
        if option is not None:
            if is_memory or aliases:
                raise ConfigurationError(
                    f"{qualname}: parameter {name!r} is a call option ({option}) and cannot also be "
                    "a MemoryId or a template variable"
                )
            if any(kind == option for _, kind in options):
                raise ConfigurationError(f"{qualname}: two parameters are typed as the call's {option}")
            options.append((name, option))
        elif is_memory:
            if memory is not None:
                raise ConfigurationError(
                    f"{qualname}: parameters {memory!r} and {name!r} are both marked MemoryId; "
                    "a method has one memory id"
                )
            if aliases or content:
                raise ConfigurationError(
                    f"{qualname}: parameter {name!r} is a MemoryId and cannot also be "
                    "a template variable or a content"
                )
            memory = name
        elif content is not None:
            if aliases:
                raise ConfigurationError(
                    f"{qualname}: parameter {name!r} is a content ({base}); contents attach to the "
                    "user message and have no template name"
                )
            contents.append(ContentParam(name, content[0], content[1]))
        else:
            if len(aliases) > 1:
                raise ConfigurationError(f"{qualname}: parameter {name!r} has two TemplateName(...) names")
            variable = aliases[0] if aliases else name
            if aliases and not aliases[0].isidentifier():
                raise ConfigurationError(
                    f"{qualname}: parameter {name!r}: TemplateName({variable!r}) is not a valid variable name"
                )
            if any(variable == v for _, v in variables):
                raise ConfigurationError(
                    f"{qualname}: parameter {name!r}: template variable {variable!r} is taken"
                )
            variables.append((name, variable))

    user_template: Template | None = getattr(function, _USER_ATTR, None)
    system_template: Template | None = getattr(function, _SYSTEM_ATTR, None) or getattr(
        cls, _SYSTEM_ATTR, None
    )
    used: set[str] = set()
    for template in (user_template, system_template):
        if template is not None:
            used.update(template.variables)
    if len(variables) == 1 and "it" in used:
        used.add(variables[0][1])

    user_param: str | None = None
    if user_template is None:
        free = [param for param, variable in variables if variable not in used]
        if len(free) > 1:
            raise ConfigurationError(
                f"{qualname}: parameters {', '.join(map(repr, free))} bind to nothing: without "
                "@user_message exactly one parameter is the user message; add a template"
            )
        if free:
            user_param = free[0]
        elif not contents:
            raise ConfigurationError(
                f"{qualname}: nothing to send: add @user_message or a parameter for the user message"
            )
    unbound = tuple((p, v) for p, v in variables if v not in used) if user_template else ()

    kind, parser = _output(qualname, hints)
    return MethodSpec(
        qualname=qualname,
        name=function.__name__,
        function=function,
        signature=signature.replace(parameters=parameters),
        memory_param=memory,
        variables=tuple(variables),
        contents=tuple(contents),
        user_template=user_template,
        user_param=user_param,
        system_template=system_template,
        output_kind=kind,
        parser=parser,
        unbound=unbound,
        option_params=tuple(options),
        options=method_options(qualname, function, signature, options),
        binder=binder(parameters),
    )


_SPECS: weakref.WeakKeyDictionary[type[Any], ServiceSpec] = weakref.WeakKeyDictionary()


def service_spec(cls: type[Any]) -> ServiceSpec:
    """The spec of a service class, computed once per class (`ConfigurationError` when wrong)."""
    cached = _SPECS.get(cls)
    if cached is not None:
        return cached
    if not inspect.isclass(cls):
        raise ConfigurationError(f"build() takes a class, got {cls!r}")
    candidates: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        candidates.update(vars(klass))
    methods: dict[str, MethodSpec] = {}
    for name, attribute in candidates.items():
        if name.startswith("_"):
            continue
        if isinstance(attribute, staticmethod | classmethod):
            wrapped = attribute.__func__
            if is_stub(wrapped) or hasattr(wrapped, _USER_ATTR) or hasattr(wrapped, _SYSTEM_ATTR):
                raise ConfigurationError(
                    f"{cls.__name__}.{name}: a service method is a plain `async def` method, "
                    f"not a {type(attribute).__name__}"
                )
            continue
        if not inspect.isfunction(attribute):
            continue
        declared = hasattr(attribute, _USER_ATTR) or hasattr(attribute, _SYSTEM_ATTR)
        stub = is_stub(attribute)
        if not (stub or declared):
            continue
        qualname = f"{cls.__name__}.{name}"
        if not inspect.iscoroutinefunction(attribute):
            raise ConfigurationError(f"{qualname}: a service method must be declared `async def`")
        if not stub:
            raise ConfigurationError(
                f"{qualname}: a service method's body must be `...`; agentrt supplies the body"
            )
        methods[name] = _method_spec(cls, attribute)
    if not methods:
        raise ConfigurationError(
            f"{cls.__name__} declares no service methods (`async def` methods whose body is `...`)"
        )
    spec = ServiceSpec(cls=cls, methods=methods)
    _SPECS[cls] = spec
    return spec
