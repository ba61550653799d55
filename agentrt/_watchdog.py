"""Deadlines for streams: one timer per stream, not a cancel scope per read.

A stream's reads happen in whichever task reads it, between `yield`s, so a deadline cannot be one
cancel scope held around the stream; a scope per read costs 10 to 20 µs (anyio's on asyncio, trio's
own), more than the rest of a streamed token. `Watchdog` arms one timer at the deadline instead: on
asyncio `loop.call_at`, on trio an entry in a heap that one system task per run sleeps on. When it
fires it calls `interrupt` (an HTTP response's: shut its socket down, so that the pending read ends
at once with an error or the end of the body) and sets `fired`, which the reader checks after each
read and maps to its timeout error. Nothing waits on the reader's task, so any task may read, and
any task (or the finalizer of an abandoned stream) may `close` it: closing disarms the timer, and
after it `interrupt` is never called.

A stream with nothing to interrupt (no socket: a mock transport, a model that is not HTTP) is read
with `read_before`, a cancel scope per read: correct everywhere, and what it always cost.

This is the one module that knows the async backends apart.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio

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
        self._cancel: Callable[[], Any] | None
        trio = sys.modules.get("trio")
        if trio is not None and trio.lowlevel.in_trio_run():
            self._cancel = _trio_timers(trio).add(self)
        else:
            self._cancel = asyncio.get_running_loop().call_at(deadline, self._fire).cancel

    def _fire(self) -> None:
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


class _TrioTimers:
    """The watchdogs of one trio run, fired by one system task that sleeps until the earliest
    deadline (trio has no `call_at`; a task per stream cost more than the rest of a call).

    The task sleeps in a cancel scope whose deadline follows the heap's top; closed watchdogs stay in
    the heap until they reach the top (then they are dropped, and the scope's deadline moves on, so
    that a virtual clock never jumps to a dead deadline) or until they are most of it.
    """

    __slots__ = ("_heap", "_order", "_scope", "_stale")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._order = 0  # ties broken by arming order (watchdogs do not compare)
        self._scope: Any = None
        self._stale = 0

    def add(self, watchdog: Watchdog) -> Callable[[], None]:
        """Arm `watchdog`; returns what disarms it."""
        self._order += 1
        heapq.heappush(self._heap, (watchdog.deadline, self._order, watchdog))
        scope = self._scope
        if scope is not None and watchdog.deadline < scope.deadline:
            scope.deadline = watchdog.deadline
        return self._forget

    def _forget(self) -> None:
        heap = self._heap
        while heap and heap[0][2].closed:
            heapq.heappop(heap)
        self._stale += 1
        if self._stale > 64 and 2 * self._stale > len(heap):
            heap[:] = [entry for entry in heap if not entry[2].closed]
            heapq.heapify(heap)
            self._stale = 0
        if self._scope is not None:
            self._scope.deadline = heap[0][0] if heap else math.inf

    async def run(self) -> None:
        import trio

        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                heapq.heappop(heap)[2]._fire()


_TRIO_TIMERS: Any = None  # the RunVar holding each trio run's _TrioTimers, made on first use


def _trio_timers(trio: Any) -> _TrioTimers:
    global _TRIO_TIMERS
    if _TRIO_TIMERS is None:
        _TRIO_TIMERS = trio.lowlevel.RunVar("agentrt_watchdogs")
    timers: _TrioTimers | None = _TRIO_TIMERS.get(None)
    if timers is None:
        timers = _TrioTimers()
        _TRIO_TIMERS.set(timers)
        trio.lowlevel.spawn_system_task(timers.run, name="agentrt watchdogs")
    return timers


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
