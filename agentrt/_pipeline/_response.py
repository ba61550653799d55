"""The model's response as the driver (`Invocation.events`) reads it: under a deadline, for models
that do not handle one (`_Deadline`); held until the checks raced against the first response passed
(`_race`); and the errors of a response stopped early, at a token limit (`_cut`) or at the
invocation's deadline (`_timed_out`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import ModelTimeoutError
from .._watchdog import read_before
from ..models._protocol import aclose_iterator
from . import _moderate

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._budget import BudgetLimit
    from .._errors import BudgetExceededError
    from .._events import ModelChunk, ModelResponse
    from ..models._protocol import ModelRequest, ResponseAccumulator
    from ._turn import Turn


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
