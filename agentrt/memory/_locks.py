"""The conversation locks within a process: per store and thread, a FIFO queue per conversation that
any task may release (`_acquire`, `_release`); the turn that holds one is a `_Holder`. A shared store
adds its own lease across processes (see `_memory.Memory`).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from ._memory import Memory
    from ._store import ChatMemoryStore


class _Holder:
    """One turn's claim on a conversation's lock: the task that may still close it, if any, and the
    method that opened it (for the error)."""

    __slots__ = ("task", "where")

    def __init__(self, task: object, where: str) -> None:
        self.task: object | None = task
        """The task that opened the turn or last started reading its stream; `None` once the turn
        is closed from a stream's finalizer (another task then releases the lock)."""
        self.where = where


class _Queue:
    """Who holds one conversation's lock and who waits for it, in order."""

    __slots__ = ("holder", "waiters")

    def __init__(self, holder: _Holder) -> None:
        self.holder = holder
        self.waiters: deque[tuple[anyio.Event, _Holder]] = deque()


class _Locks:
    """The conversation locks of one store, per thread (an event loop runs in one thread, and its
    events must be set from it)."""

    __slots__ = ("_local",)

    def __init__(self) -> None:
        self._local = threading.local()

    def table(self) -> dict[str, _Queue]:
        try:
            table: dict[str, _Queue] = self._local.table
        except AttributeError:
            table = self._local.table = {}
        return table


_LOCKS: weakref.WeakKeyDictionary[Any, _Locks] = weakref.WeakKeyDictionary()
# Stores that cannot be weakly referenced, by id: the store (so that its id is not reused), its
# locks, and how many `Memory` objects use it. The last one to be collected removes the entry.
_STRONG_LOCKS: dict[int, tuple[Any, _Locks, int]] = {}
_STRONG_GUARD = threading.Lock()


def _locks_for(store: ChatMemoryStore, user: Memory) -> _Locks:
    """The locks of `store`, shared by every service that uses it (two services sharing a namespace
    on one store lock the same conversations); kept as long as a `Memory` (`user`) uses it."""
    try:
        locks = _LOCKS.get(store)
        if locks is None:
            locks = _LOCKS[store] = _Locks()
        return locks
    except TypeError:
        pass
    key = id(store)
    with _STRONG_GUARD:
        entry = _STRONG_LOCKS.get(key)
        locks = _Locks() if entry is None else entry[1]
        _STRONG_LOCKS[key] = (store, locks, 1 if entry is None else entry[2] + 1)
    weakref.finalize(user, _forget_locks, key)
    return locks


def _forget_locks(key: int) -> None:
    """A `Memory` on a store that cannot be weakly referenced was collected."""
    with _STRONG_GUARD:
        store, locks, users = _STRONG_LOCKS[key]
        if users > 1:
            _STRONG_LOCKS[key] = (store, locks, users - 1)
        else:
            del _STRONG_LOCKS[key]


async def _acquire(table: dict[str, _Queue], key: str, holder: _Holder) -> None:
    """Wait for the lock of `key`; a waiter that is cancelled after it was handed the lock passes it on."""
    queue = table.get(key)
    if queue is None:
        table[key] = _Queue(holder)
        return
    waiter = (anyio.Event(), holder)
    queue.waiters.append(waiter)
    try:
        await waiter[0].wait()
    except BaseException:
        if waiter[0].is_set():
            _release(table, key)
        else:
            queue.waiters.remove(waiter)
        raise


def _release(table: dict[str, _Queue], key: str) -> None:
    """Hand the lock of `key` to the next waiter, or free it."""
    queue = table[key]
    if queue.waiters:
        # The holder changes now, not when the waiter wakes: the task that released may start its
        # next turn on the conversation before then, and must wait, not be told it holds the lock.
        event, queue.holder = queue.waiters.popleft()
        event.set()
    else:
        del table[key]
