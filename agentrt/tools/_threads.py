"""The worker-thread limit of one service's sync tools (`ThreadLimiter`), shared by all its invocations."""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ThreadLimiter"]


class ThreadLimiter:
    """The worker-thread limit of one service's sync tools, shared by all its invocations.

    Two bounds, because a worker thread cannot be killed:

    - a count of the tool bodies that run, across every event loop and backend, abandoned ones
      included (a call cut by a timeout, a deadline or a cancellation leaves its thread running; it
      keeps its slot until the body returns). A started thread waits for a slot in the thread, in
      order, never on the loop; a slot that frees is handed to the first waiter;
    - one `CapacityLimiter` per event loop bounds the worker threads that loop starts. It is kept
      per loop, weakly, because a limiter belongs to its loop: several loops in several threads, or
      one `trio.run` after another, each get their own.

    A call abandoned while its thread still waits for a slot wakes that thread, which gives up
    without running the body.
    """

    __slots__ = ("_free", "_limiters", "_lock", "_waiting", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = total
        self._lock = threading.Lock()
        self._waiting: deque[_Waiter] = deque()  # threads waiting for a slot, first come first
        self._limiters: weakref.WeakKeyDictionary[object, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()

    def _loop_limiter(self) -> anyio.CapacityLimiter:
        token = anyio.lowlevel.current_token()
        loop = getattr(token, "native_token", token)  # anyio >= 4.11 wraps the loop's own token
        limiter = self._limiters.get(loop)
        if limiter is None:
            limiter = self._limiters[loop] = anyio.CapacityLimiter(self.total)
        return limiter

    async def run(self, function: Callable[[], Any]) -> Any:
        """Run `function` in a worker thread within the limit (anyio copies the context into it).

        Cancellation abandons the thread, as `anyio.to_thread.run_sync(abandon_on_cancel=True)`.
        """
        waiter = _Waiter()

        def body() -> Any:
            if not self._acquire(waiter):
                return None
            try:
                if waiter.abandoned:
                    return None
                return function()
            finally:
                self._release()

        try:
            return await anyio.to_thread.run_sync(body, abandon_on_cancel=True, limiter=self._loop_limiter())
        finally:
            self._abandon(waiter)

    def _acquire(self, waiter: _Waiter) -> bool:
        """In the worker thread: take a slot, waiting for one in order; `False` when the call was
        abandoned first (then no slot is taken)."""
        with self._lock:
            if waiter.abandoned:
                return False
            if self._free and not self._waiting:
                self._free -= 1
                return True
            wake = waiter.wake = threading.Event()
            self._waiting.append(waiter)
        wake.wait()  # set by `_release` (granted) or `_abandon`
        return waiter.granted  # else abandoned: `_abandon` took it out of the queue

    def _release(self) -> None:
        """A body returned: hand its slot to the first waiter, or free it."""
        with self._lock:
            if self._waiting:
                waiter = self._waiting.popleft()
                waiter.granted = True
                assert waiter.wake is not None
                waiter.wake.set()
            else:
                self._free += 1
                assert self._free <= self.total

    def _abandon(self, waiter: _Waiter) -> None:
        """The call returned or was cancelled: a thread still waiting for a slot gives up."""
        with self._lock:
            waiter.abandoned = True
            if waiter.wake is not None and not waiter.granted:
                self._waiting.remove(waiter)
                waiter.wake.set()


class _Waiter:
    """One call's claim on a `ThreadLimiter` slot."""

    __slots__ = ("abandoned", "granted", "wake")

    def __init__(self) -> None:
        self.abandoned = False
        self.granted = False
        self.wake: threading.Event | None = None  # made when the thread has to wait
