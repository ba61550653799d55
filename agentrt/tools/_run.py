"""What the tool loop is told and what it tells: its settings and failure policies, the limits that
stop it, what a tool returns and the text the model sees for it. The loop that runs the calls is
`_loop.ToolLoop`; the worker-thread limit of sync tools is `_threads.ThreadLimiter`.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import orjson
from pydantic import BaseModel

from .._errors import AgentError, ConfigurationError
from .._events import ToolOutcome
from .._messages import ImageContent, ToolCall
from ..models._protocol import ToolChoice  # at runtime: `get_type_hints(ToolSettings)` resolves it

__all__ = [
    "JOURNAL",
    "OUTCOME_UNKNOWN",
    "CallJournal",
    "FailurePolicy",
    "LoopLimit",
    "OutcomeUnknownError",
    "ToolFailure",
    "ToolReturn",
    "ToolSettings",
    "arguments_hash",
    "result_text",
]

OUTCOME_UNKNOWN: Final[ContextVar[bool]] = ContextVar("agentrt_outcome_unknown", default=False)
"""Set while a tool round whose first run died with its worker runs again, when no `JOURNAL` knows
which of its calls finished: a call of it that is not safe to run again (see `safe_again`) is not
run; it fails with `OutcomeUnknownError` under the tool failure policy. One read per call, none per
token. (`agentrt.durable` records each call instead: `JOURNAL`.)"""


class CallJournal(Protocol):
    """Where a durable turn (`agentrt.durable`) records each call of a tool not safe to run again,
    by a key unique in the turn: started before it runs, finished (its outcome as JSON) after."""

    async def before(self, key: str) -> dict[str, Any] | bool:
        """Before the call: `False` (not started before: record it started, run it), `True` (started
        in a worker that died before it finished: its outcome is unknown), or the outcome recorded
        when it finished (not run again)."""
        ...

    async def after(self, key: str, outcome: dict[str, Any]) -> None:
        """The call finished: record its outcome."""
        ...

    async def settle(self, calls: Sequence[tuple[str, ToolCall]]) -> None:
        """Before a round's calls run: its calls not safe to run again, with their keys. A durable
        turn may stop the round here, before any call ran (to ask a human about a call whose
        outcome is unknown)."""
        ...


JOURNAL: Final[ContextVar[CallJournal | None]] = ContextVar("agentrt_call_journal", default=None)
"""Set by a durable turn around each segment that may run tools: one read per call, none per token."""


class OutcomeUnknownError(AgentError):
    """A tool call started in a worker that died before it finished: whether it took effect is
    unknown, and it was not run again (the tool is not declared idempotent)."""


def safe_again(annotations: Mapping[str, Any]) -> bool:
    """Whether a tool may run again after a run whose outcome is unknown: its owner says it is
    idempotent (`idempotentHint`, `@tool(idempotent=True)`) or changes nothing (`readOnlyHint`)."""
    return annotations.get("idempotentHint") is True or annotations.get("readOnlyHint") is True


SUCCESS_TEXT: Final = "Success"
"""What the model sees when a tool returns None."""


class LoopLimit(enum.StrEnum):
    """Which limit of the tool loop stopped it."""

    MAX_ROUNDS = "max_rounds"
    MAX_CALLS = "max_calls"
    REPEATED_CALL = "repeated_call"
    FAILED_ROUNDS = "failed_rounds"


@dataclass(frozen=True, slots=True)
class ToolFailure:
    """A failed tool call, as given to a failure handler."""

    outcome: ToolOutcome
    tool: str
    call: ToolCall
    error: BaseException | None
    timeout: float | None = None


FailureHandler = Callable[[ToolFailure], "str | Awaitable[str]"]
FailurePolicy = Literal["report", "raise"] | FailureHandler
"""`"report"`: the model gets a tool-result text (sanitized unless `error_detail`); `"raise"`: the
invocation fails with the typed error; a handler: its text is what the model gets."""


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """How the tool loop runs and when it stops.

    - `tool_choice`: for the first request of an invocation, `"auto"`, `"required"`, `"none"` or the
      name of the tool the model must call. Later requests let the model choose (so a forced tool
      cannot loop), or offer no tools to a model without `Capabilities.tool_choice_auto`.
    - `timeout`: seconds per call (a tool's own `@tool(timeout=...)` wins); `None` for none.
    - `max_concurrency`: calls of one round running at once (`None`: all of them).
    - `max_rounds`, `max_calls`: tool rounds and tool calls per invocation.
    - `max_identical_calls`: how often the same tool with identical arguments may run.
    - `max_failed_rounds`: consecutive rounds in which every call failed.
    - `on_limit`: `"raise"` a `ToolLoopLimitError` carrying the partial result, or `"final_answer"`:
      one more request without tools that asks the model to answer with what it has.
    - `on_invalid_arguments`, `on_unknown_tool`, `on_timeout`, `on_error`: the failure policies.
    - `error_detail`: report the exception's message to the model (off: only the tool name and the
      exception type, because messages can carry data the model should not see).
    - `thread_limit`: worker threads the service's sync tools may use at once, shared by all its
      invocations (500 concurrent calls of a service still use at most this many threads).

    Invalid values raise `ConfigurationError`.
    """

    tool_choice: ToolChoice | None = None
    timeout: float | None = None
    max_concurrency: int | None = None
    max_rounds: int = 10
    max_calls: int = 50
    max_identical_calls: int = 3
    max_failed_rounds: int = 3
    on_limit: Literal["raise", "final_answer"] = "raise"
    on_invalid_arguments: FailurePolicy = "report"
    on_unknown_tool: FailurePolicy = "report"
    on_timeout: FailurePolicy = "report"
    on_error: FailurePolicy = "report"
    error_detail: bool = False
    thread_limit: int = 16

    def __post_init__(self) -> None:
        def bad(message: str) -> ConfigurationError:
            return ConfigurationError(f"ToolSettings: {message}")

        if self.timeout is not None and not self.timeout > 0:
            raise bad(f"timeout must be positive or None, got {self.timeout!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise bad(f"max_concurrency must be at least 1 or None, got {self.max_concurrency!r}")
        for name in ("max_rounds", "max_calls", "max_identical_calls", "max_failed_rounds", "thread_limit"):
            if getattr(self, name) < 1:
                raise bad(f"{name} must be at least 1, got {getattr(self, name)!r}")
        if self.on_limit not in ("raise", "final_answer"):
            raise bad(f"on_limit must be 'raise' or 'final_answer', got {self.on_limit!r}")
        for name in ("on_invalid_arguments", "on_unknown_tool", "on_timeout", "on_error"):
            policy = getattr(self, name)
            if policy not in ("report", "raise") and (isinstance(policy, str) or not callable(policy)):
                raise bad(f"{name} must be 'report', 'raise' or a handler, got {policy!r}")

    def policy(self, outcome: ToolOutcome) -> FailurePolicy:
        if outcome is ToolOutcome.INVALID_ARGUMENTS:
            return self.on_invalid_arguments
        if outcome is ToolOutcome.UNKNOWN_TOOL:
            return self.on_unknown_tool
        if outcome is ToolOutcome.TIMEOUT:
            return self.on_timeout
        return self.on_error


FINAL_ANSWER_PROMPT: Final = (
    "The tool budget for this request is used up. Do not call any more tools: answer now, "
    "as well as you can, with the information you already have."
)


_last_hash: tuple[str, str] = ("", hashlib.sha256(b"").hexdigest()[:16])


def arguments_hash(arguments: str) -> str:
    """A short, stable digest of a call's arguments (logged and reported instead of the arguments)."""
    global _last_hash
    last = _last_hash
    if last[0] is arguments:  # the same call's arguments again: its request event, then its execution
        return last[1]
    digest = hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    _last_hash = (arguments, digest)
    return digest


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """What a tool returns to send the model images with its result: `value` is what it sees as text
    (as any return value: str as is, None as a success text, else JSON), `images` follow it
    (`ImageContent`; see `ToolResultMessage.images` for how each adapter sends them). A `value`
    that is itself a `ToolReturn` (a wrapper adding images) gives its value, and its images after
    these.

        @tool
        async def chart(series: str) -> ToolReturn:
            return ToolReturn("the chart of " + series, images=[ImageContent.from_bytes(png, "image/png")])
    """

    value: Any
    images: Sequence[ImageContent] = ()


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def result_text(value: Any) -> str:
    """What the model sees for a tool's return value: str as is, None as a success text, else JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return SUCCESS_TEXT
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()
