"""Test helpers about tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

_T = TypeVar("_T")


async def in_another_task(start: Callable[[], Awaitable[_T]]) -> _T:
    """Await `start()` in a task of its own: a conversation left held there is another task's, which
    this task's turns wait for (a turn on a conversation its own kept stream holds is refused)."""
    done: list[_T] = []

    async def run() -> None:
        done.append(await start())

    async with anyio.create_task_group() as group:
        group.start_soon(run)
    return done[0]
