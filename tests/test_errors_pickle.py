"""Every agentrt error survives pickling: a task queue or a process pool can carry it.

A round trip (every pickle protocol, and `copy`/`deepcopy`, which use the same protocol) keeps the type,
`str(error)`, `args` and every attribute, including a `ToolLoopLimitError`'s partial `Result` with
its messages and tool executions.

What pickling does not carry, by Python's own rules for exceptions: `__cause__`, `__context__` and
`__traceback__` (the original exception of a `ToolExecutionError` may not even be picklable). Notes
added with `add_note` live in the instance dict and do survive.

A tool's return value (`ToolExecution.value`, never compared nor shown) is carried when it pickles and
becomes `None` when it does not (a lock, a lambda, an open connection): the error itself must always
make it across.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import pickle
import pkgutil
import threading
from collections.abc import Callable
from typing import Any

import pytest

import agentrt
from agentrt import _errors
from agentrt._errors import (
    AgentError,
    ApprovalDecisionError,
    ApprovalError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ApprovalRequired,
    AuthenticationError,
    BadRequestError,
    BudgetExceededError,
    ChatMemoryError,
    ConfigurationError,
    ContentRefusedError,
    ContextLengthExceededError,
    ConversationBusyError,
    ConversationLockLostError,
    ConversationReentryError,
    GuardrailError,
    InputGuardrailError,
    ModelConnectionError,
    ModelError,
    ModelNotFoundError,
    ModelResponseError,
    ModelTimeoutError,
    ModerationError,
    ModerationFailedError,
    OutputGuardrailError,
    OutputParsingError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    RetrievalError,
    ServerError,
    ToolArgumentsError,
    ToolError,
    ToolExecutionError,
    ToolLoopLimitError,
    ToolTimeoutError,
    UnknownToolError,
)
from agentrt._events import FinishReason, GuardrailVerdict, Result, ToolExecution, ToolOutcome, Usage
from agentrt._messages import (
    AssistantMessage,
    ImageContent,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentrt.durable import TurnFailedError
from agentrt.local import LocalModelError
from agentrt.mcp import MCPServerError, MCPToolError
from agentrt.moderation import Moderation
from agentrt.tools._run import LoopLimit, OutcomeUnknownError

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)

_MODEL_FIELDS: dict[str, Any] = {
    "status": 503,
    "body": '{"error": {"type": "overloaded_error", "message": "Overloaded"}}',
    "request_id": "req_01HZX3",
    "endpoint": "https://api.example.com/v1/chat/completions",
    "mid_stream": True,
    "code": "overloaded_error",
}


def _model_error(cls: type[ModelError]) -> Callable[[], AgentError]:
    return lambda: cls(f"{cls.__name__}: the endpoint failed", **_MODEL_FIELDS)


def _tool_error(cls: type[ToolError]) -> Callable[[], AgentError]:
    return lambda: cls(f"tool 'lookup' call call_7 failed ({cls.__name__})", tool="lookup", call_id="call_7")


def _partial(value: Any = ("a", 1)) -> Result[Any]:
    call = ToolCall(id="call_1", name="lookup", arguments='{"city": "Oslo"}')
    return Result(
        value=None,
        text="Let me look that up again.",
        usage=Usage(input_tokens=812, output_tokens=64, cached_input_tokens=512, reasoning_tokens=8),
        finish_reason=FinishReason.TOOL_CALLS,
        thinking="the user wants the weather",
        tool_executions=(
            ToolExecution(
                name="lookup",
                call_id="call_1",
                arguments_hash="9f2c1e",
                result='{"temp": 3}',
                round=1,
                duration=0.0125,
                value=value,
            ),
            ToolExecution(
                name="missing",
                call_id="call_2",
                arguments_hash="0a0b0c",
                result="error: unknown tool 'missing'",
                outcome=ToolOutcome.UNKNOWN_TOOL,
                error_kind=None,
                round=2,
                duration=0.0001,
            ),
        ),
        attempts=2,
        model="gpt-4o-mini-2024-07-18",
        messages=(
            SystemMessage(text="You are a weather assistant."),
            UserMessage.of("What is the weather in Oslo?", ImageContent.from_bytes(b"\x89PNG", "image/png")),
            AssistantMessage(text=None, thinking="look it up", tool_calls=(call,)),
            ToolResultMessage(tool_call_id="call_1", tool_name="lookup", text='{"temp": 3}'),
        ),
        invocation_id="inv_5c1d",
    )


class TenantQuotaError(RateLimitError):
    """A user's own subclass whose __init__ looks nothing like its base's."""

    def __init__(self, tenant: str, used: int, limit: int) -> None:
        super().__init__(f"tenant {tenant} used {used} of {limit} requests", status=429, retry_after=30.0)
        self.tenant = tenant
        self.used = used
        self.limit = limit


class SlottedToolError(ToolError):
    """A user's own subclass that keeps an extra field in a slot."""

    __slots__ = ("attempt",)

    def __init__(self, attempt: int) -> None:
        super().__init__(f"attempt {attempt} failed", tool="fetch", call_id=f"call_{attempt}")
        self.attempt = attempt


def _approval() -> agentrt.ApprovalRequested:
    call = agentrt.PendingCall("c1", "refund", {"order": "A1", "amount": 250.0})
    return agentrt.ApprovalRequested("id", "run-1", "Desk.chat", "ada", (call,), 1e9, partial=_partial())


SAMPLES: dict[type[AgentError], Callable[[], AgentError]] = {
    AgentError: lambda: AgentError("something in agentrt failed"),
    ConfigurationError: lambda: ConfigurationError(
        "Assistant.answer: parameter 'city' has no type annotation"
    ),
    ModelError: _model_error(ModelError),
    ModelConnectionError: _model_error(ModelConnectionError),
    ModelTimeoutError: _model_error(ModelTimeoutError),
    ModelResponseError: _model_error(ModelResponseError),
    AuthenticationError: _model_error(AuthenticationError),
    PermissionDeniedError: _model_error(PermissionDeniedError),
    ModelNotFoundError: _model_error(ModelNotFoundError),
    RateLimitError: lambda: RateLimitError(
        "rate limited", retry_after=12.5, **{**_MODEL_FIELDS, "status": 429, "code": "rate_limit"}
    ),
    BadRequestError: _model_error(BadRequestError),
    ContextLengthExceededError: _model_error(ContextLengthExceededError),
    ServerError: _model_error(ServerError),
    OverloadedError: _model_error(OverloadedError),
    ContentRefusedError: lambda: ContentRefusedError("I can't help with that."),
    OutputParsingError: lambda: OutputParsingError(
        "Assistant.extract: the answer is not a valid Person",
        text='{"name": "Ada", "age": "unknown"}',
        target="Person",
    ),
    ToolError: _tool_error(ToolError),
    ToolArgumentsError: _tool_error(ToolArgumentsError),
    UnknownToolError: _tool_error(UnknownToolError),
    ToolTimeoutError: _tool_error(ToolTimeoutError),
    ToolExecutionError: _tool_error(ToolExecutionError),
    ToolLoopLimitError: lambda: ToolLoopLimitError(
        "Assistant.answer: the tool loop stopped at its limit 'max_rounds' after 2 round(s) and 2 call(s)",
        reason=LoopLimit.MAX_ROUNDS,
        partial=_partial(),
    ),
    BudgetExceededError: lambda: BudgetExceededError(
        "Assistant.answer: the invocation reached its total-token budget of 900",
        limit="total_tokens",
        partial=_partial(),
    ),
    ChatMemoryError: lambda: ChatMemoryError("the store failed"),
    OutcomeUnknownError: lambda: OutcomeUnknownError(
        "tool 'refund' started in a worker that died; it was not run again"
    ),
    TurnFailedError: lambda: TurnFailedError.of("t1", "ValueError", "boom"),
    RetrievalError: lambda: RetrievalError(
        "Docs.ask: retriever BM25Retriever failed", retriever="BM25Retriever"
    ),
    ModerationError: lambda: ModerationError(
        "Docs.ask: the moderation model flagged the user's message (violence)",
        categories=("violence",),
        flagged="input",
        moderation=Moderation(True, {"violence": True}, {"violence": 0.9}, "omni-moderation-latest"),
        partial=_partial(),
    ),
    ModerationFailedError: lambda: ModerationFailedError(
        "Docs.ask: the moderation model failed", categories=(), flagged="input", moderation=None, partial=None
    ),
    GuardrailError: lambda: GuardrailError("refused", failures=()),
    ApprovalRequired: lambda: ApprovalRequired(
        "Desk.chat: tool call(s) refund (c1) wait for approval",
        approval=_approval(),
        partial=_partial(),
    ),
    ApprovalError: lambda: ApprovalError("refused"),
    ApprovalPendingError: lambda: ApprovalPendingError("Desk.chat: a turn waits", approval=_approval()),
    ApprovalNotFoundError: lambda: ApprovalNotFoundError("Desk: resume: no turn waits as run 'r'"),
    ApprovalDecisionError: lambda: ApprovalDecisionError("Desk.chat: no decision for pending call(s) ['c1']"),
    OutputGuardrailError: lambda: OutputGuardrailError(
        "Assistant.chat: the output guardrails refused the answer after 1 attempt(s) (Polite: rude)",
        failures=(GuardrailVerdict("id", "Polite", "output", "failure", "rude", 0.001),),
        partial=_partial(),
    ),
    InputGuardrailError: lambda: InputGuardrailError(
        "Assistant.chat: the input guardrails refused the user message (NoSecrets: a key)",
        failures=(GuardrailVerdict("id", "NoSecrets", "input", "fatal", "a key", 0.001),),
    ),
    ConversationBusyError: lambda: ConversationBusyError(
        "Assistant.chat: conversation 'ada' stayed busy with another turn for 2 s", memory_id="ada"
    ),
    ConversationLockLostError: lambda: ConversationLockLostError("the lock of 'x' is not owner 'o''s"),
    ConversationReentryError: lambda: ConversationReentryError(
        "Assistant.chat: conversation 'ada' is held by a turn of this same task (Assistant.stream)",
        memory_id="ada",
        holder="Assistant.stream",
    ),
    LocalModelError: lambda: LocalModelError("the local model server did not start within 60 s"),
    MCPServerError: lambda: MCPServerError("MCP server 'notes': could not connect", server="notes"),
    MCPToolError: lambda: MCPToolError("no note 'x'", server="notes", tool="read_note"),
    TenantQuotaError: lambda: TenantQuotaError("acme", 1001, 1000),
    SlottedToolError: lambda: SlottedToolError(3),
}


def _all_agentrt_errors() -> set[type[AgentError]]:
    """Every AgentError subclass defined anywhere in the agentrt package."""
    for module in pkgutil.walk_packages(agentrt.__path__, "agentrt."):
        importlib.import_module(module.name)
    found: set[type[AgentError]] = set()
    pending = [AgentError]
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("agentrt"):
            found.add(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_agentrt_error_is_covered() -> None:
    exported = {getattr(_errors, name) for name in _errors.__all__}
    assert exported <= _all_agentrt_errors()
    agentrt_samples = {cls for cls in SAMPLES if cls.__module__.startswith("agentrt")}
    assert agentrt_samples == _all_agentrt_errors()


def _state(error: BaseException) -> dict[str, Any]:
    """Every attribute: the instance dict plus any slots."""
    state = dict(vars(error))
    for klass in type(error).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if hasattr(error, name):
                state[name] = getattr(error, name)
    return state


def _assert_same(before: Any, after: Any) -> None:
    """Equal including the fields a dataclass leaves out of `==` (invocation id, duration, value)."""
    assert type(after) is type(before)
    if dataclasses.is_dataclass(before) and not isinstance(before, type):
        for f in dataclasses.fields(before):
            _assert_same(getattr(before, f.name), getattr(after, f.name))
    elif isinstance(before, tuple):
        assert len(after) == len(before)
        for b, a in zip(before, after, strict=True):
            _assert_same(b, a)
    else:
        assert after == before


def _assert_round_trip(error: AgentError, copied: AgentError) -> None:
    assert copied is not error
    assert type(copied) is type(error)
    assert str(copied) == str(error)
    assert repr(copied) == repr(error)
    assert copied.args == error.args
    before, after = _state(error), _state(copied)
    assert after.keys() == before.keys()
    for name, value in before.items():
        _assert_same(value, after[name])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda cls: cls.__name__)
def test_error_survives_pickling(cls: type[AgentError], protocol: int) -> None:
    error = SAMPLES[cls]()
    assert type(error) is cls
    _assert_round_trip(error, pickle.loads(pickle.dumps(error, protocol)))


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda cls: cls.__name__)
def test_error_survives_copy_and_deepcopy(cls: type[AgentError]) -> None:
    error = SAMPLES[cls]()
    _assert_round_trip(error, copy.copy(error))
    _assert_round_trip(error, copy.deepcopy(error))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_raised_error_keeps_its_fields_and_notes_but_not_its_cause(protocol: int) -> None:
    original = ConnectionResetError("peer reset")
    try:
        try:
            raise original
        except ConnectionResetError as exc:
            raise ToolExecutionError("tool 'fetch' raised", tool="fetch", call_id="call_9") from exc
    except ToolExecutionError as exc:
        exc.add_note("while answering Assistant.answer")
        error = exc
    assert error.__cause__ is original
    assert error.__traceback__ is not None

    copied = pickle.loads(pickle.dumps(error, protocol))

    _assert_round_trip(error, copied)
    assert copied.__notes__ == ["while answering Assistant.answer"]
    # Python never pickles the exception chain nor the traceback (documented above).
    assert copied.__cause__ is None
    assert copied.__traceback__ is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "value",
    [threading.Lock(), lambda: "not importable"],
    ids=["lock", "lambda"],
)
def test_tool_value_that_does_not_pickle_becomes_none(value: Any, protocol: int) -> None:
    error = ToolLoopLimitError("limit", reason=LoopLimit.MAX_CALLS, partial=_partial(value))

    copied = pickle.loads(pickle.dumps(error, protocol))

    assert isinstance(copied, ToolLoopLimitError)
    first, second = copied.partial.tool_executions
    assert first.value is None
    assert dataclasses.replace(first, value=None) == dataclasses.replace(
        error.partial.tool_executions[0], value=None
    )
    assert first.duration == error.partial.tool_executions[0].duration
    _assert_same(error.partial.tool_executions[1], second)
    _assert_same(
        dataclasses.replace(error.partial, tool_executions=()),
        dataclasses.replace(copied.partial, tool_executions=()),
    )
    # the original is untouched
    assert error.partial.tool_executions[0].value is value


def test_copy_and_deepcopy_keep_a_tool_value_that_does_not_pickle() -> None:
    lock, function = threading.Lock(), lambda: "not importable"
    error = ToolLoopLimitError("limit", reason=LoopLimit.MAX_CALLS, partial=_partial(lock))
    assert copy.copy(error).partial.tool_executions[0].value is lock
    execution = dataclasses.replace(error.partial.tool_executions[0], value=function)
    assert copy.copy(execution).value is function
    assert copy.deepcopy(execution).value is function  # deepcopy shares functions
    _assert_same(execution, copy.deepcopy(execution))
