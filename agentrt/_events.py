"""Events of an invocation, the chunks a model streams, and the final `Result`.

A model adapter yields *chunks* (`TextDelta`, `ThinkingDelta`, `ToolCallDelta`, `RefusalDelta`, `Usage`,
`Finish`, `ResponseMeta`). The pipeline passes the public ones straight through as events (no copy per
token) and adds lifecycle events (`Started`, `RequestIssued`, `ResponseReceived`, `Completed`).
`FailedEvent` and `CancelledEvent` only reach listeners: in the event stream, errors are raised, never
yielded.

Everything here is a slotted dataclass: these objects are created per token and must stay cheap.
The per-token ones (`TextDelta`, `ThinkingDelta`, `ToolCallDelta`) are not frozen, because a frozen
dataclass's `__init__` costs twice as much; treat them as immutable all the same.
"""

from __future__ import annotations

import copy
import enum
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, SupportsIndex, TypeVar

from ._budget import Budget, Spent
from ._messages import AssistantMessage, ChatMessage, ImageContent, ToolCall
from ._wire import Content, ModelRequest

__all__ = [
    "ApprovalRequested",
    "CancelledEvent",
    "Completed",
    "Event",
    "FailedEvent",
    "Finish",
    "FinishReason",
    "LifecycleEvent",
    "ModelChunk",
    "ModelResponse",
    "PendingCall",
    "RefusalDelta",
    "RequestIssued",
    "Reset",
    "ResetReason",
    "ResponseMeta",
    "ResponseReceived",
    "Result",
    "Retrieved",
    "Started",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallDelta",
    "ToolCallRequested",
    "ToolExecuted",
    "ToolExecution",
    "ToolOutcome",
    "Usage",
]

T = TypeVar("T")


class FinishReason(enum.StrEnum):
    """Why the model stopped."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    OTHER = "other"


# --- chunks (from the model; the public ones are also events) ------------------------------------


@dataclass(slots=True)
class TextDelta:
    """A piece of answer text."""

    text: str


@dataclass(slots=True)
class ThinkingDelta:
    """A piece of reasoning text; `signature` is set on the chunk that closes a signed block.

    A `redacted` chunk is a whole block whose reasoning the provider encrypted (Anthropic's
    `redacted_thinking`): its `text` is empty and `signature` holds the opaque data, which must be sent
    back unchanged.
    """

    text: str
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class RefusalDelta:
    """A piece of a refusal (the model declined to produce structured output)."""

    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A fragment of a tool call. Fragments with the same `index` belong to one call; `id` and `name`
    usually arrive on the first fragment only, `arguments` is a piece of JSON text split anywhere."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage. `estimated` is true when some part was estimated because the server sent none."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.estimated or other.estimated,
        )


@dataclass(frozen=True, slots=True)
class Finish:
    """The model finished this response; `raw` is the provider's own reason string."""

    reason: FinishReason
    raw: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """The provider's response id and the model that actually served the request."""

    id: str | None = None
    model: str | None = None


ModelChunk = TextDelta | ThinkingDelta | RefusalDelta | ToolCallDelta | Usage | Finish | ResponseMeta
"""What `ChatModel.stream` yields."""


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One complete model response: the fold of its chunks."""

    message: AssistantMessage
    usage: Usage
    finish_reason: FinishReason | None = None
    id: str | None = None
    model: str | None = None


# --- lifecycle events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The invocation began. `method` is `Class.method`, `model` the name of the service's model and
    `provider` who serves it, as the model declares (`Capabilities.provider`: `"openai"`,
    `"anthropic"`, `"ollama"`; `None` for a model that does not say)."""

    invocation_id: str
    method: str
    memory_id: Any = None
    model: str | None = None
    provider: str | None = None


@dataclass(frozen=True, slots=True)
class RequestIssued:
    """A request is about to be sent to the model (`round` counts requests within the invocation)."""

    invocation_id: str
    request: ModelRequest
    round: int


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A model response is complete."""

    invocation_id: str
    response: ModelResponse
    round: int


class ToolOutcome(enum.StrEnum):
    """How a tool call ended."""

    SUCCESS = "success"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TIMEOUT = "timeout"
    ERROR = "error"
    DENIED = "denied"
    """A human denied the call (or its approval expired): it never ran."""


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """One tool call as it ran: what the model saw (`result`) and how it went.

    `arguments_hash` identifies the arguments without revealing them; `error_kind` is the exception
    type name of a failure; `value` is what the tool returned (not compared, not shown).
    """

    name: str
    call_id: str
    arguments_hash: str
    result: str
    outcome: ToolOutcome = ToolOutcome.SUCCESS
    error_kind: str | None = None
    round: int = 1
    duration: float = field(default=0.0, compare=False)
    value: Any = field(default=None, compare=False, repr=False)
    images: tuple[ImageContent, ...] = field(default=(), repr=False)
    """Images the tool returned with its result (`ToolReturn`, an MCP tool's image content)."""

    @property
    def is_error(self) -> bool:
        return self.outcome is not ToolOutcome.SUCCESS

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # `value` is whatever the tool returned, for use in this process. Pickling carries it when it
        # pickles and gives `None` when it does not (a lock, a lambda, a connection), so that a `Result`,
        # and the `ToolLoopLimitError` carrying one, always pickle; `result` keeps what the model saw.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.value is not None:
            try:
                pickle.dumps(self.value, protocol.__index__())
            except Exception:
                state["value"] = None
        return (_tool_execution, (state,))

    # copy and deepcopy keep every value as before (they would otherwise go through `__reduce_ex__`).
    def __copy__(self) -> ToolExecution:
        return replace(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> ToolExecution:
        return ToolExecution(**{f.name: copy.deepcopy(getattr(self, f.name), memo) for f in fields(self)})


def _tool_execution(state: dict[str, Any]) -> ToolExecution:
    """Unpickle a `ToolExecution`."""
    return ToolExecution(**state)


@dataclass(frozen=True, slots=True, repr=False)
class ToolCallRequested:
    """The model asked for a tool call.

    `annotations` are what the tool's owner says of it, as they said it (an MCP server's
    `readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`; empty for tools written
    in Python), shown with the call over SSE and on its OTel span.

    The event carries the whole `call` (its arguments too) to code in this process, as
    `RequestIssued` carries the prompt: the SSE endpoint and the frontends need them for
    `tool_details=True`. Whatever leaves the process shows `arguments_hash` instead unless its owner
    opted in: the event's `repr` (what a log line prints), agentrt's logs, OTel spans (arguments with
    `capture_content=True`), SSE and frontend streams (with `tool_details=True`).
    """

    invocation_id: str
    call: ToolCall
    arguments_hash: str
    round: int
    annotations: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __repr__(self) -> str:
        call = self.call
        return (
            f"ToolCallRequested(invocation_id={self.invocation_id!r}, name={call.name!r}, "
            f"call_id={call.id!r}, arguments_hash={self.arguments_hash!r}, round={self.round!r})"
        )


@dataclass(frozen=True, slots=True)
class ToolExecuted:
    """A tool call finished (in the model's order, once the round's calls have all finished)."""

    invocation_id: str
    execution: ToolExecution


@dataclass(frozen=True, slots=True)
class Retrieved:
    """What retrieval found for the call, before the first model request: the `queries` run (the
    user's text, or what the query transformer made of it), the `contents` injected into the message
    the model sees (ranked, at most `Retrieval.max_results`), and the retrievers `skipped` under
    `on_error="skip"` (`agentrt.rag.Skipped`)."""

    invocation_id: str
    queries: tuple[str, ...]
    contents: tuple[Content, ...]
    skipped: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class GuardrailVerdict:
    """A guardrail ran: on the user message (`kind` "input") or on an answer ("output"; `attempt`
    is 1 for the first answer, 2 after one re-ask, ...). `verdict` is a `guardrails.Verdict` value;
    `partial` is true for a check of part of an answer (a `chunked` stream's chunk)."""

    invocation_id: str
    guardrail: str
    kind: str
    verdict: str
    message: str | None
    seconds: float
    attempt: int = 1
    partial: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict in ("success", "success_with")


class ResetReason(enum.StrEnum):
    """Why released text was withdrawn."""

    REJECTED = "rejected"
    """The output guardrails asked again: the answer released so far was refused."""
    REWRITTEN = "rewritten"
    """An output guardrail rewrote text that was already released."""
    TOOL_CALLS = "tool_calls"
    """The text released so far came with tool calls: it was not the answer."""
    UNPARSED = "unparsed"
    """The answer did not parse into the return type: it is asked for again (a repair)."""


@dataclass(frozen=True, slots=True)
class Reset:
    """Discard the text and thinking released since the previous `Reset` (or the start): it is
    withdrawn, and what follows replaces it. Only streams whose output guardrails release text before
    the whole answer passed (`release="chunked"` or `"optimistic"`), and streams of structured values
    whose answer did not parse (a repair), have resets; `attempt` is the attempt whose text is
    withdrawn."""

    invocation_id: str
    reason: ResetReason
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    """The outcome of an invocation: the parsed value and everything learned on the way.

    Two results compare equal when they carry the same outcome; the invocation id is not compared.
    """

    value: T
    text: str
    usage: Usage
    finish_reason: FinishReason | None = None
    thinking: str | None = None
    tool_executions: tuple[ToolExecution, ...] = ()
    sources: tuple[Content, ...] = ()
    """The contents retrieval injected into the message the model saw (`agentrt.rag.Content`)."""
    attempts: int = 1
    model: str | None = None
    messages: tuple[ChatMessage, ...] = field(default=(), repr=False)
    """The transcript of the last request and its answer, as the model saw it: with format
    instructions and retrieved text, and with any rejected answer and its reprompt (or a repair's).
    Keep `turn` instead if you store conversations yourself."""
    invocation_id: str = field(default="", compare=False)
    budget: Budget | None = None
    """The invocation's effective budget (call > method > build), when it had one."""
    spent: Spent | None = field(default=None, compare=False)
    """What the invocation spent against each limit of `budget` (set when it had one)."""
    turn: tuple[ChatMessage, ...] = field(default=(), repr=False)
    """This turn as chat memory stores it: the user's own message, the tool exchanges, the accepted
    answer; never a rejected answer, a reprompt, format instructions or retrieved text."""
    approval: ApprovalRequested | None = None
    """Set when the turn stopped for a human's approval of tool calls (`value` is then `None` and
    nothing was stored): resume it with `agentrt.resume`."""


@dataclass(frozen=True, slots=True)
class Completed(Generic[T]):
    """The invocation succeeded; the last event of every successful stream."""

    invocation_id: str
    result: Result[T]


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A tool call that waits for a human's decision: the model's call id, the tool, and its
    arguments as validated (JSON data, by parameter name)."""

    id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """The turn stopped before tool calls that need a human's approval; the last event of its stream.

    The calls of the round that needed none have run; the turn is stored server-side (with the
    conversation, in the memory's store) and nothing of it is in the conversation's history yet.
    Resume it with `agentrt.resume(service, run_id, decisions, memory_id=...)` before `expires_at`
    (seconds since the epoch); after that its calls count as denied.
    """

    invocation_id: str
    run_id: str
    method: str
    memory_id: Any
    calls: tuple[PendingCall, ...]
    expires_at: float | None
    partial: Result[Any] | None = field(default=None, compare=False, repr=False)
    """What the turn has so far (its `value` is `None`)."""


@dataclass(frozen=True, slots=True)
class FailedEvent:
    """The invocation raised `error` (delivered to listeners only; the stream raises it)."""

    invocation_id: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class CancelledEvent:
    """The invocation was cancelled or closed early (delivered to listeners only)."""

    invocation_id: str


Event = (
    Started
    | RequestIssued
    | TextDelta
    | ThinkingDelta
    | RefusalDelta
    | Usage
    | ResponseReceived
    | ToolCallRequested
    | ToolExecuted
    | Retrieved
    | GuardrailVerdict
    | Reset
    | ApprovalRequested
    | Completed[Any]
)
"""What an invocation's event stream yields."""

LifecycleEvent = (
    Started
    | RequestIssued
    | ResponseReceived
    | ToolCallRequested
    | ToolExecuted
    | Retrieved
    | GuardrailVerdict
    | Reset
    | ApprovalRequested
    | Completed[Any]
    | FailedEvent
    | CancelledEvent
)
"""What listeners receive."""
