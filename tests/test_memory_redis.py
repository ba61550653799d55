"""`RedisStore` against a real redis-server (tests/redis_server.py): what only this store does.

Every assertion reads the state back from Redis (through the store or a separate raw client). What
both shared stores promise (locks, leases, owner checks, atomic commits) is tested in
tests/test_memory_shared_stores.py; what every store keeps, in tests/test_memory_stores.py.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import redis

from agentrt._messages import AssistantMessage, ChatMessage, ToolCall, UserMessage, message_from_json
from agentrt.memory._redis import RedisStore


@pytest.fixture
def prefix() -> str:
    """A prefix of this test's own: tests share the server, never a key."""
    return f"test-{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A client of its own, to read what the store wrote."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_url, prefix=prefix)
    yield store
    await store.aclose()


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text for m in messages if isinstance(m, UserMessage)]


def stored(raw: redis.Redis, prefix: str, key: str) -> list[ChatMessage]:
    return [message_from_json(item) for item in raw.lrange(f"{prefix}conv:{key}", 0, -1)]  # type: ignore[union-attr]


async def test_a_conversation_is_a_list_of_one_item_per_message(
    store: RedisStore, raw: redis.Redis, prefix: str
) -> None:
    messages: list[ChatMessage] = [
        user("question"),
        AssistantMessage(text="Let me check.", tool_calls=(ToolCall(id="c1", name="time", arguments=""),)),
    ]
    await store.commit("conv", messages)
    assert raw.llen(f"{prefix}conv:conv") == len(messages)
    assert stored(raw, prefix, "conv") == messages

    await store.commit("c", [user(str(i)) for i in range(5)])
    await store.commit("c", [user("5"), user("6")], drop=2)
    assert texts(stored(raw, prefix, "c")) == ["2", "3", "4", "5", "6"]
    await store.commit("c", [], drop=10)
    assert stored(raw, prefix, "c") == []
    assert raw.exists(f"{prefix}conv:c") == 0  # an emptied conversation leaves no key
    await store.replace("c", [user("r")])
    assert texts(stored(raw, prefix, "c")) == ["r"]
    await store.delete("c")
    assert raw.exists(f"{prefix}conv:c") == 0


async def test_a_retried_write_is_applied_once(
    store: RedisStore, raw: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py retries a command whose reply was lost; the retry carries the same write id."""
    await store.commit("c", [user("a"), user("b")])
    fixed = uuid.uuid4()
    monkeypatch.setattr("agentrt.memory._redis.uuid.uuid4", lambda: fixed)
    await store.commit("c", [user("c")], drop=1)
    await store.commit("c", [user("c")], drop=1)  # what a retry sends
    assert texts(stored(raw, prefix, "c")) == ["b", "c"]


async def test_a_missing_redis_client_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from agentrt.memory._redis import RedisStore\n"
        "try:\n    RedisStore()\nexcept ImportError as e:\n    print(e)\n"
    )
    done = await anyio.run_process([sys.executable, "-c", code])
    assert "pip install 'agentrt[redis]'" in done.stdout.decode()
