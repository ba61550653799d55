"""Awaiting a method: `Invocation.result()`, the fold of the invocation's events to its `Result`,
with a time budget under one cancel scope at its deadline (see `Invocation.result`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio

from .._events import CancelledEvent, Completed, FailedEvent
from .._watchdog import WATCHED
from ._response import _timed_out
from ._runtime import notify

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable

    from .._events import ApprovalRequested, Event, Result
    from ._turn import Turn


async def result(turn: Turn, events: Callable[..., AsyncGenerator[Event, None]]) -> Result[Any]:
    """Run `turn` to the end and return its result: the fold of `events(forward=False)` (the
    invocation's `events`, whose `id` is the turn's)."""
    if turn.resume_from is not None:
        turn.resume_clock()
    deadline = turn.deadline
    if deadline is None:
        return await _fold(turn, events(forward=False))
    # Watched, the pipeline reports no cancellation itself: this scope, or one outside it, may
    # have caused it, and only here is it known which.
    turn.watched = True
    listeners = turn.runtime.listeners
    watching = WATCHED.set(deadline)  # adapters need no scope or watchdog of their own
    try:
        with anyio.CancelScope(deadline=deadline) as scope:
            return await _fold(turn, events(forward=False))
    except anyio.get_cancelled_exc_class():
        if listeners:
            notify(listeners, CancelledEvent(turn.id))  # someone else's cancellation
        raise
    finally:
        WATCHED.reset(watching)
    assert scope.cancelled_caught
    error = _timed_out(turn)
    if listeners:
        notify(listeners, FailedEvent(turn.id, error))
    raise error


async def _fold(turn: Turn, events: AsyncGenerator[Event, None]) -> Result[Any]:
    result: Result[Any] | None = None
    try:
        async for event in events:
            if type(event) is Completed:
                result = event.result
    finally:
        await events.aclose()
    if result is None:  # stopped for approval: its event was the last
        approval = turn.asked
        assert approval is not None, "an invocation ends with Completed, ApprovalRequested or raises"
        return approval_result(approval)
    return result


def approval_result(approval: ApprovalRequested) -> Result[Any]:
    """The `Result` of a turn that stopped for approval: what it had, with `approval` set."""
    assert approval.partial is not None
    return replace(approval.partial, approval=approval)
