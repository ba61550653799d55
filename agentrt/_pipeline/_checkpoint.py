"""A turn as versioned JSON data, and back.

At a step boundary (`BOUNDARIES`: before a model request, after a response, before a tool round,
before the commit) everything a turn knows is data: the messages so far, this turn's exchange, the
attempts, re-asks, repairs and rounds, the release state with the events it holds, the budget account,
the tool loop's history. `dump` writes it as a JSON-ready dict; `load` rebuilds the turn for a fresh
`build()` of the same class, and the driver re-attaches its live parts when it starts (the
conversation, locked again; the tools, with the loop's state; a new deadline).

What a checkpoint does not carry, and why:
- the call's arguments: rendering is done (the messages are saved), and the memory id is saved;
- the model stream, the lock, listeners: live parts, re-attached;
- time: the seconds the turn had spent are saved, and a restored turn's clock starts from them, so
  time between save and restore (a human deciding, a worker restarting) is not spent;
- a tool's Python return value (`ToolExecution.value`) is saved only as JSON data: an immediate
  tool's answer is parsed again from its result text when its value does not round-trip.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pydantic import TypeAdapter

from .._budget import Budget, BudgetAccount, now
from .._errors import OutputParsingError
from .._events import (
    ModelResponse,
    ResponseReceived,
    ToolCallRequested,
    ToolExecuted,
    ToolExecution,
    Usage,
)
from .._messages import ChatMessage, ToolCall, UserMessage
from ..models._protocol import JsonObjectFormat, JsonSchemaFormat, ModelRequest, ModelSettings, ToolSpec
from ..output._parsers import TypeParser
from ..rag._types import Content
from ..tools._run import LoopLimit
from ._approve import Waiting
from ._release import Mode, Release, Released
from ._turn import BOUNDARIES, Phase, Turn

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._events import Event
    from .._spec import MethodSpec
    from ._plan import Plan
    from ._runtime import Runtime

__all__ = ["VERSION", "CheckpointError", "dump", "load"]

VERSION: Final = 1
"""The checkpoint format; `load` refuses others."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored here: another format version, another method, or data
    that does not validate."""


@dataclass(slots=True)
class _Request:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    response_format: dict[str, Any] | None = None
    settings: ModelSettings | None = None


@dataclass(slots=True)
class _Account:
    budget: Budget
    seconds: float
    input_tokens: int
    output_tokens: int
    model_requests: int
    tool_calls: int
    estimated: bool


@dataclass(slots=True)
class _Released:
    text: str
    thinking: str
    text_at: int
    thought_at: int
    size: int


@dataclass(slots=True)
class _Checkpoint:
    version: int
    id: str
    method: str
    phase: str
    memory_id: Any
    attempt: int
    attempts: int
    reasks: int
    repairs: int
    round: int
    max_repairs: int
    moderating: bool
    checking: bool
    answered: bool
    unreleased: str
    unthought: str
    system: str | None
    user: UserMessage | None
    outgoing: UserMessage | None
    history: tuple[ChatMessage, ...]
    sources: tuple[Content, ...]
    request: _Request | None
    sent: _Request | None
    since_sent: list[ChatMessage]
    exchange: list[ChatMessage]
    response: ModelResponse | None
    received: ModelResponse | None
    usage: Usage
    final: str | None
    immediate: list[ToolExecution] | None
    account: _Account | None
    settings: ModelSettings | None
    mode: str
    released: _Released | None
    pending: list[dict[str, Any]] | None
    loop: dict[str, Any] | None
    executions: list[ToolExecution] = field(default_factory=list)
    waiting: Waiting | None = None
    value: Any = None
    text: str = ""
    parsed: bool = False


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    """Built on first use: a checkpoint's adapters cost tens of milliseconds to build, which an
    application that never saves a turn should not pay at import."""
    return TypeAdapter(kind)


def _no_json(value: Any) -> None:
    """What a value that is not JSON data is saved as (see the module docstring)."""
    return None


def dump(turn: Turn) -> dict[str, Any]:
    """The turn at a step boundary as JSON-ready data (`orjson.dumps` takes it as it is).

    Raises `CheckpointError` off a boundary, where part of the turn is a live stream."""
    if not turn.at_boundary:
        raise CheckpointError(
            f"{turn.spec.qualname}: a turn is saved at a step boundary, not at {turn.phase}"
        )
    assert turn.stopped is None
    assert turn.rejected is None
    assert not turn.verdicts
    assert turn.retrieved is None
    account = turn.account
    release = turn.release
    released = release.released
    loop = turn.loop
    memory_id = turn.memory_id
    checkpoint = _Checkpoint(
        version=VERSION,
        id=turn.id,
        method=turn.spec.qualname,
        phase=turn.phase.value,
        memory_id=memory_id,
        attempt=turn.attempt,
        attempts=turn.attempts,
        reasks=turn.reasks,
        repairs=turn.repairs,
        round=turn.round,
        max_repairs=turn.max_repairs,
        moderating=turn.moderating,
        checking=turn.checking,
        answered=turn.answered,
        unreleased=turn.unreleased,
        unthought=turn.unthought,
        system=turn.system,
        user=turn.user,
        outgoing=turn.outgoing,
        history=turn.history,
        sources=turn.sources,
        request=_request(turn.request),
        sent=_request(turn.sent),
        since_sent=list(turn.since_sent),
        exchange=list(turn.exchange),
        response=turn.response,
        received=turn.received,
        usage=turn.usage,
        final=turn.final.value if turn.final is not None else None,
        immediate=turn.immediate,
        account=_Account(
            budget=account.budget,
            seconds=max(0.0, now() - account.started),
            input_tokens=account.input_tokens,
            output_tokens=account.output_tokens,
            model_requests=account.model_requests,
            tool_calls=account.tool_calls,
            estimated=account.estimated,
        )
        if account is not None
        else None,
        settings=turn.settings,
        mode=release.mode.value,
        released=_saved_release(released),
        pending=[_event(event) for event in release.pending] if release.pending is not None else None,
        loop=loop.snapshot() if loop is not None else None,
        executions=list(loop.executions) if loop is not None else [],
        waiting=turn.waiting,
        value=_value(turn) if turn.phase is Phase.COMMIT else None,
        text=turn.text,
        parsed=turn.parsed,
    )
    data: dict[str, Any] = _adapter(_Checkpoint).dump_python(checkpoint, mode="json", fallback=_no_json)
    return data


def load(runtime: Runtime, spec: MethodSpec, plan: Plan, data: Mapping[str, Any]) -> Turn:
    """The turn saved in `data`, for `spec` under `runtime` (a fresh build of the same class).

    Needs no event loop: the turn's clock starts when it is read (`Turn.resume_clock`). Raises
    `CheckpointError` for another format version or method, or data that does not validate or that
    the method cannot go on from (a step without what it needs, a release state not its own)."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        found = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"{spec.qualname}: a checkpoint of version {VERSION} is needed, not {found!r}")
    if data.get("method") != spec.qualname:
        raise CheckpointError(f"{spec.qualname}: the checkpoint is of {data.get('method')!r}")
    try:
        return _load(runtime, spec, plan, data)
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, LookupError, OutputParsingError) as error:
        # (pydantic's ValidationError is a ValueError)
        raise CheckpointError(f"{spec.qualname}: the checkpoint does not validate: {error}") from error


def _load(runtime: Runtime, spec: MethodSpec, plan: Plan, data: Mapping[str, Any]) -> Turn:
    saved = _adapter(_Checkpoint).validate_python(data)
    phase = Phase(saved.phase)
    if phase not in BOUNDARIES:
        raise ValueError(f"{phase.value!r} is not a step boundary")
    mode = Mode(saved.mode)
    if mode not in _MODES[(plan.release, plan.streams)]:
        raise ValueError(f"release mode {mode.value!r} is not one this method can be in")
    _needs(phase, saved)
    pending = [_loaded(item, saved.id) for item in saved.pending] if saved.pending is not None else None
    if (pending is None) != (mode is Mode.PLAIN or mode is Mode.OPTIMISTIC):
        raise ValueError("held events do not fit the release mode")
    memory_id = _memory_id(spec, saved.memory_id)
    arguments = {spec.memory_param: memory_id} if spec.memory_param else {}
    turn = Turn(saved.id, runtime, spec, arguments, saved.settings, None, plan)
    turn.phase = phase
    turn.attempt, turn.attempts = saved.attempt, saved.attempts
    turn.reasks, turn.repairs, turn.round = saved.reasks, saved.repairs, saved.round
    turn.max_repairs = saved.max_repairs
    turn.moderating, turn.checking, turn.answered = saved.moderating, saved.checking, saved.answered
    turn.unreleased, turn.unthought = saved.unreleased, saved.unthought
    turn.system, turn.user, turn.outgoing = saved.system, saved.user, saved.outgoing
    turn.history, turn.sources = saved.history, saved.sources
    turn.request = _model_request(saved.request, turn)
    turn.sent = _model_request(saved.sent, turn)
    turn.since_sent, turn.exchange = saved.since_sent, saved.exchange
    turn.response, turn.received, turn.usage = saved.response, saved.received, saved.usage
    turn.final = LoopLimit(saved.final) if saved.final is not None else None
    turn.immediate = saved.immediate
    if saved.account is not None:
        # No clock here: the turn's resumes from the seconds it had spent when it is read, so time
        # between save and restore is not spent.
        account = turn.account = BudgetAccount(saved.account.budget, 0.0)
        account.input_tokens = saved.account.input_tokens
        account.output_tokens = saved.account.output_tokens
        account.model_requests = saved.account.model_requests
        account.tool_calls = saved.account.tool_calls
        account.estimated = saved.account.estimated
        turn.resume_from = saved.account.seconds
    release = turn.release = Release(plan.release, plan.streams, _chunk(plan))  # its own, not shared
    release.mode = mode
    if saved.released is not None:
        if release.released is None:
            raise ValueError("the checkpoint's release state is not this method's")
        r = saved.released
        release.released.text, release.released.thinking = r.text, r.thinking
        release.released.text_at, release.released.thought_at, release.released.size = (
            r.text_at,
            r.thought_at,
            r.size,
        )
    release.pending = pending
    if saved.loop is not None:
        if turn.plan.answer is None and not runtime.tools and runtime.tool_provider is None:
            raise ValueError("the checkpoint has a tool loop, the method no tools")
        turn.restoring = (_loop_state(saved.loop), saved.executions)
    turn.waiting = saved.waiting
    if phase is Phase.COMMIT:
        turn.value, turn.text = _revalue(spec, saved.value, saved.text, saved.parsed), saved.text
        turn.parsed = saved.parsed
    return turn


_MODES: Final = {
    ("plain", False): frozenset({Mode.PLAIN}),
    ("plain", True): frozenset({Mode.PLAIN, Mode.HOLD}),
    ("buffer", True): frozenset({Mode.HOLD}),
    ("chunked", True): frozenset({Mode.CHUNKED, Mode.HOLD}),
    ("optimistic", True): frozenset({Mode.OPTIMISTIC}),
}
"""The release modes a method's plan can be in: its own, and the held replay after a re-ask."""


def _needs(phase: Phase, saved: _Checkpoint) -> None:
    """What each step reads of the turn must be there."""
    if saved.user is None or saved.outgoing is None:
        raise ValueError("the checkpoint has no user message")
    if phase is Phase.REQUEST and saved.request is None:
        raise ValueError("a turn before a request needs the request")
    if phase is Phase.RESPONSE and (saved.received is None or saved.sent is None):
        raise ValueError("a turn after a response needs the response")
    if phase is Phase.TOOLS:
        if saved.response is None or not saved.response.message.tool_calls or saved.loop is None:
            raise ValueError("a turn before a tool round needs the response's calls and the tool loop")
        if saved.request is None:
            raise ValueError("a turn before a tool round needs the request")
    if phase is Phase.APPROVAL:
        waiting = saved.waiting
        if saved.response is None or saved.loop is None or waiting is None:
            raise ValueError(
                "a turn waiting for approval needs the response's calls, the tool loop and its waiting calls"
            )
        calls = saved.response.message.tool_calls
        if len(waiting.done) != len(calls) or not waiting.calls:
            raise ValueError("the waiting calls do not fit the response's")
        for position, pending in waiting.calls:
            if (
                not 0 <= position < len(calls)
                or waiting.done[position] is not None
                or pending.id.split("#")[0] != calls[position].id
            ):
                raise ValueError("the waiting calls do not fit the response's")
    elif saved.waiting is not None:
        raise ValueError(f"a turn at {phase.value!r} has no calls waiting for approval")
    if phase is Phase.COMMIT and saved.response is None and saved.immediate is None:
        raise ValueError("a turn before the commit needs its answer")
    if phase is not Phase.REQUEST and saved.sent is None:
        raise ValueError("the checkpoint has no request sent")


def _loop_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The tool loop's counts, checked."""
    rounds, calls, failed = state["rounds"], state["calls"], state["failed_rounds"]
    identical = [(str(name), str(arguments), int(count)) for name, arguments, count in state["identical"]]
    if not all(isinstance(n, int) and n >= 0 for n in (rounds, calls, failed)):
        raise ValueError("the tool loop's counts are not counts")
    return {"rounds": rounds, "calls": calls, "failed_rounds": failed, "identical": identical}


def _memory_id(spec: MethodSpec, saved: Any) -> Any:
    """The memory id as the method declares it (a tuple, a UUID, ...), from its JSON."""
    if spec.memory_param is None:
        return saved
    if saved is None:
        raise ValueError("the checkpoint's memory id is None")
    annotation = typing.get_type_hints(spec.function, include_extras=True).get(spec.memory_param, Any)
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation
    if base is Any:
        return _tuples(saved)
    return _adapter(base).validate_python(saved)


def _tuples(value: Any) -> Any:
    """JSON arrays back as tuples (a memory id of no declared type: hashable, as it was)."""
    if isinstance(value, list):
        return tuple(_tuples(item) for item in value)
    return value


def _chunk(plan: Plan) -> int | None:
    chain = plan.output_chain
    return chain.chunk if chain is not None else None


def _saved_release(released: Released | None) -> _Released | None:
    if released is None:
        return None
    return _Released(released.text, released.thinking, released.text_at, released.thought_at, released.size)


def _request(request: ModelRequest | None) -> _Request | None:
    if request is None:
        return None
    form = request.response_format
    response_format: dict[str, Any] | None = None
    if isinstance(form, JsonSchemaFormat):
        response_format = {"kind": "schema", "name": form.name, "schema": form.schema, "strict": form.strict}
    elif isinstance(form, JsonObjectFormat):
        response_format = {"kind": "object", "schema": form.schema}
    return _Request(request.messages, request.tools, request.tool_choice, response_format, request.settings)


def _model_request(saved: _Request | None, turn: Turn) -> ModelRequest | None:
    if saved is None:
        return None
    form = saved.response_format
    response_format: JsonSchemaFormat | JsonObjectFormat | None = None
    if form is not None:
        kind = form.get("kind")
        if kind == "schema":
            response_format = JsonSchemaFormat(form["name"], form["schema"], bool(form.get("strict")))
        elif kind == "object":
            response_format = JsonObjectFormat(form.get("schema"))
        else:
            raise CheckpointError(f"{turn.spec.qualname}: unknown response format {kind!r} in the checkpoint")
    return ModelRequest(
        messages=saved.messages,
        tools=saved.tools,
        tool_choice=saved.tool_choice,
        response_format=response_format,
        settings=saved.settings,
        deadline=turn.deadline,
    )


def _event(event: Event) -> dict[str, Any]:
    kind = type(event)
    if kind is ResponseReceived:
        return {
            "kind": "response",
            "response": _adapter(ModelResponse).dump_python(event.response, mode="json", fallback=_no_json),  # type: ignore[union-attr]
            "round": event.round,  # type: ignore[union-attr]
        }
    if kind is ToolCallRequested:
        assert isinstance(event, ToolCallRequested)
        held: dict[str, Any] = {
            "kind": "call",
            "call": _adapter(ToolCall).dump_python(event.call, mode="json"),
            "hash": event.arguments_hash,
            "round": event.round,
        }
        if event.annotations:
            held["annotations"] = dict(event.annotations)
        return held
    if kind is ToolExecuted:
        return {
            "kind": "executed",
            "execution": _adapter(ToolExecution).dump_python(event.execution, mode="json", fallback=_no_json),  # type: ignore[union-attr]
        }
    raise CheckpointError(f"a turn does not hold {kind.__name__} events")  # pragma: no cover


def _loaded(item: Mapping[str, Any], invocation_id: str) -> Event:
    kind = item.get("kind")
    if kind == "response":
        return ResponseReceived(
            invocation_id, _adapter(ModelResponse).validate_python(item["response"]), int(item["round"])
        )
    if kind == "call":
        return ToolCallRequested(
            invocation_id,
            _adapter(ToolCall).validate_python(item["call"]),
            str(item["hash"]),
            int(item["round"]),
            dict(item.get("annotations") or {}),
        )
    if kind == "executed":
        return ToolExecuted(invocation_id, _adapter(ToolExecution).validate_python(item["execution"]))
    raise ValueError(f"unknown held event {kind!r}")


def _value(turn: Turn) -> Any:
    """The accepted value as JSON text (`None` when the turn parses its text again on restore)."""
    if turn.parsed:
        return None
    parser = turn.spec.parser
    if isinstance(parser, TypeParser):
        return parser.adapter.dump_json(turn.value, by_alias=True).decode()
    return turn.value


def _revalue(spec: MethodSpec, data: Any, text: str, parsed: bool) -> Any:
    """The accepted value again: the text parsed as it was (the common case), or a guardrail's or
    an immediate tool's value from its JSON."""
    parser = spec.parser
    if parsed:
        return parser.parse(text)
    if isinstance(parser, TypeParser):
        if not isinstance(data, str):
            raise ValueError(f"the saved value is not JSON text: {data!r}")
        return parser.adapter.validate_json(data)
    return data
