"""Declaring guardrails: on a class, on a method, or at `build(...)` (method > class > build).

A guardrail is a function of its request, or an object with a `validate(request)` method, sync or
async, that returns a `GuardrailResult`. A sync guardrail runs on the event loop: keep it quick, or
make it async. An output guardrail that can judge part of an answer says so with a true
`partial_text` attribute (`@partial_text` on a function); a `chunked` stream needs it of every one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel

from .._errors import ConfigurationError
from .._events import ToolExecution
from .._messages import ChatMessage, ToolCall, UserMessage
from ._results import GuardrailResult

__all__ = [
    "INPUT_ATTR",
    "OUTPUT_ATTR",
    "Guardrail",
    "InputGuardrailRequest",
    "OutputChain",
    "OutputGuardrailRequest",
    "Release",
    "guardrail_chain",
    "input_guardrails",
    "output_guardrails",
    "partial_text",
]

INPUT_ATTR: Final = "__agentrt_input_guardrails__"
OUTPUT_ATTR: Final = "__agentrt_output_guardrails__"

_T = TypeVar("_T")

Release = Literal["buffer", "chunked", "optimistic"]


@dataclass(frozen=True, slots=True)
class InputGuardrailRequest:
    """What an input guardrail checks: the user message (as rewritten by the guardrails before it),
    with the method, the memory id and the conversation so far (read-only; empty without memory)."""

    user_message: UserMessage
    method: str
    memory_id: Any
    history: tuple[ChatMessage, ...] = ()

    @property
    def text(self) -> str:
        return self.user_message.text


@dataclass(frozen=True, slots=True)
class OutputGuardrailRequest:
    """What an output guardrail checks: the answer's text (as rewritten by the guardrails before
    it), its thinking, this turn's tool executions, the attempt (1, then 2 after a re-ask, ...), and
    the method's parser."""

    text: str
    user_message: UserMessage
    method: str
    memory_id: Any
    history: tuple[ChatMessage, ...] = ()
    thinking: str | None = None
    tool_executions: tuple[ToolExecution, ...] = ()
    attempt: int = 1
    parse: Callable[[str], Any] = str
    """The method's parser: text to its return type, or `OutputParsingError` (see `JsonExtractor`)."""
    partial: bool = False
    """True for a check of part of an answer (a `chunked` stream, at a chunk's end): `text` is the
    answer so far, whose first `released` characters the reader already has. The whole answer is
    checked again when it is complete (`partial` false)."""
    released: int = 0
    tool_calls: tuple[ToolCall, ...] = ()
    """Not empty for text the model sent together with these tool calls: it is not the answer (the
    turn goes on after the calls run), but it reaches memory and readers, so the chain checks it
    too. A guardrail that judges only answers (one that parses them) passes it; `success_with` may
    rewrite it but give no value; a retry or reprompt asks again, and the calls do not run."""

    @property
    def chunk(self) -> str:
        """The text not released yet: all of `text` unless `partial`."""
        return self.text[self.released :]


def _defined_by(cls: type, name: str) -> type | None:
    """The class of `cls`'s MRO that defines `name`."""
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


class Guardrail:
    """One declared guardrail: its name (an object's `name` attribute, else its class's or the
    function's qualified name; events and errors report it) and how to call it."""

    __slots__ = ("call", "name", "partial")

    def __init__(self, target: object, where: str) -> None:
        validate = getattr(target, "validate", None)
        if isinstance(target, type):
            validate = None  # a class: its validate is unbound
        elif isinstance(target, BaseModel) and _defined_by(type(target), "validate") is BaseModel:
            validate = None  # pydantic's own (deprecated) classmethod, not the guardrail's
        if callable(validate) and not inspect.isfunction(target):
            call: Callable[[Any], Any] = validate
            own = getattr(target, "name", None)  # an object may name itself
            name = own if isinstance(own, str) and own else type(target).__qualname__
        elif callable(target) and not isinstance(target, type):
            call = target
            name = getattr(target, "__qualname__", None) or type(target).__qualname__
        else:
            kind = "a class (pass an instance)" if isinstance(target, type) else "not callable"
            raise ConfigurationError(
                f"{where}: guardrail {target!r} is {kind}: give a function of the request, or an object "
                "with a validate(request) method, returning a GuardrailResult"
            )
        self.call = call
        """The guardrail itself: what it returns for a request (see `check`)."""
        self.name = name
        # a bound method (`obj.validate`) of an object that declares it declares it too
        owner = getattr(target, "__self__", None)
        self.partial = getattr(target, "partial_text", getattr(owner, "partial_text", False)) is True

    def __repr__(self) -> str:
        return f"<Guardrail {self.name}>"

    async def check(self, request: Any) -> GuardrailResult:
        """Run the guardrail on `request`: its result (awaited, for an async one)."""
        result = self.call(request)
        if result.__class__ is GuardrailResult:
            return result
        return await self.settle(result)

    async def settle(self, result: object) -> GuardrailResult:
        """What `check` does with anything `call` returned other than a `GuardrailResult`: await it
        (an async guardrail), then make sure of its type. A caller on a per-chunk path calls `call`
        and settles only what is not a result already, so a sync guardrail costs one call."""
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, GuardrailResult):
            raise TypeError(
                f"guardrail {self.name} returned {result!r}; it must return a GuardrailResult "
                "(agentrt.guardrails.success(), failure(...), ...)"
            )
        return result


@dataclass(frozen=True, slots=True)
class OutputChain:
    """The output guardrails of a method, with how often they may re-ask and how a stream releases
    text while they have not passed it."""

    guardrails: tuple[Guardrail, ...]
    max_retries: int = 2
    release: Release = "buffer"
    chunk: int | None = None
    """Under `chunked`: at least this many characters per chunk; `None`: sentences and lines."""


def guardrail_chain(guardrails: Sequence[object] | object, where: str) -> tuple[Guardrail, ...]:
    """Guardrails declared as a list, each checked."""
    if isinstance(guardrails, str | bytes) or not isinstance(guardrails, Sequence):
        guardrails = (guardrails,)
    return tuple(Guardrail(g, where) for g in guardrails)


def output_chain(
    guardrails: Sequence[object], max_retries: int, release: str, where: str, chunk: int | None = None
) -> OutputChain:
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigurationError(f"{where}: max_retries must be an int >= 0, got {max_retries!r}")
    if release not in ("buffer", "chunked", "optimistic"):
        raise ConfigurationError(
            f"{where}: release must be 'buffer', 'chunked' or 'optimistic', got {release!r}"
        )
    if chunk is not None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ConfigurationError(
                f"{where}: chunk must be a positive int (characters) or None, got {chunk!r}"
            )
        if release != "chunked":
            raise ConfigurationError(f"{where}: chunk={chunk} needs release='chunked', not {release!r}")
    chain = guardrail_chain(guardrails, where)
    return OutputChain(chain, max_retries, release, chunk)  # type: ignore[arg-type]


def partial_text(guardrail: _T) -> _T:
    """Declare that an output guardrail function can judge part of an answer (see
    `OutputGuardrailRequest.partial`): it may run under `release="chunked"`. An object declares it
    with a `partial_text = True` attribute."""
    try:
        setattr(guardrail, "partial_text", True)  # noqa: B010
    except (AttributeError, TypeError):
        raise ConfigurationError(
            f"@partial_text: cannot mark {guardrail!r}; give it a partial_text = True attribute"
        ) from None
    return guardrail


def _where(target: object) -> str:
    """`Class.method` (or `Class`) of a decorated target, without the `<locals>` of where it was made."""
    qualname = getattr(target, "__qualname__", None)
    return qualname.rsplit("<locals>.", 1)[-1] if isinstance(qualname, str) else repr(target)


class InputChain(tuple[Guardrail, ...]):
    """An input chain: its guardrails in order, and whether they run beside the model's first
    response (`parallel`) instead of before it."""

    parallel: bool

    def __new__(cls, guardrails: tuple[Guardrail, ...], parallel: bool = False) -> InputChain:
        chain = super().__new__(cls, guardrails)
        chain.parallel = parallel
        return chain


def input_guardrails(*guardrails: object, parallel: bool = False) -> Callable[[_T], _T]:
    """Declare the input guardrails of a method, or of every method of a class, run in order before
    any model request; with `parallel`, while the model answers the first request instead (its
    chunks are held until the chain passed; a failure cancels the request, nothing is shown or
    stored). A parallel chain may pass or refuse the user's message, but not rewrite it."""
    if not isinstance(parallel, bool):
        raise ConfigurationError(f"@input_guardrails: parallel must be a bool, got {parallel!r}")

    def decorate(target: _T) -> _T:
        chain = guardrail_chain(guardrails, f"{_where(target)}: @input_guardrails")
        setattr(target, INPUT_ATTR, InputChain(chain, parallel) if parallel else chain)
        return target

    return decorate


def output_guardrails(
    *guardrails: object, max_retries: int = 2, release: Release = "buffer", chunk: int | None = None
) -> Callable[[_T], _T]:
    """Declare the output guardrails of a method, or of every method of a class, run in order on each
    answer; `max_retries` re-asks at most (after the first answer), `release` how a stream releases
    text the chain has not passed yet (`chunk`: the characters per chunk under `chunked`; sentences
    and lines by default)."""

    def decorate(target: _T) -> _T:
        where = f"{_where(target)}: @output_guardrails"
        setattr(target, OUTPUT_ATTR, output_chain(guardrails, max_retries, release, where, chunk))
        return target

    return decorate
