"""`SQLiteStore` on a file in `tmp_path`: what only this store does.

Every assertion reads the state back from the file (through a fresh store or a raw sqlite3
connection). Several stores on one file stand for several processes (each has its own connections,
as processes do); one test runs a real second process. The shared behaviour of all stores is tested
elsewhere.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path

import anyio
import pytest

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
    message_from_json,
)
from agentrt.memory._sqlite import SQLiteStore
from agentrt.memory._store import ChatMemoryStore, SharedChatMemoryStore


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(path)
    yield store
    store.close()


@pytest.fixture
async def other(path: Path) -> AsyncIterator[SQLiteStore]:
    """A second store on the same file, with its own connections (another process, as it were)."""
    store = SQLiteStore(path)
    yield store
    store.close()


@pytest.fixture
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection of its own, to read what the stores wrote."""
    db = sqlite3.connect(path, isolation_level=None)
    yield db
    db.close()


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text for m in messages if isinstance(m, UserMessage)]


def rows(raw: sqlite3.Connection, key: str) -> list[tuple[int, ChatMessage]]:
    """The conversation's rows as stored: (seq, message), by seq."""
    found = raw.execute("SELECT seq, body FROM agentrt_messages WHERE key = ? ORDER BY seq", (key,))
    return [(seq, message_from_json(body)) for seq, body in found]


def stored_texts(raw: sqlite3.Connection, key: str) -> list[str]:
    return texts([m for _, m in rows(raw, key)])


def lease(raw: sqlite3.Connection, key: str) -> tuple[str, float] | None:
    """The lease row as stored: (owner, expires)."""
    row = raw.execute("SELECT owner, expires FROM agentrt_leases WHERE key = ?", (key,)).fetchone()
    return None if row is None else (row[0], row[1])


def lease_owner(raw: sqlite3.Connection, key: str) -> str | None:
    row = lease(raw, key)
    return None if row is None else row[0]


async def wait_until_taken(store: SQLiteStore, key: str, owner: str, *, within: float) -> float:
    """Poll `try_lock` until it succeeds (bounded by `within` seconds); the seconds it took."""
    start = anyio.current_time()
    with anyio.fail_after(within):
        while True:
            if await store.try_lock(key, owner):
                break
            await anyio.sleep(0.02)
    return anyio.current_time() - start


async def test_is_a_shared_store(store: SQLiteStore, path: Path) -> None:
    assert isinstance(store, ChatMemoryStore)
    assert isinstance(store, SharedChatMemoryStore)
    assert repr(store) == f"SQLiteStore({str(path)!r}, lease_seconds=30.0)"
    for bad in (0, -1.0, True):
        with pytest.raises(ConfigurationError):
            SQLiteStore(path, lease_seconds=bad)
    with pytest.raises(ConfigurationError):
        SQLiteStore(":memory:")


async def test_the_file_is_made_on_first_use_in_wal_mode(store: SQLiteStore, path: Path) -> None:
    assert not await anyio.Path(path).exists()
    assert await store.load("c") == []
    with closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"agentrt_messages", "agentrt_leases"}


async def test_conversations_survive_a_restart(path: Path) -> None:
    first = SQLiteStore(path)
    await first.commit("a", [user("1"), user("2")])
    await first.commit("b", [user("x")])
    await first.commit("a", [user("3")], drop=1)
    first.close()
    assert texts(await first.load("a")) == ["2", "3"]  # a closed store reopens its connections
    first.close()

    second = SQLiteStore(path)
    try:
        assert texts(await second.load("a")) == ["2", "3"]
        assert texts(await second.load("b")) == ["x"]
        await second.commit("a", [user("4")])
        assert texts(await second.load("a")) == ["2", "3", "4"]
    finally:
        second.close()


async def test_every_field_round_trips_one_row_per_message(
    store: SQLiteStore, path: Path, raw: sqlite3.Connection
) -> None:
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
    await store.commit("conv", messages[:2])
    await store.commit("conv", messages[2:])

    assert await store.load("conv") == messages
    assert rows(raw, "conv") == list(enumerate(messages, 1))
    fresh = SQLiteStore(path)
    try:
        assert await fresh.load("conv") == messages
    finally:
        fresh.close()
    assert await store.load("never-written") == []


async def test_commit_drops_then_appends(store: SQLiteStore, raw: sqlite3.Connection) -> None:
    await store.commit("c", [user(str(i)) for i in range(5)])
    await store.commit("other", [user("untouched")])
    await store.commit("c", [user("5"), user("6")], drop=2)
    assert [(seq, m.text) for seq, m in rows(raw, "c") if isinstance(m, UserMessage)] == [
        (3, "2"),
        (4, "3"),
        (5, "4"),
        (6, "5"),
        (7, "6"),
    ]
    await store.commit("c", [], drop=10)
    assert rows(raw, "c") == []
    await store.commit("c", [user("again")])
    assert stored_texts(raw, "c") == ["again"]
    await store.replace("c", [user("r1"), user("r2")])
    assert stored_texts(raw, "c") == ["r1", "r2"]
    await store.delete("c")
    await store.delete("c")  # a missing conversation is not an error
    assert rows(raw, "c") == []
    assert stored_texts(raw, "other") == ["untouched"]
    with pytest.raises(ValueError, match="negative"):
        await store.commit("other", [], drop=-1)


async def test_a_commit_that_fails_half_way_changes_nothing(
    store: SQLiteStore, other: SQLiteStore, raw: sqlite3.Connection
) -> None:
    """The drop runs before the insert fails: the transaction rolls both back, and leaves no
    transaction open (the same store and another one can write next)."""
    await store.commit("c", [user("a"), user("b"), user("c")])
    raw.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON agentrt_messages "
        "WHEN NEW.body LIKE '%refused%' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        await store.commit("c", [user("ok"), user("refused")], drop=2)
    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        await store.replace("c", [user("refused")])
    assert stored_texts(raw, "c") == ["a", "b", "c"]

    with anyio.fail_after(5):  # a transaction left open would hold the write lock for 10 s
        await other.commit("c", [user("d")], drop=1)
        await store.commit("c", [user("e")], drop=1)
    assert stored_texts(raw, "c") == ["c", "d", "e"]


async def test_commit_with_drop_is_atomic_for_concurrent_readers(
    store: SQLiteStore, other: SQLiteStore
) -> None:
    """Each commit drops 2 and appends 2: a reader must always see 6 consecutive messages, never the
    rows between the drop and the insert."""
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
    assert texts(await store.load("c")) == [str(i) for i in range(2 * commits, 2 * commits + size)]


async def test_writes_with_a_wrong_or_missing_owner_change_nothing(
    store: SQLiteStore, other: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.commit("c", [user("a"), user("b")])
    before = rows(raw, "c")

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
    assert rows(raw, "c") == before
    assert lease_owner(raw, "c") == "alice"

    # The holder's writes go through, from any store on the file.
    await other.commit("c", [user("c")], drop=1, owner="alice")
    assert stored_texts(raw, "c") == ["b", "c"]
    await other.replace("c", [user("r")], owner="alice")
    assert stored_texts(raw, "c") == ["r"]
    await other.delete("c", owner="alice")
    assert rows(raw, "c") == []
    await store.unlock("c", "alice")
    assert lease(raw, "c") is None

    # Unlocked: the former holder is refused too.
    with pytest.raises(ConversationLockLostError):
        await store.commit("c", [user("late")], owner="alice")
    assert rows(raw, "c") == []


async def test_an_expired_lease_nobody_took_still_lets_its_owner_write(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    assert await store.try_lock("c", "alice")
    store.renewer.release("c", "alice")
    raw.execute("UPDATE agentrt_leases SET expires = ? WHERE key = 'c'", (time.time() - 60,))
    await store.commit("c", [user("mine")], owner="alice")
    assert stored_texts(raw, "c") == ["mine"]


async def test_only_one_of_several_stores_gets_the_lock(tmp_path: Path) -> None:
    """On a fresh file each round, so the stores also make the schema at the same time."""
    for round_ in range(10):
        path = tmp_path / f"race{round_}.db"
        stores = [SQLiteStore(path) for _ in range(6)]
        results: dict[int, bool] = {}

        async def take(i: int, store: SQLiteStore, results: dict[int, bool] = results) -> None:
            results[i] = await store.try_lock("k", f"owner{i}")

        try:
            async with anyio.create_task_group() as tg:
                for i, s in enumerate(stores):
                    tg.start_soon(take, i, s)
            winners = [i for i, taken in results.items() if taken]
            assert len(winners) == 1, results
            (winner,) = winners
            with closing(sqlite3.connect(path)) as raw:
                assert raw.execute("SELECT owner FROM agentrt_leases").fetchall() == [(f"owner{winner}",)]
            loser = stores[(winner + 1) % len(stores)]
            assert not await loser.try_lock("k", "late")
            assert not await stores[winner].try_lock("k", f"owner{winner}")  # not reentrant
            await stores[winner].unlock("k", f"owner{winner}")
            assert await loser.try_lock("k", "late")
            await loser.unlock("k", "late")
        finally:
            for s in stores:
                s.close()


async def test_unlock_by_another_owner_does_nothing(store: SQLiteStore, raw: sqlite3.Connection) -> None:
    assert await store.try_lock("c", "alice")
    await store.unlock("c", "bob")
    assert lease_owner(raw, "c") == "alice"
    assert store.renewer.held() == {("c", "alice")}
    await store.unlock("c", "alice")
    assert lease(raw, "c") is None
    assert store.renewer.held() == frozenset()


async def test_a_lock_no_longer_renewed_expires(path: Path, raw: sqlite3.Connection) -> None:
    lease_seconds = 0.3
    holder = SQLiteStore(path, lease_seconds=lease_seconds)
    taker = SQLiteStore(path, lease_seconds=lease_seconds)
    try:
        await holder.commit("c", [user("a")])
        assert await holder.try_lock("c", "alice")
        holder.renewer.release("c", "alice")  # as if the holder's process stopped renewing

        assert not await taker.try_lock("c", "bob")
        waited = await wait_until_taken(taker, "c", "bob", within=5.0)
        assert waited > lease_seconds / 3  # it was still alive for a while after the last renewal
        assert lease_owner(raw, "c") == "bob"

        with pytest.raises(ConversationLockLostError):
            await holder.commit("c", [user("late")], owner="alice")
        assert stored_texts(raw, "c") == ["a"]
        await taker.unlock("c", "bob")
    finally:
        holder.close()
        taker.close()


async def test_a_live_holders_lease_is_renewed(path: Path, raw: sqlite3.Connection) -> None:
    lease_seconds = 0.3
    holder = SQLiteStore(path, lease_seconds=lease_seconds)
    taker = SQLiteStore(path, lease_seconds=lease_seconds)
    try:
        assert await holder.try_lock("c", "alice")
        start = anyio.current_time()
        checks = 0
        with anyio.fail_after(10):
            while anyio.current_time() - start < 1.0:
                assert not await taker.try_lock("c", "bob")
                row = lease(raw, "c")
                assert row is not None
                owner, expires = row
                assert owner == "alice"
                assert 0 < expires - time.time() <= lease_seconds
                checks += 1
                await anyio.sleep(lease_seconds / 5)
        assert checks >= 5

        # The renewer is a thread: it renews even while the event loop is blocked.
        time.sleep(3 * lease_seconds)  # noqa: ASYNC251 (blocking the loop is the point)
        assert not await taker.try_lock("c", "bob")

        await holder.commit("c", [user("still mine")], owner="alice")
        assert stored_texts(raw, "c") == ["still mine"]
        await holder.unlock("c", "alice")
        assert await taker.try_lock("c", "bob")
        await taker.unlock("c", "bob")
    finally:
        holder.close()
        taker.close()


async def test_a_lease_taken_by_another_owner_is_no_longer_renewed(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    fast = SQLiteStore(store.path, lease_seconds=0.3)
    try:
        assert await fast.try_lock("c", "alice")
        raw.execute("UPDATE agentrt_leases SET owner = 'bob' WHERE key = 'c'")
        with anyio.fail_after(5):
            while True:
                if not fast.renewer.held():
                    break
                await anyio.sleep(0.02)
        assert lease_owner(raw, "c") == "bob"
    finally:
        fast.close()


async def test_a_cancelled_write_completes(store: SQLiteStore, path: Path, raw: sqlite3.Connection) -> None:
    """The write waits for another connection's write lock; cancelled meanwhile, it is not
    abandoned: the call returns only once the write happened."""
    await store.commit("c", [user("a"), user("b")])
    blocker = sqlite3.connect(path, isolation_level=None)
    released = anyio.Event()
    try:
        blocker.execute("BEGIN IMMEDIATE")

        async def release_later(scope: anyio.CancelScope) -> None:
            with anyio.fail_after(5):
                while True:
                    if scope.cancel_called:
                        break
                    await anyio.sleep(0.01)
            await anyio.sleep(0.1)
            blocker.execute("COMMIT")
            released.set()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                with anyio.move_on_after(0.1) as scope:
                    tg.start_soon(release_later, scope)
                    await store.commit("c", [user("c")], drop=1)
                assert released.is_set()
        assert stored_texts(raw, "c") == ["b", "c"]
    finally:
        blocker.close()


CHILD = """
import sys

import anyio

from agentrt.memory._sqlite import SQLiteStore


async def main() -> None:
    path, lease, key, owner = sys.argv[1:]
    store = SQLiteStore(path, lease_seconds=float(lease))
    assert await store.try_lock(key, owner)
    print("locked", flush=True)
    await anyio.sleep_forever()


anyio.run(main)
"""


async def test_the_lock_of_a_killed_process_expires(
    store: SQLiteStore, path: Path, raw: sqlite3.Connection
) -> None:
    lease_seconds = 1.0
    command = [sys.executable, "-c", CHILD, str(path), str(lease_seconds), "c", "child"]
    process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=None)
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            output = b""
            while b"\n" not in output:
                output += await process.stdout.receive()
        assert output == b"locked\n"
        assert lease_owner(raw, "c") == "child"

        # The child renews its lease: still held after two leases.
        start = anyio.current_time()
        with anyio.fail_after(10):
            while anyio.current_time() - start < 2 * lease_seconds:
                assert not await store.try_lock("c", "parent")
                await anyio.sleep(0.1)
        assert process.returncode is None
        assert lease_owner(raw, "c") == "child"

        process.kill()  # SIGKILL: no cleanup runs in the child
        await process.wait()
        assert not await store.try_lock("c", "parent")  # the lease outlives the process a while
        await wait_until_taken(store, "c", "parent", within=10.0)
        assert lease_owner(raw, "c") == "parent"
        await store.unlock("c", "parent")
        assert lease(raw, "c") is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()
