"""The stages after the loop: output guardrails (and re-asks), parse, commit. Each is a small function
over the turn."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.to_thread

from .._errors import ContentRefusedError, OutputGuardrailError, OutputParsingError
from .._events import CancelledEvent, FailedEvent, GuardrailVerdict
from .._messages import AssistantMessage, UserMessage
from ..guardrails._declare import OutputGuardrailRequest
from ..guardrails._results import NO_VALUE, GuardrailResult, Verdict
from ._runtime import notify

if TYPE_CHECKING:
    from .._messages import ChatMessage, ToolCall
    from ..guardrails._declare import OutputChain
    from ..memory._memory import Conversation
    from ._turn import Turn

__all__ = [
    "COMMIT_ONCE",
    "OFF_LOOP",
    "Outcome",
    "accept",
    "answer_text",
    "check_value",
    "commit",
    "output_guardrails",
    "parse",
    "parse_off_loop",
    "reask",
    "refused",
    "repair",
    "store",
    "tell_ended",
    "unlock",
    "unparsed",
]


def answer_text(turn: Turn) -> str:
    """The answer's text: the final response's, or the immediate tools' results."""
    if turn.immediate is not None:
        return "\n".join(execution.result for execution in turn.immediate)
    response = turn.response
    assert response is not None
    return response.message.text or ""


# Checked at every chunk of a `chunked` stream, where an enum member's lookup on its class costs
# about as much as a pass-through guardrail.
COMMIT_ONCE: Final[ContextVar[bool]] = ContextVar("agentrt_commit_once", default=False)
"""Set by a durable turn (`agentrt.durable`) around its commit step: the turn is committed with its id
(`ChatMemoryStore.commit(turn=...)`), so a commit step run again after a crash stores it once."""

_SUCCESS: Final = Verdict.SUCCESS
_SUCCESS_WITH: Final = Verdict.SUCCESS_WITH
_FAILURE: Final = Verdict.FAILURE
_FATAL: Final = Verdict.FATAL
_RETRY: Final = Verdict.RETRY
_REPROMPT: Final = Verdict.REPROMPT


@dataclass(slots=True)
class Outcome:
    """What an output chain decided about one answer."""

    text: str
    value: Any = NO_VALUE
    failures: list[GuardrailVerdict] = field(default_factory=list)
    reask: GuardrailResult | None = None
    """The retry or reprompt that stopped the chain, if one did."""


async def output_guardrails(
    turn: Turn,
    chain: OutputChain,
    text: str,
    attempt: int,
    thinking: str | None,
    *,
    released: int | None = None,
    tool_calls: tuple[ToolCall, ...] = (),
) -> Outcome:
    """Run the output chain over the answer `text` (attempt 1, then 2 after a re-ask, ...), or over
    the answer so far, whose first `released` characters were released (a `chunked` stream's check),
    or over text the model sent with `tool_calls` (not the answer, but stored and shown all the same).

    `success_with` rewrites the text later guardrails see (and may give the method's value, but not
    for part of an answer); failures accumulate to the end of the chain; `fatal` stops it; a retry or
    reprompt stops it and asks again (the invocation decides whether it may)."""
    assert turn.user is not None
    partial = released is not None
    loop = turn.loop
    listeners = turn.runtime.listeners
    request = OutputGuardrailRequest(
        text=text,
        user_message=turn.user,
        method=turn.spec.qualname,
        memory_id=turn.memory_id,
        history=turn.history,
        thinking=thinking,
        tool_executions=tuple(loop.executions) if loop is not None else (),
        attempt=attempt,
        parse=turn.spec.parser.parse,
        partial=partial,
        released=released or 0,
        tool_calls=tool_calls,
    )
    outcome = Outcome(text)
    clock = time.perf_counter
    for guardrail in chain.guardrails:
        started = clock()
        result = guardrail.call(request)  # a sync guardrail's result, without a coroutine around it
        if result.__class__ is not GuardrailResult:
            result = await guardrail.settle(result)
        verdict = result.verdict
        event = GuardrailVerdict(
            turn.id,
            guardrail.name,
            "output",
            verdict._value_,  # `.value`, without the enum's property
            result.message,
            clock() - started,
            attempt,
            partial,
        )
        turn.verdicts.append(event)
        if listeners:
            notify(listeners, event)
        if verdict is _SUCCESS:
            continue
        if verdict is _SUCCESS_WITH:
            assert result.text is not None
            outcome.text = result.text
            if result.value is not NO_VALUE:
                if tool_calls:
                    raise TypeError(
                        f"{turn.spec.qualname}: output guardrail {guardrail.name} gave a value for text "
                        "that came with tool calls; give values when request.tool_calls is empty"
                    )
                if partial:
                    raise TypeError(
                        f"{turn.spec.qualname}: output guardrail {guardrail.name} gave a value for part "
                        "of an answer; give values when request.partial is false"
                    )
                outcome.value = result.value
            request = replace(request, text=result.text)
        elif verdict is _FAILURE:
            outcome.failures.append(event)
        elif verdict is _FATAL:
            outcome.failures.append(event)
            break
        elif verdict is _RETRY or verdict is _REPROMPT:
            outcome.failures.append(event)
            outcome.reask = result
            break
    return outcome


def reask(turn: Turn, rejected: AssistantMessage, result: GuardrailResult) -> None:
    """Make the next request ask again: the request that got the rejected answer (retry), or it with
    the rejected answer and the reprompt text (reprompt; without the answer with message removal).
    The turn keeps its tool exchanges (tools that ran are not run again); the rejected answer and
    the reprompt text never join the exchange, so memory never stores them."""
    if result.verdict is Verdict.RETRY:
        sent = turn.sent
        assert sent is not None
        turn.request = sent
        return
    assert result.prompt is not None
    _ask_again(turn, () if result.remove_message else (rejected,), result.prompt)


def repair(turn: Turn, failed: AssistantMessage, error: OutputParsingError) -> None:
    """Make the next request ask for an answer that parses: the request that got the `failed` answer,
    then that answer and what was wrong with it. Like a re-ask, neither joins the exchange."""
    prompt = (
        f"Your answer could not be read as {error.target}: {error.detail}. "
        "Answer again, in the format asked for."
    )
    _ask_again(turn, (failed,), prompt)


def _ask_again(turn: Turn, shown: tuple[ChatMessage, ...], prompt: str) -> None:
    sent = turn.sent
    assert sent is not None
    turn.request = replace(sent, messages=(*sent.messages, *shown, UserMessage.of(prompt)))


def unparsed(turn: Turn, error: OutputParsingError, attempt: int, repairs: int) -> OutputParsingError:
    """The error for an answer that did not parse, after `repairs` repairs: the parser's error,
    naming the method, with the partial `Result`."""
    after = f" (after {repairs} repair{'s' if repairs > 1 else ''})" if repairs else ""
    return OutputParsingError(
        f"{turn.spec.qualname}: {error}{after}",
        text=error.text,
        target=error.target,
        detail=error.detail,
        partial=replace(turn.partial(), attempts=attempt),
    )


def accept(turn: Turn, message: AssistantMessage | None, text: str, answered: str) -> bool:
    """Add the accepted answer, `text`, to the exchange (what memory stores); whether a guardrail
    rewrote it. `message` is the model's answer (`None`: immediate tools' results, `answered`).

    A rewritten answer replaces the model's text everywhere the reader looks: the stored message, the
    turn's response (so the result's transcript and a held stream's `ResponseReceived` carry it), or,
    for immediate tools' results, an assistant message after them."""
    if message is None:
        if text == answered:
            return False
        turn.exchange.append(AssistantMessage(text=text))
        return True
    if text == (message.text or ""):
        turn.exchange.append(message)
        return False
    message = message.model_copy(update={"text": text})
    response = turn.response
    assert response is not None
    turn.response = replace(response, message=message)
    turn.exchange.append(message)
    return True


def refused(turn: Turn, outcome: Outcome, attempt: int, *, immediate: bool = False) -> OutputGuardrailError:
    """The error for an answer the chain refused (or kept asking about past `max_retries`; an
    immediate tool's result, which no model answered, cannot be asked again)."""
    said = "; ".join(f"{f.guardrail}: {f.message}" for f in outcome.failures)
    if outcome.reask is None:
        why = "refused the answer"
    elif immediate:
        why = "asked again about an immediate tool's result, which cannot be asked again"
    else:
        why = "kept asking again past max_retries"
    partial = turn.partial()
    return OutputGuardrailError(
        f"{turn.spec.qualname}: the output guardrails {why} after {attempt} attempt(s) ({said})",
        failures=tuple(outcome.failures),
        partial=replace(partial, attempts=attempt),
    )


def check_value(turn: Turn, value: Any) -> None:
    """A value an output guardrail gave (`success_with(text, value)`) must be of the return type."""
    if not turn.spec.parser.accepts(value):
        raise TypeError(
            f"{turn.spec.qualname}: an output guardrail gave {value!r}, which is not of the method's "
            "return type"
        )


def parse(turn: Turn, text: str, rewritten: bool = False) -> Any:
    """The answer as the declared return type (`OutputParsingError` when it does not parse): one
    immediate tool's value as it is, unless a guardrail rewrote the answer."""
    parser = turn.spec.parser
    immediate = turn.immediate
    if immediate is not None and not rewritten:
        only = immediate[0].value if len(immediate) == 1 else None
        return only if parser.accepts(only) else parser.parse(text)
    response = turn.response
    assert response is not None
    if response.message.refusal and not text:
        raise ContentRefusedError(response.message.refusal)
    return parser.parse(text)


OFF_LOOP: Final = 1 << 14
"""Answers longer than this (in characters) are parsed in a worker thread, not on the event loop.
The slowest answer shapes to search (brackets every character, nested unclosed strings) take 0.1-0.5
µs a character here, so an answer parsed on the loop holds it for a few ms at most
(`benchmarks/bench_parse_gap.py`); longer ones are parsed in a worker thread, which holds the GIL one
bounded search (32 Ki characters) or one slice of a long list's items at a time."""


async def parse_off_loop(turn: Turn, text: str, rewritten: bool) -> Any:
    """`parse` in a worker thread: a long answer does not stop the event loop while it is read.
    Cancelled, the caller goes on at once (the thread finishes its parse and is forgotten)."""
    return await anyio.to_thread.run_sync(parse, turn, text, rewritten, abandon_on_cancel=True)


async def commit(turn: Turn) -> None:
    """Write the turn to its conversation in one atomic write: the user's own message (without format
    instructions or retrieved text), then the exchange (assistant messages and tool results, the
    answer last). Only a turn that succeeded gets here; re-asks and repairs are not in the exchange.

    The invocation awaits it shielded: a write that started is finished, so a turn is either stored
    whole and reported, or not stored (a cancellation that arrives meanwhile takes effect after it).
    """
    conversation = turn.conversation
    assert conversation is not None
    assert turn.user is not None
    await conversation.commit([turn.user, *turn.exchange], turn.id if COMMIT_ONCE.get() else None)


async def store(turn: Turn, conversation: Conversation) -> None:
    """Commit the turn to its conversation and release it, shielded: a write that started finishes,
    and the next turn on the conversation starts now, not when the stream's reader gets to its end."""
    with anyio.CancelScope(shield=True):
        await commit(turn)
        await conversation.release()


async def unlock(conversation: Conversation) -> None:
    """Release a conversation the turn holds and did not commit to (nothing was written): at once
    when it is only held in the process, shielded when its store holds a lease too."""
    if conversation.owner is None:
        conversation.release_local()
    else:
        with anyio.CancelScope(shield=True):
            await conversation.release()


def tell_ended(turn: Turn, exc: BaseException) -> None:
    """Tell listeners the invocation ended before `Completed` with `exc`: a `CancelledEvent` for a
    cancellation or a closed stream (unless `result()` watches the turn: it reports those), else a
    `FailedEvent`."""
    cancelled = isinstance(exc, GeneratorExit | anyio.get_cancelled_exc_class())
    if not (cancelled and turn.watched):
        event = CancelledEvent(turn.id) if cancelled else FailedEvent(turn.id, exc)
        notify(turn.runtime.listeners, event)
