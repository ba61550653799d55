"""What both shared stores (`SQLiteStore`, `RedisStore`) promise: one lock holder across processes,
writes refused to anyone else, commits atomic for readers, leases renewed while held by a live event
loop and expired when not (a crashed process, a wedged loop), writes completed even when cancelled.

Each test runs on both stores (and on asyncio and trio). `Backend.make` makes another store on the
same data at each call (the same file in `tmp_path`, or the same redis-server and key prefix), with
connections of its own: another process, as it were; one test runs a real second process. State is
read back through another store or through `Backend.lock`, which reads the lock as stored. What only
one store does is in tests/test_memory_sqlite.py and tests/test_memory_redis.py; what every store
(in-memory too) keeps is in tests/test_memory_stores.py.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

import agentrt
from agentrt import memory
from agentrt._errors import ConfigurationError, ConversationLockLostError
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
)
from agentrt.memory import ChatMemoryStore, RedisStore, SharedChatMemoryStore, SQLiteStore

Store = SQLiteStore | RedisStore


class Backend:
    """One test's data in one kind of shared store: makes stores on it and reads its lock raw."""

    def __init__(self, kind: str, tmp_path: Path, redis_url: str | None) -> None:
        self.kind = kind
        self.path = tmp_path / "memory.db"
        self.url = redis_url
        self.prefix = f"test-{uuid.uuid4().hex[:12]}:"  # tests share the server, never a key
        self.raw = None if redis_url is None else redis.Redis.from_url(redis_url)
        self.made: list[Store] = []

    def spec(self, lease_seconds: Any) -> tuple[str, list[Any], dict[str, Any]]:
        """How to make a store on this data: class name, arguments, keywords (as JSON for a child)."""
        if self.kind == "sqlite":
            return "SQLiteStore", [str(self.path)], {"lease_seconds": lease_seconds}
        return "RedisStore", [self.url], {"prefix": self.prefix, "lease_seconds": lease_seconds}

    def make(self, *, lease_seconds: Any = 30.0) -> Store:
        name, args, kwargs = self.spec(lease_seconds)
        store: Store = getattr(memory, name)(*args, **kwargs)
        self.made.append(store)
        return store

    def lock(self, key: str) -> tuple[str, float] | None:
        """The lock as stored: its owner and the seconds left on its lease; `None` when free."""
        if self.raw is None:
            with closing(sqlite3.connect(self.path)) as db:
                query = "SELECT owner, expires FROM agentrt_leases WHERE key = ?"
                row = db.execute(query, (key,)).fetchone()
            return None if row is None else (row[0], row[1] - time.time())
        owner, ttl_ms = (
            self.raw.pipeline().get(f"{self.prefix}lock:{key}").pttl(f"{self.prefix}lock:{key}").execute()
        )
        return None if owner is None else (owner.decode(), ttl_ms / 1000)

    def lock_owner(self, key: str) -> str | None:
        held = self.lock(key)
        return None if held is None else held[0]

    def give_lock(self, key: str, owner: str) -> None:
        """Hand a held lock to `owner` behind its holder's back (as if it expired and `owner` took it)."""
        if self.raw is None:
            with closing(sqlite3.connect(self.path, isolation_level=None)) as db:
                db.execute("UPDATE agentrt_leases SET owner = ? WHERE key = ?", (owner, key))
        else:
            assert self.raw.set(f"{self.prefix}lock:{key}", owner, xx=True, px=30_000)

    @contextmanager
    def writes_held(self) -> Iterator[Callable[[], None]]:
        """Hold every write to the data until the yielded `release` is called: SQLite, another
        connection's write transaction; Redis, `CLIENT PAUSE ... WRITE`."""
        if self.raw is None:
            with closing(sqlite3.connect(self.path, isolation_level=None)) as blocker:
                blocker.execute("BEGIN IMMEDIATE")
                yield lambda: blocker.execute("COMMIT").close()
            return
        raw = self.raw
        raw.client_pause(5_000, all=False)
        try:
            yield lambda: raw.client_unpause() and None
        finally:
            raw.client_unpause()

    async def aclose(self) -> None:
        for store in self.made:
            await store.aclose()
        if self.raw is not None:
            self.raw.close()


@pytest.fixture(params=["sqlite", "redis"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    backend = Backend(request.param, tmp_path, url)
    yield backend
    await backend.aclose()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.make()


@pytest.fixture
def other(backend: Backend) -> Store:
    """A second store on the same data, with its own connections (another process, as it were)."""
    return backend.make()


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text for m in messages if isinstance(m, UserMessage)]


async def wait_until_taken(store: Store, key: str, owner: str, *, within: float) -> float:
    """Poll `try_lock` until it succeeds (bounded by `within` seconds); the seconds it took."""
    start = anyio.current_time()
    with anyio.fail_after(within):
        while True:
            if await store.try_lock(key, owner):
                break
            await anyio.sleep(0.02)
    return anyio.current_time() - start


async def test_is_a_shared_store_and_refuses_bad_arguments(backend: Backend, store: Store) -> None:
    assert isinstance(store, ChatMemoryStore)
    assert isinstance(store, SharedChatMemoryStore)
    for bad in (0, -1.0, True, float("inf")):
        with pytest.raises(ConfigurationError):
            backend.make(lease_seconds=bad)
    await store.commit("c", [user("a")])
    with pytest.raises(ValueError, match="negative"):
        await store.commit("c", [], drop=-1)
    assert texts(await backend.make().load("c")) == ["a"]


async def test_attachments_and_tool_calls_round_trip(store: Store, other: Store) -> None:
    """Fields the all-stores suite (tests/test_memory_stores.py) does not write: binary contents,
    text next to tool calls, empty tool arguments; read back by another store."""
    messages: list[ChatMessage] = [
        UserMessage(
            contents=(
                TextContent(text="look at this, ünïcödé 🐍\nsecond line\x00after a NUL"),
                ImageContent.from_bytes(b"\x89PNG\r\n\x1a\n\x00\xff", "image/png", detail="high"),
                ImageContent.from_url("https://example.com/cat.jpg"),
                AudioContent.from_bytes(b"RIFF....WAVE", "audio/wav"),
                PdfContent.from_bytes(b"%PDF-1.7", "application/pdf", filename="a.pdf"),
            ),
            name="alice",
        ),
        AssistantMessage(
            text="Let me check.", tool_calls=(ToolCall(id="call_2", name="time", arguments=""),)
        ),
        ToolResultMessage(tool_call_id="call_2", tool_name="time", text='{"temp": 21}'),
    ]
    await store.commit("conv", messages[:2])
    await store.commit("conv", messages[2:])
    assert await other.load("conv") == messages
    assert await other.load("never-written") == []


async def test_commit_with_drop_is_atomic_for_concurrent_readers(store: Store, other: Store) -> None:
    """Each commit drops 2 and appends 2: a reader must always see 6 consecutive messages, never the
    conversation between the drop and the append."""
    size, commits = 6, 150
    await store.commit("c", [user(str(i)) for i in range(size)])
    seen: list[list[str]] = []
    done = anyio.Event()

    async def read() -> None:
        while not done.is_set():
            seen.append(texts(await other.load("c")))

    n = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        # At least `commits`, and on until the reader has read a few times meanwhile (on a loaded
        # machine its thread may get few turns during the first 150).
        while n < commits or len(seen) <= 10:
            first = size + 2 * n
            await store.commit("c", [user(str(first)), user(str(first + 1))], drop=2)
            n += 1
        done.set()

    for view in seen:
        numbers = [int(t) for t in view]
        assert len(numbers) == size, view
        assert numbers == list(range(numbers[0], numbers[0] + size)), view
    assert texts(await other.load("c")) == [str(i) for i in range(2 * n, 2 * n + size)]


async def test_writes_with_a_wrong_or_missing_owner_change_nothing(
    backend: Backend, store: Store, other: Store
) -> None:
    await store.commit("c", [user("a"), user("b")])
    before = await other.load("c")

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
    assert await other.load("c") == before
    assert backend.lock_owner("c") == "alice"

    # The holder's writes go through, from any store on the data.
    await other.commit("c", [user("c")], drop=1, owner="alice")
    assert texts(await store.load("c")) == ["b", "c"]
    await other.replace("c", [user("r")], owner="alice")
    assert texts(await store.load("c")) == ["r"]
    await other.delete("c", owner="alice")
    assert await store.load("c") == []
    await store.unlock("c", "alice")
    assert backend.lock("c") is None

    # Unlocked: the former holder is refused too.
    with pytest.raises(ConversationLockLostError):
        await store.commit("c", [user("late")], owner="alice")
    assert await other.load("c") == []


async def test_only_one_of_several_stores_gets_the_lock(backend: Backend) -> None:
    stores = [backend.make() for _ in range(6)]  # on SQLite, the first round also makes the schema
    for round_ in range(10):
        key = f"k{round_}"
        results: dict[int, bool] = {}

        async def take(i: int, s: Store, key: str = key, results: dict[int, bool] = results) -> None:
            results[i] = await s.try_lock(key, f"owner{i}")

        async with anyio.create_task_group() as tg:
            for i, s in enumerate(stores):
                tg.start_soon(take, i, s)

        winners = [i for i, taken in results.items() if taken]
        assert len(winners) == 1, results
        (winner,) = winners
        assert backend.lock_owner(key) == f"owner{winner}"
        loser = stores[(winner + 1) % len(stores)]
        assert not await loser.try_lock(key, "late")
        # Its owner takes it again, from another store too (a durable turn's next worker does).
        assert await loser.try_lock(key, f"owner{winner}")
        assert backend.lock_owner(key) == f"owner{winner}"
        await loser.unlock(key, f"owner{winner}")
        await stores[winner].unlock(key, f"owner{winner}")
        assert backend.lock(key) is None
        assert await loser.try_lock(key, "late")
        await loser.unlock(key, "late")


async def test_unlock_by_another_owner_does_nothing(backend: Backend, store: Store) -> None:
    assert await store.try_lock("c", "alice")
    await store.unlock("c", "bob")
    assert backend.lock_owner("c") == "alice"
    assert store.renewer.held() == {("c", "alice")}
    await store.unlock("c", "alice")
    assert backend.lock("c") is None
    assert store.renewer.held() == frozenset()


async def test_a_lock_no_longer_renewed_expires(backend: Backend) -> None:
    lease = 0.3
    holder = backend.make(lease_seconds=lease)
    taker = backend.make(lease_seconds=lease)
    await holder.commit("c", [user("a")])
    assert await holder.try_lock("c", "alice")
    holder.renewer.release("c", "alice")  # as if the holder's process stopped renewing

    assert not await taker.try_lock("c", "bob")
    waited = await wait_until_taken(taker, "c", "bob", within=5.0)
    assert waited > lease / 3  # it was still alive for a while after the last renewal
    assert backend.lock_owner("c") == "bob"

    with pytest.raises(ConversationLockLostError):
        await holder.commit("c", [user("late")], owner="alice")
    assert texts(await taker.load("c")) == ["a"]
    await taker.unlock("c", "bob")


async def test_a_live_holders_lease_is_renewed(backend: Backend) -> None:
    # Three leases long, with room for a loaded machine (the renewer runs every third of a lease and
    # needs the loop's answer each time: 0.3 s leases were cut on two busy cores).
    lease = 0.9
    holder = backend.make(lease_seconds=lease)
    taker = backend.make(lease_seconds=lease)
    assert await holder.try_lock("c", "alice")
    start = anyio.current_time()
    checks = 0
    with anyio.fail_after(20):
        while anyio.current_time() - start < 3 * lease:
            assert not await taker.try_lock("c", "bob")
            held = backend.lock("c")
            assert held is not None
            owner, left = held
            assert owner == "alice"
            assert 0 < left <= lease
            checks += 1
            await anyio.sleep(lease / 5)
    assert checks >= 5

    await holder.commit("c", [user("still mine")], owner="alice")
    assert texts(await taker.load("c")) == ["still mine"]
    await holder.unlock("c", "alice")
    assert await taker.try_lock("c", "bob")
    await taker.unlock("c", "bob")


async def test_a_wedged_event_loop_loses_its_lease(backend: Backend) -> None:
    """A process that is alive but stuck loses its locks as a crashed one does: a lease is renewed
    only while the event loop that took it answers. Here the test's own loop is blocked (no await)
    until another store takes the lock from a thread with an event loop of its own (another
    process, as it were)."""
    lease = 0.3
    holder = backend.make(lease_seconds=lease)
    taker = backend.make(lease_seconds=30.0)  # its lock outlasts the test without renewal
    await holder.commit("c", [user("a")])
    assert await holder.try_lock("c", "alice")

    def take_from_another_thread() -> bool:
        taken: list[bool] = []
        thread = threading.Thread(target=lambda: taken.append(anyio.run(taker.try_lock, "c", "bob")))
        thread.start()
        thread.join()
        return taken == [True]

    give_up = time.monotonic() + 10
    while not take_from_another_thread():  # the loop is wedged: nothing in it runs meanwhile
        assert time.monotonic() < give_up, "the lease of a wedged event loop was still renewed"
        time.sleep(lease / 10)  # noqa: ASYNC251 (blocking the loop is the point)
    assert backend.lock_owner("c") == "bob"

    # The loop runs again: its writes are refused, and its renewer learns that the lease is gone.
    with pytest.raises(ConversationLockLostError):
        await holder.commit("c", [user("late")], owner="alice")
    with anyio.fail_after(5):
        while True:
            if not holder.renewer.held():
                break
            await anyio.sleep(0.02)
    assert texts(await taker.load("c")) == ["a"]
    assert backend.lock_owner("c") == "bob"
    await taker.unlock("c", "bob")


async def test_a_lease_taken_by_another_owner_is_no_longer_renewed(backend: Backend) -> None:
    holder = backend.make(lease_seconds=0.3)
    assert await holder.try_lock("c", "alice")
    backend.give_lock("c", "bob")
    with anyio.fail_after(5):
        while True:
            if not holder.renewer.held():
                break
            await anyio.sleep(0.02)
    assert backend.lock_owner("c") == "bob"


async def test_a_cancelled_write_completes(backend: Backend, store: Store, other: Store) -> None:
    """The write waits for the data to take writes again; cancelled meanwhile, it is not abandoned:
    the call returns only once the write happened."""
    await store.commit("c", [user("a"), user("b")])
    released = anyio.Event()
    with backend.writes_held() as release:

        async def release_later(scope: anyio.CancelScope) -> None:
            with anyio.fail_after(5):
                while True:
                    if scope.cancel_called:
                        break
                    await anyio.sleep(0.01)
            release()  # the write was cancelled while it waited; now it may go on
            released.set()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                with anyio.move_on_after(0.1) as scope:
                    tg.start_soon(release_later, scope)
                    await store.commit("c", [user("c")], drop=1)
                assert released.is_set()
    assert texts(await other.load("c")) == ["b", "c"]


CHILD = """
import json
import sys

import anyio

from agentrt import memory


async def main() -> None:
    name, args, kwargs, key, owner = sys.argv[1:]
    store = getattr(memory, name)(*json.loads(args), **json.loads(kwargs))
    assert await store.try_lock(key, owner)
    print("locked", flush=True)
    await anyio.sleep_forever()


anyio.run(main)
"""


async def test_the_lock_of_a_killed_process_expires(backend: Backend, store: Store) -> None:
    lease = 1.0
    name, args, kwargs = backend.spec(lease)
    command = [sys.executable, "-c", CHILD, name, json.dumps(args), json.dumps(kwargs), "c", "child"]
    process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=None)
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            output = b""
            while b"\n" not in output:
                output += await process.stdout.receive()
        assert output == b"locked\n"
        assert backend.lock_owner("c") == "child"

        # The child renews its lease: still held after two leases.
        start = anyio.current_time()
        with anyio.fail_after(10):
            while anyio.current_time() - start < 2 * lease:
                assert not await store.try_lock("c", "parent")
                await anyio.sleep(0.1)
        assert process.returncode is None
        assert backend.lock_owner("c") == "child"

        process.kill()  # SIGKILL: no cleanup runs in the child
        await process.wait()
        assert not await store.try_lock("c", "parent")  # the lease outlives the process a while
        await wait_until_taken(store, "c", "parent", within=10.0)
        assert backend.lock_owner("c") == "parent"
        await store.unlock("c", "parent")
        assert backend.lock("c") is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_lock_taken_after_its_caller_stopped_waiting_is_given_back(
    backend: Backend, store: Store
) -> None:
    """A native asyncio cancellation (or an event loop shutting down, which cancels every task) stops
    the wait for a `try_lock` whose worker thread goes on; the lock that thread then takes must not
    stay held, and renewed, with nobody to release it. asyncio only: trio's cancellation of a thread
    call waits for the thread."""
    import asyncio

    with backend.writes_held() as release:
        attempt = asyncio.ensure_future(store.try_lock("c", "gone"))
        await anyio.wait_all_tasks_blocked()  # its worker thread waits at the held write
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
        release()

    # The thread settles the attempt, then gives the lock back (a moment later: a loaded machine
    # showed the lock still held between the two). Both within 10 s, a third of the lease: a lock
    # left held fails here, it cannot expire in time to pass for one given back.
    with anyio.fail_after(10):
        while True:
            if not store.renewer._attempts and backend.lock_owner("c") is None:
                break
            await anyio.sleep(0.005)
    assert store.renewer.held() == frozenset()
    assert await store.try_lock("c", "next")


# --- lease lengths that cannot work are refused at construction ---------------------------------------------


@pytest.mark.parametrize("lease", [True, float("nan"), float("inf"), 1e-9, 0, -1, "30"])
def test_a_lease_length_that_cannot_work_is_a_configuration_error(lease: Any, tmp_path: Any) -> None:
    with pytest.raises(agentrt.ConfigurationError, match="lease_seconds must be a finite number"):
        SQLiteStore(tmp_path / "chat.db", lease_seconds=lease)
    with pytest.raises(agentrt.ConfigurationError, match="lease_seconds must be a finite number"):
        RedisStore("redis://127.0.0.1:1/0", lease_seconds=lease)
