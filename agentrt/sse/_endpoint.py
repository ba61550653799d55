"""`endpoint(service.method, ...)`: the options checked, the protocol's `Wire` made, and the routes
of a `Handler` (the request, its `stop` and its `resume`).
"""

from __future__ import annotations

import math
import typing
from typing import Any, Final, Literal

from .._budget import Budget
from .._errors import ConfigurationError
from .._service import runtime_of
from .._spec import OutputKind
from ..runs import Runs
from ._agui import AgUIWire
from ._errors import answering_refusals
from ._handler import Handler
from ._native import NativeWire
from ._vercel import VercelWire
from ._wire import Settings

if typing.TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.requests import Request
    from starlette.responses import Response

    from .._pipeline import Runtime
    from .._spec import MethodSpec
    from .._stream import PartialStream, TokenStream
    from ._runs import Disconnect
    from ._wire import Wire

Protocol = Literal["agentrt", "vercel-ui", "ag-ui"]
"""What an endpoint speaks (see `endpoint`)."""

WIRES: Final[dict[str, type[Wire]]] = {wire.name: wire for wire in (NativeWire, VercelWire, AgUIWire)}
"""Each protocol's `Wire`, by its name."""

_SPEC_ATTR: Final = "__agentrt_spec__"
"""Where a built method keeps its `MethodSpec` (set by `build`)."""


def endpoint(
    method: Callable[..., Awaitable[TokenStream | PartialStream[Any]]],
    *,
    memory_id: Callable[[Request], Any] | Callable[[Request, str | None], Any] | None = None,
    budget: Budget | None = None,
    request_budget: bool = False,
    thinking: bool = False,
    tool_details: bool = False,
    ping: float | None = 15,
    send_timeout: float | None = 30,
    max_body: int = 1_048_576,
    protocol: Protocol = "agentrt",
    message: str | None = None,
    runs: Runs | None = None,
    on_disconnect: Disconnect = "cancel",
) -> Endpoint:
    """A Starlette endpoint that runs `method` (a streaming method of a built service, bound:
    `service.chat`) for each request and streams its events over SSE.

    - `memory_id`: the conversation of a request, from the request (e.g. its authenticated user);
      sync or async; any hashable JSON value, a tuple such as `(user, chat_id)` included. Required
      when the method has a memory id: the body never supplies it. An exception the app answers
      itself (`HTTPException`, or a type it has a handler for) is its response; any other is a 500
      `memory_id_failed` (logged), as is an answer that is not hashable JSON (a list, a dict);
      `None`, `""` or a tuple with one of them is a 400
      `no_conversation` (such requests would all share one conversation).
    - `budget`: the most one request may spend, a cap on every limit of the method's own budget
      (the stricter limit applies), so that a public endpoint cannot be made to spend without bound.
    - `request_budget`: let the body carry a `"budget"` object (`Budget`'s fields) to spend less:
      it tightens the limits, never loosens them.
    - `thinking`, `tool_details`: also send thinking deltas, and tool arguments and results.
    - `ping`: seconds between keep-alive comments (`None`: sse-starlette's default).
    - `send_timeout`: seconds a client may leave an event unread before the stream is given up (a
      client that stops reading would otherwise hold the invocation and its conversation).
    - `max_body`: the largest request body read, in bytes (413 past it), the stop route's too.
    - `runs`: an `agentrt.runs.Runs`, the app's run manager: each request's stream runs there as a
      run whose events are appended to its log (ids `{run_id}:{seq}`, the `agentrt-run-id` header
      names the run) before they are sent; a client resumes it with `Last-Event-ID` (this endpoint,
      or `endpoint.resume`, a GET route: `?run=` reads from the start, a `{id}` path parameter names
      the client's conversation and resumes its run that has not ended, 204 if none); only the
      conversation's owner may (404 otherwise, and for an expired run). A log that cannot be
      reached (Redis down) makes starting, resuming or stopping a run a 503 `runs_unavailable`.
    - `on_disconnect`: `"cancel"` (the default) cancels the run when its client hangs up, and stores
      the turn only if the answer's final event was sent; `"detach"` (needs `runs`) lets the run go
      on to its end, stores the turn, and keeps its log for a client that comes back.
    - `protocol`: what the endpoint speaks: `"agentrt"` (the events above), `"vercel-ui"` (the
      Vercel AI SDK's UI message stream, for `useChat`) or `"ag-ui"` (AG-UI 1.0). A client
      protocol's request is the client's own (`useChat`'s `{id, messages}`, AG-UI's
      `RunAgentInput`): only its last message, the user's, is read, into the method's `message`
      parameter (by default its one required `str` parameter); the conversation's history comes
      from memory, never from the client. The method's other parameters are read from the body's
      other fields (Vercel) or from `forwardedProps` (AG-UI). A `memory_id` resolver that takes two
      arguments gets the client's conversation id too (`id`, `threadId`): combine it with the
      authenticated user, never use it alone. The endpoint's `stop` (`endpoint.stop`, a second
      route) cancels a run by its id (`{"runId": ..., "threadId": ...}`; the `agentrt-run-id`
      response header: Vercel's message id, AG-UI's `runId`) for the same user.

    A turn that stops for a human's approval of tool calls ends the stream with the protocol's own
    request for it, and the client's next request resumes it (`agentrt.resume`, on the conversation
    the `memory_id` resolver gives: another conversation's run is not found):

    - `"agentrt"`: the `approval_required` event, then a request `{"approval": {"run_id",
      "decisions"}}` (see the module docstring).
    - `"vercel-ui"`: a `tool-approval-request` chunk per waiting call (`approvalId` is
      `"<run id>:<call id>"`, `toolCallId` the call's part, `approvalDescriptor` `{"tool",
      "arguments"}`), then `finish` (`tool-calls`). The next request (`useChat` after
      `addToolApprovalResponse`, e.g. with `sendAutomaticallyWhen:
      lastAssistantMessageIsCompleteWithApprovalResponses`) ends with the assistant message whose
      tool parts are `approval-responded`: only their `approval` (`id`, `approved`, `reason`) is
      read, approve or deny (this protocol has no edit); the resumed stream continues that message.
      With `runs` it is a run of its own, whose log begins with that message as the request
      carried it, rebuilt in chunks (`useChat`'s resume replays a run from its first `start`, where
      the SDK starts the message again); the request's own response reads from after them.
    - `"ag-ui"`: `RUN_FINISHED` with outcome `{"type": "interrupt", "interrupts": [...]}`, one
      interrupt per waiting call (`id` `"<run id>:<call id>"`, `reason` `"tool_approval"`,
      `toolCallId`, `responseSchema`, `expiresAt`, `metadata` `{"tool", "arguments"}`). The next
      run's `resume` entries answer them: `resolved` with payload `{"approved": true,
      "arguments"?: {...}}` (approve, with an edit) or `{"approved": false, "reason"?: ...}`
      (deny); `cancelled` denies. Its messages and `forwardedProps` are not read.

    Every waiting call needs its answer; an answer for a call the server did not ask about, a bad
    edit, or a run that is not pending is refused before anything runs (HTTP 400, 404), as is a
    new message while a turn waits (409). An approval request carries the calls' arguments
    whatever `tool_details` says: a human decides on them.

    Without `runs`, a request that carries `Last-Event-ID` (a client reconnecting after a lost
    stream) is refused with 409 `not_resumable`: the lost invocation was cancelled, and a second one
    would repeat the turn in its conversation. With `runs`, it resumes the run that id names.

    Raises `ConfigurationError` for a method that is not a built service's streaming method, or a
    method with a memory id and no `memory_id` resolver.
    """
    spec, runtime = _spec_of(method)
    _check(spec, runtime, memory_id, budget, ping, send_timeout, max_body, runs, on_disconnect)
    wire = _wire_of(spec, protocol)
    chain = runtime.output_guardrails.get(spec.name) if runtime is not None else None
    settings = Settings(
        spec,
        thinking=thinking,
        tool_details=tool_details,
        structured=spec.output_kind is OutputKind.PARTIAL,
        request_budget=request_budget,
        release=chain.release if chain is not None else None,
        gated=runtime is not None and spec.name in runtime.approvals,
        runs=runs,
    )
    handler = Handler(
        method,
        wire(settings, message),
        memory_id=memory_id,
        budget=budget,
        ping=ping,
        send_timeout=send_timeout,
        max_body=max_body,
        on_disconnect=on_disconnect,
    )
    return _routes(handler)


def _spec_of(method: Any) -> tuple[MethodSpec, Runtime | None]:
    """The spec of a built service's streaming method, and its service's runtime."""
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
    return spec, runtime_of(method.__self__)


def _wire_of(spec: MethodSpec, protocol: str) -> type[Wire]:
    """The `Wire` of the protocol the endpoint speaks."""
    wire = WIRES.get(protocol)
    if wire is None:
        raise ConfigurationError(
            f"{spec.qualname}: protocol must be one of {', '.join(map(repr, WIRES))}, got {protocol!r}"
        )
    return wire


def _routes(handler: Handler) -> Endpoint:
    """The endpoint: the handler's request, with its `stop` and its `resume` routes, each answering
    a refusal with its error response."""
    answering = answering_refusals(handler.handle)
    vars(answering)["stop"] = answering_refusals(handler.stop)
    vars(answering)["resume"] = answering_refusals(handler.resume_get)
    return typing.cast("Endpoint", answering)


def _check(
    spec: MethodSpec,
    runtime: Runtime | None,
    memory_id: Any,
    budget: Any,
    ping: Any,
    send_timeout: Any,
    max_body: Any,
    runs: Any,
    on_disconnect: Any,
) -> None:
    """Refuse options the method cannot be served with (`ConfigurationError`)."""
    if spec.memory_param is None and runtime is not None and runtime.memory is not None:
        raise ConfigurationError(
            f"{spec.qualname}: the service has chat memory, but the method has no memory id "
            "(Annotated[str, MemoryId]): every client of the endpoint would share one conversation"
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
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ConfigurationError(f"{spec.qualname}: max_body must be a positive number of bytes")
    if runs is not None and not isinstance(runs, Runs):
        raise ConfigurationError(f"{spec.qualname}: runs must be an agentrt.runs.Runs, got {runs!r}")
    if on_disconnect not in ("cancel", "detach"):
        raise ConfigurationError(
            f"{spec.qualname}: on_disconnect must be 'cancel' or 'detach', got {on_disconnect!r}"
        )
    if on_disconnect == "detach" and runs is None:
        raise ConfigurationError(
            f"{spec.qualname}: on_disconnect='detach' needs runs=agentrt.runs.Runs(...): a run that "
            "outlives its connection lives in the app's run manager"
        )


class Endpoint(typing.Protocol):
    """A Starlette endpoint (`async (request) -> response`) and its `stop` endpoint."""

    def __call__(self, request: Request, /) -> Awaitable[Response]: ...

    @property
    def stop(self) -> Callable[[Request], Awaitable[Response]]: ...

    @property
    def resume(self) -> Callable[[Request], Awaitable[Response]]: ...
