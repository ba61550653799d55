"""`RedisStore` against a real redis-server (tests/redis_server.py): what only this store does.

Every assertion reads the state back from Redis (through the store or a separate raw client). The
shared behaviour of all stores is tested elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import redis
from redis_server import redis_server

from agentrt._errors import ConversationLockLostError
from agentrt._messages import (
    AssistantMessage,
    AudioContent,
    ChatMessage,
    ImageContent,
    PdfContent,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    message_from_json,
)
from agentrt.memory._redis import RedisStore
from agentrt.memory._store import ChatMemoryStore, SharedChatMemoryStore


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from redis_server()


@pytest.fixture
def prefix() -> str:
    """A prefix of this test's own: tests share the server, never a key."""
    return f"test-{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def raw(url: str) -> Iterator[redis.Redis]:
    """A client of its own, to read what the store wrote."""
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
async def store(url: str, prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(url, prefix=prefix)
    yield store
    await store.aclose()


@pytest.fixture
async def other(url: str, prefix: str) -> AsyncIterator[RedisStore]:
    """A second store on the same keys, with its own connections (another process, as it were)."""
    store = RedisStore(url, prefix=prefix)
    yield store
    await store.aclose()


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text for m in messages if isinstance(m, UserMessage)]


def stored(raw: redis.Redis, prefix: str, key: str) -> list[ChatMessage]:
    return [message_from_json(item) for item in raw.lrange(f"{prefix}conv:{key}", 0, -1)]  # type: ignore[union-attr]


async def wait_until_taken(store: RedisStore, key: str, owner: str, *, within: float) -> float:
    """Poll `try_lock` until it succeeds (bounded by `within` seconds); the seconds it took."""
    start = anyio.current_time()
    with anyio.fail_after(within):
        while True:
            if await store.try_lock(key, owner):
                break
            await anyio.sleep(0.02)
    return anyio.current_time() - start


async def test_is_a_shared_store(store: RedisStore) -> None:
    assert isinstance(store, ChatMemoryStore)
    assert isinstance(store, SharedChatMemoryStore)


async def test_every_field_round_trips_one_item_per_message(
    store: RedisStore, raw: redis.Redis, prefix: str
) -> None:
    messages: list[ChatMessage] = [
        UserMessage(
            contents=(
                TextContent(text="look at this, ünïcödé 🐍\nsecond line"),
                ImageContent.from_bytes(b"\x89PNG\r\n\x1a\n\x00\xff", "image/png", detail="high"),
                ImageContent.from_url("https://example.com/cat.jpg"),
                AudioContent.from_bytes(b"RIFF....WAVE", "audio/wav"),
                PdfContent.from_bytes(b"%PDF-1.7", "application/pdf", filename="a.pdf"),
            ),
            name="alice",
        ),
        AssistantMessage(
            text="Let me check.",
            thinking="The user wants the weather; call the tool.",
            thinking_signature="sig-123==",
            tool_calls=(
                ToolCall(id="call_1", name="weather", arguments='{"city": "Zürich"}'),
                ToolCall(id="call_2", name="time", arguments=""),
            ),
        ),
        ToolResultMessage(tool_call_id="call_1", tool_name="weather", text='{"temp": 21}'),
        ToolResultMessage(tool_call_id="call_2", tool_name="time", text="boom", is_error=True),
        AssistantMessage(refusal="I can't help with that."),
    ]
    await store.commit("conv", messages)

    assert await store.load("conv") == messages
    assert raw.llen(f"{prefix}conv:conv") == len(messages)
    assert stored(raw, prefix, "conv") == messages
    assert await store.load("never-written") == []


async def test_commit_drops_then_appends(store: RedisStore, raw: redis.Redis, prefix: str) -> None:
    await store.commit("c", [user(str(i)) for i in range(5)])
    await store.commit("c", [user("5"), user("6")], drop=2)
    assert texts(stored(raw, prefix, "c")) == ["2", "3", "4", "5", "6"]
    await store.commit("c", [], drop=10)
    assert stored(raw, prefix, "c") == []
    assert raw.exists(f"{prefix}conv:c") == 0


async def test_commit_with_drop_is_atomic_for_concurrent_readers(
    store: RedisStore, other: RedisStore
) -> None:
    """Each commit drops 2 and appends 2: a reader must always see 6 consecutive messages, never the
    list between the drop and the append."""
    size, commits = 6, 150
    await store.commit("c", [user(str(i)) for i in range(size)])
    seen: list[list[str]] = []
    done = anyio.Event()

    async def read() -> None:
        while not done.is_set():
            seen.append(texts(await other.load("c")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        for n in range(commits):
            first = size + 2 * n
            await store.commit("c", [user(str(first)), user(str(first + 1))], drop=2)
        done.set()

    assert len(seen) > 10
    for view in seen:
        numbers = [int(t) for t in view]
        assert len(numbers) == size, view
        assert numbers == list(range(numbers[0], numbers[0] + size)), view
    final = texts(await store.load("c"))
    assert final == [str(i) for i in range(2 * commits, 2 * commits + size)]


async def test_writes_with_a_wrong_or_missing_owner_change_nothing(
    store: RedisStore, other: RedisStore, raw: redis.Redis, prefix: str
) -> None:
    await store.commit("c", [user("a"), user("b")])
    before = stored(raw, prefix, "c")

    # Nobody holds the lock: any owner is refused.
    with pytest.raises(ConversationLockLostError):
        await store.commit("c", [user("x")], drop=1, owner="ghost")

    assert await store.try_lock("c", "alice")
    for writer in (store, other):
        with pytest.raises(ConversationLockLostError):
            await writer.commit("c", [user("x")], drop=1, owner="bob")
        with pytest.raises(ConversationLockLostError):
            await writer.replace("c", [user("x")], owner="bob")
        with pytest.raises(ConversationLockLostError):
            await writer.delete("c", owner="bob")
    assert stored(raw, prefix, "c") == before

    await other.commit("c", [user("c")], drop=1, owner="alice")
    assert texts(stored(raw, prefix, "c")) == ["b", "c"]
    await other.replace("c", [user("r")], owner="alice")
    assert texts(stored(raw, prefix, "c")) == ["r"]
    await other.delete("c", owner="alice")
    assert raw.exists(f"{prefix}conv:c") == 0
    await store.unlock("c", "alice")


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


async def test_only_one_of_two_stores_gets_the_lock(
    store: RedisStore, other: RedisStore, raw: redis.Redis, prefix: str
) -> None:
    for round_ in range(20):
        key = f"k{round_}"
        results: dict[str, bool] = {}

        async def take(s: RedisStore, owner: str, key: str = key, results: dict[str, bool] = results) -> None:
            results[owner] = await s.try_lock(key, owner)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, store, "one")
            tg.start_soon(take, other, "two")

        winners = [owner for owner, taken in results.items() if taken]
        assert len(winners) == 1, results
        assert raw.get(f"{prefix}lock:{key}") == winners[0].encode()
        loser = other if winners[0] == "one" else store
        assert not await loser.try_lock(key, "three")
        await (store if winners[0] == "one" else other).unlock(key, winners[0])
        assert raw.exists(f"{prefix}lock:{key}") == 0


async def test_unlock_by_another_owner_does_nothing(store: RedisStore, raw: redis.Redis, prefix: str) -> None:
    assert await store.try_lock("c", "alice")
    await store.unlock("c", "bob")
    assert raw.get(f"{prefix}lock:c") == b"alice"
    assert store.renewer.held() == {("c", "alice")}
    await store.unlock("c", "alice")
    assert raw.exists(f"{prefix}lock:c") == 0
    assert store.renewer.held() == frozenset()


async def test_a_lock_no_longer_renewed_expires(url: str, prefix: str, raw: redis.Redis) -> None:
    lease = 0.3
    holder = RedisStore(url, prefix=prefix, lease_seconds=lease)
    taker = RedisStore(url, prefix=prefix, lease_seconds=lease)
    try:
        await holder.commit("c", [user("a")])
        assert await holder.try_lock("c", "alice")
        holder.renewer.release("c", "alice")  # as if the holder's process stopped renewing

        assert not await taker.try_lock("c", "bob")
        waited = await wait_until_taken(taker, "c", "bob", within=5.0)
        assert waited > lease / 3  # it was still alive for a while after the last renewal
        assert raw.get(f"{prefix}lock:c") == b"bob"

        with pytest.raises(ConversationLockLostError):
            await holder.commit("c", [user("late")], owner="alice")
        assert texts(stored(raw, prefix, "c")) == ["a"]
        await taker.unlock("c", "bob")
    finally:
        await holder.aclose()
        await taker.aclose()


async def test_a_live_holders_lease_is_renewed(url: str, prefix: str, raw: redis.Redis) -> None:
    lease = 0.5
    holder = RedisStore(url, prefix=prefix, lease_seconds=lease)
    taker = RedisStore(url, prefix=prefix, lease_seconds=lease)
    try:
        assert await holder.try_lock("c", "alice")
        start = anyio.current_time()
        checks = 0
        while anyio.current_time() - start < 5 * lease:
            assert not await taker.try_lock("c", "bob")
            assert raw.get(f"{prefix}lock:c") == b"alice"
            assert 0 < raw.pttl(f"{prefix}lock:c") <= lease * 1000  # type: ignore[operator]
            checks += 1
            await anyio.sleep(lease / 5)
        assert checks >= 10
        await holder.commit("c", [user("still mine")], owner="alice")
        assert texts(stored(raw, prefix, "c")) == ["still mine"]

        await holder.unlock("c", "alice")
        assert await taker.try_lock("c", "bob")
        await taker.unlock("c", "bob")
    finally:
        await holder.aclose()
        await taker.aclose()


CHILD = """
import sys

import anyio

from agentrt.memory._redis import RedisStore


async def main() -> None:
    url, prefix, lease, key, owner = sys.argv[1:]
    store = RedisStore(url, prefix=prefix, lease_seconds=float(lease))
    assert await store.try_lock(key, owner)
    print("locked", flush=True)
    await anyio.sleep_forever()


anyio.run(main)
"""


async def test_the_lock_of_a_killed_process_expires(
    store: RedisStore, url: str, prefix: str, raw: redis.Redis
) -> None:
    lease = 1.0
    command = [sys.executable, "-c", CHILD, url, prefix, str(lease), "c", "child"]
    process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=None)
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            output = b""
            while b"\n" not in output:
                output += await process.stdout.receive()
        assert output == b"locked\n"
        assert raw.get(f"{prefix}lock:c") == b"child"

        # The child renews its lease: still held after two leases.
        await anyio.sleep(2 * lease)
        assert process.returncode is None
        assert raw.get(f"{prefix}lock:c") == b"child"
        assert not await store.try_lock("c", "parent")

        process.kill()  # SIGKILL: no cleanup runs in the child
        await process.wait()
        assert not await store.try_lock("c", "parent")  # the lease outlives the process a while
        await wait_until_taken(store, "c", "parent", within=10.0)
        assert raw.get(f"{prefix}lock:c") == b"parent"
        await store.unlock("c", "parent")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


async def test_a_missing_redis_client_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from agentrt.memory._redis import RedisStore\n"
        "try:\n    RedisStore()\nexcept ImportError as e:\n    print(e)\n"
    )
    done = await anyio.run_process([sys.executable, "-c", code])
    assert "pip install 'agentrt[redis]'" in done.stdout.decode()
