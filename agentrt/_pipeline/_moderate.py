"""Checks raced against the model: the user's message is judged while the model answers.

Moderation (`ModerationJudge`) and input guardrails declared `parallel` (`InputJudge`) judge the
user's message during the first model response, which is read through `Raced`. Its first read opens a
task group (and closes it before returning: nothing is held across the pipeline's `yield`): one task
asks the judge, and this task reads the model's chunks into a buffer meanwhile. A pass ends the race
at the next chunk (the chunks read so far, then the rest, flow on as if nothing happened: the reader
waits for no more than the model's own first chunk, or the verdict, whichever comes later). A refusal
cancels the read at once, which closes the model's stream, and raises the judge's error
(`ModerationError`, `InputGuardrailError`): none of the buffered text was released, and the turn
stores nothing.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._errors import InputGuardrailError, ModelTimeoutError, ModerationError, ModerationFailedError
from ..guardrails._run import run_input
from ..models._protocol import aclose_iterator
from ..moderation._types import Moderation
from . import _meter
from ._runtime import notify

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import TaskGroup

    from .._events import GuardrailVerdict, ModelChunk
    from ..guardrails._declare import Guardrail
    from ..moderation._declare import Moderate
    from ._turn import Turn

__all__ = ["InputJudge", "Judge", "ModerationJudge", "Raced", "judge"]


class Judge(Protocol):
    """What `Raced` races the model against."""

    async def verdict(self) -> object | None:
        """`None` when the message may go on; else what refuses it (given to `error`)."""
        ...

    def error(self, found: object) -> BaseException:
        """The error to raise for what `verdict` found (or raised), once the race is over."""
        ...


class ModerationJudge:
    """The moderation model on the user's message (`Moderate`)."""

    __slots__ = ("_settings", "_text", "_turn")

    def __init__(self, turn: Turn, settings: Moderate, text: str) -> None:
        self._turn, self._settings, self._text = turn, settings, text

    async def verdict(self) -> object | None:
        return await _verdict(self._turn, self._settings, self._text)

    def error(self, found: object) -> BaseException:
        if not isinstance(found, Exception | Moderation):
            assert isinstance(found, BaseException)
            return found  # a BaseException of the moderation model's, bare
        return _flagged(self._turn, found, "input")


class InputJudge:
    """Input guardrails declared `parallel`: the chain over the user's message, which the model
    already has, so a guardrail may pass or refuse it but not rewrite it."""

    __slots__ = ("_chain", "_turn")

    def __init__(self, turn: Turn, chain: tuple[Guardrail, ...]) -> None:
        self._turn, self._chain = turn, chain

    async def verdict(self) -> object | None:
        turn = self._turn
        user = turn.user
        assert user is not None
        listeners = turn.runtime.listeners

        def report(verdict: GuardrailVerdict) -> None:
            turn.verdicts.append(verdict)
            if listeners:
                notify(listeners, verdict)

        try:
            checked = await run_input(
                self._chain,
                user,
                invocation_id=turn.id,
                method=turn.spec.qualname,
                memory_id=turn.memory_id,
                history=turn.history,
                report=report,
            )
        except InputGuardrailError as error:
            return error
        if checked != user:
            return TypeError(
                f"{turn.spec.qualname}: a parallel input guardrail rewrote the user's message, which "
                "the model already has; rewrite in a chain that is not parallel"
            )
        return None

    def error(self, found: object) -> BaseException:
        assert isinstance(found, BaseException)
        return found


async def judge(turn: Turn, settings: Moderate, text: str, flagged: str) -> None:
    """Moderate `text` (the user's message, or the answer): return if it passed; raise
    `ModerationError` if it was flagged, `ModerationFailedError` if the model failed and the policy
    is `"fail"`."""
    verdict = await _verdict(turn, settings, text)
    if verdict is not None:
        raise _flagged(turn, verdict, flagged)


async def _verdict(turn: Turn, settings: Moderate, text: str) -> Moderation | BaseException | None:
    """The flagged verdict (or the failure to stop on), or `None` when the text may go on."""
    model = settings.model
    assert model is not None
    try:
        verdicts = await model.moderate([text])
        if not isinstance(verdicts, list | tuple) or len(verdicts) != 1:
            raise ValueError(f"moderation model {model.name} gave {verdicts!r} for one text")
        verdict = verdicts[0]
        if not isinstance(verdict, Moderation):
            raise TypeError(
                f"moderation model {model.name} gave {verdict!r}, not an agentrt.moderation.Moderation"
            )
    except Exception as exc:
        if settings.on_error == "allow":
            return None
        return exc
    return verdict if verdict.flagged else None


def _flagged(turn: Turn, verdict: Moderation | BaseException, flagged: str) -> ModerationError:
    """The error for a flag (or a failure under `on_error="fail"`), with the turn so far; a response
    that had started arriving (`turn.streaming`) counts in its usage, and against the budget."""
    response = None
    accumulator = turn.streaming
    request = turn.sent
    if accumulator is not None and accumulator.started and request is not None:
        response = accumulator.build(request, cut=True)
        if turn.account is not None:
            turn.account.record(response.usage)
        turn.streaming = None
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


class Raced:
    """The model's first response of a turn judged while it streams (see the module docstring).

    While the verdict is pending the response is read under the turn's budget: the token allowance
    (`allowance`, output tokens) stops the reading once spent (the pipeline's own meter then cuts the
    response as the chunks are released), and the deadline (`deadline`, for readers no scope of the
    caller's watches) cuts the wait. Chunks read before the race ends in an error count in the
    turn's response so far (`turn.streaming`): what was paid for is in the partial result.
    """

    __slots__ = ("_allowance", "_chunks", "_deadline", "_held", "_judge", "_turn")

    def __init__(
        self,
        chunks: AsyncIterator[ModelChunk],
        turn: Turn,
        judge: Judge,
        *,
        allowance: int | None = None,
        deadline: float | None = None,
    ) -> None:
        self._chunks = chunks
        self._turn = turn
        self._judge = judge
        self._allowance = allowance
        self._deadline = deadline
        self._held: deque[ModelChunk] | None = None

    def __aiter__(self) -> Raced:
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
        outcome: list[object | None] = []
        decided = anyio.Event()
        ended = False
        failure: BaseException | None = None
        following = self._chunks.__anext__
        allowance = self._allowance
        meter = _meter.Meter(allowance) if allowance is not None else None

        async def verdict(group: TaskGroup) -> None:
            try:
                found = await self._judge.verdict()
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:
                found = exc
            outcome.append(found)
            decided.set()
            if found is not None:
                group.cancel_scope.cancel()  # stop reading the model: its stream is closed below

        handed = False
        try:
            # A scope of its own only for a deadline no caller's scope watches (a scope costs more
            # than the rest of a step).
            scope = anyio.CancelScope(deadline=self._deadline) if self._deadline is not None else None
            with scope if scope is not None else contextlib.nullcontext():
                async with anyio.create_task_group() as group:
                    group.start_soon(verdict, group)
                    try:
                        while not decided.is_set():
                            try:
                                chunk = await following()
                            except StopAsyncIteration:
                                ended = True
                                break
                            read.append(chunk)
                            if meter is not None and meter.over(chunk):
                                break  # the allowance is spent: read no more, the meter cuts it
                        if not decided.is_set():
                            await decided.wait()
                    except Exception as exc:  # the model failed: raised after the group, not in it
                        failure = exc
                        group.cancel_scope.cancel()
            found = outcome[0] if outcome else None
            timed_out = scope is not None and scope.cancelled_caught
            handed = found is None and failure is None and not timed_out
        finally:
            if not handed:
                # The race ends in an error (a flag, a failure, a deadline, a cancellation from
                # outside): what was read counts in the response so far, never shown.
                accumulator = self._turn.streaming
                if accumulator is not None:
                    for chunk in read:
                        accumulator.add(chunk)
        if found is not None:
            error = self._judge.error(found)
            if isinstance(error, Exception):  # (a bare BaseException goes at once)
                with anyio.CancelScope(shield=True):
                    await aclose_iterator(self._chunks)
            raise error
        if failure is not None:
            raise failure
        if timed_out:
            raise ModelTimeoutError("the deadline passed while moderation was pending", mid_stream=True)
        held: deque[Any] = deque(read)
        if ended:
            held.append(None)
        return held

    async def aclose(self) -> None:
        await aclose_iterator(self._chunks)
