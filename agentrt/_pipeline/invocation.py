"""The pipeline: one invocation of a service method as one async stream of events.

There is one loop. Awaiting a method, reading a `TokenStream`, or (later) an SSE endpoint are all folds
over `Invocation.events()`, which runs the stages of DESIGN §2 over one `Turn`:

    prepare (render → memory → input guardrails → retrieval → tools → output format)
    model ⇄ tools: before_request → stream the response → after_response → [tool round → after_round]
    answer: output guardrails → parse → commit

The generator runs in the reader's task. It never holds a task group or a cancel scope across a
`yield`: concurrency (a tool round) and deadlines are opened and closed inside one await, and the only
scope around a `yield`-free region that outlives an error is a shield around closing the model stream,
so the adapter's cleanup finishes even on trio, where cancellation is level-triggered. So the stream can
be read, and closed, by any task, the finalizer of an abandoned stream included.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio

from .._budget import chars_for_tokens
from .._errors import BudgetExceededError, ModelTimeoutError, OutputParsingError
from .._events import (
    CancelledEvent,
    Completed,
    Event,
    FailedEvent,
    RefusalDelta,
    RequestIssued,
    Reset,
    ResetReason,
    ResponseReceived,
    Result,
    Started,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallRequested,
    ToolExecuted,
    Usage,
)
from .._spec import OutputKind
from .._watchdog import read_before
from ..guardrails._results import NO_VALUE
from ..models._protocol import ResponseAccumulator, aclose_iterator
from ..output._modes import AnswerChunks
from ..tools._run import arguments_hash
from . import _finish, _loop, _meter, _moderate, _release, _stages
from ._runtime import notify
from ._turn import Turn

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable

    from .._budget import Budget, BudgetLimit
    from .._events import ModelChunk, ModelResponse
    from .._spec import MethodSpec
    from ..guardrails._results import GuardrailResult
    from ..models._protocol import ModelRequest, ModelSettings
    from ._runtime import Runtime

__all__ = ["READY", "Invocation"]

_T = TypeVar("_T")

# Chunks the pipeline forwards to readers as they are; the others are folded into ResponseReceived.
_FORWARD: Final = frozenset({TextDelta, ThinkingDelta, RefusalDelta, Usage})
# Chunks other than text deltas that spend an output-token allowance (see _meter).
_METERED: Final = frozenset({ThinkingDelta, ToolCallDelta, Usage})
_STREAMS: Final = frozenset({OutputKind.STREAM, OutputKind.PARTIAL})


class _Ready:
    """Yielded once by a primed `events()`: the model accepted the first request (see `events`)."""

    __slots__ = ()


READY: Final = _Ready()


class _Deadline:
    """A model stream read under a deadline, for models that do not handle `request.deadline`.

    A model's iterator has nothing a watchdog could interrupt, so each read takes its own cancel
    scope (`read_before`: never held across the pipeline's `yield`); a read cut at the deadline
    raises `ModelTimeoutError`, as the HTTP adapters do.
    """

    __slots__ = ("_chunks", "_deadline")

    def __init__(self, chunks: AsyncIterator[ModelChunk], deadline: float) -> None:
        self._chunks = chunks
        self._deadline = deadline

    def __aiter__(self) -> _Deadline:
        return self

    async def __anext__(self) -> ModelChunk:
        chunk, cut = await read_before(self._chunks, self._deadline, None)
        if cut:
            raise ModelTimeoutError("the model stream reached the invocation's deadline", mid_stream=True)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        await aclose_iterator(self._chunks)


class Invocation:
    """One call of a service method. Create, then read `events()` once (or await `result()`)."""

    __slots__ = ("_turn", "id")

    def __init__(
        self,
        runtime: Runtime,
        spec: MethodSpec,
        arguments: dict[str, Any],
        *,
        settings: ModelSettings | None = None,
        budget: Budget | None = None,
        max_repairs: int | None = None,
    ) -> None:
        self.id = os.urandom(16).hex()  # as random as uuid4().hex, without building a UUID
        self._turn = Turn(self.id, runtime, spec, arguments, settings, budget)
        self._turn.max_repairs = runtime.max_repairs if max_repairs is None else max_repairs

    async def result(self) -> Result[Any]:
        """Run to the end and return the result: the fold of `events()`.

        With a time budget, the whole fold runs under one cancel scope at the deadline, held by this
        coroutine (one task, no `yield` to anyone else), so nothing inside needs a scope of its own:
        not the network reads, not the tool rounds. Cut there, the call raises `BudgetExceededError`.
        """
        turn = self._turn
        deadline = turn.deadline
        if deadline is None:
            return await self._fold(self.events())
        # Watched, the pipeline reports no cancellation itself: this scope, or one outside it, may
        # have caused it, and only here is it known which.
        turn.watched = True
        listeners = turn.runtime.listeners
        try:
            with anyio.CancelScope(deadline=deadline) as scope:
                return await self._fold(self.events())
        except anyio.get_cancelled_exc_class():
            if listeners:
                notify(listeners, CancelledEvent(self.id))  # someone else's cancellation
            raise
        assert scope.cancelled_caught
        error = _timed_out(turn)
        if listeners:
            notify(listeners, FailedEvent(self.id, error))
        raise error

    @staticmethod
    async def _fold(events: AsyncGenerator[Event, None]) -> Result[Any]:
        result: Result[Any] | None = None
        try:
            async for event in events:
                if type(event) is Completed:
                    result = event.result
        finally:
            await events.aclose()
        assert result is not None, "an invocation ends with Completed or raises"
        return result

    async def events(self, *, prime: bool = False) -> AsyncGenerator[Event, None]:
        """The invocation's events, ending with `Completed`; errors are raised, not yielded.

        With `prime`, the first item is `READY`, yielded once the model accepted the first request
        (its first chunk arrived), before any event: a caller that takes it has seen every error up
        to that point raised (a bad argument, a connection error, 401, 429, an exceeded context). The
        events before it (`Started`, `RequestIssued`) follow it; listeners get them as they happen.
        """
        turn = self._turn
        runtime = turn.runtime
        listeners = runtime.listeners
        model = runtime.model
        started = Started(self.id, turn.spec.qualname, turn.memory_id, model.name, runtime.provider)
        if listeners:
            notify(listeners, started)
        held: list[Event] | None = [started] if prime else None
        deadline = turn.deadline  # fixed for the invocation; None without a time budget
        # Steps that may wait are put under the deadline here, unless `result()` holds a scope at it
        # around the whole invocation (`watched`).
        guard = None if turn.watched else deadline
        done = False
        try:
            if held is None:
                yield started
            prepare = _stages.prepare(turn)
            if guard is not None and _stages.may_wait(turn):
                prepare = _scoped(turn, prepare, guard)
            await prepare
            if turn.verdicts:  # the input guardrails' verdicts (listeners had them as they came)
                for verdict in turn.verdicts:
                    if held is None:
                        yield verdict
                    else:
                        held.append(verdict)
                turn.verdicts.clear()
            if turn.retrieved is not None:  # what retrieval found (listeners had it)
                if held is None:
                    yield turn.retrieved
                else:
                    held.append(turn.retrieved)
                turn.retrieved = None
            # Moderation: the user's message is judged while the model answers its first request.
            moderation = runtime.moderations.get(turn.spec.name) if runtime.moderations else None
            moderating = moderation is not None and bool(turn.user is not None and turn.user.text)
            chain = runtime.output_guardrails.get(turn.spec.name) if runtime.output_guardrails else None
            streams = turn.spec.output_kind in _STREAMS
            policy = chain.release if chain is not None and streams else None
            # How this attempt's text reaches a stream's reader: held until the chain passed the
            # answer (`buffer`, and every re-ask of a `chunked` stream: stream-to-sync), released
            # chunk by chunk as each passes (`chunked`), or at once (`optimistic`; a rejection then
            # withdraws it with a `Reset`). `released` is what the reader has of it.
            # An answer that is moderated too is held until it passed, like `buffer`.
            hold = policy == "buffer" or (
                streams and policy is None and moderation is not None and moderation.answer
            )
            chunking = policy == "chunked"
            optimistic = policy == "optimistic"
            released = None
            if chain is not None and (chunking or optimistic):
                released = _release.Released(chain.chunk)
            # Held or chunked, responses and tool events wait with the text: released with the
            # accepted answer or chunk (a rejected answer's response never is, nor are requests, which
            # may carry one); listeners get every event as it happens.
            pending: list[Event] | None = [] if hold or chunking else None

            def shown(event: ResponseReceived | ToolCallRequested | ToolExecuted) -> bool:
                """Tell listeners of a response or tool event; whether to yield it now (False: it
                is held with the text)."""
                if listeners:
                    notify(listeners, event)
                if pending is None:
                    return True
                pending.append(event)
                return False

            attempt = 1  # answers so far: 1, then one more per re-ask or repair
            reasks = repairs = 0
            round_ = 0
            value: Any = NO_VALUE
            stopped: _finish.Outcome | None = None  # a chunk the chain refused: the answer stops there
            while True:  # one answer per pass; output guardrails may ask again
                while True:
                    round_ += 1
                    request, allowance = _loop.before_request(turn)
                    issued = RequestIssued(self.id, request, round_)
                    if listeners:
                        notify(listeners, issued)
                    if pending is None:  # held back otherwise: a re-asked request carries a rejected answer
                        if held is None:
                            yield issued
                        else:
                            held.append(issued)
                    accumulator = turn.streaming = ResponseAccumulator()
                    add = accumulator.add
                    append = accumulator.text_sink()  # what `add` does for a TextDelta, without the call
                    chunks = model.stream(request)
                    if moderating:
                        assert moderation is not None
                        assert turn.user is not None
                        chunks = _moderate.Moderated(
                            chunks,
                            turn,
                            moderation,
                            turn.user.text,
                            allowance=allowance[0] if allowance is not None else None,
                            deadline=guard,
                        )
                        moderating = False
                    if turn.answer is not None:  # tool mode: the answer tool's arguments are the text
                        chunks = turn.answering = AnswerChunks(chunks)
                    if guard is not None and not runtime.handles_deadline:
                        chunks = _Deadline(chunks, guard)
                    # A token limit: the allowance in characters, spent chunk by chunk (see _meter); the
                    # response stops within one chunk of it.
                    left = chars_for_tokens(allowance[0]) if allowance is not None else 0
                    carried = None
                    try:
                        if held is not None:
                            # Primed: wait for the model to accept the request, then hand over.
                            first = await anext(chunks, None)
                            yield cast("Event", READY)
                            for event in held:
                                yield event
                            held = None
                            if chunking:
                                carried = first  # checked with the chunks after it
                            elif first is not None:
                                add(first)
                                if first.__class__ in _FORWARD and not hold:
                                    yield first  # type: ignore[misc]
                                if allowance is not None:
                                    left -= _meter.spend(first, allowance[0])
                                    if left < 0:
                                        raise _cut(turn, accumulator, request, allowance)
                        if hold:
                            # Output guardrails on a stream: text and thinking are held back until
                            # the chain passes the answer (the `buffer` release).
                            most = allowance[0] if allowance is not None else 0
                            async for chunk in chunks:
                                add(chunk)
                                if allowance is not None:
                                    left -= _meter.spend(chunk, most)
                                    if left < 0:
                                        raise _cut(turn, accumulator, request, allowance)
                                if chunk.__class__ is Usage:
                                    yield chunk
                        elif chunking:
                            # `chunked`: the answer so far is checked at each chunk's end, and the
                            # chunk released once it passed; a refused chunk stops the response.
                            assert chain is not None
                            assert released is not None
                            assert pending is not None
                            most = allowance[0] if allowance is not None else 0
                            crossed = released.crossed
                            # By sentences, most tokens end in none of the characters that may end one.
                            gate = _release.MAY_END if chain.chunk is None else None
                            following = chunks.__anext__
                            while True:  # `async for`, after a primed first chunk (as fast)
                                if carried is None:
                                    try:
                                        chunk = await following()
                                    except StopAsyncIteration:
                                        break
                                else:
                                    chunk, carried = carried, None
                                kind = chunk.__class__
                                if kind is TextDelta:
                                    text = chunk.text  # type: ignore[union-attr]
                                    append(text)
                                    if allowance is not None:
                                        size = len(text)
                                        left -= size if size > _meter.TOKEN else _meter.TOKEN
                                        if left < 0:
                                            raise _cut(turn, accumulator, request, allowance)
                                    if (gate is None or text[-1:] in gate) and crossed(text):
                                        checking = _release.check(turn, chain, accumulator, released, attempt)
                                        if guard is not None:
                                            checking = _scoped(turn, checking, guard)
                                        outcome, out = await checking
                                        for verdict in turn.verdicts:
                                            yield verdict
                                        turn.verdicts.clear()
                                        if outcome.failures:
                                            stopped = outcome
                                            break
                                        for event in pending:
                                            yield event
                                        pending.clear()
                                        for event in out:
                                            if listeners and event.__class__ is Reset:
                                                notify(listeners, event)
                                            yield event
                                    continue
                                add(chunk)
                                if allowance is not None and kind in _METERED:
                                    left -= _meter.spend(chunk, most)
                                    if left < 0:
                                        raise _cut(turn, accumulator, request, allowance)
                                if kind is Usage:
                                    yield chunk  # type: ignore[misc]
                        elif allowance is None:
                            async for chunk in chunks:
                                if chunk.__class__ is TextDelta:
                                    append(chunk.text)
                                    yield chunk
                                else:
                                    add(chunk)
                                    if chunk.__class__ in _FORWARD:
                                        yield chunk  # type: ignore[misc]
                        else:
                            most = allowance[0]
                            async for chunk in chunks:
                                if chunk.__class__ is TextDelta:
                                    text = chunk.text
                                    append(text)
                                    size = len(text)
                                    left -= size if size > _meter.TOKEN else _meter.TOKEN
                                    if left < 0:
                                        raise _cut(turn, accumulator, request, allowance)
                                    yield chunk
                                else:
                                    add(chunk)
                                    if chunk.__class__ in _METERED:
                                        left -= _meter.spend(chunk, most)
                                        if left < 0:
                                            raise _cut(turn, accumulator, request, allowance)
                                    if chunk.__class__ in _FORWARD:
                                        yield chunk  # type: ignore[misc]
                    except ModelTimeoutError as exc:
                        if deadline is not None and anyio.current_time() >= deadline:
                            raise _timed_out(turn) from exc
                        raise
                    finally:
                        with anyio.CancelScope(shield=True):
                            await aclose_iterator(chunks)
                    if stopped is not None:
                        # Refused part way: the response ends where it was cut, and is not shown.
                        response = accumulator.build(request, cut=True)
                        turn.streaming = None
                        _loop.record(turn, response)
                        if listeners:
                            notify(listeners, ResponseReceived(self.id, response, round_))
                        break
                    response = accumulator.build(request)
                    turn.streaming = None
                    step = _loop.after_response(turn, response)
                    received = ResponseReceived(self.id, response, round_)
                    if shown(received):
                        yield received
                    if step is _loop.Step.ANSWER:
                        break
                    if released is not None:
                        # Not the answer (it calls tools): what the reader has of it is withdrawn.
                        shown_all = response.message if optimistic else None
                        reset = released.withdraw(self.id, ResetReason.TOOL_CALLS, attempt, shown_all)
                        if reset is not None:
                            if listeners:
                                notify(listeners, reset)
                            yield reset
                    if step is _loop.Step.ASK:
                        continue
                    calls = response.message.tool_calls
                    for call in calls:
                        requested = ToolCallRequested(self.id, call, arguments_hash(call.arguments), round_)
                        if shown(requested):
                            yield requested
                    loop = turn.loop
                    assert loop is not None
                    round_run = loop.run_round(calls)
                    if guard is not None:
                        round_run = _scoped(turn, round_run, guard)
                    executions = await round_run
                    for execution in executions:
                        executed = ToolExecuted(self.id, execution)
                        if shown(executed):
                            yield executed
                    if _loop.after_round(turn, calls, executions) is _loop.Step.ANSWER:
                        break
                # the answer: output guardrails (which may ask again), then parse
                text = answered = _finish.answer_text(turn)
                immediate = turn.immediate is not None
                message = None
                if not immediate:
                    assert turn.response is not None
                    message = turn.response.message
                    if message.tool_calls:
                        # An answer with calls that never ran (stray calls in a final answer, or a
                        # model that called tools the service does not have): the answer counts, the
                        # calls do not. Stored with them, every later request would carry an
                        # unanswered call. A message of calls only keeps an empty text: providers
                        # reject an assistant message with neither text nor calls.
                        message = message.model_copy(update={"tool_calls": (), "text": message.text or ""})
                final = None
                cut = False
                again: GuardrailResult | OutputParsingError | None = None  # what asks again, if anything
                if chain is not None:
                    turn.attempts = attempt  # answers checked, this one included
                    cut = stopped is not None
                    if stopped is not None:
                        outcome, stopped = stopped, None
                    else:
                        if chunking and not immediate:
                            assert released is not None
                            # the answer as released so far (with any rewrites), then the rest
                            text = released.text + accumulator.text_from(released.text_at)[0]
                        assert turn.response is not None
                        checked = _finish.output_guardrails(
                            turn, chain, text, attempt, turn.response.message.thinking
                        )
                        if guard is not None:
                            checked = _scoped(turn, checked, guard)
                        outcome = await checked
                        for verdict in turn.verdicts:
                            yield verdict
                        turn.verdicts.clear()
                    if outcome.reask is not None and message is not None and reasks < chain.max_retries:
                        again = outcome.reask
                        reasks += 1
                    elif outcome.failures:
                        raise _finish.refused(turn, outcome, attempt, immediate=immediate)
                    else:
                        text, value = outcome.text, outcome.value
                        if value is not NO_VALUE:
                            _finish.check_value(turn, value)  # before any text is released
                if again is None and value is NO_VALUE:
                    # Parsed before the answer is accepted: one that does not parse is repaired (asked
                    # again with what was wrong), and nothing of it is stored or released.
                    turn.attempts = attempt
                    try:
                        if len(text) > _finish.OFF_LOOP:
                            parsing = _finish.parse_off_loop(turn, text, text != answered)
                            if guard is not None:
                                parsing = _scoped(turn, parsing, guard)
                            value = await parsing
                        else:
                            value = _finish.parse(turn, text, text != answered)
                    except OutputParsingError as error:
                        if message is None or repairs >= turn.max_repairs:
                            raise _finish.unparsed(turn, error, attempt, repairs) from error
                        again = error
                        repairs += 1
                if again is not None:
                    assert message is not None
                    repairing = isinstance(again, OutputParsingError)
                    why = ResetReason.UNPARSED if repairing else ResetReason.REJECTED
                    if pending and not cut:
                        pending.pop()  # the rejected answer's ResponseReceived
                    reset = None
                    if released is not None:
                        shown_all = message if optimistic else None
                        reset = released.withdraw(self.id, why, attempt, shown_all)
                    elif streams and not hold:
                        # A stream without output guardrails showed the answer as it came: withdrawn,
                        # and the next one replayed stream-to-sync, its events held with it.
                        reset = Reset(self.id, why, attempt)
                        hold = True
                        pending = []
                    if reset is not None:
                        if listeners:
                            notify(listeners, reset)
                        yield reset
                    if chunking:  # asked again, the answer is replayed stream-to-sync: held until it passed
                        chunking = False
                        hold = True
                    if isinstance(again, OutputParsingError):
                        _finish.repair(turn, message, again)
                    else:
                        _finish.reask(turn, message, again)
                    attempt += 1
                    continue
                if moderation is not None and moderation.answer and text:
                    judging = _moderate.judge(turn, moderation, text, "answer")
                    if guard is not None:
                        judging = _scoped(turn, judging, guard)
                    await judging
                rewritten = _finish.accept(turn, message, text, answered)
                if pending is not None:  # released once the chain passed
                    final = pending.pop() if not immediate and pending else None
                    if rewritten and final is not None:  # its response, as the reader gets it
                        assert turn.response is not None
                        final = ResponseReceived(self.id, turn.response, round_)
                    for event in pending:
                        yield event
                    pending.clear()
                if streams:
                    if immediate:
                        yield TextDelta(text)
                    elif hold:  # the accepted answer, as one delta, then its response
                        assert turn.response is not None
                        thinking = turn.response.message.thinking
                        if thinking:
                            yield ThinkingDelta(thinking)
                        if text:
                            yield TextDelta(text)
                        if final is not None:
                            yield final
                    elif released is not None:  # the rest of the accepted answer (or a Reset, and all of it)
                        thought = ""
                        if chunking:
                            thought = accumulator.thinking_from(released.thought_at)[0]
                        else:  # optimistic: the reader has all of the model's answer
                            assert message is not None
                            released.saw(message)
                        for event in released.release(self.id, attempt, text, thought):
                            if listeners and event.__class__ is Reset:
                                notify(listeners, event)
                            yield event
                        if final is not None:
                            yield final
                break
            conversation = turn.conversation
            if conversation is not None:
                # The turn is done: store it, and let the next turn on the conversation start now,
                # not when this stream's reader gets to its end.
                with anyio.CancelScope(shield=True):
                    await _finish.commit(turn)
                    await conversation.release()
            completed: Completed[Any] = Completed(self.id, turn.result(value, text, attempt))
            if listeners:
                notify(listeners, completed)
            done = True
            yield completed
        except BaseException as exc:
            # A reader that stops at Completed and closes the stream is not a cancellation.
            if listeners and not done:
                cancelled = isinstance(exc, GeneratorExit | anyio.get_cancelled_exc_class())
                if not (cancelled and turn.watched):  # watched: result() reports cancellations
                    notify(listeners, CancelledEvent(self.id) if cancelled else FailedEvent(self.id, exc))
            raise
        finally:
            conversation = turn.conversation
            if conversation is not None and conversation.held:
                # Not committed: nothing was written. Release, whichever task closes the stream.
                if conversation.owner is None:
                    conversation.release_local()
                else:
                    with anyio.CancelScope(shield=True):
                        await conversation.release()


async def _scoped(turn: Turn, step: Awaitable[_T], deadline: float) -> _T:
    """Await one step of the turn under its deadline: cut there with `BudgetExceededError`.

    Only steps that may wait (on I/O, a tool, a user's provider) are scoped: a cancel scope costs more
    than the rest of a plain call.
    """
    with anyio.CancelScope(deadline=deadline) as scope:
        return await step
    assert scope.cancelled_caught
    raise turn.exceeded("seconds")


def _cut(
    turn: Turn, accumulator: ResponseAccumulator, request: ModelRequest, allowance: tuple[int, BudgetLimit]
) -> Exception:
    """The error for a response stopped at a token limit (the stream is closed on the way out)."""
    response = accumulator.build(request, cut=True)
    account = turn.account
    assert account is not None
    account.record(response.usage)
    return turn.exceeded(
        allowance[1], streamed=response, cause=f"the response was stopped past {allowance[0]} output tokens"
    )


def _timed_out(turn: Turn) -> BudgetExceededError:
    """The error for an invocation cut at its deadline, with the response under way, if any."""
    account = turn.account
    assert account is not None
    accumulator, request = turn.streaming, turn.sent
    if accumulator is None or request is None or not accumulator.started:
        return turn.exceeded("seconds")  # nothing of a response arrived: no response to report
    turn.streaming = None
    response: ModelResponse = accumulator.build(request, cut=True)
    account.record(response.usage)
    return turn.exceeded("seconds", streamed=response, cause="while the model responded")
