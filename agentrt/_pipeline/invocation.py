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
from types import AsyncGeneratorType
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio

from .._errors import ModelTimeoutError
from .._events import (
    Completed,
    Event,
    Result,
    TextDelta,
)
from . import _approve, _checkpoint, _finish, _fold, _stages, _steps
from ._plan import Plan, plan
from ._response import Response, _timed_out
from ._runtime import notify
from ._turn import BOUNDARIES, Phase, Turn

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping

    from .._budget import Budget
    from .._spec import MethodSpec
    from ..models._protocol import ModelSettings
    from ._runtime import Runtime

__all__ = ["READY", "Invocation", "StopAtBoundary"]

_T = TypeVar("_T")

# Enum members and their hashes are looked up in Python code: the driver reads them as constants.
_PREPARE: Final = Phase.PREPARE
_REQUEST: Final = Phase.REQUEST
_RESPONSE: Final = Phase.RESPONSE
_TOOLS: Final = Phase.TOOLS
_APPROVAL: Final = Phase.APPROVAL
_COMMIT: Final = Phase.COMMIT


class _Ready:
    """Yielded once by a primed `events()`: the model accepted the first request (see `events`)."""

    __slots__ = ()


READY: Final = _Ready()


class StopAtBoundary(Exception):
    """Raised by an `on_boundary` callback to end the invocation there because its owner stops it (a
    durable turn's segment ends): not the invocation's failure, so listeners get no `FailedEvent`
    (any other exception the callback raises is one)."""


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
        method_plan: Plan | None = None,
    ) -> None:
        self.id = os.urandom(16).hex()  # as random as uuid4().hex, without building a UUID
        self._turn = Turn(
            self.id, runtime, spec, arguments, settings, budget, method_plan or plan(runtime, spec)
        )
        self._turn.max_repairs = runtime.max_repairs if max_repairs is None else max_repairs

    @classmethod
    def restore(
        cls,
        runtime: Runtime,
        spec: MethodSpec,
        checkpoint: Mapping[str, Any],
        *,
        method_plan: Plan | None = None,
    ) -> Invocation:
        """The invocation whose turn `checkpoint` saved (see `checkpoint`), to be read on from the step
        it was saved at: its events continue those of the original (no second `Started`), and it
        commits as the original would have. Raises `CheckpointError` for a checkpoint it cannot take."""
        turn = _checkpoint.load(runtime, spec, method_plan or plan(runtime, spec), checkpoint)
        invocation = cls.__new__(cls)
        invocation.id = turn.id
        invocation._turn = turn
        return invocation

    def checkpoint(self) -> dict[str, Any]:
        """The turn as versioned JSON data, at a step boundary: from an `on_boundary` callback, or
        after the callback raised to stop the invocation there. Raises `CheckpointError` elsewhere
        (a turn stopped inside a step has part of the step done)."""
        return _checkpoint.dump(self._turn)

    def on_boundary(self, callback: Callable[[Phase], None] | None) -> None:
        """Call `callback` with the step at each step boundary, before the step runs: where the turn
        may be checkpointed. An exception it raises ends the invocation there (nothing is stored);
        listeners see it as a failure unless it is a `StopAtBoundary`."""
        self._turn.boundary = None if callback is None else (lambda turn: callback(turn.phase))

    def result(self) -> Coroutine[Any, Any, Result[Any]]:
        """Run to the end and return the result (await it): the fold of `events()`.

        With a time budget, the whole fold runs under one cancel scope at the deadline, held by this
        coroutine (one task, no `yield` to anyone else), so nothing inside needs a scope of its own:
        not the network reads, not the tool rounds. Cut there, the call raises `BudgetExceededError`.
        """
        return _fold.result(self._turn, self.events)  # its coroutine, not one more around it

    async def events(self, *, prime: bool = False, forward: bool = True) -> AsyncGenerator[Event, None]:
        """The invocation's events, ending with `Completed`; errors are raised, not yielded.

        A loop over the turn's steps (`Phase`): prepare → request → response → tools → answer →
        commit. Each step reads and writes the turn; between steps (at `BOUNDARIES`) the turn is
        whole data and may be checkpointed (`checkpoint()`), and a restored turn starts at the step it
        was saved at.

        With `prime`, `READY` is yielded once the model accepted the first request (its first chunk
        arrived), after the events before it (`Started`, `RequestIssued`, ...) and before any chunk:
        a caller that reads up to it has seen every error up to that point raised (a bad argument, a
        connection error, 401, 429, an exceeded context). A turn restored past its first request
        yields it at once (after a resumed approval's round: before the next request, or at once if
        it needs none).

        Without `forward`, the model's chunks (text, thinking, refusal, usage) are not yielded, only
        the events around them: `result()` folds to `Completed` and has no use for them (each one
        would resume this generator and the fold once more).
        """
        turn = self._turn
        if turn.resume_from is not None:
            turn.resume_clock()
        listeners = turn.runtime.listeners
        restored = turn.phase is not _PREPARE
        priming = prime  # READY is still to come
        # A resumed approval is a new run of the turn (a new stream, a new span): it starts again.
        started = _stages.started(turn) if not restored or turn.decisions is not None else None
        deadline = turn.deadline  # fixed for the invocation; None without a time budget
        # Steps that may wait are put under the deadline here, unless `result()` holds a scope at it
        # around the whole invocation (`watched`).
        guard = None if turn.watched else deadline
        done = False
        try:
            if started is not None:
                yield started
            prepare = _stages.reopen(turn) if restored else _stages.prepare(turn)
            if guard is not None and _stages.may_wait(turn):
                prepare = _steps.scoped(turn, prepare, guard)
            await prepare
            if turn.verdicts:  # the input guardrails' verdicts (listeners had them as they came)
                for verdict in turn.verdicts:
                    yield verdict
                turn.verdicts.clear()
            if turn.retrieved is not None:  # what retrieval found (listeners had it)
                yield turn.retrieved
                turn.retrieved = None
            release = turn.release
            if priming and turn.phase is not _REQUEST and turn.phase is not _APPROVAL:
                # Restored past its request: the model accepted that long ago.
                priming = False
                yield cast("Event", READY)
            while True:
                phase = turn.phase
                if turn.boundary is not None and phase in BOUNDARIES:
                    turn.at_boundary = True
                    turn.boundary(turn)
                    turn.at_boundary = False
                if phase is _REQUEST:
                    response = Response(turn, guard, forward)
                    # Held back with the text: a re-asked request carries a rejected answer.
                    if release.pending is None:
                        yield response.issued
                    chunks = response.chunks
                    meter, show, shown = response.meter, response.show, response.shown
                    chunking, gate, crossed = response.chunking, response.gate, response.crossed
                    add = response.accumulator.add
                    append = response.accumulator.text_sink()  # `add` of a TextDelta, without the call
                    try:
                        if priming:  # wait for the model to accept the request, then say so
                            first = await anext(chunks, None)
                            priming = False
                            yield cast("Event", READY)
                            if first is not None:
                                for event in await response.lead(first):
                                    yield event
                        if response.stopped is not None:
                            pass  # (`chunked`: the chain refused the first chunk)
                        elif meter is None and not chunking:  # nothing to meter or check per chunk
                            if show:  # the plain loop: text as it comes
                                async for chunk in chunks:
                                    if chunk.__class__ is TextDelta:
                                        append(chunk.text)
                                        yield chunk
                                    else:
                                        add(chunk)
                                        if chunk.__class__ in shown:
                                            yield chunk  # type: ignore[misc]
                            else:  # text held, or not yielded at all (an awaited call)
                                async for chunk in chunks:
                                    if chunk.__class__ is TextDelta:
                                        append(chunk.text)
                                    else:
                                        add(chunk)
                                        if chunk.__class__ in shown:
                                            yield chunk  # type: ignore[misc]
                        else:
                            async for chunk in chunks:
                                if chunk.__class__ is TextDelta:
                                    text = chunk.text
                                    append(text)
                                    if meter is not None:
                                        meter.spend(chunk)
                                    if show:
                                        yield chunk
                                    elif chunking and (gate is None or text[-1:] in gate) and crossed(text):  # type: ignore[misc]
                                        for event in await response.check():  # `chunked`: a chunk's end
                                            yield event
                                        if response.stopped is not None:
                                            break
                                else:
                                    add(chunk)
                                    if meter is not None:
                                        meter.spend(chunk)
                                    if chunk.__class__ in shown:
                                        yield chunk  # type: ignore[misc]
                    except ModelTimeoutError as exc:
                        if deadline is not None and anyio.current_time() >= deadline:
                            raise _timed_out(turn) from exc
                        raise
                    finally:
                        # A finished async generator (an HTTP adapter's, read to its end) has
                        # nothing to close: the close would be all the work.
                        if not (isinstance(chunks, AsyncGeneratorType) and chunks.ag_frame is None):
                            await response.close()
                    if response.stopped is None:
                        for verdict in turn.verdicts:  # a parallel input chain's (listeners had them)
                            yield verdict
                        turn.verdicts.clear()
                    response.end()
                elif phase is _TOOLS or phase is _APPROVAL:
                    if phase is _APPROVAL and turn.decisions is None:
                        # Calls wait for a human: what the reader was held back from so far (it
                        # passed its checks), then the turn is stored and the stream ends.
                        if release.pending:
                            for event in release.pending:
                                yield event
                            release.pending.clear()
                        approval = turn.asked = await _approve.suspend(turn)
                        if listeners:
                            notify(listeners, approval)
                        done = True
                        yield approval
                        return
                    step = (_steps.tool_round if phase is _TOOLS else _steps.approved_round)(turn, guard)
                    try:
                        async for event in step:
                            yield event
                    except BaseException:
                        await step.aclose()  # the reader stopped during the round (or it raised)
                        raise
                    if priming and turn.phase is not _REQUEST:
                        priming = False
                        yield cast("Event", READY)  # resumed into an answer that needs no request
                elif phase is not _COMMIT:  # RESPONSE, ANSWER
                    made: list[Event] = []
                    try:
                        await (_steps.respond if phase is _RESPONSE else _steps.answer)(turn, guard, made)
                    except Exception:
                        for event in made:  # what the step made before its error, then the error
                            yield event
                        raise
                    for event in made:
                        yield event
                else:  # Phase.COMMIT
                    conversation = turn.conversation
                    completed: Completed[Any] = Completed(
                        self.id, turn.result(turn.value, turn.text, turn.attempt)
                    )
                    if turn.deferred:
                        # The reader sends the answer's end, then asks on: only then is it stored
                        # (closed here, the turn is not: see `DEFER_COMMIT`).
                        yield completed
                    if conversation is not None:
                        # The turn is done: store it, and let the next turn on the conversation start
                        # now, not when this stream's reader gets to its end (shielded).
                        await _finish.store(turn, conversation)
                    if listeners:
                        notify(listeners, completed)
                    done = True
                    if not turn.deferred:
                        yield completed
                    return
        except BaseException as exc:
            # A reader that stops at Completed and closes the stream is not a cancellation.
            if listeners and not done and not isinstance(exc, StopAtBoundary):
                _finish.tell_ended(turn, exc)
            raise
        finally:
            conversation = turn.conversation
            if conversation is not None and conversation.held:
                # Not committed: nothing was written. Release, whichever task closes the stream.
                await _finish.unlock(conversation)
