"""The steps of a turn after a model request, over the `Turn`.

The driver (`Invocation.events`) runs the request step inline, since its chunk loops are the per-token
path and another generator there costs about 900 instructions a token (+8%, callgrind). The steps after
a response make a few events each and live here: `respond` and `answer` are coroutines that put their
events in `out` (the driver yields them when the step is done, or before its error: a generator per
step cost about 10% of a plain call); `tool_round` is a generator, so that a reader sees each
`ToolCallRequested` before the tools run.

    respond   what a response is: the answer, a round of tool calls (its text checked first), or a
              new request
    tool_round  run the response's tool calls
    answer    output guardrails, `decide`, parse; accept (release the text), ask again, repair, refuse

Each step reads and writes the turn and sets `turn.phase` to the next one, so the turn is whole data at
every step boundary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio

from .._errors import OutputParsingError
from .._events import (
    Reset,
    ResetReason,
    ResponseReceived,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
    ToolExecution,
)
from ..guardrails._results import NO_VALUE
from ..tools._run import arguments_hash
from . import _approve, _finish, _loop, _moderate
from ._decide import Decision, after_chain, after_parse
from ._release import Mode
from ._runtime import notify
from ._turn import Phase

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable

    from .._events import Event
    from .._messages import ToolCall
    from ..guardrails._declare import OutputChain
    from ..guardrails._results import GuardrailResult
    from ._turn import Turn

__all__ = ["answer", "respond", "scoped", "shown", "tool_round"]

_T = TypeVar("_T")

# Enum members are looked up in Python code: read as constants on the per-call path.
_REQUEST: Final = Phase.REQUEST
_TOOLS: Final = Phase.TOOLS
_APPROVAL: Final = Phase.APPROVAL
_ANSWER: Final = Phase.ANSWER
_COMMIT: Final = Phase.COMMIT
_PLAIN: Final = Mode.PLAIN
_CHUNKED: Final = Mode.CHUNKED
_OPTIMISTIC: Final = Mode.OPTIMISTIC
_GO_ANSWER: Final = _loop.Step.ANSWER
_GO_TOOLS: Final = _loop.Step.TOOLS
_GO_ASK: Final = _loop.Step.ASK
_ACCEPT: Final = Decision.ACCEPT
_REASK: Final = Decision.REASK
_REFUSE: Final = Decision.REFUSE
_UNPARSED: Final = Decision.UNPARSED


async def scoped(turn: Turn, step: Awaitable[_T], deadline: float) -> _T:
    """Await one step of the turn under its deadline: cut there with `BudgetExceededError`.

    Only steps that may wait (on I/O, a tool, a user's provider) are scoped: a cancel scope costs more
    than the rest of a plain call.
    """
    with anyio.CancelScope(deadline=deadline) as scope:
        return await step
    assert scope.cancelled_caught
    raise turn.exceeded("seconds")


def shown(turn: Turn, event: ResponseReceived | ToolCallRequested | ToolExecuted) -> bool:
    """Tell listeners of a response or tool event; whether to yield it now (False: it is held with
    the text)."""
    listeners = turn.runtime.listeners
    if listeners:
        notify(listeners, event)
    pending = turn.release.pending
    if pending is None:
        return True
    pending.append(event)
    return False


async def _chain(
    turn: Turn,
    chain: OutputChain,
    text: str,
    thinking: str | None,
    guard: float | None,
    out: list[Event],
    tool_calls: tuple[ToolCall, ...] = (),
) -> _finish.Outcome:
    """The output chain over `text` (this attempt's answer, or text sent with `tool_calls`), under
    the deadline; its verdicts go to `out`."""
    checked = _finish.output_guardrails(turn, chain, text, turn.attempt, thinking, tool_calls=tool_calls)
    if guard is not None:
        checked = scoped(turn, checked, guard)
    outcome = await checked
    out.extend(turn.verdicts)
    turn.verdicts.clear()
    return outcome


async def respond(turn: Turn, guard: float | None, out: list[Event]) -> None:
    """`Phase.RESPONSE`: what the response just streamed (`turn.received`) is."""
    listeners = turn.runtime.listeners
    chain = turn.plan.output_chain
    release = turn.release
    # What the response means: the answer, a round of tool calls, or a new request.
    got = turn.received
    assert got is not None
    response, turn.received = got, None
    round_, attempt = turn.round, turn.attempt
    step = _loop.after_response(turn, response)
    received = ResponseReceived(turn.id, response, round_)
    if shown(turn, received):
        out.append(received)
    if step is _GO_ANSWER:
        turn.phase = _ANSWER
        return
    said = response.message.text or ""
    checks = bool(said) and not said.isspace()
    if chain is not None and checks:
        # Text sent with tool calls is not the answer, but memory stores it and readers get it
        # (also when a loop limit stops the calls): the chain checks it as it checks answers
        # (DESIGN §5).
        turn.attempts = attempt
        message = response.message
        outcome = await _chain(turn, chain, said, message.thinking, guard, out, message.tool_calls)
        decision = after_chain(outcome, askable=True, reasks=turn.reasks, max_retries=chain.max_retries)
        if decision is not _ACCEPT:
            if decision is _REFUSE:
                raise _finish.refused(turn, outcome, attempt)
            if step is _GO_TOOLS:
                _loop.unspend_round(turn, response.message.tool_calls)  # they never run
            turn.rejected = outcome.reask
            turn.phase = _ANSWER
            return
        if outcome.text != said:  # rewritten: stored, sent back and shown so
            response = _loop.rewrite(turn, outcome.text)
            if release.pending:
                release.pending[-1] = ResponseReceived(turn.id, response, round_)
            said = outcome.text
    moderation = turn.plan.moderation
    if checks and moderation is not None and moderation.answer:
        # Moderated answers: the text that comes with tool calls is judged as an answer is.
        judging = _moderate.judge(turn, moderation, said, "answer")
        if guard is not None:
            judging = scoped(turn, judging, guard)
        await judging
    released = release.released
    if released is not None:
        # Not the answer (it calls tools): what the reader has of it is withdrawn.
        shown_all = response.message if release.mode is _OPTIMISTIC else None
        reset = released.withdraw(turn.id, ResetReason.TOOL_CALLS, attempt, shown_all)
        if reset is not None:
            if listeners:
                notify(listeners, reset)
            out.append(reset)
    turn.phase = _REQUEST if step is _GO_ASK else _TOOLS


async def tool_round(turn: Turn, guard: float | None) -> AsyncGenerator[Event, None]:
    """`Phase.TOOLS`: run the tool calls of `turn.response`, concurrently, under the deadline. Calls
    that need a human's approval wait: the others run, then the turn goes to `Phase.APPROVAL`."""
    assert turn.response is not None
    calls = turn.response.message.tool_calls
    round_ = turn.round
    loop = turn.loop
    assert loop is not None
    tools = loop.tools
    for call in calls:
        definition = tools.get(call.name)
        requested = ToolCallRequested(
            turn.id,
            call,
            arguments_hash(call.arguments),
            round_,
            dict(definition.annotations) if definition is not None and definition.annotations else {},
        )
        if shown(turn, requested):
            yield requested
    loop.begin_round(calls)
    if turn.plan.approvals is None:
        round_run = loop.run_calls(calls)
        if guard is not None:
            round_run = scoped(turn, round_run, guard)
        executions = await round_run
    else:
        gating = _approve.gate(turn, calls)
        if guard is not None:
            gating = scoped(turn, gating, guard)
        waiting, refused = await gating
        if waiting:
            _approve.check_store(turn)  # a turn that cannot wait runs nothing of its round
        run = [
            call for position, call in enumerate(calls) if position not in waiting and position not in refused
        ]
        round_run = loop.run_calls(run)
        if guard is not None:
            round_run = scoped(turn, round_run, guard)
        ran = iter(await round_run)
        done: list[ToolExecution | None] = [
            None if position in waiting else refused[position] if position in refused else next(ran)
            for position in range(len(calls))
        ]
        if waiting:
            for execution in done:
                if execution is not None:
                    executed = ToolExecuted(turn.id, execution)
                    if shown(turn, executed):
                        yield executed
            turn.waiting = _approve.new_waiting(turn, waiting, done)
            turn.phase = _APPROVAL
            return
        executions = [execution for execution in done if execution is not None]
    for execution in executions:
        executed = ToolExecuted(turn.id, execution)
        if shown(turn, executed):
            yield executed
    loop.end_round(executions)
    step = _loop.after_round(turn, calls, executions)
    turn.phase = _ANSWER if step is _GO_ANSWER else _REQUEST


async def approved_round(turn: Turn, guard: float | None) -> AsyncGenerator[Event, None]:
    """`Phase.APPROVAL`, resumed with decisions: check them, claim the stored turn (so no other
    resume runs it), run the approved calls, and finish the round with the denials as results."""
    waiting = turn.waiting
    loop = turn.loop
    assert waiting is not None
    assert loop is not None
    approved, decided = _approve.resolve(turn)  # ApprovalDecisionError: nothing recorded, still waiting
    if decided:  # denied: never run, so not spent (as calls the chain asked again about)
        assert turn.response is not None
        calls = turn.response.message.tool_calls
        _loop.unspend_round(turn, tuple(calls[position] for position in decided))
    claiming = _approve.claim(turn)
    if guard is not None:
        claiming = scoped(turn, claiming, guard)
    await claiming
    round_run = loop.run_calls([call for _, call in approved])
    if guard is not None:
        round_run = scoped(turn, round_run, guard)
    ran = await round_run
    decided.update(zip((position for position, _ in approved), ran, strict=True))
    for position in sorted(decided):
        executed = ToolExecuted(turn.id, decided[position])
        if shown(turn, executed):
            yield executed
    done = waiting.done
    executions = [
        execution if execution is not None else decided[position] for position, execution in enumerate(done)
    ]
    turn.waiting = None
    turn.decisions = None
    assert turn.response is not None
    # The round's executions were recorded as they happened (those that ran before the turn
    # stopped, then the decided ones): the result lists them in the model's order, as a round that
    # never stopped would.
    loop.executions[-len(executions) :] = executions
    loop.end_round(executions)
    step = _loop.after_round(turn, turn.response.message.tool_calls, executions)
    turn.phase = _ANSWER if step is _GO_ANSWER else _REQUEST


async def answer(turn: Turn, guard: float | None, out: list[Event]) -> None:
    """`Phase.ANSWER`: check the answer (output guardrails, then parse) and `decide`: accept it and
    release its text (then `Phase.COMMIT`), or ask again or repair (then `Phase.REQUEST`); a refusal
    or an answer that cannot be repaired raises."""
    listeners = turn.runtime.listeners
    plan = turn.plan
    chain, streams, moderation = plan.output_chain, plan.streams, plan.moderation
    release = turn.release
    # The answer: output guardrails (which may ask again), then parse.
    attempt = turn.attempt
    text = answered = _finish.answer_text(turn)
    immediate = turn.immediate is not None
    message = None
    if not immediate:
        assert turn.response is not None
        message = turn.response.message
        if message.tool_calls:
            # An answer with calls that never ran (stray calls in a final answer, a
            # model that called tools the service does not have, or text with calls
            # the chain asked again about): the answer counts, the calls do not.
            # Stored with them, every later request would carry an unanswered call.
            # A message of calls only keeps an empty text: providers reject an
            # assistant message with neither text nor calls.
            message = message.model_copy(update={"tool_calls": (), "text": message.text or ""})
    final = None
    cut = False
    value: Any = NO_VALUE
    again: GuardrailResult | OutputParsingError | None = None  # what asks again, if anything
    stopped = turn.stopped
    if turn.rejected is not None:
        again, turn.rejected = turn.rejected, None
        turn.reasks += 1
    elif chain is not None:
        turn.attempts = attempt  # answers checked, this one included
        cut = stopped is not None
        if stopped is not None:
            outcome, turn.stopped = stopped, None
        else:
            if release.mode is _CHUNKED and not immediate:
                assert release.released is not None
                # the answer as released so far (with any rewrites), then the rest
                text = release.released.text + turn.unreleased
            assert turn.response is not None
            outcome = await _chain(turn, chain, text, turn.response.message.thinking, guard, out)
        decision = after_chain(
            outcome, askable=message is not None, reasks=turn.reasks, max_retries=chain.max_retries
        )
        if decision is _REASK:
            again = outcome.reask
            turn.reasks += 1
        elif decision is _REFUSE:
            raise _finish.refused(turn, outcome, attempt, immediate=immediate)
        else:
            text, value = outcome.text, outcome.value
            if value is not NO_VALUE:
                _finish.check_value(turn, value)  # before any text is released
    parsed = again is None and value is NO_VALUE
    if parsed:
        # Parsed before the answer is accepted: one that does not parse is repaired
        # (asked again with what was wrong), and nothing of it is stored or released.
        turn.attempts = attempt
        try:
            if len(text) > _finish.OFF_LOOP:
                parsing = _finish.parse_off_loop(turn, text, text != answered)
                if guard is not None:
                    parsing = scoped(turn, parsing, guard)
                value = await parsing
            else:
                value = _finish.parse(turn, text, text != answered)
        except OutputParsingError as error:
            decision = after_parse(
                True, askable=message is not None, repairs=turn.repairs, max_repairs=turn.max_repairs
            )
            if decision is _UNPARSED:
                raise _finish.unparsed(turn, error, attempt, turn.repairs) from error
            again = error
            turn.repairs += 1
    if again is not None:
        assert message is not None
        repairing = isinstance(again, OutputParsingError)
        why = ResetReason.UNPARSED if repairing else ResetReason.REJECTED
        pending = release.pending
        if pending and not cut:
            pending.pop()  # the rejected answer's ResponseReceived
        reset = None
        if release.released is not None:
            shown_all = message if release.mode is _OPTIMISTIC else None
            reset = release.released.withdraw(turn.id, why, attempt, shown_all)
        elif streams and release.mode is _PLAIN:
            # A stream without output guardrails showed the answer as it came: withdrawn,
            # and the next one replayed stream-to-sync, its events held with it.
            reset = Reset(turn.id, why, attempt)
        if reset is not None:
            if listeners:
                notify(listeners, reset)
            out.append(reset)
        release.again()  # the next answer is replayed stream-to-sync
        if repairing:
            _finish.repair(turn, message, again)  # type: ignore[arg-type]
        else:
            _finish.reask(turn, message, again)  # type: ignore[arg-type]
        turn.attempt += 1
        turn.phase = _REQUEST
        return
    if moderation is not None and moderation.answer and text:
        judging = _moderate.judge(turn, moderation, text, "answer")
        if guard is not None:
            judging = scoped(turn, judging, guard)
        await judging
    rewritten = _finish.accept(turn, message, text, answered)
    pending = release.pending
    if pending is not None:  # released once the chain passed
        final = pending.pop() if not immediate and pending else None
        if rewritten and final is not None:  # its response, as the reader gets it
            assert turn.response is not None
            final = ResponseReceived(turn.id, turn.response, turn.round)
        for event in pending:
            out.append(event)
        pending.clear()
    if streams:
        if immediate:
            out.append(TextDelta(text))
        elif release.mode is Mode.HOLD:  # the accepted answer, as one delta, then its response
            assert turn.response is not None
            thinking = turn.response.message.thinking
            if thinking:
                out.append(ThinkingDelta(thinking))
            if text:
                out.append(TextDelta(text))
            if final is not None:
                out.append(final)
        elif release.released is not None:  # the rest of the accepted answer (or a Reset, and all of it)
            thought = ""
            if release.mode is _CHUNKED:
                thought = turn.unthought
            else:  # optimistic: the reader has all of the model's answer
                assert message is not None
                release.released.saw(message)
            for event in release.released.release(turn.id, attempt, text, thought):
                if listeners and event.__class__ is Reset:
                    notify(listeners, event)
                out.append(event)
            if final is not None:
                out.append(final)
    turn.value, turn.text = value, text
    # Parsed from the model's text (not a guardrail's value, not an immediate tool's): a restored
    # turn parses the text again rather than trusting a JSON round trip of the value.
    turn.parsed = parsed and not immediate
    turn.phase = _COMMIT
