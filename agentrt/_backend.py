"""The one module that knows the async backends apart: asyncio and trio, the two that anyio runs on.

Everything else in agentrt is written against anyio, and ruff refuses `import asyncio` and `import
trio` elsewhere in the package (pyproject.toml). What is here is what anyio does not offer, or offers
at a cost the hot path cannot pay:

- `now`: the backend's clock without anyio's backend lookup (read per streamed chunk);
- `home` and `spawn`: reach the running event loop from another thread, and start a task nobody
  waits for (the close of a stream collected unclosed; the heartbeat of a shared store's lease);
- `call_at`: a timer at a deadline, without a task or a cancel scope (a stream's watchdog);
- `current_task`: the running task, compared by identity (who holds a conversation);
- `waiters`: one-shot wakes for a task that waits, cheaper than `anyio.Event` (a run log's reader
  waits for each streamed frame);
- `complete`: run an operation to its end whatever cancels its caller, native asyncio
  cancellation included.

trio is never imported here: it is looked up in `sys.modules`, where it is if a trio run is going on.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import sys
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol, TypeAlias, TypeVar

import anyio

__all__ = [
    "Schedule",
    "Timer",
    "Waiter",
    "call_at",
    "complete",
    "current_task",
    "home",
    "now",
    "spawn",
    "waiters",
]

_T = TypeVar("_T")

Schedule: TypeAlias = Callable[[Callable[[], object]], object]
"""Runs a callback in an event loop, from any thread (see `home`)."""


def _trio() -> Any:
    """The trio module if a trio run is going on in this thread, else `None`."""
    trio = sys.modules.get("trio")
    if trio is not None and getattr(trio.lowlevel, "in_trio_run", bool)():
        return trio
    return None


def now() -> float:
    """`anyio.current_time()` without its backend lookup: the asyncio loop's own clock, or trio's
    (what anyio reads on each)."""
    trio = sys.modules.get("trio")
    if trio is not None and getattr(trio.lowlevel, "in_trio_run", bool)():
        return float(trio.current_time())
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return anyio.current_time()


def home() -> Schedule | None:
    """A thread-safe way to run a callback in the event loop running in this thread, if any: the
    loop's `call_soon_threadsafe`, or the trio run's `TrioToken.run_sync_soon`. It raises
    `RuntimeError` once the loop is closed (trio's `RunFinishedError` is one).

    Two calls in one loop return equal callables (bound methods of one object), so a `home` also
    names its loop, as a dict key."""
    trio = _trio()
    if trio is not None:
        run_sync_soon: Schedule = trio.lowlevel.current_trio_token().run_sync_soon
        return run_sync_soon
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        return None


# Tasks started by `spawn` on asyncio, which keeps only weak references to tasks.
_spawned: set[asyncio.Task[Any]] = set()


def spawn(function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
    """Start `function(*args)` in a task of the running event loop that nobody waits for (on trio a
    system task: it must not raise). Call it in the loop's thread, e.g. from a `home` callback."""
    trio = _trio()
    if trio is not None:
        trio.lowlevel.spawn_system_task(function, *args)
        return
    task = asyncio.get_running_loop().create_task(function(*args))
    _spawned.add(task)
    task.add_done_callback(_spawned.discard)


class Waiter(Protocol):
    """A one-shot wake of one waiting task: `await waiter` until `set_result(None)`; `done()` once set
    (or, on asyncio, once its waiter was cancelled: then it is not set again)."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def __await__(self) -> Generator[Any, None, Any]: ...


class _TrioWaiter:
    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def done(self) -> bool:
        return bool(self._event.is_set())

    def set_result(self, result: None, /) -> None:
        self._event.set()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._event.wait().__await__()  # type: ignore[no-any-return]


def waiters() -> Callable[[], Waiter]:
    """What makes `Waiter`s in the running event loop: its `create_future` on asyncio (a bare future:
    a third of what `anyio.Event` costs a wait, its backend lookup and two wrapping coroutines), a
    trio event on trio. One waiter per waiting task: a task cancelled while it waits cancels its
    future, which must then be no other task's."""
    trio = _trio()
    if trio is not None:
        event = trio.Event
        return lambda: _TrioWaiter(event())
    return asyncio.get_running_loop().create_future


class Timer(Protocol):
    """What `call_at` fires: `fire()` once at `deadline`, unless `closed` by then."""

    @property
    def deadline(self) -> float: ...

    @property
    def closed(self) -> bool: ...

    def fire(self) -> None: ...


def call_at(timer: Timer) -> Callable[[], object]:
    """Arm `timer` in the running event loop, at its `deadline` on the backend's clock; returns
    what disarms it. On asyncio `loop.call_at`; on trio an entry in a heap that one system task per
    run sleeps on (trio has no `call_at`; a task per timer cost more than the rest of a model call)."""
    trio = _trio()
    if trio is not None:
        return _trio_timers(trio).add(timer)
    return asyncio.get_running_loop().call_at(timer.deadline, timer.fire).cancel


class _TrioTimers:
    """The timers of one trio run, fired by one system task that sleeps until the earliest deadline.

    The task sleeps in a cancel scope whose deadline follows the heap's top; closed timers stay in
    the heap until they reach the top (then they are dropped, and the scope's deadline moves on, so
    that a virtual clock never jumps to a dead deadline) or until they are most of it.
    """

    __slots__ = ("_heap", "_order", "_scope", "_stale")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = 0  # ties broken by arming order (timers do not compare)
        self._scope: Any = None
        self._stale = 0

    def add(self, timer: Timer) -> Callable[[], None]:
        """Arm `timer`; returns what disarms it (once `timer.closed` is true)."""
        self._order += 1
        heapq.heappush(self._heap, (timer.deadline, self._order, timer))
        scope = self._scope
        if scope is not None and timer.deadline < scope.deadline:
            scope.deadline = timer.deadline
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

    async def run(self, trio: Any) -> None:
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                heapq.heappop(heap)[2].fire()


_TRIO_TIMERS: Any = None  # the RunVar holding each trio run's _TrioTimers, made on first use


def _trio_timers(trio: Any) -> _TrioTimers:
    global _TRIO_TIMERS
    if _TRIO_TIMERS is None:
        _TRIO_TIMERS = trio.lowlevel.RunVar("agentrt_timers")
    timers: _TrioTimers | None = _TRIO_TIMERS.get(None)
    if timers is None:
        timers = _TrioTimers()
        _TRIO_TIMERS.set(timers)
        trio.lowlevel.spawn_system_task(timers.run, trio, name="agentrt timers")
    return timers


def _asyncio_task() -> asyncio.Task[Any] | None:
    """The running asyncio task; `None` under trio or outside of a task."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def current_task() -> object | None:
    """The running task (asyncio's or trio's), compared by identity only; `None` outside of one."""
    task = _asyncio_task()
    if task is not None:
        return task
    trio = sys.modules.get("trio")  # anyio's other backend: imported if it runs
    if trio is None:
        return None
    try:
        current: object = trio.lowlevel.current_task()
    except RuntimeError:
        return None
    return current


async def complete(operation: Coroutine[Any, Any, _T]) -> _T:
    """Run `operation` to its end even if the caller is cancelled meanwhile; a cancellation that
    arrived is raised after it.

    A store's write cut off mid-flight could have happened or not, and a lock taken in flight could
    be held without the turn knowing. anyio's shield defers cancel scopes (and trio's cancellation);
    a native asyncio cancellation (`task.cancel()`, `asyncio.timeout`, `wait_for`) goes through it,
    so on asyncio the operation runs in a task of its own, which the caller waits out.
    """
    with anyio.CancelScope(shield=True):
        if _asyncio_task() is None:
            return await operation
        task = asyncio.ensure_future(operation)
        cancelled: BaseException | None = None
        while True:
            try:
                result = await asyncio.shield(task)
            except asyncio.CancelledError as exc:
                if not task.done():
                    cancelled = exc  # the caller's: wait the operation out, then raise it
                    continue
                if cancelled is None:
                    raise
                raise cancelled from None
            except BaseException as exc:
                if cancelled is None:
                    raise
                raise cancelled from exc
            if cancelled is not None:
                raise cancelled
            return result
    raise AssertionError("unreachable: a shielded scope with no deadline is never cancelled")
