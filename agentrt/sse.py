"""Serving a streaming service method over Server-Sent Events (Starlette, FastAPI).

`endpoint(service.method, ...)` is a Starlette endpoint (`async (request) -> response`): the request's
JSON body is validated against the method's parameters (a pydantic model made from its signature,
without the memory id and option parameters), the memory id comes from the `memory_id` resolver, and
the invocation's events go out as SSE events through sse-starlette's `EventSourceResponse`:

| event | data |
|---|---|
| `token` | `{"text": ...}`, a text delta |
| `thinking` | `{"text": ...}`, only with `thinking=True` |
| `tool_call` | `{"id", "name"}` (and `"arguments"` with `tool_details=True`) |
| `tool_result` | `{"id", "name", "outcome"}` (and `"result"` with `tool_details=True`) |
| `reset` | `{"reason", "attempt"}`: discard the text shown so far |
| `guardrail` | `{"guardrail", "kind", "verdict", "attempt"}` |
| `done` | the `Result`: text, value (as JSON), usage, finish reason, tool executions, attempts |
| `error` | `{"type", "message"}`: the error's type and a fixed, safe message (the error itself is logged) |

Every event has an `id` (1, 2, ...). `EVENTS` maps each event's name to the shape of its data (a
`TypedDict`), and `event_schema()` gives their JSON schemas.

Errors before the model accepted the request (a bad body, an input guardrail, a rate limit, an
exceeded context, a busy conversation) are HTTP error responses with a JSON body
`{"error": {"type", "message"}}` (and `Retry-After` for 429), not a 200 stream. A client that
disconnects cancels the invocation: sse-starlette cancels the task that reads it, which closes the
model stream and stores nothing.

`stream_response(stream, ...)` is the lower-level part: the SSE response for a `TokenStream` (or
`PartialStream`) the caller already has.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import typing
from typing import Any, Final, NotRequired

import anyio
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticUserError,
    TypeAdapter,
    ValidationError,
    create_model,
)
from pydantic_core import to_jsonable_python
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import JSONResponse, Response
from typing_extensions import TypedDict

from ._budget import Budget
from ._errors import (
    AgentError,
    BudgetExceededError,
    ConfigurationError,
    ContextLengthExceededError,
    ConversationBusyError,
    InputGuardrailError,
    RateLimitError,
)
from ._events import (
    Completed,
    GuardrailVerdict,
    Reset,
    Result,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
)
from ._options import call_options
from ._spec import OutputKind

if typing.TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from starlette.requests import Request

    from ._events import Event
    from ._spec import MethodSpec
    from ._stream import PartialStream, TokenStream

__all__ = ["EVENTS", "endpoint", "event_schema", "result_json", "stream_response"]

logger = logging.getLogger("agentrt")

_SPEC_ATTR: Final = "__agentrt_spec__"
"""Where a built method keeps its `MethodSpec` (set by `build`)."""

# What a client is told of an error: a fixed message per kind, never the exception's own text (which
# may carry a tool's data, a provider's body or a key fragment). The error itself goes to the log.
_SAFE: Final[tuple[tuple[type[BaseException], int, str], ...]] = (
    (InputGuardrailError, 400, "the request was refused by an input guardrail"),
    (ContextLengthExceededError, 400, "the conversation is too long for the model"),
    (RateLimitError, 429, "the model is rate limited; try again later"),
    (ConversationBusyError, 409, "the conversation is busy with another request"),
    (BudgetExceededError, 429, "the request's budget was exhausted"),
    (AgentError, 502, "the model or the service failed"),
)


# --- the events' data, as a client receives it ------------------------------------------------------


class _Text(TypedDict):
    text: str


class _ToolCall(TypedDict):
    id: str
    name: str
    arguments: NotRequired[str]
    """With `tool_details=True`: the arguments as the model wrote them (JSON text)."""


class _ToolResult(TypedDict):
    id: str
    name: str
    outcome: str
    result: NotRequired[str]
    """With `tool_details=True`: what the model was told of the call."""


class _Reset(TypedDict):
    reason: str
    attempt: int


class _Guardrail(TypedDict):
    guardrail: str
    kind: str
    verdict: str
    attempt: int


class _Usage(TypedDict):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    estimated: bool


class _Execution(TypedDict):
    id: str
    name: str
    outcome: str


class _Done(TypedDict):
    text: str
    value: Any
    usage: _Usage
    finish_reason: str | None
    tool_executions: list[_Execution]
    attempts: int
    invocation_id: str


class _Error(TypedDict):
    type: str
    message: str


EVENTS: Final[dict[str, type]] = {
    "token": _Text,
    "thinking": _Text,
    "tool_call": _ToolCall,
    "tool_result": _ToolResult,
    "reset": _Reset,
    "guardrail": _Guardrail,
    "done": _Done,
    "error": _Error,
}
"""Each SSE event's name and the shape of its data (JSON)."""


def event_schema() -> dict[str, Any]:
    """The JSON schema of the events' data, by event name (for clients and their code generators)."""
    return {name: TypeAdapter(shape).json_schema() for name, shape in EVENTS.items()}


def _classify(error: BaseException) -> tuple[int, str]:
    for kind, status, message in _SAFE:
        if isinstance(error, kind):
            return status, message
    return 500, "internal error"


def _error_json(error: BaseException) -> dict[str, Any]:
    return {"type": type(error).__name__, "message": _classify(error)[1]}


def result_json(result: Result[Any]) -> dict[str, Any]:
    """The `done` event's data: what a client needs of a `Result` (no messages, no tool values)."""
    usage = result.usage
    return {
        "text": result.text,
        "value": to_jsonable_python(result.value, fallback=str),
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
            "estimated": usage.estimated,
        },
        "finish_reason": result.finish_reason.value if result.finish_reason is not None else None,
        "tool_executions": [
            {"id": e.call_id, "name": e.name, "outcome": e.outcome.value} for e in result.tool_executions
        ],
        "attempts": result.attempts,
        "invocation_id": result.invocation_id,
    }


def _encode(event: Event, thinking: bool, tool_details: bool) -> tuple[str, dict[str, Any]] | None:
    """An event as an SSE event name and its data; `None` for events a client is not sent."""
    kind = type(event)
    if kind is TextDelta:
        return "token", {"text": event.text}  # type: ignore[union-attr]
    if kind is Completed:
        return "done", result_json(event.result)  # type: ignore[union-attr]
    if kind is ThinkingDelta:
        return ("thinking", {"text": event.text}) if thinking else None  # type: ignore[union-attr]
    if kind is ToolCallRequested:
        assert isinstance(event, ToolCallRequested)
        call: dict[str, Any] = {"id": event.call.id, "name": event.call.name}
        if tool_details:
            call["arguments"] = event.call.arguments
        return "tool_call", call
    if kind is ToolExecuted:
        assert isinstance(event, ToolExecuted)
        execution = event.execution
        done: dict[str, Any] = {
            "id": execution.call_id,
            "name": execution.name,
            "outcome": execution.outcome.value,
        }
        if tool_details:
            done["result"] = execution.result
        return "tool_result", done
    if kind is Reset:
        assert isinstance(event, Reset)
        return "reset", {"reason": event.reason.value, "attempt": event.attempt}
    if kind is GuardrailVerdict:
        assert isinstance(event, GuardrailVerdict)
        return "guardrail", {
            "guardrail": event.guardrail,
            "kind": event.kind,
            "verdict": event.verdict,
            "attempt": event.attempt,
        }
    return None


def stream_response(
    stream: TokenStream | PartialStream[Any],
    *,
    thinking: bool = False,
    tool_details: bool = False,
    ping: float | None = None,
    headers: dict[str, str] | None = None,
    send_timeout: float | None = None,
) -> EventSourceResponse:
    """The SSE response for a stream the caller already has (see the module docstring for the
    events). The stream is closed however the response ends: done, failed, or the client gone."""

    async def events() -> AsyncIterator[ServerSentEvent]:
        number = 0
        try:
            async for event in stream.events():
                encoded = _encode(event, thinking, tool_details)
                if encoded is None:
                    continue
                number += 1
                yield ServerSentEvent(data=_dumps(encoded[1]), event=encoded[0], id=str(number))
        except Exception as error:
            logger.exception("agentrt.sse: the stream failed")
            number += 1
            yield ServerSentEvent(data=_dumps(_error_json(error)), event="error", id=str(number))
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    return EventSourceResponse(events(), ping=ping, headers=headers, send_timeout=send_timeout)


def endpoint(
    method: Callable[..., Awaitable[TokenStream | PartialStream[Any]]],
    *,
    memory_id: Callable[[Request], Any] | None = None,
    budget: Budget | None = None,
    thinking: bool = False,
    tool_details: bool = False,
    ping: float | None = 15,
    send_timeout: float | None = 30,
) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint that runs `method` (a streaming method of a built service, bound:
    `service.chat`) for each request and streams its events over SSE.

    - `memory_id`: the conversation of a request, from the request (e.g. its authenticated user);
      sync or async. Required when the method has a memory id: the body never supplies it.
    - `budget`: what one request may spend (over the service's own, field by field), so that a public
      endpoint cannot be made to spend without bound.
    - `thinking`, `tool_details`: also send thinking deltas, and tool arguments and results.
    - `ping`: seconds between keep-alive comments (`None`: sse-starlette's default).
    - `send_timeout`: seconds a client may leave an event unread before the stream is given up (a
      client that stops reading would otherwise hold the invocation and its conversation).

    Raises `ConfigurationError` for a method that is not a built service's streaming method, or a
    method with a memory id and no `memory_id` resolver.
    """
    spec: MethodSpec | None = getattr(getattr(method, "__func__", None), _SPEC_ATTR, None)
    if spec is None or getattr(method, "__self__", None) is None:
        raise ConfigurationError(
            f"agentrt.sse.endpoint takes a method of a built service (service.method), got {method!r}"
        )
    if spec.output_kind not in (OutputKind.STREAM, OutputKind.PARTIAL):
        raise ConfigurationError(
            f"{spec.qualname}: an SSE endpoint streams; declare the method -> TokenStream (or "
            "PartialStream[T])"
        )
    if spec.memory_param is not None and memory_id is None:
        raise ConfigurationError(
            f"{spec.qualname}: the method has a memory id ({spec.memory_param!r}); give endpoint(...) "
            "a memory_id resolver of the request (the request body never chooses the conversation)"
        )
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigurationError(f"{spec.qualname}: budget must be an agentrt.Budget, got {budget!r}")
    if ping is not None and (
        isinstance(ping, bool) or not isinstance(ping, int | float) or not ping > 0 or not math.isfinite(ping)
    ):
        raise ConfigurationError(f"{spec.qualname}: ping must be a positive number of seconds or None")
    if memory_id is not None and spec.memory_param is None:
        raise ConfigurationError(
            f"{spec.qualname}: memory_id is given, but the method has no memory id parameter "
            "(Annotated[str, MemoryId]): its calls would not be kept per conversation"
        )
    if send_timeout is not None and (
        isinstance(send_timeout, bool) or not isinstance(send_timeout, int | float) or not send_timeout > 0
    ):
        raise ConfigurationError(
            f"{spec.qualname}: send_timeout must be a positive number of seconds or None"
        )
    body, names, positional_names = _body_model(spec)

    async def handle(request: Request) -> Response:
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json" and not kind.endswith("+json"):
            # Only JSON: a form or text/plain POST needs no CORS preflight, so any site could make a
            # signed-in user's browser send one (and write into the user's conversation).
            return _refusal(415, "UnsupportedMediaType", "the request body must be application/json")
        try:
            validated = body.model_validate_json(await request.body() or b"{}")
        except ValidationError as error:
            return JSONResponse(
                {
                    "error": {"type": "RequestValidationError", "message": "the request body is invalid"},
                    "detail": [
                        {**problem, "loc": [names.get(str(part), part) for part in problem["loc"]]}
                        for problem in error.errors(
                            include_url=False, include_context=False, include_input=False
                        )
                    ],
                },
                status_code=422,
            )
        # The validated values as they are (a model stays a model), by parameter name.
        values = {name: getattr(validated, field) for field, name in names.items()}
        if spec.memory_param is not None:
            assert memory_id is not None
            conversation = memory_id(request)  # an HTTPException it raises is the response
            if inspect.isawaitable(conversation):
                conversation = await conversation
            values[spec.memory_param] = conversation
        positional = [values.pop(name) for name in positional_names]
        stream = failure = None
        async with anyio.create_task_group() as group:
            # The model may take long to accept the request (a busy conversation, a slow first
            # token): a client that leaves meanwhile cancels it.
            group.start_soon(_cancel_on_disconnect, request, group.cancel_scope)
            try:
                with call_options(budget=budget) if budget is not None else contextlib.nullcontext():
                    stream = await method(*positional, **values)
            except Exception as error:  # raised here, not from the task group (no exception group)
                failure = error
            group.cancel_scope.cancel()
        if failure is not None:
            return _error_response(spec, failure)
        if stream is None:  # the client went away before the model answered
            return Response(status_code=499)
        return stream_response(
            stream, thinking=thinking, tool_details=tool_details, ping=ping, send_timeout=send_timeout
        )

    return handle


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel `scope` when the client disconnects (the body was read: the next message says so)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def _refusal(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def _error_response(spec: MethodSpec, error: Exception) -> JSONResponse:
    """An error before the stream started, as an HTTP error (logged with its details)."""
    status, _ = _classify(error)
    log = logger.warning if status < 500 else logger.exception
    log("agentrt.sse: %s failed before its stream: %s", spec.qualname, type(error).__name__)
    headers = {}
    if isinstance(error, RateLimitError) and error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return JSONResponse({"error": _error_json(error)}, status_code=status, headers=headers)


def _body_model(spec: MethodSpec) -> tuple[type[BaseModel], dict[str, str], list[str]]:
    """The request body: the method's parameters but the memory id and the option parameters, with
    their annotations and defaults; unknown fields are refused. Fields have neutral names (`p0`,
    ...) and the parameters' names as aliases, so that no parameter name can clash with pydantic's
    own (`model_config`, `json`, `_private`). Also: field name -> parameter name, and the
    positional-only parameters, in order."""
    skipped = {spec.memory_param, *(name for name, _ in spec.option_params)}
    hints = typing.get_type_hints(spec.function, include_extras=True)  # resolved at build already
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    positional: list[str] = []
    for index, (name, parameter) in enumerate(spec.signature.parameters.items()):  # without `self`
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(name)
        if name in skipped:
            continue
        default = parameter.default if parameter.default is not inspect.Parameter.empty else ...
        field = f"p{index}"
        fields[field] = (hints.get(name, Any), Field(default, alias=name))
        names[field] = name
    try:
        model = create_model(
            f"{spec.name}_body",
            __config__=ConfigDict(extra="forbid", populate_by_name=False, arbitrary_types_allowed=False),
            **fields,
        )
    except PydanticUserError as exc:  # a parameter type pydantic cannot read from JSON
        raise ConfigurationError(
            f"{spec.qualname}: its parameters cannot be read from a JSON body: {str(exc).splitlines()[0]}"
        ) from exc
    return model, names, positional


def _dumps(data: dict[str, Any]) -> str:
    return orjson.dumps(data).decode()
