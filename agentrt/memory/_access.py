"""Reading and writing a service's conversations from outside a turn (LangChain4j's `ChatMemoryAccess`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .._errors import ConfigurationError
from ._memory import DEFAULT_MEMORY_ID, check_history, complete
from ._store import PendingStore

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._messages import ChatMessage
    from ._memory import Conversation, Memory

__all__ = ["MemoryAccess", "access"]


class MemoryAccess:
    """The conversations of one service. Writes take the conversation's lock, so they wait for a
    turn running on it (as long as the memory's `wait` allows) and never interleave with one."""

    __slots__ = ("_memory", "_where")

    def __init__(self, memory: Memory, where: str) -> None:
        self._memory = memory
        self._where = where

    def __repr__(self) -> str:
        return f"<MemoryAccess of {self._where} on {self._memory.store!r}>"

    @property
    def namespace(self) -> str:
        """The namespace of this service's conversations in the store."""
        return self._memory.namespace

    async def read(self, memory_id: Any = DEFAULT_MEMORY_ID) -> list[ChatMessage]:
        """The conversation as stored (oldest first; no system message)."""
        memory = self._memory
        return await memory.store.load(memory.key(memory_id, f"{self._where}.read"))

    async def replace(self, memory_id: Any, messages: Sequence[ChatMessage]) -> None:
        """Make the conversation exactly `messages` (e.g. a summary in place of a long history).

        `ValueError` for a system message or a tool result without its call before it."""
        where = f"{self._where}.replace"
        messages = list(messages)
        check_history(messages, where)
        conversation = await self._memory.open(memory_id, where)
        try:
            await conversation.replace(messages)
        finally:
            await _release(conversation)

    async def clear(self, memory_id: Any = DEFAULT_MEMORY_ID) -> None:
        """Empty the conversation (and drop a turn of it that waits for approval)."""
        conversation = await self._memory.open(memory_id, f"{self._where}.clear")
        try:
            await conversation.replace(())
            await _drop_pending(conversation)
        finally:
            await _release(conversation)

    async def evict(self, memory_id: Any = DEFAULT_MEMORY_ID) -> None:
        """Remove the conversation from the store, with a turn of it that waits for approval."""
        conversation = await self._memory.open(memory_id, f"{self._where}.evict")
        try:
            await conversation.delete()
            await _drop_pending(conversation)
        finally:
            await _release(conversation)


async def _drop_pending(conversation: Conversation) -> None:
    """Remove the conversation's turn that waits for approval, if its store keeps one: it holds the
    history it was sent, and would be stored on top of what is left."""
    store = conversation.memory.store
    if not isinstance(store, PendingStore):
        return
    found = await complete(store.load_pending(conversation.key))
    if found is not None:
        await complete(store.take_pending(conversation.key, found[0], owner=conversation.owner))


async def _release(conversation: Conversation) -> None:
    with anyio.CancelScope(shield=True):
        await conversation.release()


def access(service: object) -> MemoryAccess:
    """Read, replace, clear and evict the conversations of a built service.

    `ConfigurationError` when `service` is not a built service or was built without `memory=`."""
    from .._service import runtime_of

    runtime = runtime_of(service)
    name = f"agentrt.memory.access({type(service).__qualname__})"
    if runtime is None:
        raise ConfigurationError(f"{service!r} is not a service made by agentrt.build")
    if runtime.memory is None:
        raise ConfigurationError(
            f"{type(service).__qualname__} was built without memory=; it keeps no conversations"
        )
    return MemoryAccess(runtime.memory, name)
