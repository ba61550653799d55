"""The model ⇄ tools loop's decisions, over the `Turn`.

The loop itself (send `turn.request`, stream the response, run a tool round, repeat) is in
`invocation.py`, because its chunk loop is the per-token hot path and must not pass through another
generator. What it does between requests is here: what a response means (`after_response`), what a
tool round adds (`after_round`), and how the loop stops at its limits. Everything reads and writes the
turn, so the loop can be started again from any state it leaves.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import anyio

from .._errors import ToolLoopLimitError
from .._messages import UserMessage
from ..models._protocol import request_text_chars
from ..output._modes import FINAL_ANSWER_TOOL_PROMPT
from ..tools._run import FINAL_ANSWER_PROMPT

if TYPE_CHECKING:
    from .._budget import BudgetLimit
    from .._events import ModelResponse, ToolExecution
    from .._messages import ToolCall
    from ..models._protocol import ModelRequest, ToolSpec
    from ..tools._loop import ToolLoop
    from ..tools._run import LoopLimit
    from ._turn import Turn

__all__ = ["Step", "after_response", "after_round", "before_request", "record", "rewrite", "unspend_round"]

logger = logging.getLogger("agentrt")


class Step(enum.Enum):
    """What the loop does next."""

    ANSWER = "answer"
    """The response is the final answer: leave the loop."""
    TOOLS = "tools"
    """Run the response's tool calls, then ask again."""
    ASK = "ask"
    """Send `turn.request` (the next request is ready)."""


# Members read as constants: on 3.11 a class attribute of an enum goes through `EnumType.__getattr__`.
_ANSWER: Final = Step.ANSWER
_TOOLS: Final = Step.TOOLS
_ASK: Final = Step.ASK


def before_request(turn: Turn) -> tuple[ModelRequest, tuple[int, BudgetLimit] | None]:
    """Check the budget, count the request as sent, and return it (it carries the invocation's
    deadline, which the model, or the pipeline around it, enforces) with the output tokens its
    response may stream before a token limit is passed (`None` without token limits).

    Raises `BudgetExceededError` when a limit forbids another request, or when the request's own
    input (as estimated) would leave no output tokens.
    """
    request = turn.request
    assert request is not None
    account = turn.account
    allowance = None
    if account is not None:
        verdict = account.before_request(lambda: request_text_chars(request.messages))
        if isinstance(verdict, str):
            raise turn.exceeded(verdict, cause="before a model request")
        allowance = verdict
        account.model_requests += 1
    turn.sent = request
    turn.since_sent = []
    return request, allowance


def record(turn: Turn, response: ModelResponse) -> None:
    """Record `response` as the turn's latest, and what it spent (`BudgetExceededError` past a
    token limit)."""
    turn.response = response
    turn.since_sent.append(response.message)
    turn.usage = turn.usage + response.usage
    account = turn.account
    if account is not None:
        spent = account.record(response.usage)
        if spent is not None:
            raise turn.exceeded(spent, cause="after a model response")


def after_response(turn: Turn, response: ModelResponse) -> Step:
    """Record `response`; decide whether it is the answer or a round of tool calls.

    Raises `BudgetExceededError` (a token limit, or the tool calls it asks for), or
    `ToolLoopLimitError` when a loop limit stops it and the settings say "raise".
    """
    record(turn, response)
    account = turn.account
    calls = response.message.tool_calls
    loop = turn.loop
    if loop is None or not calls:
        return _ANSWER
    if turn.answered:
        return _ANSWER  # the answer tool was called: calls beside it do not run
    if turn.final is not None:
        if not (response.message.text or "").strip():
            # Asked for an answer without tools, the model called tools again: a typed error with
            # the partial result, never a silent empty (or blank) answer.
            raise _limit_error(turn, turn.final, "asked for a final answer, the model called tools again")
        return _ANSWER  # an answer with stray tool calls: the answer counts, the calls do not
    limit = loop.limit_before(calls)
    if limit is not None:
        # The response's calls never run, so it is not part of the exchange.
        _stop_at(turn, limit)
        return _ASK
    if account is not None:
        over = account.before_tools(len(calls), anyio.current_time())
        if over is not None:
            raise turn.exceeded(over, cause=f"before a round of {len(calls)} tool call(s)")
        account.tool_calls += len(calls)  # counted as they start: a round cut short spent them
    return _TOOLS


def unspend_round(turn: Turn, calls: tuple[ToolCall, ...]) -> None:
    """Give back the tool calls `after_response` counted for a round that will not run (the chain
    asked again about the text that came with them)."""
    account = turn.account
    if account is not None:
        account.tool_calls -= len(calls)


def rewrite(turn: Turn, text: str) -> ModelResponse:
    """Replace the text of the latest response (a guardrail rewrote it): what the exchange stores,
    the next request carries and the reader is shown."""
    response = turn.response
    assert response is not None
    response = replace(response, message=response.message.model_copy(update={"text": text}))
    turn.response = response
    turn.since_sent[-1] = response.message
    return response


def after_round(turn: Turn, calls: tuple[ToolCall, ...], executions: list[ToolExecution]) -> Step:
    """Add the round's exchange to the next request; decide whether the round ends the turn."""
    loop = turn.loop
    response = turn.response
    request = turn.request
    assert loop is not None
    assert response is not None
    assert request is not None
    results = loop.result_messages(executions)
    turn.exchange.append(response.message)
    turn.exchange.extend(results)
    turn.since_sent.extend(results)
    capabilities = turn.runtime.model.capabilities
    # The model chooses from now on; a model that cannot gets no more tools (in tool mode: the
    # answer tool, forced).
    tools = tuple(d.spec for d in turn.tools.values()) if capabilities.tool_choice_auto else ()
    choice = None
    answer = turn.answer
    if answer is not None:
        choice = answer.choice if tools else answer.alone
        tools = (*tools, answer.spec)
    turn.request = replace(
        request,
        messages=(*request.messages, response.message, *results),
        tools=tools,
        tool_choice=choice,
    )
    if all(not e.is_error and turn.tools[e.name].immediate for e in executions):
        turn.immediate = executions
        return _ANSWER
    limit = loop.limit_after()
    if limit is not None:
        _stop_at(turn, limit)
    return _ASK


def _stop_at(turn: Turn, limit: LoopLimit) -> None:
    """A loop limit: raise, or make the next request the last one (no tools, asking for an answer)."""
    if turn.runtime.tool_settings.on_limit != "final_answer":
        raise _limit_error(turn, limit)
    logger.info("invocation %s: tool loop limit %s; asking for a final answer", turn.id, limit)
    request = turn.request
    assert request is not None
    # The unanswered tool calls of the last response are not sent: an assistant message with tool
    # calls must be followed by their results, and those calls never ran.
    answer = turn.answer
    prompt = FINAL_ANSWER_PROMPT if answer is None else FINAL_ANSWER_TOOL_PROMPT
    if answer is not None:  # in tool mode, the answer tool alone, forced
        tools: tuple[ToolSpec, ...] = (answer.spec,)
        choice: str | None = answer.alone
    elif request.tools and turn.runtime.model.capabilities.tool_choice_auto:
        # The tools stay defined, with `tool_choice` "none": a transcript with tool calls and results
        # but no tools is refused by some providers (Anthropic), and "none" rules out another call.
        tools, choice = request.tools, "none"
    else:
        tools, choice = (), None
    turn.request = replace(
        request, messages=(*request.messages, UserMessage.of(prompt)), tools=tools, tool_choice=choice
    )
    turn.final = limit


def _limit_error(turn: Turn, limit: LoopLimit, detail: str = "") -> ToolLoopLimitError:
    loop: ToolLoop | None = turn.loop
    assert loop is not None
    return ToolLoopLimitError(
        f"{turn.spec.qualname}: the tool loop stopped at its limit {limit.value!r} "
        f"after {loop.rounds} round(s) and {len(loop.executions)} call(s)"
        + (f"; {detail}" if detail else ""),
        reason=limit,
        partial=turn.partial(),
    )
