"""Deadlines for streams: one timer per stream, not a cancel scope per read.

A stream's reads happen in whichever task reads it, between `yield`s, so a deadline cannot be one
cancel scope held around the stream; a scope per read costs 10 to 20 µs (anyio's on asyncio, trio's
own), more than the rest of a streamed token. `Watchdog` arms one timer at the deadline instead
(`_backend.call_at`: on asyncio `loop.call_at`, on trio an entry in a heap that one system task per
run sleeps on). When it fires it calls `interrupt` (an HTTP response's: shut its socket down, so
that the pending read ends at once with an error or the end of the body) and sets `fired`, which the
reader checks after each read and maps to its timeout error. Nothing waits on the reader's task, so
any task may read, and any task (or the finalizer of an abandoned stream) may `close` it: closing
disarms the timer, and after it `interrupt` is never called.

A stream with nothing to interrupt (no socket: a mock transport, a model that is not HTTP) is read
with `read_before`, a cancel scope per read: correct everywhere, and what it always cost.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio

from ._backend import call_at

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

__all__ = ["NEVER", "WATCHED", "Watchdog", "read_before"]

WATCHED: ContextVar[float | None] = ContextVar("agentrt_watched_deadline", default=None)
"""The deadline that an enclosing cancel scope of the caller's watches, in this context: an awaited
invocation (`Invocation.result`) holds one scope at its deadline around everything it runs, so an
adapter whose request carries that same deadline needs neither a scope of its own around opening it
nor a watchdog on its body. Compared by value: a request with another deadline is watched as usual."""

logger = logging.getLogger("agentrt")

_T = TypeVar("_T")


class Watchdog:
    """Calls `interrupt` once at `deadline` (on the backend's clock) unless closed first.

    `fired` tells a reader that the deadline passed while the watchdog was armed: what it read since
    may be cut short, and it raises its timeout error. `close` is idempotent, synchronous and safe
    from any task; a watchdog closed before it fired never fires.
    """

    __slots__ = ("_cancel", "_interrupt", "closed", "deadline", "fired")

    def __init__(self, deadline: float, interrupt: Callable[[], None]) -> None:
        self._interrupt = interrupt
        self.deadline = deadline
        self.fired = False
        self.closed = False
        self._cancel: Callable[[], Any] | None = call_at(self)

    def fire(self) -> None:
        """The timer's: at the deadline, unless closed first."""
        if self.closed:  # closed after its timer came due, before it ran
            return
        self.fired = True
        self.closed = True
        self._cancel = None
        try:
            self._interrupt()
        except Exception:  # never let a timer's failure escape into the event loop
            logger.exception("interrupting a stream at its deadline failed")

    def close(self) -> None:
        """Disarm: `interrupt` will not be called. Idempotent; any task may call it."""
        self.closed = True
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()


class _Never:
    """The watchdog of a stream without a deadline: never fires."""

    __slots__ = ()
    fired: Final = False

    def close(self) -> None:
        pass


NEVER: Final = _Never()


async def read_before(chunks: AsyncIterator[_T], deadline: float, default: _T) -> tuple[_T, bool]:
    """The next item of `chunks` (`default` at its end), read under a cancel scope at `deadline`;
    and whether the deadline cut the read (the item is then `default`).

    The fallback for streams with nothing a `Watchdog` could interrupt.
    """
    with anyio.CancelScope(deadline=deadline) as scope:
        return await anext(chunks, default), False
    assert scope.cancelled_caught
    return default, True
