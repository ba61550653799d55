"""agentrt's own protocol (`protocol="agentrt"`): its events, named and numbered (their data's
shapes, `EVENTS`; a `Result` as `done` has it, `result_json`), its encoder (`Native`), and its
requests: the method's parameters as JSON, or `{"approval": ...}` to resume a turn (`NativeWire`).
"""

from __future__ import annotations

import typing
from typing import Any, Final, Literal, NotRequired

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python
from sse_starlette import ServerSentEvent
from typing_extensions import TypedDict

from .._approval import Approve, Deny
from .._errors import ConfigurationError
from .._events import (
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
from ._encoder import Encoder, Sent, approval_json, dumps, new_id
from ._wire import Asked, Body, Resumption, Undecidable, Wire

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

    from .. import _approval
    from .._events import Event
    from ..rag._types import Content


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


def encode(event: Event, thinking: bool, tool_details: bool) -> tuple[str, dict[str, Any]] | None:
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


class Native(Encoder):
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
            text = dumps(data)
        self.number += 1  # after the data is made: a failure there leaves no gap in the ids
        return ServerSentEvent(data=text, event=name, id=str(self.number))

    def opened(self) -> list[Any]:
        return []

    def event(self, event: Event) -> Sequence[Any]:
        if self.structured and type(event) is TextDelta:
            return ()  # a structured answer's text: its values are sent instead
        encoded = encode(event, self.thinking, self.tool_details)
        return (encoded,) if encoded is not None else ()

    def partial(self, value: Any) -> list[Any]:
        return [("partial", {"value": value})]

    def completed(self, result: Result[Any], done: dict[str, Any]) -> list[Any]:
        return [("done", done)]

    def approval(self, approval: ApprovalRequested) -> list[Any]:
        return [("approval_required", approval_json(approval))]

    def failed(self, error: dict[str, Any]) -> list[Any]:
        return [("error", error)]

    def stopped(self, sent: Sent) -> list[Any]:
        return [("stopped", {})]


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


def _resumption(raw: bytes) -> Resumption | None:
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
        raise Undecidable(
            (extra[0],), "a resume request carries its decisions ('approval') only, no method parameters"
        )
    try:
        asked = _NativeResume.model_validate(data["approval"])
    except ValidationError as error:
        raise Undecidable.of(error, ("approval",)) from None
    decisions: dict[str, _approval.Decision] = {
        call: Approve(arguments=d.arguments) if isinstance(d, _ApproveBody) else Deny(d.reason)
        for call, d in asked.decisions.items()
    }
    return Resumption(asked.run_id, decisions)


class NativeWire(Wire):
    """agentrt's own protocol: a request is the method's parameters (`{"approval": ...}` resumes a
    turn); a response is a run (stoppable, numbered `{run_id}:{seq}`) in a run manager only."""

    __slots__ = ()

    name = "agentrt"
    logs_sent = False  # its stopped end is `stopped` whatever was sent

    def body_of(self, message: str | None) -> Body:
        settings = self.settings
        spec = settings.spec
        if message is not None:
            raise ConfigurationError(f"{spec.qualname}: message= is for a client protocol")
        body = Body(spec, settings.request_budget)
        if settings.gated and "approval" in body.names.values():
            raise ConfigurationError(
                f"{spec.qualname}: its tool calls may wait for approval, and a resume request's body is "
                "{'approval': ...}, but the method has a parameter of that name; rename it"
            )
        return body

    def read(self, raw: bytes) -> Asked:
        # `approval` is reserved in the body of a method whose calls may wait for approval.
        if self.settings.gated and b'"approval"' in raw:
            resuming = _resumption(raw)
            if resuming is not None:
                return Asked(resuming=resuming)
        return self.body.asked(self.body.model.model_validate_json(raw or b"{}"))

    async def encoder(self, asked: Asked) -> tuple[Encoder, str] | None:
        settings = self.settings
        if settings.runs is None:
            return None
        run_id = new_id("run")
        return Native(settings.thinking, settings.tool_details, settings.structured), run_id

    def blank(self) -> Encoder:
        return Native(False, False, False)
