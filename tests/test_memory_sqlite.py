"""`SQLiteStore` on a file in `tmp_path`: what only this store does.

Every assertion reads the state back from the file (through a fresh store or a raw sqlite3
connection). Several stores on one file stand for several processes (each has its own connections,
as processes do). What both shared stores promise (locks, leases, owner checks, atomic commits, a
killed process's lock) is tested in tests/test_memory_shared_stores.py; what every store keeps, in
tests/test_memory_stores.py.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path

import anyio
import depth
import pytest

from agentrt._errors import ConfigurationError
from agentrt._messages import AssistantMessage, ChatMessage, UserMessage, message_from_json
from agentrt.memory._sqlite import SQLiteStore


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


async def test_repr_and_a_file_is_required(store: SQLiteStore, path: Path) -> None:
    assert repr(store) == f"SQLiteStore({str(path)!r}, lease_seconds=30.0)"
    with pytest.raises(ConfigurationError):
        SQLiteStore(":memory:")


async def test_the_file_is_made_on_first_use_in_wal_mode(store: SQLiteStore, path: Path) -> None:
    assert not await anyio.Path(path).exists()
    assert await store.load("c") == []
    with closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"agentrt_messages", "agentrt_leases", "agentrt_pending", "agentrt_turns"}


async def test_stores_opening_a_new_file_at_once_all_make_it_and_one_gets_the_lock(tmp_path: Path) -> None:
    """Switching a new file to WAL needs it to itself: stores that open it at once must wait, not fail."""
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
        finally:
            for s in stores:
                s.close()
        winners = [i for i, taken in results.items() if taken]
        assert len(winners) == 1, results
        with closing(sqlite3.connect(path)) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert raw.execute("SELECT owner FROM agentrt_leases").fetchall() == [(f"owner{winners[0]}",)]


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


async def test_one_row_per_message_numbered_by_seq(store: SQLiteStore, raw: sqlite3.Connection) -> None:
    messages: list[ChatMessage] = [user("0"), AssistantMessage(text="a"), user("1")]
    await store.commit("conv", messages[:2])
    await store.commit("conv", messages[2:])
    assert rows(raw, "conv") == list(enumerate(messages, 1))

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
    assert rows(raw, "c") == []
    assert stored_texts(raw, "other") == ["untouched"]


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


async def test_an_expired_lease_nobody_took_still_lets_its_owner_write(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    """Unlike Redis, where an expired lease is gone, the row stays until someone takes it."""
    assert await store.try_lock("c", "alice")
    store.renewer.release("c", "alice")
    raw.execute("UPDATE agentrt_leases SET expires = ? WHERE key = 'c'", (time.time() - 60,))
    await store.commit("c", [user("mine")], owner="alice")
    assert stored_texts(raw, "c") == ["mine"]


CLOSE_WHILE_RENEWING = """
import sys

import anyio

from agentrt.memory import SQLiteStore


async def main() -> None:
    store = SQLiteStore(sys.argv[1], lease_seconds=0.1)
    for round_ in range(int(sys.argv[2])):
        for index in range(300):
            await store.try_lock(f"k{index}", "me")  # turns hold their conversations
        await anyio.sleep(0.03 + (round_ % 7) * 0.002)  # while the renewer renews them
        store.close()
        for index in range(300):
            await store.unlock(f"k{index}", "me")
    print("survived")


anyio.run(main)
"""


# On asyncio only: the child runs its own event loop (asyncio, `anyio.run`) whatever the test runs on;
# this process only waits for it, so a trio run would repeat the asyncio one (19 s each).
# A race hunted by repetition: 60 rounds under `make test-deep`, 12 in `make test`.
@pytest.mark.exhaustive
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_closing_while_the_renewer_works_does_not_crash_the_process(tmp_path: Path) -> None:
    # Closing a connection another thread is using crashes the process (SIGSEGV): run it in a child.
    rounds = "60" if depth.FULL else "12"
    result = await anyio.run_process(
        [sys.executable, "-c", CLOSE_WHILE_RENEWING, str(tmp_path / "chat.db"), rounds], check=False
    )
    assert result.returncode == 0, (result.returncode, result.stderr.decode(errors="replace")[-2000:])
    assert result.stdout.decode().strip() == "survived"
