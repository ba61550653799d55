"""Moderation, raced against the model: the user's message is judged while the model answers.

The first model response of a moderated turn is read through `Moderated`. Its first read opens a task
group (and closes it before returning: nothing is held across the pipeline's `yield`): one task asks
the moderation model, and this task reads the model's chunks into a buffer meanwhile. A pass ends the
race at the next chunk (the chunks read so far, then the rest, flow on as if nothing happened: the
reader waits for no more than the model's own first chunk, or the verdict, whichever comes later). A
flag cancels the read at once, which closes the model's stream, and raises `ModerationError`: none of
the buffered text was released, and the turn stores nothing.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import ModerationError, ModerationFailedError
from ..models._protocol import ResponseAccumulator, aclose_iterator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import TaskGroup

    from .._events import ModelChunk
    from ..models._protocol import ModelRequest
    from ..moderation._declare import Moderate
    from ..moderation._types import Moderation
    from ._turn import Turn

__all__ = ["Moderated", "judge"]


async def judge(turn: Turn, settings: Moderate, text: str, flagged: str) -> None:
    """Moderate `text` (the user's message, or the answer): return if it passed; raise
    `ModerationError` if it was flagged, `ModerationFailedError` if the model failed and the policy
    is `"fail"`."""
    verdict = await _verdict(turn, settings, text)
    if verdict is not None:
        raise _flagged(turn, verdict, flagged, None)


async def _verdict(turn: Turn, settings: Moderate, text: str) -> Moderation | BaseException | None:
    """The flagged verdict (or the failure to stop on), or `None` when the text may go on."""
    model = settings.model
    assert model is not None
    try:
        verdicts = await model.moderate([text])
        if len(verdicts) != 1:
            raise ValueError(f"moderation model {model.name} gave {len(verdicts)} verdicts for one text")
    except Exception as exc:
        if settings.on_error == "allow":
            return None
        return exc
    verdict = verdicts[0]
    return verdict if verdict.flagged else None


def _flagged(
    turn: Turn,
    verdict: Moderation | BaseException,
    flagged: str,
    streamed: tuple[ModelRequest, list[ModelChunk]] | None,
) -> ModerationError:
    """The error for a flag (or a failure under `on_error="fail"`), with the turn so far; a response
    that had started arriving counts in its usage (and against the budget)."""
    response = None
    if streamed is not None and streamed[1]:
        request, chunks = streamed
        accumulator = ResponseAccumulator()
        for chunk in chunks:
            accumulator.add(chunk)
        response = accumulator.build(request, cut=True)
        if turn.account is not None:
            turn.account.record(response.usage)
    partial = turn.partial(response)
    method = turn.spec.qualname
    if isinstance(verdict, BaseException):
        failed = ModerationFailedError(
            f"{method}: the moderation model failed ({type(verdict).__name__}), and on_error is 'fail'",
            categories=(),
            flagged=flagged,
            moderation=None,
            partial=partial,
        )
        failed.__cause__ = verdict
        return failed
    categories = verdict.flagged_categories
    named = ", ".join(categories) if categories else "no category named"
    which = "user's message" if flagged == "input" else "answer"
    return ModerationError(
        f"{method}: the moderation model flagged the {which} ({named})",
        categories=categories,
        flagged=flagged,
        moderation=verdict,
        partial=partial,
    )


class Moderated:
    """The model's first response of a moderated turn (see the module docstring)."""

    __slots__ = ("_chunks", "_held", "_request", "_settings", "_text", "_turn")

    def __init__(
        self,
        chunks: AsyncIterator[ModelChunk],
        turn: Turn,
        settings: Moderate,
        request: ModelRequest,
        text: str,
    ) -> None:
        self._chunks = chunks
        self._turn = turn
        self._settings = settings
        self._request = request
        self._text = text
        self._held: deque[ModelChunk] | None = None

    def __aiter__(self) -> Moderated:
        return self

    async def __anext__(self) -> ModelChunk:
        held = self._held
        if held is None:
            held = self._held = await self._race()
        if held:
            chunk = held.popleft()
            if chunk is None:
                raise StopAsyncIteration
            return chunk
        return await self._chunks.__anext__()

    async def _race(self) -> deque[Any]:
        """Read chunks until the verdict is in; the chunks read (`None` marks the stream's end)."""
        read: list[ModelChunk] = []
        outcome: list[Moderation | BaseException | None] = []
        decided = anyio.Event()
        ended = False
        failure: Exception | None = None
        following = self._chunks.__anext__

        async def verdict(group: TaskGroup) -> None:
            found = await _verdict(self._turn, self._settings, self._text)
            outcome.append(found)
            decided.set()
            if found is not None:
                group.cancel_scope.cancel()  # stop reading the model: its stream is closed below

        async with anyio.create_task_group() as group:
            group.start_soon(verdict, group)
            try:
                while not decided.is_set():
                    try:
                        read.append(await following())
                    except StopAsyncIteration:
                        ended = True
                        break
                if ended:
                    await decided.wait()
            except Exception as exc:  # the model failed: raised after the group, not in a group
                failure = exc
                group.cancel_scope.cancel()
        if outcome and outcome[0] is not None:
            with anyio.CancelScope(shield=True):
                await aclose_iterator(self._chunks)
            raise _flagged(self._turn, outcome[0], "input", (self._request, read))
        if failure is not None:
            raise failure
        held: deque[Any] = deque(read)
        if ended:
            held.append(None)
        return held

    async def aclose(self) -> None:
        await aclose_iterator(self._chunks)
