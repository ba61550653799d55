"""The state of one turn: what the steps of an invocation read and write, in one explicit place.

A turn starts with the call's arguments and ends with a `Result`. In between it holds the rendered
user message (what memory stores) and the outgoing one (what the model sees: augmented, with format
instructions), the request to send next, this turn's exchange (assistant messages and tool results,
in order), the usage, the budget account, the step it is at (`phase`), its attempts, re-asks, repairs
and rounds, and its release state. Because the whole state is here, the model ⇄ tools loop can be run
again from it (a retry, a reprompt, a repair) without re-running the stages before it, and between
steps the turn can be saved as data and restored (`_checkpoint`).
"""

from __future__ import annotations

import enum
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from .._budget import Budget, BudgetAccount, BudgetLimit, now
from .._errors import BudgetExceededError, ConversationBusyError
from .._events import Result, Usage
from ..guardrails._results import NO_VALUE
from ..memory._memory import DEFAULT_MEMORY_ID
from ._release import Release

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._approval import Decision
    from .._events import ApprovalRequested, GuardrailVerdict, ModelResponse, Retrieved, ToolExecution
    from .._messages import ChatMessage, UserMessage
    from .._spec import MethodSpec
    from ..guardrails._results import GuardrailResult
    from ..memory._memory import Conversation
    from ..models._protocol import ModelRequest, ModelSettings, ResponseAccumulator
    from ..output._modes import AnswerTool
    from ..rag._types import Content
    from ..tools._declare import ToolDefinition
    from ..tools._loop import ToolLoop
    from ..tools._run import LoopLimit
    from ._approve import Waiting
    from ._finish import Outcome
    from ._plan import Plan
    from ._runtime import Runtime

__all__ = ["BOUNDARIES", "DEFAULT_MEMORY_ID", "Phase", "Turn"]


class Phase(enum.Enum):
    """The step a turn is at: what the driver (`Invocation.events`) does next."""

    PREPARE = "prepare"
    """Render, memory, input guardrails, retrieval, tools, output format."""
    REQUEST = "request"
    """Send `turn.request` and stream its response into `turn.received`."""
    RESPONSE = "response"
    """Decide what `turn.received` is: the answer, a round of tool calls, or a new request."""
    TOOLS = "tools"
    """Run the tool calls of `turn.response`."""
    APPROVAL = "approval"
    """Calls of the tool round wait for a human: store the turn and stop (`turn.waiting`), or, once
    resumed with decisions (`turn.decisions`), run the approved ones and finish the round."""
    ANSWER = "answer"
    """Output guardrails and parse: accept, ask again, repair or refuse."""
    COMMIT = "commit"
    """Store the turn and complete."""


BOUNDARIES: Final = frozenset({Phase.REQUEST, Phase.RESPONSE, Phase.TOOLS, Phase.APPROVAL, Phase.COMMIT})
"""The steps a turn may be checkpointed before: before a model request (after a tool round), after a
response (before its tool calls run), while calls wait for approval, and before the commit."""

_LIMIT_TEXT: Final[dict[str, str]] = {
    "seconds": "its time budget of {} s",
    "input_tokens": "its input-token budget of {}",
    "output_tokens": "its output-token budget of {}",
    "total_tokens": "its total-token budget of {}",
    "model_requests": "its budget of {} model requests",
    "tool_calls": "its budget of {} tool calls",
}


DEFER_COMMIT: Final[ContextVar[bool]] = ContextVar("agentrt_defer_commit", default=False)
"""Set by a server around the call that makes a stream (`agentrt.sse`): the invocations made in it
yield `Completed` before their turn is stored, and store it only when the reader asks for the next
event (a reader that closes the stream at `Completed` stores nothing). The server asks once the
final event was handed to the client's connection: a client gone before that has no turn stored."""

_AWAITED: Final = Release("plain", False, None)
"""The release state of every awaited call without output guardrails: it never changes
(`Release.again` leaves a plain awaited call as it is)."""
_NO_USAGE: Final = Usage()  # frozen: one for every turn's start (its init sets five fields)
_PREPARE: Final = Phase.PREPARE  # (on 3.11 a class attribute of an enum goes through `EnumType.__getattr__`)


class Turn:
    """One invocation's state, stage by stage (see the module docstring). Not shared between tasks."""

    __slots__ = (
        "account",
        "answer",
        "answered",
        "arguments",
        "asked",
        "at_boundary",
        "attempt",
        "attempts",
        "boundary",
        "checking",
        "conversation",
        "deadline",
        "decisions",
        "deferred",
        "exchange",
        "final",
        "history",
        "id",
        "immediate",
        "loop",
        "max_repairs",
        "memory_id",
        "moderating",
        "opening",
        "outgoing",
        "parsed",
        "phase",
        "plan",
        "reasks",
        "received",
        "record",
        "rejected",
        "release",
        "repairs",
        "request",
        "response",
        "restoring",
        "resume_from",
        "retrieved",
        "round",
        "runtime",
        "sent",
        "settings",
        "since_sent",
        "sources",
        "spec",
        "stopped",
        "streaming",
        "system",
        "text",
        "tools",
        "unreleased",
        "unthought",
        "usage",
        "user",
        "value",
        "verdicts",
        "waiting",
        "watched",
    )

    def __init__(
        self,
        invocation_id: str,
        runtime: Runtime,
        spec: MethodSpec,
        arguments: dict[str, Any],
        settings: ModelSettings | None,
        budget: Budget | None,
        plan: Plan,
    ) -> None:
        self.id = invocation_id
        self.runtime = runtime
        self.spec = spec
        self.plan = plan
        self.phase = _PREPARE
        self.boundary: Callable[[Turn], None] | None = None
        """Called at each step boundary (`BOUNDARIES`), where the turn may be checkpointed."""
        self.at_boundary = False
        """True while `boundary` runs: the turn is whole data only then (a turn stopped inside a
        step has part of the step done)."""
        self.arguments = arguments
        self.settings = settings
        self.account = BudgetAccount(budget, now()) if budget is not None else None
        self.deadline = self.account.deadline if self.account is not None else None
        """When the invocation's time budget ends (`anyio.current_time()`), if it has one."""
        self.deferred = DEFER_COMMIT.get()
        """Whether the turn is stored after its reader came back from `Completed` (see
        `DEFER_COMMIT`), not before it is yielded."""
        self.watched = False
        """Whether the consumer (`Invocation.result`) holds a cancel scope at `deadline` around the
        whole invocation, so that no step needs one of its own."""
        self.streaming: ResponseAccumulator | None = None
        """The response under way, while it streams (for the partial result of a cut)."""
        self.memory_id: Any = arguments[spec.memory_param] if spec.memory_param else DEFAULT_MEMORY_ID
        if self.memory_id is None:
            raise TypeError(f"{spec.qualname}(): the memory id {spec.memory_param!r} is None")
        self.conversation: Conversation | None = None
        """The conversation, locked from the memory stage until the turn is committed or ends."""
        self.opening = False
        """Whether the memory stage is waiting for the conversation (its lock, its store)."""
        self.attempts = 1
        """Answers checked so far (1, then 2 after a re-ask or a repair, ...)."""
        self.attempt = 1
        """The answer under way: 1, then one more per re-ask or repair."""
        self.reasks = 0
        self.repairs = 0
        self.round = 0
        """Model requests sent so far (each response's round)."""
        chain = plan.output_chain
        if plan.release == "plain" and not plan.streams:
            self.release = _AWAITED  # nothing to hold or withdraw, ever: one shared state
        else:
            self.release = Release(plan.release, plan.streams, chain.chunk if chain is not None else None)
        self.moderating = False
        """Moderation races the next request's first chunks (the first request's, once)."""
        self.checking = False
        """A parallel input chain races the next request's first chunks (the first's, once)."""
        self.received: ModelResponse | None = None
        """The response just streamed, not yet decided on (`Phase.RESPONSE`)."""
        self.answered = False
        """In tool mode, whether `received` called the answer tool."""
        self.unreleased = ""
        self.unthought = ""
        """A `chunked` stream's text and thinking of `received` not released yet."""
        self.stopped: Outcome | None = None
        """The chain refused a chunk of the response under way: the answer stops there."""
        self.rejected: GuardrailResult | None = None
        """The chain asked again about text sent with tool calls."""
        self.resume_from: float | None = None
        """A restored turn's seconds spent, until its clock starts again (`resume_clock`)."""
        self.restoring: Any = None
        """A restored turn's tool-loop state, until its tools are attached again."""
        self.value: Any = NO_VALUE
        self.text = ""
        self.parsed = False
        """The accepted answer's value and text (`Phase.COMMIT`)."""
        self.max_repairs = runtime.max_repairs
        """How often an answer that does not parse may be asked for again."""
        self.history: tuple[ChatMessage, ...] = ()
        """The conversation's history sent with this turn (what guardrails may read)."""
        self.verdicts: list[GuardrailVerdict] = []
        """Guardrail verdicts not yet yielded as events (the stages before the loop cannot yield)."""
        self.system: str | None = None
        self.user: UserMessage | None = None
        """The user message as the caller made it: what memory stores."""
        self.outgoing: UserMessage | None = None
        """The user message the model sees: augmented by retrieval, with format instructions."""
        self.sources: tuple[Content, ...] = ()
        """What retrieval injected into the outgoing message."""
        self.retrieved: Retrieved | None = None
        """Retrieval's event, not yet yielded (the stages before the loop cannot yield)."""
        self.tools: Mapping[str, ToolDefinition] = {}
        self.loop: ToolLoop | None = None
        self.request: ModelRequest | None = None
        """The request to send next."""
        self.sent: ModelRequest | None = None
        """The last request sent."""
        self.since_sent: list[ChatMessage] = []
        """What happened after `sent`: its response, the results of a tool round on it."""
        self.exchange: list[ChatMessage] = []
        """This turn's messages after the user's: assistant messages and tool results, in order."""
        self.response: ModelResponse | None = None
        self.usage = _NO_USAGE
        self.final: LoopLimit | None = None
        """The loop limit that made the next request the last one (no tools), if any."""
        self.immediate: list[ToolExecution] | None = None
        self.answer: AnswerTool | None = plan.answer
        """The method's `final_answer` tool, in tool mode."""
        self.waiting: Waiting | None = None
        """The tool round's calls that wait for approval, and what ran of it (`Phase.APPROVAL`)."""
        self.decisions: Mapping[str, Decision] | None = None
        """A resumed turn's decisions on the waiting calls, by call id."""
        self.record: bytes | None = None
        """A resumed turn's pending record as its store kept it (put back if its claim is cut)."""
        self.asked: ApprovalRequested | None = None
        """The event of a turn that stopped for approval (its stream's last)."""

    # --- budget --------------------------------------------------------------------------------

    def resume_clock(self) -> None:
        """Start a restored turn's clock (on the event loop that runs it) from the seconds it had
        spent: its deadline, and its requests', move by the time it spent saved."""
        spent, self.resume_from = self.resume_from, None
        account = self.account
        assert spent is not None
        assert account is not None
        account.started = now() - spent
        seconds = account.budget.seconds
        account.deadline = account.started + seconds if seconds is not None else None
        self.deadline = account.deadline
        if self.request is not None:
            self.request = replace(self.request, deadline=self.deadline)
        if self.sent is not None:
            self.sent = replace(self.sent, deadline=self.deadline)

    def exceeded(
        self, limit: BudgetLimit, *, streamed: ModelResponse | None = None, cause: str = ""
    ) -> BudgetExceededError:
        """The error for `limit`, with the partial result (and the response cut short, if any)."""
        account = self.account
        assert account is not None, "only an invocation with a budget can exceed it"
        budget = account.budget
        value = getattr(budget, limit)
        partial = self.partial(streamed)
        if self.opening and not cause:
            cause = "waiting for its conversation, busy with another turn"
        where = f"; {cause}" if cause else ""
        error = BudgetExceededError(
            f"{self.spec.qualname}: the invocation reached {_LIMIT_TEXT[limit].format(value)}{where}",
            limit=limit,
            partial=partial,
        )
        if self.opening:  # the time ran out before the conversation was free: say so
            error.__cause__ = ConversationBusyError(
                f"{self.spec.qualname}: conversation {self.memory_id!r} stayed busy with another turn "
                "until the time budget ran out",
                memory_id=self.memory_id,
            )
        return error

    # --- results -------------------------------------------------------------------------------

    def partial(self, streamed: ModelResponse | None = None) -> Result[Any]:
        """What the turn has so far, as a `Result` whose value is `None` (for errors that stop it).

        The transcript is what happened: the last request sent, then what followed it (its response,
        the results of a tool round on it), never a request that was not sent. `streamed` is a
        response that was cut short: its text and usage count, and its message ends the transcript.
        """
        response = streamed or self.response
        sent = self.sent
        messages: tuple[ChatMessage, ...] = (*sent.messages, *self.since_sent) if sent is not None else ()
        usage = self.usage
        if streamed is not None:
            usage = usage + streamed.usage
            messages = (*messages, streamed.message)
        account = self.account
        loop = self.loop
        return Result(
            value=None,
            text=(response.message.text or "") if response is not None else "",
            usage=usage,
            finish_reason=response.finish_reason if response is not None else None,
            thinking=response.message.thinking if response is not None else None,
            tool_executions=tuple(loop.executions) if loop is not None else (),
            sources=self.sources,
            attempts=self.attempts,
            model=(response.model if response is not None else None) or self.runtime.model.name,
            messages=messages,
            invocation_id=self.id,
            budget=account.budget if account is not None else None,
            spent=account.spent(now()) if account is not None else None,
        )

    def result(self, value: Any, text: str, attempts: int = 1) -> Result[Any]:
        """The `Result` of a turn that succeeded."""
        response = self.response
        assert response is not None
        assert self.request is not None
        message = response.message
        loop = self.loop
        account = self.account
        return Result(
            value=value,
            text=text,
            usage=self.usage,
            finish_reason=response.finish_reason,
            thinking=message.thinking,
            tool_executions=tuple(loop.executions) if loop is not None else (),
            sources=self.sources,
            model=response.model or self.runtime.model.name,
            attempts=attempts,
            messages=((*self.request.messages, message) if self.immediate is None else self.request.messages),
            invocation_id=self.id,
            budget=account.budget if account is not None else None,
            spent=account.spent(now()) if account is not None else None,
            turn=(self.user, *self.exchange) if self.user is not None else tuple(self.exchange),
        )
