"""The model's response as the driver (`Invocation.events`) reads it.

`Response` is one request's response: the request sent (checked against the budget), the model's
chunks (under a deadline, for models that do not handle one: `_Deadline`; held until the checks raced
against the first response passed: `_race`; in tool mode, the answer tool's arguments as text), the
meter that spends its output-token allowance, what its release policy shows of it as it streams
(`show`, `shown`, and for `chunked` the checks at each chunk's end: `check`), and what it leaves in
the turn once read (`end`). The driver keeps only the loop over the chunks: each layer of generator
between the model and the reader would cost every token a resume. Also here: the errors of a
response stopped early, at a token limit (`_cut`) or at the invocation's deadline (`_timed_out`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

from .._errors import ModelTimeoutError
from .._events import RefusalDelta, RequestIssued, Reset, ResponseReceived, TextDelta, ThinkingDelta, Usage
from .._watchdog import read_before
from ..models._protocol import ResponseAccumulator, aclose_iterator
from ..output._modes import AnswerChunks
from . import _finish, _loop, _meter, _moderate, _release, _steps
from ._release import Mode
from ._runtime import notify
from ._turn import Phase

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._budget import BudgetLimit
    from .._errors import BudgetExceededError
    from .._events import Event, ModelChunk, ModelResponse
    from ..models._protocol import ModelRequest
    from ._turn import Turn

__all__ = ["Response"]

# The chunks other than text a reader is shown as they come: all of them (a plain stream), usage only
# (text held back by an output guardrail: thinking and refusals are released with the text), none
# (an awaited call, whose reader folds to the result).
_ALL: Final = frozenset({ThinkingDelta, RefusalDelta, Usage})
_USAGE: Final = frozenset({Usage})
_NONE: Final[frozenset[type]] = frozenset()
# Enum members are looked up in Python code (through `EnumType.__getattr__`, on 3.11): read once here.
_HOLD: Final = Mode.HOLD
_CHUNKED: Final = Mode.CHUNKED
_RESPONSE: Final = Phase.RESPONSE
_ANSWER: Final = Phase.ANSWER


class Response:
    """One model request of a turn and its response as it streams (see the module docstring).

    Made at the request step: counts the round, checks the budget (`BudgetExceededError`), tells
    listeners the request is issued and opens the model's stream. The driver reads `chunks` and
    spends each chunk with `meter` (`None`: no token limit); `show` says whether text deltas are
    yielded as they come, `shown` which other chunks are; with `chunking`, a text delta that may end
    a chunk (`gate`, then `crossed`) is checked by `check`, which sets `stopped` when the chain
    refuses it.
    """

    __slots__ = (
        "accumulator",
        "answering",
        "attempt",
        "chunking",
        "chunks",
        "crossed",
        "gate",
        "guard",
        "issued",
        "meter",
        "request",
        "show",
        "shown",
        "stopped",
        "turn",
    )

    def __init__(self, turn: Turn, guard: float | None, forward: bool) -> None:
        self.turn = turn
        self.guard = guard
        turn.round += 1
        self.attempt = turn.attempt
        self.request, allowance = request, allowance = _loop.before_request(turn)
        self.issued = RequestIssued(turn.id, request, turn.round)
        runtime = turn.runtime
        if runtime.listeners:
            notify(runtime.listeners, self.issued)
        accumulator = self.accumulator = turn.streaming = ResponseAccumulator()
        chunks = runtime.model.stream(request)
        if turn.moderating or turn.checking:  # judged while the model answers
            chunks = _race(turn, chunks, allowance, guard)
        self.answering = None
        if turn.answer is not None:  # tool mode: the answer tool's arguments are the text
            chunks = self.answering = AnswerChunks(chunks)
        if guard is not None and not runtime.handles_deadline:
            chunks = _Deadline(chunks, guard)
        self.chunks = chunks
        self.meter = None
        if allowance is not None:
            self.meter = _meter.Meter(allowance[0], lambda: _cut(turn, accumulator, request, allowance))
        mode = turn.release.mode
        chunking = self.chunking = mode is _CHUNKED
        held = chunking or mode is _HOLD
        self.show = forward and not held
        self.shown = _NONE if not forward else _USAGE if held else _ALL
        self.stopped: _finish.Outcome | None = None
        self.gate = self.crossed = None
        if chunking:
            chain = turn.plan.output_chain
            released = turn.release.released
            assert chain is not None
            assert released is not None
            # By sentences, most tokens end in none of the characters that may end one.
            self.gate = _release.MAY_END if chain.chunk is None else None
            self.crossed = released.crossed

    def ends(self, text: str) -> bool:
        """Whether a text delta ends a chunk to `check` (`chunked`; the driver inlines this)."""
        gate, crossed = self.gate, self.crossed
        return crossed is not None and (gate is None or text[-1:] in gate) and crossed(text)

    async def lead(self, chunk: ModelChunk) -> list[Event]:
        """Read one chunk outside the driver's loop (the first, after priming waited for it): the
        events to yield for it."""
        self.accumulator.add(chunk)
        if self.meter is not None:
            self.meter.spend(chunk)
        if chunk.__class__ is not TextDelta:
            return [chunk] if chunk.__class__ in self.shown else []  # type: ignore[list-item]
        if self.show:
            return [chunk]
        return await self.check() if self.ends(chunk.text) else []

    async def check(self) -> list[Event]:
        """`chunked`, at a chunk's end: check the answer so far; the events to yield (the chain's
        verdicts, then, once it passed, what was held with the text and the chunk). Sets `stopped`
        when the chain refuses it."""
        turn = self.turn
        chain = turn.plan.output_chain
        release = turn.release
        released, pending = release.released, release.pending
        assert chain is not None
        assert released is not None
        assert pending is not None
        checking = _release.check(turn, chain, self.accumulator, released, self.attempt)
        if self.guard is not None:
            checking = _steps.scoped(turn, checking, self.guard)
        outcome, out = await checking
        events: list[Event] = [*turn.verdicts]
        turn.verdicts.clear()
        if outcome.failures:
            self.stopped = outcome
            return events
        events += pending
        pending.clear()
        listeners = turn.runtime.listeners
        if listeners:
            for event in out:
                if event.__class__ is Reset:
                    notify(listeners, event)
        events += out
        return events

    async def close(self) -> None:
        """Close the model's stream (however the reading ended): shielded, so its cleanup finishes
        under cancellation too."""
        with anyio.CancelScope(shield=True):
            await aclose_iterator(self.chunks)

    def end(self) -> None:
        """Leave the response read in the turn, and the turn at its next step: the response step, or
        (a chunk refused part way under `chunked`) the answer step with the refusal."""
        turn = self.turn
        turn.streaming = None
        accumulator = self.accumulator
        if self.stopped is not None:
            # Refused part way: the response ends where it was cut, and is not shown.
            response = accumulator.build(self.request, cut=True)
            _loop.record(turn, response)
            listeners = turn.runtime.listeners
            if listeners:
                notify(listeners, ResponseReceived(turn.id, response, turn.round))
            turn.stopped = self.stopped
            turn.phase = _ANSWER
            return
        turn.received = accumulator.build(self.request)
        turn.answered = self.answering is not None and self.answering.answered
        if self.chunking:
            released = turn.release.released
            assert released is not None
            # what the reader has not been released yet, for the answer's check
            turn.unreleased = accumulator.text_from(released.text_at)[0]
            turn.unthought = accumulator.thinking_from(released.thought_at)[0]
        turn.phase = _RESPONSE


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


def _race(
    turn: Turn,
    chunks: AsyncIterator[ModelChunk],
    allowance: tuple[int, BudgetLimit] | None,
    guard: float | None,
) -> AsyncIterator[ModelChunk]:
    """The first response, held until the checks raced against it passed: moderation and a parallel
    input chain (each once per turn)."""
    most = allowance[0] if allowance is not None else None
    user = turn.user
    assert user is not None
    if turn.checking:
        chain = turn.plan.input_chain
        assert chain is not None
        chunks = _moderate.Raced(
            chunks, turn, _moderate.InputJudge(turn, chain), allowance=most, deadline=guard
        )
        turn.checking = False
    if turn.moderating:
        moderation = turn.plan.moderation
        assert moderation is not None
        judge = _moderate.ModerationJudge(turn, moderation, user.text)
        chunks = _moderate.Raced(chunks, turn, judge, allowance=most, deadline=guard)
        turn.moderating = False
    return chunks


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
