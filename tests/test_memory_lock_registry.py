"""The conversation locks of a store are shared by every service on it, and kept no longer than
those services.

Locks are found by store: weakly for a store that can be weakly referenced, else by id in a table
that holds the store, which the last service (its `Memory`) to be collected empties. The store here
has `__slots__` without `__weakref__`, as a user's store may.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Annotated

import pytest

import agentrt
from agentrt import ConversationReentryError, MemoryId
from agentrt._messages import ChatMessage
from agentrt.memory import ChatMemory, InMemoryStore
from agentrt.memory._locks import _STRONG_LOCKS
from agentrt.memory._memory import Memory
from agentrt.testing import FunctionModel


class SlottedStore:
    """A store that cannot be weakly referenced."""

    __slots__ = ("inner",)

    def __init__(self) -> None:
        self.inner = InMemoryStore()

    async def load(self, key: str) -> list[ChatMessage]:
        return await self.inner.load(key)

    async def commit(
        self, key: str, messages: Sequence[ChatMessage], *, drop: int = 0, owner: str | None = None
    ) -> None:
        await self.inner.commit(key, messages, drop=drop, owner=owner)

    async def replace(self, key: str, messages: Sequence[ChatMessage], *, owner: str | None = None) -> None:
        await self.inner.replace(key, messages, owner=owner)

    async def delete(self, key: str, *, owner: str | None = None) -> None:
        await self.inner.delete(key, owner=owner)


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


def memory(store: SlottedStore) -> Memory:
    return Memory(ChatMemory(store, namespace="shared", wait=0), "tests.Chat")


async def test_services_on_a_store_that_cannot_be_weakly_referenced_share_its_locks() -> None:
    store = SlottedStore()
    first, second = memory(store), memory(store)
    held = await first.open("c", "first")
    try:
        with pytest.raises(ConversationReentryError):  # one lock table: this task holds it already
            await second.open("c", "second")
    finally:
        await held.release()
    (await second.open("c", "second")).release_local()


async def test_the_locks_of_such_a_store_are_dropped_with_the_last_service_using_it() -> None:
    store = SlottedStore()
    services = [
        agentrt.build(Chat, model=FunctionModel(lambda _: "hi"), memory=ChatMemory(store, namespace="shared"))
        for _ in range(2)
    ]
    assert [await service.chat("c", "hello") for service in services] == ["hi", "hi"]
    assert _STRONG_LOCKS[id(store)][0] is store

    services.pop()
    gc.collect()
    assert id(store) in _STRONG_LOCKS  # the other service still uses them
    services.pop()
    gc.collect()
    assert id(store) not in _STRONG_LOCKS
