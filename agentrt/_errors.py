"""The agentrt exception tree.

Every error agentrt raises derives from `AgentError`. Cancellation is never converted into one of these:
it stays the backend's own cancellation exception.

    AgentError
    ├── ConfigurationError          a service, tool or model is declared wrongly (raised at build time)
    ├── ModelError                  the model endpoint failed; carries status, body, request id, endpoint
    │   ├── ModelConnectionError    the endpoint could not be reached
    │   ├── ModelTimeoutError       the endpoint did not answer in time
    │   ├── ModelResponseError      the endpoint answered something agentrt cannot read
    │   ├── AuthenticationError     401
    │   ├── PermissionDeniedError   403
    │   ├── ModelNotFoundError      404
    │   ├── RateLimitError          429 (with `retry_after`)
    │   ├── BadRequestError         400/422 (the provider's message is kept)
    │   │   └── ContextLengthExceededError
    │   ├── ServerError             5xx
    │   │   └── OverloadedError     503/529 and "overloaded" errors
    │   └── ContentRefusedError     the model refused to produce the requested output
    ├── OutputParsingError          the answer does not parse into the declared return type
    ├── ToolError                   a tool call failed and the policy for that failure is "raise"
    │   ├── ToolArgumentsError      the model's arguments do not validate
    │   ├── UnknownToolError        the model called a tool that does not exist
    │   ├── ToolTimeoutError        the tool did not finish within its timeout
    │   └── ToolExecutionError      the tool raised (the original exception is the __cause__)
    ├── ToolLoopLimitError          a limit of the tool loop was reached (carries `reason` and `partial`)
    ├── BudgetExceededError         a limit of the invocation's Budget was reached (`limit`, `partial`)
    ├── ChatMemoryError             chat memory could not serve a turn; nothing of it was stored
    │   ├── ConversationBusyError   another turn held the conversation past the memory's `wait`
    │   ├── ConversationLockLostError  a shared store's lock expired or was taken mid-turn
    │   └── ConversationReentryError   the task's own unclosed stream holds the conversation
    ├── RetrievalError              a retriever (or an embedding model behind it) failed (`retriever`)
    ├── ModerationError             the moderation model flagged the call (`categories`, `partial`)
    │   └── ModerationFailedError   the moderation model itself failed and the policy says "fail"
    ├── ApprovalRequired            the turn waits for a human's decision on tool calls (`approval`)
    └── ApprovalError               approvals refused a call or a resume; nothing ran, nothing stored
        ├── ApprovalPendingError    a new turn on a conversation whose turn waits for approval
        ├── ApprovalNotFoundError   no such pending run (resumed already, stale, another conversation's)
        └── ApprovalDecisionError   decisions that do not fit the pending calls (missing, unknown, invalid)

Every error pickles (and copies), whatever its `__init__` looks like, a user's own subclasses included:
a task queue or a process pool carries it with its type, message, `args` and every attribute. As always
in Python, the exception chain (`__cause__`, `__context__`) and the traceback are not carried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._events import ApprovalRequested, Result

__all__ = [
    "AgentError",
    "ApprovalDecisionError",
    "ApprovalError",
    "ApprovalNotFoundError",
    "ApprovalPendingError",
    "ApprovalRequired",
    "AuthenticationError",
    "BadRequestError",
    "BudgetExceededError",
    "ChatMemoryError",
    "ConfigurationError",
    "ContentRefusedError",
    "ContextLengthExceededError",
    "ConversationBusyError",
    "ConversationLockLostError",
    "ConversationReentryError",
    "GuardrailError",
    "InputGuardrailError",
    "ModelConnectionError",
    "ModelError",
    "ModelNotFoundError",
    "ModelResponseError",
    "ModelTimeoutError",
    "ModerationError",
    "ModerationFailedError",
    "OutputGuardrailError",
    "OutputParsingError",
    "OverloadedError",
    "PermissionDeniedError",
    "RateLimitError",
    "RetrievalError",
    "ServerError",
    "ToolArgumentsError",
    "ToolError",
    "ToolExecutionError",
    "ToolLoopLimitError",
    "ToolTimeoutError",
    "UnknownToolError",
]


def _slot_names(cls: type) -> list[str]:
    """The names of the slots `cls` and its bases declare (private names mangled), in MRO order."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return names


def _rebuild(cls: type[AgentError], args: tuple[Any, ...]) -> AgentError:
    """Unpickle an error: create it without calling `__init__`; pickle then restores its attributes."""
    error = cls.__new__(cls)
    error.args = args
    return error


class AgentError(Exception):
    """Base class of every error raised by agentrt."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default (`type(self)(*self.args)`, then the instance dict) calls `__init__` with the
        # message only: that fails for keyword-only fields, and re-formats messages an `__init__` builds.
        # Rebuild without `__init__` instead and restore `args` and every attribute, slots included
        # (`BaseException.__setstate__` sets each item of the state).
        state = dict(self.__dict__)
        for name in _slot_names(type(self)):
            try:
                state[name] = getattr(self, name)
            except AttributeError:
                continue  # an unset slot
        return (_rebuild, (type(self), self.args), state)


class ConfigurationError(AgentError):
    """A service, tool, template or model is declared wrongly.

    Raised when a class is decorated or built, never on the first call. The message names
    `Class.method` and the offending parameter or variable.
    """


class ModelError(AgentError):
    """The model endpoint failed.

    Attributes are whatever the failure offered: the HTTP `status`, the response `body` (text, possibly
    truncated), the provider's `request_id`, the `endpoint` (URL without credentials), whether the
    failure happened after the first byte of the response reached the pipeline (`mid_stream`), and the
    provider's machine-readable error `code` (e.g. `"context_length_exceeded"`, `"tool_use_failed"`).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        request_id: str | None = None,
        endpoint: str | None = None,
        mid_stream: bool = False,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body
        self.request_id = request_id
        self.endpoint = endpoint
        self.mid_stream = mid_stream
        self.code = code

    def __str__(self) -> str:
        parts = [self.message]
        if self.status is not None:
            parts.append(f"status {self.status}")
        if self.endpoint:
            parts.append(f"endpoint {self.endpoint}")
        if self.request_id:
            parts.append(f"request id {self.request_id}")
        return parts[0] if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"


class ModelConnectionError(ModelError):
    """The endpoint could not be reached (DNS, refused connection, TLS, reset before a response)."""


class ModelTimeoutError(ModelError):
    """The endpoint did not answer within the transport timeout."""


class ModelResponseError(ModelError):
    """The endpoint answered with something that is not a valid response of its protocol."""


class AuthenticationError(ModelError):
    """The endpoint rejected the credentials (HTTP 401)."""


class PermissionDeniedError(ModelError):
    """The credentials are valid but not allowed to do this (HTTP 403)."""


class ModelNotFoundError(ModelError):
    """The model or the endpoint path does not exist (HTTP 404)."""


class RateLimitError(ModelError):
    """The endpoint is rate limiting (HTTP 429); `retry_after` is in seconds when the server said."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
        body: str | None = None,
        request_id: str | None = None,
        endpoint: str | None = None,
        mid_stream: bool = False,
        code: str | None = None,
    ) -> None:
        super().__init__(
            message,
            status=status,
            body=body,
            request_id=request_id,
            endpoint=endpoint,
            mid_stream=mid_stream,
            code=code,
        )
        self.retry_after = retry_after


class BadRequestError(ModelError):
    """The endpoint rejected the request (HTTP 400/422); the message is the provider's own."""


class ContextLengthExceededError(BadRequestError):
    """The conversation does not fit into the model's context window."""


class ServerError(ModelError):
    """The endpoint failed on its side (HTTP 5xx)."""


class OverloadedError(ServerError):
    """The endpoint is temporarily overloaded (HTTP 503/529 or an "overloaded" error)."""


class ContentRefusedError(ModelError):
    """The model refused to produce the requested output; `refusal` holds its explanation."""

    def __init__(self, refusal: str) -> None:
        super().__init__(f"the model refused: {refusal}")
        self.refusal = refusal


class OutputParsingError(AgentError):
    """The model's answer could not be parsed into the method's declared return type.

    `text` is the raw answer; `target` names the type it should have become; `detail` says what was
    wrong (the first validation errors, each with where it was); `partial` is the `Result` so far when
    the invocation raised it (after its repairs, if any).
    """

    def __init__(
        self,
        message: str,
        *,
        text: str,
        target: str,
        detail: str = "",
        partial: Result[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.text = text
        self.target = target
        self.detail = detail
        self.partial = partial


class ToolError(AgentError):
    """A tool call failed and its failure policy is "raise".

    `tool` is the tool name the model used, `call_id` the model's id for the call.
    """

    def __init__(self, message: str, *, tool: str, call_id: str) -> None:
        super().__init__(message)
        self.tool = tool
        self.call_id = call_id


class ToolArgumentsError(ToolError):
    """The model's arguments for a tool are not valid JSON or do not match its schema."""


class UnknownToolError(ToolError):
    """The model called a tool that this invocation does not offer."""


class ToolTimeoutError(ToolError):
    """A tool did not finish within its timeout."""


class ToolExecutionError(ToolError):
    """A tool raised; the tool's exception is `__cause__`."""


class ToolLoopLimitError(AgentError):
    """The tool loop reached a limit; `reason` says which, `partial` is the `Result` so far.

    `partial.value` is `None`; `partial.tool_executions` lists every call that ran.
    """

    def __init__(self, message: str, *, reason: str, partial: Result[Any]) -> None:
        super().__init__(message)
        self.reason = reason
        self.partial = partial


class BudgetExceededError(AgentError):
    """The invocation reached a limit of its `Budget`; `limit` names it, `partial` is the `Result` so far.

    `partial.value` is `None`; `partial.text` is the answer text so far, `partial.usage` what was spent
    (estimated where the server reported nothing, and marked so), `partial.spent` the account against
    every limit, `partial.tool_executions` every call that finished, `partial.messages` the transcript.
    """

    def __init__(self, message: str, *, limit: str, partial: Result[Any]) -> None:
        super().__init__(message)
        self.limit = limit
        self.partial = partial


class ChatMemoryError(AgentError):
    """Chat memory could not serve a turn: its conversation was busy, its lock was lost, or its store
    failed. Nothing of the turn was stored."""


class ConversationBusyError(ChatMemoryError):
    """Another turn held the conversation longer than the memory's wait limit; `memory_id` names it."""

    def __init__(self, message: str, *, memory_id: Any) -> None:
        super().__init__(message)
        self.memory_id = memory_id


class ConversationLockLostError(ChatMemoryError):
    """A shared store's lock on the conversation expired or was taken while the turn ran (the holder
    stopped renewing it, e.g. a paused process): the turn was not stored, so no other turn's messages
    were overwritten or interleaved."""


class ConversationReentryError(ChatMemoryError):
    """A task started a turn on a conversation that a turn of its own still holds: most likely a
    stream it broke out of and kept, neither closed nor read to its end. Only that task could close
    it, so waiting would never end; raised at once instead, before anything is sent or stored.
    `memory_id` names the conversation, `holder` the method (`Class.method`) whose turn holds it.

    Close the stream first, best by construction: `async with await svc.stream(...) as tokens:`.
    """

    def __init__(self, message: str, *, memory_id: Any, holder: str) -> None:
        super().__init__(message)
        self.memory_id = memory_id
        self.holder = holder


class GuardrailError(AgentError):
    """Guardrails refused the call; `failures` are the verdicts that failed (`GuardrailVerdict`), in
    the order they ran."""

    def __init__(self, message: str, *, failures: tuple[Any, ...]) -> None:
        super().__init__(message)
        self.failures = failures


class InputGuardrailError(GuardrailError):
    """The input guardrails refused the user message: no model request was made, nothing stored."""


class OutputGuardrailError(GuardrailError):
    """The output guardrails refused the answer (a failure, a fatal, or re-asks past `max_retries`).
    `failures` are the failed verdicts of the last run of the chain; `partial` the `Result` so far
    (its `attempts` counts the answers checked). Nothing was stored."""

    def __init__(self, message: str, *, failures: tuple[Any, ...], partial: Result[Any]) -> None:
        super().__init__(message, failures=failures)
        self.partial = partial


class RetrievalError(AgentError):
    """A retriever failed or timed out (`retriever` names it), and its policy is to fail the call;
    the retriever's own exception (an embedding model's `ModelError`, say) is `__cause__`. No model
    request was made for the turn, nothing was stored."""

    def __init__(self, message: str, *, retriever: str) -> None:
        super().__init__(message)
        self.retriever = retriever


class ModerationError(AgentError):
    """The moderation model flagged the user message (or the answer, where that is moderated).

    `categories` are the flagged categories' names, `flagged` which text was flagged (`"input"` or
    `"answer"`), `moderation` the moderation model's whole verdict, `partial` the `Result` so far: its
    usage counts any model response that was already under way (and paid for) when the flag came; its
    text is what the model had said, which no reader was shown. Nothing was stored."""

    def __init__(
        self,
        message: str,
        *,
        categories: tuple[str, ...],
        flagged: str,
        moderation: Any,
        partial: Result[Any] | None,
    ) -> None:
        super().__init__(message)
        self.categories = categories
        self.flagged = flagged
        self.moderation = moderation
        self.partial = partial


class ModerationFailedError(ModerationError):
    """The moderation model could not give a verdict (its error is `__cause__`) and the moderation's
    `on_error` policy is `"fail"`: the call is stopped as if flagged, with no categories."""


class ApprovalRequired(AgentError):
    """The turn stopped before tool calls that need a human's approval (an awaited method that returns
    its value; a `Result[T]` method returns a `Result` with `approval` set instead, a stream ends with
    the event). `approval` is the `ApprovalRequested` event: its `run_id` and `calls`; `partial` is the
    `Result` so far. Resume with `agentrt.resume(service, approval.run_id, decisions, memory_id=...)`.
    """

    def __init__(self, message: str, *, approval: ApprovalRequested, partial: Result[Any]) -> None:
        super().__init__(message)
        self.approval = approval
        self.partial = partial


class ApprovalError(AgentError):
    """Approvals refused a turn or a resume: nothing ran and nothing was stored."""


class ApprovalPendingError(ApprovalError):
    """A new turn on a conversation whose previous turn waits for approval (the policy `"refuse"`):
    decide on it first (`agentrt.resume`), or build with `Approvals(while_pending="deny")`.
    `approval` is the pending turn's `ApprovalRequested`."""

    def __init__(self, message: str, *, approval: ApprovalRequested) -> None:
        super().__init__(message)
        self.approval = approval


class ApprovalNotFoundError(ApprovalError):
    """No pending turn with that run id on that conversation: it was resumed already, it is another
    conversation's, or a newer turn replaced it."""


class ApprovalDecisionError(ApprovalError):
    """The decisions do not fit the pending calls: one is missing, names a call that is not pending,
    is not a decision, or edits arguments the tool's schema refuses. Nothing ran; the turn still
    waits."""
