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
| `retrieved` | `{"queries", "sources": [{"id", "text", "metadata", "score"}]}`: what retrieval injected |
| `guardrail` | `{"guardrail", "kind", "verdict", "attempt"}` |
| `done` | the `Result`: text, value (as JSON), usage, finish reason, tool executions, sources, attempts |
| `approval_required` | `{"run_id", "calls": [{"id", "name", "arguments"}], "expires_at"}` (not `done`) |
| `error` | `{"type", "message"}`: the error's type and a fixed, safe message (the error itself is logged) |

`approval_required` ends a turn that stopped before tool calls that wait for a human's decision.

Every event has an `id` (1, 2, ...; `{run_id}:{seq}` for an endpoint with a run manager, see
`agentrt.runs`). `EVENTS` maps each event's name to the shape of its data (a
`TypedDict`), and `event_schema()` gives their JSON schemas.

Errors before the model accepted the request (a bad body, an input guardrail, a rate limit, an
exceeded context, a busy conversation) are HTTP error responses with a JSON body
`{"error": {"type", "message"}}` (and `Retry-After` for 429), not a 200 stream. A client that
disconnects cancels the invocation: sse-starlette cancels the task that reads it, which closes the
model stream; the turn is stored if and only if the answer's final event was written to the
connection before the server learned that the client was gone (see `_DEFER_COMMIT`, `_SETTLE`).
With a run manager (`runs=`), a run may instead go on without its client
(`on_disconnect="detach"`), and a client resumes it with `Last-Event-ID`.

A turn that stopped for approval is resumed over the same endpoint: a request whose body is only
`{"approval": {"run_id": ..., "decisions": {"<call id>": {"approve": true} | {"approve": true,
"arguments": {...}} | {"approve": false, "reason": ...}}}}` goes on with the turn `run_id` of the
request's conversation (the `memory_id` resolver's, as for any request), and streams what follows
as any request does (the decided calls' `tool_result`, the answer, `done` or another
`approval_required`). A run that is not pending on that conversation (unknown, resumed already,
another's) is a 404 `approval_not_found`; decisions that do not fit its calls (one missing, one for
a call it did not ask about, an edit the tool's schema refuses) a 400 `approval_decision`, and
nothing runs; a new message on a conversation whose turn waits is a 409 `approval_pending` that
carries the pending turn (`run_id`, `calls`, `expires_at`). The client protocols resume in their
own way (see `endpoint`).

`stream_response(stream, ...)` is the lower-level part: the SSE response for a `TokenStream` (or
`PartialStream`) the caller already has.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import re
import time
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, NotRequired

import anyio
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticUserError,
    Strict,
    TypeAdapter,
    ValidationError,
    create_model,
)
from pydantic_core import to_jsonable_python
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from typing_extensions import TypedDict

from . import _approval, _frontends, _sse_runs
from ._approval import Approve, Deny
from ._budget import Budget
from ._errors import (
    AgentError,
    ApprovalDecisionError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    BudgetExceededError,
    ChatMemoryError,
    ConfigurationError,
    ContentRefusedError,
    ContextLengthExceededError,
    ConversationBusyError,
    InputGuardrailError,
    ModelConnectionError,
    ModelError,
    ModelTimeoutError,
    ModerationError,
    ModerationFailedError,
    OutputGuardrailError,
    OutputParsingError,
    OverloadedError,
    RateLimitError,
    RetrievalError,
    ServerError,
    ToolError,
    ToolLoopLimitError,
)
from ._events import (
    ApprovalRequested,
    Completed,
    GuardrailVerdict,
    Reset,
    Result,
    Retrieved,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
)
from ._options import call_options
from ._pipeline._turn import DEFER_COMMIT as _DEFER_COMMIT
from ._resume import resume
from ._service import runtime_of
from ._spec import OutputKind
from ._stream import PartialStream
from .memory._memory import memory_key
from .runs import RunLog, RunRecord, Runs

if typing.TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from starlette.requests import Request

    from ._events import Event
    from ._spec import MethodSpec
    from ._sse_runs import Disconnect
    from ._stream import TokenStream
    from .rag._types import Content

__all__ = [
    "ERROR_TYPES",
    "EVENTS",
    "Endpoint",
    "Protocol",
    "endpoint",
    "event_schema",
    "result_json",
    "stream_response",
]

logger = logging.getLogger("agentrt")
_T = typing.TypeVar("_T")

Protocol = Literal["agentrt", "vercel-ui", "ag-ui"]
"""What an endpoint speaks (see `endpoint`)."""

_SPEC_ATTR: Final = "__agentrt_spec__"
"""Where a built method keeps its `MethodSpec` (set by `build`)."""

# What a client is told of an error: a stable code, an HTTP status (for an error before the stream)
# and a fixed message per kind, never the exception's own text (which may carry a tool's data, a
# provider's body or a key fragment) nor its class name. The error itself goes to the log. First match.
_SAFE: Final[tuple[tuple[type[BaseException], str, int, str], ...]] = (
    (InputGuardrailError, "input_refused", 400, "the request was refused by an input guardrail"),
    (ModerationFailedError, "moderation_unavailable", 503, "the request could not be moderated"),
    (ModerationError, "moderated", 400, "the request was refused by moderation"),
    (RetrievalError, "retrieval_failed", 502, "the documents could not be searched"),
    (OutputGuardrailError, "output_refused", 502, "the answer was refused by an output guardrail"),
    (ContextLengthExceededError, "context_length_exceeded", 400, "the conversation is too long"),
    (RateLimitError, "rate_limited", 429, "the model is rate limited; try again later"),
    (ConversationBusyError, "conversation_busy", 409, "the conversation is busy with another request"),
    (BudgetExceededError, "budget_exceeded", 400, "the request's budget was exhausted"),
    (ContentRefusedError, "content_refused", 502, "the model refused to answer"),
    (OverloadedError, "model_unavailable", 503, "the model is overloaded; try again later"),
    (ModelConnectionError, "model_unavailable", 502, "the model could not be reached"),
    (ModelTimeoutError, "model_unavailable", 502, "the model could not be reached"),
    (ServerError, "model_unavailable", 502, "the model could not be reached"),
    (ModelError, "model_error", 502, "the model failed the request"),
    (OutputParsingError, "output_invalid", 502, "the model's answer could not be read"),
    (ToolError, "tool_failed", 502, "a tool failed"),
    (ToolLoopLimitError, "tool_loop_limit", 502, "the model called tools past the limit"),
    (ChatMemoryError, "memory_unavailable", 503, "the conversation could not be loaded or stored"),
    (ApprovalNotFoundError, "approval_not_found", 404, "no turn of this conversation waits as that run"),
    (ApprovalDecisionError, "approval_decision", 400, "the decisions do not fit the pending tool calls"),
    (ApprovalPendingError, "approval_pending", 409, "the conversation waits for a decision on tool calls"),
    (AgentError, "agent_error", 500, "the service failed"),
)
ERROR_TYPES: Final[tuple[str, ...]] = (
    *dict.fromkeys(code for _, code, _, _ in _SAFE),
    "internal_error",
    "invalid_request",
    "unsupported_media_type",
    "body_too_large",
    "no_conversation",
    "memory_id_failed",
    "not_resumable",
    "run_not_found",
    "run_in_progress",
    "run_exists",
    "bad_event_id",
    "no_run",
    "run_expired",
    "run_lost",
    "run_truncated",
    "runs_unavailable",
)
"""Every `type` an error (an `error` event, or the body of an HTTP error) can have."""


# --- the events' data, as a client receives it ------------------------------------------------------


class _Text(TypedDict):
    text: str


class _ToolCall(TypedDict):
    id: str
    name: str
    annotations: NotRequired[dict[str, Any]]
    """What the tool's owner says of it (an MCP server's `readOnlyHint`, `destructiveHint`, ...),
    when it says anything."""
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


class _Source(TypedDict):
    id: str | None
    text: str
    metadata: dict[str, Any]
    score: float | None


class _Retrieved(TypedDict):
    queries: list[str]
    sources: list[_Source]


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
    sources: list[_Source]
    """What retrieval injected (`Result.sources`), as in the `retrieved` event."""
    attempts: int
    invocation_id: str


class _PendingCall(TypedDict):
    id: str
    name: str
    arguments: dict[str, Any]
    """The arguments as validated (by parameter name): what the call runs with if approved."""


class _ApprovalRequired(TypedDict):
    run_id: str
    """The stopped turn: what a resume request names."""
    calls: list[_PendingCall]
    """The calls that wait for a decision, one each."""
    expires_at: float | None
    """When the calls count as denied (seconds since the epoch), if ever."""


class _Error(TypedDict):
    type: str
    """One of `ERROR_TYPES`."""
    message: str
    limit: NotRequired[str]
    """For `budget_exceeded`: the `Budget` field that was reached."""
    run_id: NotRequired[str]
    """For `approval_pending`: the turn that waits (with its `calls` and `expires_at`)."""
    calls: NotRequired[list[_PendingCall]]
    expires_at: NotRequired[float | None]


class _Partial(TypedDict):
    value: Any
    """The value so far (JSON), each snapshot whole: it supersedes the one before."""


EVENTS: Final[dict[str, type]] = {
    "token": _Text,
    "partial": _Partial,
    "thinking": _Text,
    "tool_call": _ToolCall,
    "tool_result": _ToolResult,
    "reset": _Reset,
    "retrieved": _Retrieved,
    "guardrail": _Guardrail,
    "done": _Done,
    "approval_required": _ApprovalRequired,
    "error": _Error,
}
"""Each SSE event's name and the shape of its data (JSON)."""


def event_schema() -> dict[str, Any]:
    """The JSON schema of the events' data, by event name (for clients and their code generators)."""
    return {name: TypeAdapter(shape).json_schema() for name, shape in EVENTS.items()}


def _classify(error: BaseException) -> tuple[str, int, str]:
    """The code, HTTP status and safe message of an error."""
    if isinstance(error, BudgetExceededError):
        if isinstance(error.__cause__, ConversationBusyError):  # the time ran out waiting for it
            error = error.__cause__
        elif error.limit == "seconds":
            return "budget_exceeded", 504, "the request's time budget ran out"
    for kind, code, status, message in _SAFE:
        if isinstance(error, kind):
            return code, status, message
    return "internal_error", 500, "internal error"


def _error_json(error: BaseException) -> dict[str, Any]:
    code, _, message = _classify(error)
    data = {"type": code, "message": message}
    if code == "budget_exceeded" and isinstance(error, BudgetExceededError):
        data["limit"] = error.limit
    elif code == "approval_pending" and isinstance(error, ApprovalPendingError):
        data.update(_frontends.approval_json(error.approval))  # the user's own turn, to decide on
    return data


def _sources(contents: Sequence[Content]) -> list[dict[str, Any]]:
    """Retrieved contents as a client gets them (`retrieved`, and `done`'s `sources`)."""
    return [
        {
            "id": c.id,
            "text": _utf8(c.text),
            "metadata": to_jsonable_python(dict(c.metadata), fallback=str, bytes_mode="base64"),
            "score": c.score,
        }
        for c in contents
    ]


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
        "sources": _sources(result.sources),
        "attempts": result.attempts,
        "invocation_id": result.invocation_id,
    }


def _utf8(text: str) -> str:
    """`text` as JSON can carry it: lone surrogates (from a document decoded carelessly) replaced."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


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
        if event.annotations:
            call["annotations"] = event.annotations
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
    if kind is Retrieved:
        assert isinstance(event, Retrieved)
        return "retrieved", {"queries": list(event.queries), "sources": _sources(event.contents)}
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
    events; a `PartialStream` sends `partial` events, its values so far, where a `TokenStream` sends
    `token` events). The stream is closed however the response ends: done, failed, or the client
    gone."""
    encoder = _Native(thinking, tool_details, isinstance(stream, PartialStream))
    return _respond(stream, encoder, None, ping=ping, headers=headers, send_timeout=send_timeout)


class _Native(_frontends.Encoder):
    """agentrt's own events: named, numbered from 1 (see the module docstring)."""

    __slots__ = ("number", "structured", "thinking", "tool_details")

    def __init__(self, thinking: bool, tool_details: bool, structured: bool) -> None:
        self.thinking = thinking
        self.tool_details = tool_details
        self.structured = structured
        self.number = 0

    def frame(self, chunk: Any) -> ServerSentEvent:
        name, data = chunk
        try:
            text = orjson.dumps(data).decode()
        except TypeError:
            text = _frontends.dumps(data)
        self.number += 1  # after the data is made: a failure there leaves no gap in the ids
        return ServerSentEvent(data=text, event=name, id=str(self.number))

    def opened(self) -> list[Any]:
        return []

    def event(self, event: Event) -> Sequence[Any]:
        if self.structured and type(event) is TextDelta:
            return ()  # a structured answer's text: its values are sent instead
        encoded = _encode(event, self.thinking, self.tool_details)
        return (encoded,) if encoded is not None else ()

    def partial(self, value: Any) -> list[Any]:
        return [("partial", {"value": value})]

    def completed(self, result: Result[Any], done: dict[str, Any]) -> list[Any]:
        return [("done", done)]

    def approval(self, approval: ApprovalRequested) -> list[Any]:
        return [("approval_required", _frontends.approval_json(approval))]

    def failed(self, error: dict[str, Any]) -> list[Any]:
        return [("error", error)]

    def stopped(self, sent: _frontends.Sent) -> list[Any]:
        return [("stopped", {})]


_WAITED: Final = 0.0005
"""Seconds between two events past which the response takes it that the event was waited for (a
model stream's next network read), so the event loop had its turns meanwhile and the count of frames
written without one starts again: a stream that arrives token by token needs no extra turn."""

_WRITES_PER_TURN: Final = 3
"""Frames written in a row before the event loop gets a turn. A server learns that its client is
gone only when its loop runs (uvicorn then drops further writes), and a stream's events may all be
ready at once: written on without a turn, each write past the fifth to a lost connection makes
asyncio log "socket.send() raised exception." (the loss may be seen just before a turn of ours,
and a keep-alive ping may write in the same turn: three keeps below five)."""


_SETTLE: Final = 2
"""Event-loop turns between the send of a stream's final frame and the commit it lets go (see
`_DEFER_COMMIT`). A server's send returns also when nothing was written: once uvicorn's loop read
the client's end of file, the transport drops writes (and once the connection is lost, uvicorn drops
sends), and the response hears of it two turns later (the connection is closed, then the response's
disconnect listener is told and cancels it). So a hang-up read before the final send cancels the
response within these turns, and nothing is stored; one read after it lands after the commit
began: a turn is stored exactly when its final frame was written (tests/test_sse_cancel_rule.py
pins it on uvicorn's h11 protocol, iteration by iteration: 1 turn stores dropped answers, 3 drop
written ones)."""

clock = time.perf_counter


def _respond(
    stream: TokenStream | PartialStream[Any] | None,
    encoder: _frontends.Encoder,
    run: _Run | None,
    *,
    ping: float | None,
    headers: dict[str, str] | None,
    send_timeout: float | None,
    forget: Callable[[], Any] | None = None,
    tee: _sse_runs.Tee | None = None,
) -> EventSourceResponse:
    """The one response loop of every protocol: the stream's events through `encoder`. `stream` is
    `None` for a run stopped before the model answered. The stream is closed however it ends; a
    `run` is stopped by cancelling the whole response (see `_StreamResponse`), which costs the
    stream's reads nothing. A run is forgotten (no longer stoppable) once its end is sent.

    With a `tee` (a run manager's run) each frame is appended to the run's log before it is sent;
    under `"detach"`, a hang-up hands the stream to the manager (`_sse_runs.adopt`) at the next
    event, or when the response is closed between two sends."""
    snapshots = stream.snapshots if isinstance(stream, PartialStream) else None
    frame = encoder.frame
    # What the client got, chunk by chunk (a stop's end is made from it); a run's log has its own.
    sent = run.sent if run is not None and tee is None else None
    chunks_of = _frontends.chunks_of
    hold = tee is not None and tee.policy == "cancel"

    def encode(chunks: Sequence[Any]) -> list[bytes]:
        return [frame(chunk).encode() for chunk in chunks]

    put = encode if tee is None else tee.put

    def ended() -> None:
        """The run ended (its answer, an approval, an error): a stop no longer reaches it, neither
        the endpoint's nor its manager's (here or from another worker)."""
        if forget is not None:
            forget()
        if tee is not None:
            tee.runs.release(tee.run, tee.stop)

    async def frames() -> AsyncIterator[bytes]:
        out: Sequence[Any]
        written = 0  # frames written since the event loop last had a turn
        resumed = 0.0  # when the last batch was written
        reading = False  # between two events of the stream: a detached run's may be handed over
        try:
            if tee is not None:
                tee.began = True  # sse-starlette sent the response's start before it asked
            out = encoder.opened()
            if tee is not None and encoder.replay:
                # The log's start rebuilds the message a resumed run continues (Vercel): a resume
                # replays it; this client has the message already.
                tee.put(out[: len(encoder.replay)])
                out = out[len(encoder.replay) :]
            if stream is not None:
                reading = True
                async for event in stream.events():
                    if clock() - resumed > _WAITED:
                        written = 0  # the event was waited for: the loop had its turns meanwhile
                    kind = type(event)
                    if kind is Completed or kind is ApprovalRequested:
                        ended()  # the run ended (or waits for a human): a stop comes too late
                    chunks = chunks_of(event, encoder, snapshots, result_json)
                    batch, out = ([*out, *chunks] if out else chunks), ()
                    # Into the log first (whole: a close between two sends loses none of it); the
                    # final frames of a `"cancel"` run only once they were written (below).
                    datas = tee.hold(batch) if hold and kind is Completed else put(batch)  # type: ignore[union-attr]
                    for chunk, data in zip(batch, datas, strict=True):
                        if written == _WRITES_PER_TURN:
                            await anyio.lowlevel.checkpoint()
                            written = 0
                        written += 1
                        if sent is not None:
                            sent.pending = (data, chunk)
                        yield data
                    resumed = clock()
                    if kind is Completed:
                        reading = False
                        # Its sends returned; asked on, the stream stores the turn (see
                        # `DEFER_COMMIT`): a hang-up read before them lands first.
                        for _ in range(_SETTLE):
                            await anyio.lowlevel.checkpoint()
                        written = 0
                        if hold:
                            tee.release()  # type: ignore[union-attr]
                    elif tee is not None and tee.gone and kind is not ApprovalRequested:
                        # A `"detach"` run's client hung up: the manager reads on (an approval ended
                        # the stream: it was stored, and the run is no longer stoppable).
                        if _sse_runs.adopt(tee, stream, run, result_json, _error_json):
                            return
                reading = False
        except GeneratorExit:
            # Closed between two sends (a send failed or timed out, the server shuts down): a
            # detached run goes on in its manager.
            if reading and tee is not None and tee.policy == "detach" and not (run and run.stopped):
                assert stream is not None
                _sse_runs.adopt(tee, stream, run, result_json, _error_json)
            raise
        except Exception as error:
            reading = False
            ended()
            logger.exception("agentrt.sse: the stream failed")
            out = [*out, *encoder.failed(_error_json(error))]  # what an error cut off, first
        finally:
            if stream is not None and not (tee is not None and tee.adopted):
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
        if encoder.done_marker:
            out = [*out, _frontends.DONE]
        datas = put(out)
        if tee is not None:
            tee.clean = True
        for chunk, data in zip(out, datas, strict=True):
            if written == _WRITES_PER_TURN:
                await anyio.lowlevel.checkpoint()
                written = 0
            written += 1
            if sent is not None:
                sent.pending = (data, chunk)
            yield data
        # The response's end is one more write (the server's): the loop's turn first, as above.
        await anyio.lowlevel.checkpoint()

    return _StreamResponse(
        stream,
        encoder,
        run,
        forget,
        tee,
        frames(),
        ping=ping,
        headers={**encoder.headers, **(headers or {})},
        send_timeout=send_timeout,
        sep=encoder.sep,
    )


class _StreamResponse(EventSourceResponse):
    """An `EventSourceResponse` that closes its stream however the response ends, even when it is
    cancelled before its body started (the events' own `finally` runs only once they were read).

    With a `run`, the whole response runs under a scope that `stop` cancels, and each chunk counts
    as sent once its send returned (`run.sent`): after a stop the model stream is closed, then the
    protocol's last chunks for what the client has end the body. With a `tee` (a run manager's run)
    the run's log is ended too, unless the manager took the run over."""

    def __init__(
        self,
        stream: TokenStream | PartialStream[Any] | None,
        encoder: _frontends.Encoder,
        run: _Run | None,
        forget: Callable[[], Any] | None,
        tee: _sse_runs.Tee | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._agentrt_stream = stream
        self._agentrt_encoder = encoder
        self._agentrt_run = run
        self._agentrt_forget = forget
        self._agentrt_tee = tee

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        run = self._agentrt_run
        tee = self._agentrt_tee
        try:
            if run is None:
                await super().__call__(scope, receive, send)
                return
            sent = run.sent
            started = False

            async def sending(message: Any) -> None:
                nonlocal started
                pending = sent.pending
                body = message.get("body")
                if pending is None or body is None or not (body is pending[0] or body == pending[0]):
                    await send(message)  # the start, a ping, the end
                    started = True
                    return
                try:
                    await send(message)
                except BaseException:
                    sent.unsure(pending[1])
                    raise
                sent.pending = None
                sent.confirm(pending[1])

            if run.stopped:  # stopped between the model's answer and here: its stream is not read
                await self._stopped(send, False, sent)  # (its events may all come without a checkpoint)
                return
            if tee is not None and tee.policy == "detach":
                receive = _sse_runs.Detaching(receive, tee)
            with anyio.CancelScope() as stopping:
                run.scope = stopping
                try:
                    await super().__call__(scope, receive, sending if tee is None else send)
                except TimeoutError:  # sse-starlette's `send_timeout`: the client stalled
                    if tee is None or not tee.adopted:
                        raise
                    # A detached run goes on in its manager: nothing failed (no error to log).
            if run.scope is stopping:  # (a manager that took the run over has its own)
                run.scope = None
            if stopping.cancelled_caught:
                await self._stopped(send, started if tee is None else tee.began, sent)
        finally:
            if self._agentrt_forget is not None:
                self._agentrt_forget()
            if tee is None or not tee.adopted:
                if self._agentrt_stream is not None:
                    with anyio.CancelScope(shield=True):
                        await self._agentrt_stream.aclose()
                if tee is not None:
                    await tee.finish()

    async def _ping(self, send: Any) -> None:
        # sse-starlette's keep-alive pings. One that fails or times out (`send_timeout`: a stalled
        # connection) ends the response, which would cancel a `"detach"` run's stream while the
        # response waits for its next event: the client is gone instead (the stream is handed to the
        # manager at that event). Not a return either: sse-starlette ends the response when its ping
        # task returns.
        tee = self._agentrt_tee
        if tee is None or tee.policy != "detach":
            await super()._ping(send)
            return
        try:
            await super()._ping(send)
        except Exception:
            tee.gone = True
            await anyio.sleep_forever()

    async def _stopped(self, send: Any, started: bool, sent: _frontends.Sent) -> None:
        """End a stopped run's body: the model stream closed first, then the protocol's last chunks
        for what the client has."""
        if self._agentrt_stream is not None:
            with anyio.CancelScope(shield=True):
                await self._agentrt_stream.aclose()
        encoder = self._agentrt_encoder
        tee = self._agentrt_tee
        if tee is not None:  # the log's end, which a resume reads too
            body = b"".join(tee.end_stopped())
        else:
            chunks: list[Any] = [] if started else list(encoder.opened())
            for chunk in chunks:
                sent.confirm(chunk)  # sent with the end
            chunks += encoder.stopped(sent)
            if encoder.done_marker and not sent.done:
                chunks.append(_frontends.DONE)
            body = b"".join(encoder.frame(chunk).encode() for chunk in chunks)
        if not started:
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})


class _RequestBudget(BaseModel):
    """A budget a request asks for (`request_budget=True`): it can only tighten the endpoint's."""

    model_config = ConfigDict(extra="forbid")

    seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    input_tokens: Annotated[int, Strict(), Field(gt=0)] | None = None
    output_tokens: Annotated[int, Strict(), Field(gt=0)] | None = None
    total_tokens: Annotated[int, Strict(), Field(gt=0)] | None = None
    model_requests: Annotated[int, Strict(), Field(gt=0)] | None = None
    tool_calls: Annotated[int, Strict(), Field(gt=0)] | None = None


_BUDGET_FIELD: Final = "agentrt_budget"
"""The body model's field for a request's budget (its JSON name is `budget`)."""


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
    - `max_body`: the largest request body read, in bytes (413 past it).
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
    runtime = runtime_of(method.__self__)  # type: ignore[attr-defined]
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
    if runs is not None and protocol == "ag-ui" and spec.memory_param is None:
        raise ConfigurationError(
            f"{spec.qualname}: an AG-UI client names its runs (runId), and a method without a memory "
            "id has no conversation owner to check a resume or a stop against: any client naming "
            "a run id could read or stop it. Give the method a memory id (and endpoint a memory_id "
            "resolver) to keep its runs"
        )
    if on_disconnect == "detach" and runs is None:
        raise ConfigurationError(
            f"{spec.qualname}: on_disconnect='detach' needs runs=agentrt.runs.Runs(...): a run that "
            "outlives its connection lives in the app's run manager"
        )
    if protocol not in _frontends.PROTOCOLS:
        raise ConfigurationError(
            f"{spec.qualname}: protocol must be one of "
            f"{', '.join(map(repr, _frontends.PROTOCOLS))}, got {protocol!r}"
        )
    chain = runtime.output_guardrails.get(spec.name) if runtime is not None else None
    release = chain.release if chain is not None else None
    structured = spec.output_kind is OutputKind.PARTIAL
    # Whether the method's tool calls may wait for approval (its body then reserves `approval`).
    gated = runtime is not None and spec.name in runtime.approvals
    if protocol == "agentrt":
        if message is not None:
            raise ConfigurationError(f"{spec.qualname}: message= is for a client protocol")
        body, names, positional_names = _body_model(spec, request_budget)
        props = None
        if gated and "approval" in names.values():
            raise ConfigurationError(
                f"{spec.qualname}: its tool calls may wait for approval, and a resume request's body is "
                "{'approval': ...}, but the method has a parameter of that name; rename it"
            )
    else:
        if protocol == "vercel-ui" and release == "optimistic":
            raise ConfigurationError(
                f"{spec.qualname}: the Vercel UI message stream cannot withdraw text, and the method's "
                "output guardrails release it optimistically (before they passed); use "
                "release='buffer' or 'chunked'"
            )
        message = _message_param(spec, message)
        if protocol == "vercel-ui":
            body, names, positional_names = _body_model(
                spec, request_budget, message=message, envelope=_VERCEL_ENVELOPE, extra="ignore"
            )
            props = None
        else:
            props, names, positional_names = _body_model(
                spec, request_budget, message=message, extra="ignore"
            )
            body = _AgUIInput
    takes_thread = memory_id is not None and _positional_arity(memory_id) >= 2
    service = method.__self__  # type: ignore[attr-defined]
    local: dict[tuple[Any, str], _Run] = {}
    """The runs this endpoint streams itself (no `runs` manager), and those not yet handed to it."""

    async def owner_of(request: Request, thread: str | None) -> Any:
        """The request's memory id, from the resolver. Raises `_Refused` for a resolver that failed
        or named no conversation; an exception the app handles itself (an `HTTPException`) goes on."""
        if spec.memory_param is None:
            return None
        assert memory_id is not None
        try:
            conversation = memory_id(request, thread) if takes_thread else memory_id(request)  # type: ignore[call-arg]
            if inspect.isawaitable(conversation):
                conversation = await conversation
        except Exception as error:
            if _handled_by_app(request, error):
                raise
            logger.error(
                "agentrt.sse: %s: the memory_id resolver failed: %s: %s",
                spec.qualname,
                type(error).__name__,
                error,
                exc_info=error,
            )
            raise _Refused(
                500, "memory_id_failed", "the request's conversation could not be resolved"
            ) from None
        if _blank(conversation):
            # Every such request would share one conversation (all clients without the header).
            logger.warning(
                "agentrt.sse: %s: the memory_id resolver gave %r: the request is refused",
                spec.qualname,
                conversation,
            )
            raise _Refused(400, "no_conversation", "the request names no conversation")
        try:
            # What memory takes (hashable, JSON): checked here, as the runs key their owner by it
            # before memory sees it, so that every protocol answers the same, with or without runs.
            memory_key("", conversation, spec.qualname)
        except TypeError as error:
            logger.error(
                "agentrt.sse: %s: the memory_id resolver's answer is refused: %s", spec.qualname, error
            )
            raise _Refused(
                500, "memory_id_failed", "the request's conversation could not be resolved"
            ) from None
        return conversation

    async def handle(request: Request) -> Response:
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json" and not kind.endswith("+json"):
            # Only JSON: a form or text/plain POST needs no CORS preflight, so any site could make a
            # signed-in user's browser send one (and write into the user's conversation).
            return _refusal(415, "unsupported_media_type", "the request body must be application/json")
        if "last-event-id" in request.headers:
            if runs is None:
                return _refusal(409, "not_resumable", "the stream cannot be resumed; send a new request")
            return await resume_run(request)
        try:
            raw = await _read_body(request, max_body)
        except ClientDisconnect:  # the client left while sending its body
            return Response(status_code=499)
        if raw is None:
            return _refusal(413, "body_too_large", f"the request body is larger than {max_body} bytes")
        request._body = raw  # what `request.body()` and `.json()` read (e.g. in a resolver)
        thread = run_id = None
        text: str | None = None
        envelope: Any = None
        resuming: _Resumption | None = None
        try:
            if protocol == "agentrt":
                # `approval` is reserved in the body of a method whose calls may wait for approval.
                if gated and b'"approval"' in raw:
                    resuming = _native_resumption(raw)
                if resuming is None:
                    validated = body.model_validate_json(raw or b"{}")
            else:
                validated = envelope = body.model_validate_json(raw or b"{}")
            if protocol == "vercel-ui":
                thread = envelope.v_id
                resuming = _vercel_resumption(envelope)
                if resuming is None:
                    text = _vercel_text(envelope)
            elif protocol == "ag-ui":
                thread, run_id = envelope.threadId, envelope.runId
                if envelope.resume:
                    resuming = _agui_resumption(envelope.resume)
                else:
                    text = _agui_text(envelope)
                    assert props is not None
                    try:
                        validated = props.model_validate(envelope.forwardedProps)
                    except ValidationError as error:
                        return _invalid(error, ("forwardedProps",))
        except ValidationError as error:
            return _invalid(error)
        except _Unreadable as error:
            return _invalid_at(error.where, str(error))
        except _Undecidable as error:
            return error.response()
        cap = budget
        values: dict[str, Any] = {}
        if resuming is None:
            # The validated values as they are (a model stays a model), by parameter name.
            values = {name: getattr(validated, field) for field, name in names.items()}
            if message is not None:
                values[message] = text
            if request_budget:
                asked: _RequestBudget | None = getattr(validated, _BUDGET_FIELD)
                if asked is not None:
                    own = Budget(**asked.model_dump(exclude_none=True))
                    cap = own.tighter(cap)
        try:
            owner = await owner_of(request, thread)
        except _Refused as refused:
            return refused.response
        if spec.memory_param is not None:
            values[spec.memory_param] = owner
        positional = [values.pop(name, default) for name, default in positional_names]
        run: _Run | None = None
        encoder: _frontends.Encoder | None = None
        if protocol == "vercel-ui":
            if resuming is not None and resuming.message_id is not None:
                message_id = resuming.message_id  # the resumed stream continues the client's message
                # In a run manager it is a run of its own: the message's first run keeps its log.
                run_id = _frontends.new_id("run") if runs is not None else message_id
            else:
                # The answer's message id, unguessable: it names the run.
                run_id = message_id = _frontends.new_id("msg")
            vercel = encoder = _frontends.VercelUI(
                message_id,
                thinking=thinking,
                tool_details=tool_details,
                hold=release == "chunked",
                structured=structured,
            )
            if resuming is not None:
                vercel.resume(resuming.used, dict(resuming.wires))
                if runs is not None:  # a resume replays the message from its start
                    vercel.replaying(envelope.v_messages[-1])
        elif protocol == "ag-ui":
            assert thread is not None
            assert run_id is not None
            agui = encoder = _frontends.AgUI(
                thread,
                run_id,
                envelope.messages,
                thinking=thinking,
                tool_details=tool_details,
                structured=structured,
            )
            if resuming is not None:
                agui.resume(resuming.decisions)
            if runs is not None and await _from_log(spec, runs.log.find(run_id)) is not None:
                # The client names its runs, and a run's log (its ids) is kept after it ended.
                return _refusal(409, "run_exists", "a run with this id was started already; name a new one")
        if encoder is None and runs is not None:
            run_id = _frontends.new_id("run")
            encoder = _Native(thinking, tool_details, structured)
        if encoder is not None:
            assert run_id is not None
            key = (owner, run_id)
            if key in local:  # AG-UI's client names its runs: the same one twice at once is a mistake
                return _refusal(409, "run_in_progress", "a run with this id is streaming")
            run = _Run()
            local[key] = run  # from now on `stop` finds it, also while the model has not answered

        def forget() -> None:
            if run is not None and local.get(key) is run:
                del local[key]

        stream = failure = None
        try:
            async with anyio.create_task_group() as group:
                # The model may take long to accept the request (a busy conversation, a slow first
                # token): a client that leaves meanwhile, or a stop, cancels it.
                group.start_soon(_cancel_on_disconnect, request, group.cancel_scope)
                if run is not None:
                    run.scope = group.cancel_scope
                # stored once the final event was sent (a detached run stores its turn as it ends)
                deferring = _DEFER_COMMIT.set(on_disconnect == "cancel")
                try:
                    with call_options(budget_cap=cap) if cap is not None else contextlib.nullcontext():
                        if resuming is None:
                            stream = await method(*positional, **values)
                        else:  # the conversation is the resolver's: another's run is not found
                            where = {"memory_id": owner} if spec.memory_param is not None else {}
                            stream = await resume(service, resuming.run_id, resuming.decisions, **where)
                except Exception as error:  # raised here, not from the task group (no exception group)
                    failure = error
                finally:
                    _DEFER_COMMIT.reset(deferring)
                group.cancel_scope.cancel()
        except BaseException:
            # Cancelled from outside as the task group closed: the stream was made, and is nobody's.
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
            raise
        if run is not None:
            run.scope = None
        if failure is not None:
            forget()
            return _error_response(spec, failure)
        stopped = run is not None and run.stopped
        if stream is None and not stopped:  # the client went away before the model answered
            forget()
            return Response(status_code=499)
        if encoder is None:
            assert stream is not None
            return stream_response(
                stream, thinking=thinking, tool_details=tool_details, ping=ping, send_timeout=send_timeout
            )
        assert run_id is not None
        if runs is not None:
            assert run is not None
            return await start_run(stream, encoder, run, run_id, owner, thread, forget)
        return _respond(
            stream,
            encoder,
            run,
            ping=ping,
            headers={"agentrt-run-id": run_id},
            send_timeout=send_timeout,
            forget=forget,
        )

    async def start_run(
        stream: TokenStream | PartialStream[Any] | None,
        encoder: _frontends.Encoder,
        run: _Run,
        run_id: str,
        owner: Any,
        thread: str | None,
        forget: Callable[[], None],
    ) -> Response:
        """Open the run's log and answer with the response that reads the stream into it (see
        `_respond`'s `tee`)."""
        assert runs is not None
        log = runs.log
        stop_live = run.stop  # one object: `release` and the manager compare it by identity
        try:
            runs.require()
            runs.reserve(run_id, stop_live)  # a stop from another worker once the record is there
            record = RunRecord(run_id, _owner_key(spec, protocol, owner), thread)
            await _from_log(spec, log.open(record), opening=True)
        except BaseException:
            forget()
            runs.release(run_id, stop_live)
            with anyio.CancelScope(shield=True):
                if stream is not None:
                    await stream.aclose()
            raise
        sent = _frontends.Sent() if encoder.done_marker or protocol == "ag-ui" else None
        tee = _sse_runs.Tee(runs, run_id, encoder, on_disconnect, stop_live, sent)
        return _respond(
            stream,
            encoder,
            run,
            ping=ping,
            headers={"agentrt-run-id": run_id},
            send_timeout=send_timeout,
            forget=forget,
            tee=tee,
        )

    async def resume_run(request: Request, thread: str | None = None) -> Response:
        """A reader of a run's log: after `Last-Event-ID` (`{run}:{seq}`), or from its start for
        `?run=` or the active run of the client's conversation `thread` (Vercel's resume GET)."""
        assert runs is not None
        log = runs.log
        last = request.headers.get("last-event-id")
        after = 0
        run_id: str | None
        if last is not None:
            parsed = _sse_runs.parse_event_id(last)
            if parsed is None:
                return _refusal(400, "bad_event_id", "Last-Event-ID is not an id this endpoint sent")
            run_id, after = parsed
        else:
            run_id = request.query_params.get("run")
        if run_id is None and thread is None:
            return _refusal(400, "no_run", "name the run: a Last-Event-ID header or ?run=")
        record = await _from_log(spec, log.find(run_id)) if run_id is not None else None
        if run_id is not None and record is None:
            return _refusal(404, "run_not_found", "no such run of this user (or it has expired)")
        try:
            # A named run's conversation is its own: the resolver combines it with the request's
            # user (a two-argument resolver), so another user's request names another conversation.
            owner = await owner_of(request, record.thread if record is not None else thread)
        except _Refused as refused:
            return refused.response
        key = _owner_key(spec, protocol, owner)
        if run_id is None:
            assert thread is not None
            run_id = await _from_log(spec, log.active(key, thread))
            if run_id is None:
                return Response(status_code=204)  # no stream to resume (the Vercel client's "none")
            record = await _from_log(spec, log.find(run_id))
        if record is None or record.owner != key:  # another's run is not found, not forbidden
            return _refusal(404, "run_not_found", "no such run of this user (or it has expired)")
        if after and await _past_the_end(spec, log, run_id, after):
            return _refusal(400, "bad_event_id", "Last-Event-ID is past the run's last event")
        return _sse_runs.response(
            log,
            run_id,
            after,
            _encoder_for_errors(),
            ping=ping,
            headers={"agentrt-run-id": run_id},
            send_timeout=send_timeout,
        )

    def _encoder_for_errors() -> _frontends.Encoder:
        if protocol == "vercel-ui":
            return _frontends.VercelUI(
                "msg", thinking=False, tool_details=False, hold=False, structured=False
            )
        if protocol == "ag-ui":
            return _frontends.AgUI("thread", "run", [], thinking=False, tool_details=False, structured=False)
        return _Native(False, False, False)

    async def resume_get(request: Request) -> Response:
        """`GET`: resume a run (see `resume_run`); a `{id}` path parameter names the client's
        conversation (the Vercel client's `GET {api}/{chatId}/stream`)."""
        if runs is None:
            return _refusal(409, "not_resumable", "the endpoint keeps no runs (runs=...)")
        thread = request.path_params.get("id")
        return await resume_run(request, thread if isinstance(thread, str) else None)

    async def stop(request: Request) -> Response:
        """Stop a run of this endpoint by its id (`{"runId": ...}`), for the user who started it."""
        try:
            asked = _StopRequest.model_validate_json(await request.body() or b"{}")
        except ValidationError as error:
            return _invalid(error)
        try:
            owner = await owner_of(request, asked.threadId)
        except _Refused as refused:
            return refused.response
        run = local.get((owner, asked.runId))
        if run is None:
            if runs is not None:
                record = await _from_log(spec, runs.log.find(asked.runId))
                if record is not None and record.owner == _owner_key(spec, protocol, owner):
                    await _from_log(spec, runs.stop(asked.runId))
                    return JSONResponse({"stopped": asked.runId}, status_code=202)
            return _refusal(404, "run_not_found", "no such run of this user is streaming")
        run.stop()
        return JSONResponse({"stopped": asked.runId}, status_code=202)

    answering = _answering_refusals(handle)
    vars(answering)["stop"] = _answering_refusals(stop)
    vars(answering)["resume"] = _answering_refusals(resume_get)
    return typing.cast("Endpoint", answering)


class Endpoint(typing.Protocol):
    """A Starlette endpoint (`async (request) -> response`) and its `stop` endpoint."""

    def __call__(self, request: Request, /) -> Awaitable[Response]: ...

    @property
    def stop(self) -> Callable[[Request], Awaitable[Response]]: ...

    @property
    def resume(self) -> Callable[[Request], Awaitable[Response]]: ...


class _Run:
    """A streaming run of a client protocol: what `stop` cancels."""

    __slots__ = ("scope", "sent", "stopped")

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.stopped = False
        self.sent = _frontends.Sent()

    def stop(self) -> None:
        self.stopped = True
        if self.scope is not None:
            self.scope.cancel()


class _Refused(Exception):
    """A request refused before its stream, with the JSON error response that says why."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.response = _refusal(status, kind, message)


def _answering_refusals(
    route: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """`route`, a `_Refused` raised in it answered with its JSON error (a run log's failure, deep in
    the request's handling: see `_from_log`)."""

    async def answering(request: Request) -> Response:
        try:
            return await route(request)
        except _Refused as refused:
            return refused.response

    answering.__name__, answering.__qualname__, answering.__doc__ = (
        route.__name__,
        route.__qualname__,
        route.__doc__,
    )
    return answering


async def _from_log(spec: MethodSpec, call: Awaitable[_T], *, opening: bool = False) -> _T:
    """A call of the run log; its failure (Redis down, say) refuses the request with a 503
    `runs_unavailable`, logged. `opening`: the call is `open`, whose `ValueError` says that the run is
    in the log already (an AG-UI client's run id, opened since the endpoint looked): a 409."""
    try:
        return await call
    except Exception as error:
        if opening and isinstance(error, ValueError):
            raise _Refused(
                409, "run_exists", "a run with this id was started already; name a new one"
            ) from None
        logger.error(
            "agentrt.sse: %s: the run log failed: %s: %s",
            spec.qualname,
            type(error).__name__,
            error,
            exc_info=error,
        )
        raise _Refused(503, "runs_unavailable", "the run log is unavailable; try again later") from None


async def _past_the_end(spec: MethodSpec, log: RunLog, run: str, after: int) -> bool:
    """Whether `after` is past the last frame of `run` so far (an id the run never sent: a reader
    after it would wait, then skip every frame up to it). A log without `last_seq` is not asked."""
    last_seq = getattr(log, "last_seq", None)
    if last_seq is None:
        return False
    last: int | None = await _from_log(spec, last_seq(run))
    return last is not None and after > last


def _owner_key(spec: MethodSpec, protocol: str, owner: Any) -> str:
    """A run's owner as its log keeps it: the endpoint (its protocol and method) and the
    conversation's memory id, as JSON. Endpoints share a run manager: one's runs are not read or
    stopped through another (its frames are another protocol's; its memory ids mean other things)."""
    if spec.memory_param is None:
        return orjson.dumps([protocol, spec.qualname]).decode()
    return orjson.dumps([protocol, spec.qualname, owner], default=str).decode()


def _blank(memory_id: Any) -> bool:
    """Whether a memory id names no one: `None`, `""`, or a tuple with such a part."""
    if isinstance(memory_id, tuple):
        return any(_blank(part) for part in memory_id)
    return memory_id is None or memory_id == ""


def _handled_by_app(request: Request, error: Exception) -> bool:
    """Whether the app answers `error` itself: an `HTTPException`, or a type it has an exception
    handler for (Starlette's `ExceptionMiddleware` puts its handlers in the scope)."""
    if isinstance(error, HTTPException):
        return True
    handlers = request.scope.get("starlette.exception_handlers")
    if not handlers:
        return False
    return any(kind in handlers[0] for kind in type(error).__mro__)


def _positional_arity(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(1 for p in parameters if p.kind in kinds)


def _message_param(spec: MethodSpec, message: str | None) -> str:
    """The parameter a client protocol's user message fills: `message`, or the one required `str`."""
    skipped = {spec.memory_param, *(name for name, _ in spec.option_params)}
    hints = typing.get_type_hints(spec.function, include_extras=True)
    if message is not None:
        if message not in spec.signature.parameters or message in skipped:
            raise ConfigurationError(f"{spec.qualname}: message={message!r} is not one of its parameters")
        return message
    candidates = [
        name
        for name, parameter in spec.signature.parameters.items()
        if name not in skipped
        and parameter.default is inspect.Parameter.empty
        and hints.get(name, str) is str
    ]
    if len(candidates) != 1:
        raise ConfigurationError(
            f"{spec.qualname}: a client protocol fills one parameter with the user's message; the "
            f"method has {len(candidates)} required str parameters ({', '.join(candidates) or 'none'}): "
            "name it with message="
        )
    return candidates[0]


class _Unreadable(Exception):
    def __init__(self, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.where = where


_VERCEL_ENVELOPE: Final[dict[str, Any]] = {
    "v_id": (str, Field(alias="id")),
    "v_messages": (list[dict[str, Any]], Field(alias="messages", min_length=1)),
    "v_trigger": (Literal["submit-message", "regenerate-message"], Field("submit-message", alias="trigger")),
}


def _vercel_text(body: Any) -> str:
    if body.v_trigger != "submit-message":
        raise _Unreadable(("trigger",), "regenerating a message is not supported: submit a new one")
    last = body.v_messages[-1]
    if last.get("role") != "user":
        raise _Unreadable(
            ("messages", len(body.v_messages) - 1, "role"), "the last message must be the user's"
        )
    parts = last.get("parts")
    texts = [
        part["text"]
        for part in (parts if isinstance(parts, list) else ())
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    ]
    if not texts:
        raise _Unreadable(
            ("messages", len(body.v_messages) - 1, "parts"), "the user's message has no text part"
        )
    return "".join(texts)


class _AgUIInput(BaseModel):
    """AG-UI's `RunAgentInput`, what the endpoint reads of it (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore")

    # the protocol's names; at most what a resume's Last-Event-ID takes (`_sse_runs.parse_event_id`)
    threadId: str = Field(min_length=1, max_length=_sse_runs.MAX_RUN_ID)
    runId: str = Field(min_length=1, max_length=_sse_runs.MAX_RUN_ID)
    messages: list[dict[str, Any]] = Field(min_length=1)
    forwardedProps: dict[str, Any] = Field(default_factory=dict)
    resume: list[Any] | None = None
    """AG-UI 1.0's answers to the interrupts of the run this one continues (`ResumeEntry`)."""


def _agui_text(body: _AgUIInput) -> str:
    last = body.messages[-1]
    where = ("messages", len(body.messages) - 1)
    if last.get("role") != "user":
        raise _Unreadable((*where, "role"), "the last message must be the user's")
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
        if texts:
            return "".join(texts)
    raise _Unreadable((*where, "content"), "the user's message has no text")


# --- resuming a turn that waits for approval ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Resumption:
    """A request that resumes a turn: its run, a decision per call (by the model's call id), and
    for a client protocol the tool-call ids the client has (all of them, and each resumed call's)."""

    run_id: str
    decisions: dict[str, _approval.Decision]
    used: tuple[str, ...] = ()
    wires: tuple[tuple[str, str], ...] = ()
    message_id: str | None = None
    """Vercel: the assistant message the resumed stream continues."""


class _Undecidable(Exception):
    """A resume request whose decisions cannot be read: a 400 `approval_decision`, nothing runs."""

    def __init__(self, where: tuple[str | int, ...], message: str, detail: list[Any] | None = None) -> None:
        super().__init__(message)
        if detail is None:
            detail = [{"type": "value_error", "loc": list(where), "msg": message}]
        self.detail = detail

    @classmethod
    def of(cls, error: ValidationError, where: tuple[str | int, ...]) -> _Undecidable:
        problems = error.errors(include_url=False, include_context=False, include_input=False)
        detail = [{**problem, "loc": [*where, *problem["loc"]]} for problem in problems]
        return cls(where, "the decisions are invalid", detail)

    def response(self) -> JSONResponse:
        return JSONResponse(
            {
                "error": {"type": "approval_decision", "message": "the approval decisions could not be read"},
                "detail": self.detail,
            },
            status_code=400,
        )


class _ApproveBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    approve: Literal[True]
    arguments: dict[str, Any] | None = None


class _DenyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    approve: Literal[False]
    reason: str | None = None


class _NativeResume(BaseModel):
    """agentrt's resume request: `{"approval": {"run_id", "decisions"}}`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    run_id: str = Field(min_length=1, max_length=256)
    decisions: dict[str, _ApproveBody | _DenyBody]


def _native_resumption(raw: bytes) -> _Resumption | None:
    """The resumption a body asks for (`{"approval": ...}` and nothing else), or `None` for a body
    that is not one (a method call: validated as such)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "approval" not in data:
        return None
    if len(data) != 1:
        extra = sorted(key for key in data if key != "approval")
        raise _Undecidable(
            (extra[0],), "a resume request carries its decisions ('approval') only, no method parameters"
        )
    try:
        asked = _NativeResume.model_validate(data["approval"])
    except ValidationError as error:
        raise _Undecidable.of(error, ("approval",)) from None
    decisions: dict[str, _approval.Decision] = {
        call: Approve(arguments=d.arguments) if isinstance(d, _ApproveBody) else Deny(d.reason)
        for call, d in asked.decisions.items()
    }
    return _Resumption(asked.run_id, decisions)


def _split_approval(approval: str, where: tuple[str | int, ...]) -> tuple[str, str]:
    """A wire approval id's run id and call id (`"<run id>:<call id>"`, see `_frontends.approval_id`)."""
    run_id, colon, call_id = approval.partition(":")
    if not (colon and run_id and call_id):
        raise _Undecidable(where, "not an approval id this server sent ('<run id>:<call id>')")
    return run_id, call_id


def _decide(
    decisions: dict[str, _approval.Decision],
    run: list[str],
    approval: str,
    decision: _approval.Decision,
    where: tuple[str | int, ...],
) -> str:
    """Record `decision` on the call `approval` names (of the one run all answers name)."""
    run_id, call_id = _split_approval(approval, where)
    if run and run[0] != run_id:
        raise _Undecidable(where, "the answers name more than one run")
    if call_id in decisions:
        raise _Undecidable(where, f"call {call_id!r} is answered twice")
    run[:1] = [run_id]
    decisions[call_id] = decision
    return call_id


_MESSAGE_ID: Final = re.compile(r"[\w.:~-]{1,256}", re.ASCII)
"""A client's message id the resumed stream goes on with (and names its run by)."""


def _vercel_resumption(body: Any) -> _Resumption | None:
    """The answers of a `useChat` request after `addToolApprovalResponse`: its last message is the
    assistant's, with tool parts in state `approval-responded` (`approval: {id, approved, reason?}`).
    Only those are read: the parts' input (arguments) is not, the decisions approve or deny what
    the server stored. `None` for a request that answers nothing."""
    if body.v_trigger != "submit-message":
        return None
    index = len(body.v_messages) - 1
    last = body.v_messages[index]
    parts = last.get("parts")
    if last.get("role") != "assistant" or not isinstance(parts, list):
        return None
    decisions: dict[str, _approval.Decision] = {}
    run: list[str] = []
    used: list[str] = []
    wires: dict[str, str] = {}
    for number, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        wire = part.get("toolCallId")
        if isinstance(wire, str):
            used.append(wire)
        if part.get("state") != "approval-responded":
            continue
        where = ("messages", index, "parts", number, "approval")
        approval = part.get("approval")
        if (
            not isinstance(approval, dict)
            or not isinstance(approval.get("id"), str)
            or not isinstance(approval.get("approved"), bool)
        ):
            raise _Undecidable(where, "an approval-responded part carries approval {id, approved, reason?}")
        reason = approval.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise _Undecidable((*where, "reason"), "the reason is not text")
        decision = Approve() if approval["approved"] else Deny(reason)  # no edits over this protocol
        call_id = _decide(decisions, run, approval["id"], decision, where)
        if isinstance(wire, str):
            wires[call_id] = wire
    if not run:
        return None
    message_id = last.get("id")
    if not (isinstance(message_id, str) and _MESSAGE_ID.fullmatch(message_id)):
        message_id = None  # (it goes into a response header too)
    return _Resumption(run[0], decisions, tuple(used), tuple(wires.items()), message_id)


class _ResumeEntry(BaseModel):
    """AG-UI's `ResumeEntry`, what the endpoint reads of it."""

    model_config = ConfigDict(extra="ignore", strict=True)

    interruptId: str  # the protocol's names
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class _Answer(BaseModel):
    """A resolved tool approval's payload (`_frontends.APPROVAL_RESPONSE`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    approved: bool
    reason: str | None = None
    arguments: dict[str, Any] | None = None


def _agui_resumption(entries: list[Any]) -> _Resumption:
    """The decisions of an AG-UI run's `resume` entries: `resolved` with a payload `{"approved":
    true, "arguments"?: {...}}` approves (with an edit), `{"approved": false, "reason"?: ...}`
    denies; `cancelled` denies."""
    decisions: dict[str, _approval.Decision] = {}
    run: list[str] = []
    for number, raw in enumerate(entries):
        where: tuple[str | int, ...] = ("resume", number)
        try:
            entry = _ResumeEntry.model_validate(raw)
        except ValidationError as error:
            raise _Undecidable.of(error, where) from None
        decision: _approval.Decision
        if entry.status == "cancelled":
            decision = Deny()
        elif entry.payload is None:
            raise _Undecidable(
                (*where, "payload"), "a resolved approval carries a payload {approved, reason?, arguments?}"
            )
        else:
            try:
                answer = _Answer.model_validate(entry.payload)
            except ValidationError as error:
                raise _Undecidable.of(error, (*where, "payload")) from None
            if answer.approved:
                decision = Approve(arguments=answer.arguments)
            elif answer.arguments is not None:
                raise _Undecidable((*where, "payload", "arguments"), "a denied call runs with no arguments")
            else:
                decision = Deny(answer.reason)
        _decide(decisions, run, entry.interruptId, decision, (*where, "interruptId"))
    return _Resumption(run[0], decisions)


class _StopRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    runId: str
    threadId: str | None = None


def _invalid(error: ValidationError, prefix: tuple[str | int, ...] = ()) -> JSONResponse:
    problems = error.errors(include_url=False, include_context=False, include_input=False)
    return JSONResponse(
        {
            "error": {"type": "invalid_request", "message": "the request body is invalid"},
            "detail": [{**problem, "loc": [*prefix, *problem["loc"]]} for problem in problems],
        },
        status_code=422,
    )


def _invalid_at(where: tuple[str | int, ...], message: str) -> JSONResponse:
    return JSONResponse(
        {
            "error": {"type": "invalid_request", "message": "the request body is invalid"},
            "detail": [{"type": "value_error", "loc": list(where), "msg": message}],
        },
        status_code=422,
    )


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or `None` when it is longer than `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(request.stream()) as body:  # closed when left early, too
        async for chunk in body:
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


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
    """An error before the stream started, as an HTTP error. The log record carries the error
    itself (a `ModelError`'s text names the upstream status, endpoint and request id), and for a
    5xx its traceback: this runs after the `except` block, so the error is passed explicitly."""
    code, status, _ = _classify(error)
    logger.log(
        logging.WARNING if status < 500 else logging.ERROR,
        "agentrt.sse: %s failed before its stream (%d %s): %s: %s",
        spec.qualname,
        status,
        code,
        type(error).__name__,
        error,
        exc_info=error if status >= 500 else None,
    )
    headers = {}
    if isinstance(error, RateLimitError) and error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return JSONResponse({"error": _error_json(error)}, status_code=status, headers=headers)


def _body_model(
    spec: MethodSpec,
    request_budget: bool,
    *,
    message: str | None = None,
    envelope: dict[str, Any] | None = None,
    extra: Literal["forbid", "ignore"] = "forbid",
) -> tuple[type[BaseModel], dict[str, str], list[tuple[str, Any]]]:
    """The request body: the method's parameters but the memory id and the option parameters, with
    their annotations and defaults (and `budget`, with `request_budget`); unknown fields are refused.
    Fields have neutral names (`p0`, ...) and the parameters' names as aliases, so that no parameter
    name can clash with pydantic's own (`model_config`, `json`, `_private`). Also: field name ->
    parameter name, and the positional-only parameters with their defaults, in order.

    For a client protocol: `message` is the parameter the user's message fills (not a field), and
    `envelope` the protocol's own fields (field name -> (type, FieldInfo)), whose JSON names no
    parameter may have."""
    skipped = {spec.memory_param, message, *(name for name, _ in spec.option_params)}
    hints = typing.get_type_hints(spec.function, include_extras=True)  # resolved at build already
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    positional: list[tuple[str, Any]] = []
    for index, (name, parameter) in enumerate(spec.signature.parameters.items()):  # without `self`
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append((name, parameter.default))  # an option parameter: its default
        if name in skipped:
            continue
        default = parameter.default if parameter.default is not inspect.Parameter.empty else ...
        field = f"p{index}"
        fields[field] = (hints.get(name, Any), Field(default, alias=name))
        names[field] = name
    if envelope:
        taken = {info.alias for _, info in envelope.values()} & set(names.values())
        if taken:
            raise ConfigurationError(
                f"{spec.qualname}: the protocol's request has its own {sorted(taken)} field(s); rename "
                "the parameter(s)"
            )
        fields.update(envelope)
    if request_budget:
        if "budget" in names.values():
            raise ConfigurationError(
                f"{spec.qualname}: request_budget=True reserves the body's 'budget' field, but the "
                "method has a parameter of that name"
            )
        fields[_BUDGET_FIELD] = (_RequestBudget | None, Field(None, alias="budget"))
    try:
        model = create_model(
            f"{spec.name}_body",
            __config__=ConfigDict(extra=extra, populate_by_name=False, arbitrary_types_allowed=False),
            **fields,
        )
    except PydanticUserError as exc:  # a parameter type pydantic cannot read from JSON
        raise ConfigurationError(
            f"{spec.qualname}: its parameters cannot be read from a JSON body: {str(exc).splitlines()[0]}"
        ) from exc
    return model, names, positional
