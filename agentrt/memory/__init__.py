"""Chat memory: per-conversation stores, windows, and turns written whole or not at all.

    support = agentrt.build(Support, model=model, memory=agentrt.memory.window(max_messages=20))

A method with an `Annotated[str, MemoryId]` parameter uses the conversation it names; one without uses
the `"default"` conversation. Each turn locks its conversation, loads the window of it, and at its end
writes the user message, the tool exchanges and the answer in one atomic write, only on success.
"""

from __future__ import annotations

from ._access import MemoryAccess, access
from ._inmemory import DEFAULT_MAX_CONVERSATIONS, InMemoryStore
from ._memory import DEFAULT_MEMORY_ID, ChatMemory, window
from ._redis import RedisStore
from ._sqlite import SQLiteStore
from ._store import ChatMemoryStore, PendingStore, SharedChatMemoryStore
from ._window import TokenCounter, estimate_message_tokens

__all__ = [
    "DEFAULT_MAX_CONVERSATIONS",
    "DEFAULT_MEMORY_ID",
    "ChatMemory",
    "ChatMemoryStore",
    "InMemoryStore",
    "MemoryAccess",
    "PendingStore",
    "RedisStore",
    "SQLiteStore",
    "SharedChatMemoryStore",
    "TokenCounter",
    "access",
    "estimate_message_tokens",
    "window",
]
