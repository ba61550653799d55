"""Scale-out: two worker processes, 100 concurrent turns each, on one conversation in one store.

Only the store's own lock (a lease in SQLite or Redis) serializes the two processes. The store must
end with all 200 turns, whole, each seeing every turn before it: none lost, none interleaved.

The workers run one on asyncio, one on trio, whatever the test runs on; the test itself only starts
them and reads the store once, which the stores' own tests do on both backends. So it runs on
asyncio alone (a trio run repeated the same worker runs: 7-8 s each).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import anyio
import pytest

from agentrt import AssistantMessage, ChatMessage, UserMessage
from agentrt.memory import ChatMemoryStore, RedisStore, SQLiteStore

WORKER = Path(__file__).with_name("memory_worker.py")
TURNS = 100  # per worker
KEY = 'scale-out:"c"'

pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio"])


async def _run_workers(arguments: list[str]) -> None:
    """Start both workers at once (one on asyncio, one on trio) and wait for both."""

    async def run(name: str, backend: str) -> None:
        result = await anyio.run_process(
            [sys.executable, str(WORKER), *arguments, name, str(TURNS), backend], check=False
        )
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert result.stdout.decode().strip() == f"{name}: {TURNS} turns"

    with anyio.fail_after(240):
        async with anyio.create_task_group() as group:
            group.start_soon(run, "w1", "asyncio")
            group.start_soon(run, "w2", "trio")


async def _check(store: ChatMemoryStore) -> None:
    stored: list[ChatMessage] = await store.load(KEY)
    assert len(stored) == 2 * 2 * TURNS
    questions = []
    for position in range(0, len(stored), 2):
        user, answer = stored[position], stored[position + 1]
        assert isinstance(user, UserMessage)
        assert isinstance(answer, AssistantMessage)
        assert answer.text == f"{user.text}#{position}"
        questions.append(user.text)
    assert sorted(questions) == sorted(f"w{w}-{i}" for w in (1, 2) for i in range(TURNS))


async def test_two_processes_share_one_conversation_in_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    await _run_workers(["sqlite", str(path)])
    store = SQLiteStore(path)
    try:
        await _check(store)
    finally:
        await store.aclose()


async def test_two_processes_share_one_conversation_in_redis(redis_url: str) -> None:
    prefix = f"scale-{uuid.uuid4().hex}:"
    await _run_workers(["redis", redis_url, prefix])
    store = RedisStore(redis_url, prefix=prefix)
    try:
        await _check(store)
    finally:
        await store.aclose()
