"""A worker process for the scale-out tests: `count` concurrent turns on one conversation.

    python tests/memory_worker.py {sqlite PATH | redis URL PREFIX} NAME COUNT BACKEND

Each turn asks `NAME-i`; the model answers `NAME-i#h`, where h is how many messages of history the
turn was sent, so the parent can check, from the store alone, that every turn saw all turns before it.
"""

from __future__ import annotations

import sys
from typing import Annotated

import anyio

import agentrt
from agentrt import MemoryId, ModelRequest, UserMessage
from agentrt.memory import ChatMemory, ChatMemoryStore, RedisStore, SQLiteStore
from agentrt.testing import FunctionModel


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


async def answer(request: ModelRequest) -> str:
    await anyio.lowlevel.checkpoint()
    last = request.messages[-1]
    assert isinstance(last, UserMessage)
    return f"{last.text}#{len(request.messages) - 1}"


async def main(store: ChatMemoryStore, name: str, count: int) -> None:
    svc = agentrt.build(Chat, model=FunctionModel(answer), memory=ChatMemory(store, namespace="scale-out"))
    async with anyio.create_task_group() as group:
        for index in range(count):
            group.start_soon(svc.chat, "c", f"{name}-{index}")


if __name__ == "__main__":
    kind, *rest = sys.argv[1:]
    if kind == "sqlite":
        path, name, count, backend = rest
        store: ChatMemoryStore = SQLiteStore(path)
    else:
        url, prefix, name, count, backend = rest
        store = RedisStore(url, prefix=prefix)
    anyio.run(main, store, name, int(count), backend=backend)
    print(f"{name}: {count} turns")
