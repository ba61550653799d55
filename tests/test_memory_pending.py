"""The `PendingStore` contract (turns waiting for approval) on every built-in store.

Each test runs on `InMemoryStore`, `SQLiteStore` and `RedisStore` (a real redis-server), on asyncio and
trio. Where a store can have a second instance on the same data (the same file, the same server and
prefix), what was written is read back through it: what is asserted is what the store holds, not
what one object remembers. Owner checks are the shared stores' only (the in-memory store has no
leases). The last section resumes a turn waiting for approval on Redis whose claim's reply was lost
on the way back (tests/test_approval.py's service).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import redis
from test_approval import ANSWER, GATED_ROUND, pending_of, service, suspended

import agentrt
from agentrt import ApprovalNotFoundError, Approve, ConversationLockLostError, UserMessage
from agentrt.memory import (
    InMemoryStore,
    PendingStore,
    RedisStore,
    SharedChatMemoryStore,
    SQLiteStore,
)

Store = InMemoryStore | SQLiteStore | RedisStore
Factory = Callable[[], Store]
"""Makes another store on the same data (another process's view, for the shared stores); the
in-memory store has one instance, which it returns each time."""

KEY = 'pending:"c"'
DATA = bytes(range(256)) * 3 + b'{"json": "\\u0000"} \xff\xfe'  # every byte value, NUL included
SHARED = pytest.mark.parametrize("stores", ["sqlite", "redis"], indirect=True)
"""For what only the shared stores do: leases (the in-memory store has none), instances on the same
data (it has one per process)."""


class Stores:
    def __init__(self, kind: str, factory: Factory) -> None:
        self.kind = kind
        self.make = factory


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    kind: str = request.param
    made: list[SQLiteStore | RedisStore] = []
    if kind == "memory":
        single = InMemoryStore()

        def factory() -> Store:
            return single

    elif kind == "sqlite":
        path = tmp_path / "pending.db"

        def factory() -> Store:
            store = SQLiteStore(path, lease_seconds=5)
            made.append(store)
            return store

    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"test-{uuid.uuid4().hex[:12]}:"  # tests share the server, never a key

        def factory() -> Store:
            store = RedisStore(url, prefix=prefix, lease_seconds=5)
            made.append(store)
            return store

    yield Stores(kind, factory)
    for store in made:
        await store.aclose()


def user(text: str) -> UserMessage:
    return UserMessage.of(text)


async def test_every_store_keeps_pending_turns(stores: Stores) -> None:
    assert isinstance(stores.make(), PendingStore)


async def test_save_load_take_round_trip(stores: Stores) -> None:
    store, other = stores.make(), stores.make()
    assert await store.load_pending(KEY) is None
    await store.save_pending(KEY, "run-1", DATA)
    found = await other.load_pending(KEY)
    assert found == ("run-1", DATA)
    assert found is not None
    assert type(found[0]) is str
    assert type(found[1]) is bytes
    assert await other.load_pending(KEY) == ("run-1", DATA)  # loading does not take

    taken = await other.take_pending(KEY, "run-1")
    assert taken == DATA
    assert type(taken) is bytes
    assert await store.load_pending(KEY) is None
    assert await other.load_pending(KEY) is None


async def test_a_large_record_round_trips(stores: Stores) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    store, other = stores.make(), stores.make()
    await store.save_pending(KEY, "big", data)
    assert await other.take_pending(KEY, "big") == data


async def test_take_with_another_run_id_returns_none_and_leaves_the_record(stores: Stores) -> None:
    store, other = stores.make(), stores.make()
    await store.save_pending(KEY, "run-1", DATA)
    assert await other.take_pending(KEY, "run-2") is None
    assert await other.take_pending(KEY, "") is None
    assert await other.take_pending(KEY, "run-1 ") is None
    assert await store.load_pending(KEY) == ("run-1", DATA)
    assert await other.take_pending(KEY, "run-1") == DATA


async def test_a_second_take_returns_none(stores: Stores) -> None:
    store, other = stores.make(), stores.make()
    await store.save_pending(KEY, "run-1", DATA)
    assert await store.take_pending(KEY, "run-1") == DATA
    assert await store.take_pending(KEY, "run-1") is None
    assert await other.take_pending(KEY, "run-1") is None
    assert await other.take_pending("never-saved", "run-1") is None
    assert await other.load_pending(KEY) is None


async def test_save_replaces_the_conversations_pending_turn(stores: Stores) -> None:
    store, other = stores.make(), stores.make()
    await store.save_pending(KEY, "run-1", b"first")
    await other.save_pending(KEY, "run-2", b"second")
    assert await store.load_pending(KEY) == ("run-2", b"second")
    assert await store.take_pending(KEY, "run-1") is None  # replaced: gone
    assert await store.load_pending(KEY) == ("run-2", b"second")
    await store.save_pending(KEY, "run-2", b"second, saved again")  # the same run, new data
    assert await other.load_pending(KEY) == ("run-2", b"second, saved again")
    assert await other.take_pending(KEY, "run-2") == b"second, saved again"
    assert await store.load_pending(KEY) is None


async def test_conversations_have_pending_turns_of_their_own(stores: Stores) -> None:
    store, other = stores.make(), stores.make()
    await store.save_pending("a", "run-a", b"A")
    await store.save_pending("b", "run-b", b"B")
    assert await other.take_pending("a", "run-b") is None  # another conversation's run
    assert await other.take_pending("b", "run-a") is None
    assert await other.take_pending("a", "run-a") == b"A"
    assert await other.load_pending("a") is None
    assert await other.load_pending("b") == ("run-b", b"B")


async def test_pending_turns_are_independent_of_the_conversations_messages(stores: Stores) -> None:
    store, other = stores.make(), stores.make()
    await store.commit(KEY, [user("a"), user("b")])
    await store.save_pending(KEY, "run-1", DATA)
    assert [m.text for m in await other.load(KEY)] == ["a", "b"]  # a save leaves the messages

    await other.commit(KEY, [user("c")], drop=1)
    assert await store.load_pending(KEY) == ("run-1", DATA)
    await other.replace(KEY, [user("r")])
    assert await store.load_pending(KEY) == ("run-1", DATA)
    await other.delete(KEY)
    assert await store.load_pending(KEY) == ("run-1", DATA)
    assert await store.load(KEY) == []

    await store.commit(KEY, [user("after")])
    assert await other.take_pending(KEY, "run-1") == DATA
    assert [m.text for m in await store.load(KEY)] == ["after"]  # a take leaves the messages


@SHARED
async def test_owner_checks_on_the_shared_stores(stores: Stores) -> None:
    """With `owner`, a save or a take is done only while `owner` holds the conversation's lock;
    otherwise `ConversationLockLostError`, and nothing changed."""
    store, other = stores.make(), stores.make()
    assert isinstance(store, SharedChatMemoryStore)
    assert isinstance(other, SharedChatMemoryStore)

    # Nobody holds the lock: an owner's writes are refused.
    with pytest.raises(ConversationLockLostError):
        await store.save_pending(KEY, "run-1", DATA, owner="alice")
    assert await other.load_pending(KEY) is None

    assert await other.try_lock(KEY, "bob")
    await other.save_pending(KEY, "run-1", DATA, owner="bob")
    assert await store.load_pending(KEY) == ("run-1", DATA)

    # Held by bob: alice can neither replace nor take it.
    with pytest.raises(ConversationLockLostError):
        await store.save_pending(KEY, "run-2", b"alice's", owner="alice")
    with pytest.raises(ConversationLockLostError):
        await store.take_pending(KEY, "run-1", owner="alice")
    with pytest.raises(ConversationLockLostError):
        await store.take_pending(KEY, "no-such-run", owner="alice")
    assert await other.load_pending(KEY) == ("run-1", DATA)

    # bob gives it up; alice takes the lock and the record.
    await other.unlock(KEY, "bob")
    with pytest.raises(ConversationLockLostError):
        await other.take_pending(KEY, "run-1", owner="bob")
    assert await store.load_pending(KEY) == ("run-1", DATA)
    assert await store.try_lock(KEY, "alice")
    assert await store.take_pending(KEY, "run-2", owner="alice") is None  # held, but another run
    assert await store.take_pending(KEY, "run-1", owner="alice") == DATA
    assert await other.load_pending(KEY) is None
    await store.unlock(KEY, "alice")


@SHARED
async def test_the_lock_of_one_conversation_does_not_cover_another(stores: Stores) -> None:
    store = stores.make()
    assert isinstance(store, SharedChatMemoryStore)
    assert await store.try_lock("a", "alice")
    with pytest.raises(ConversationLockLostError):
        await store.save_pending("b", "run-b", b"B", owner="alice")
    assert await store.load_pending("b") is None
    await store.save_pending("a", "run-a", b"A", owner="alice")
    await store.unlock("a", "alice")


async def _race(takers: list[PendingStore], rounds: int) -> None:
    """`rounds` times: save a record, then take it from every taker at once; exactly one gets it."""

    async def take(store: PendingStore, run: str, got: list[bytes | None]) -> None:
        got.append(await store.take_pending(KEY, run))

    saver = takers[0]
    for index in range(rounds):
        run, data = f"run-{index}", f"data {index}".encode()
        await saver.save_pending(KEY, run, data)
        got: list[bytes | None] = []
        async with anyio.create_task_group() as group:
            for store in takers:
                group.start_soon(take, store, run, got)
        assert sorted(got, key=lambda value: value is not None) == [None] * (len(takers) - 1) + [data]
        assert await saver.load_pending(KEY) is None


async def test_concurrent_takes_in_one_store_give_the_record_once(stores: Stores) -> None:
    store = stores.make()
    await _race([store, store, store], rounds=30)


@SHARED
async def test_concurrent_takes_in_two_stores_give_the_record_once(stores: Stores) -> None:
    await _race([stores.make(), stores.make(), stores.make(), stores.make()], rounds=30)


async def test_an_in_memory_store_never_evicts_a_pending_turn() -> None:
    """The conversations' bound and TTL do not forget a turn while a human decides."""
    store = InMemoryStore(max_conversations=1)
    await store.save_pending(KEY, "run-1", DATA)
    await store.commit(KEY, [user("a")])
    for index in range(3):
        await store.commit(f"other-{index}", [user("b")])
    assert await store.load(KEY) == []  # the conversation was evicted...
    assert await store.take_pending(KEY, "run-1") == DATA  # ...its pending turn was not


async def test_the_pending_contract_save_load_take_once(stores: Stores) -> None:
    store = stores.make()
    assert await store.load_pending("k") is None
    assert await store.take_pending("k", "r1") is None
    await store.save_pending("k", "r1", b"one")
    await store.save_pending("k2", "r9", b"other conversation")
    assert await store.load_pending("k") == ("r1", b"one")
    assert await store.take_pending("k", "r2") is None  # another run: nothing taken
    assert await store.load_pending("k") == ("r1", b"one")
    await store.save_pending("k", "r2", b"two")  # a newer turn replaces the waiting one
    assert await store.take_pending("k", "r1") is None
    assert await store.take_pending("k", "r2") == b"two"
    assert await store.take_pending("k", "r2") is None  # once
    assert await store.load_pending("k") is None
    assert await store.load_pending("k2") == ("r9", b"other conversation")
    big = bytes(range(256)) * 40_000  # 10 MB, every byte value
    await store.save_pending("k", "r3", big)
    assert await store.take_pending("k", "r3") == big


# --- Redis: a take whose reply is lost is retried by redis-py ---------------------------------------


class _LoseOneReply(redis.Connection):
    """A connection that loses the reply of the first take script after the server ran it (the
    connection drops on the way back): redis-py reconnects and sends the command again."""

    armed: ClassVar[list[bool]] = []

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        self._last = args
        super().send_command(*args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)
        last: tuple[Any, ...] = getattr(self, "_last", ())
        script = bool(last) and str(last[0]).upper() in ("EVALSHA", "EVAL")
        if self.armed and script and b"run-to-take" in _args(last):
            self.armed.clear()
            self.disconnect()
            raise redis.ConnectionError("the reply was lost on the way back")
        return reply


def _args(command: tuple[Any, ...]) -> bytes:
    return b" ".join(a if isinstance(a, bytes) else str(a).encode() for a in command)


async def test_a_redis_take_retried_after_a_lost_reply_still_returns_the_record(redis_url: str) -> None:
    """redis-py retries a command whose reply was lost; the first attempt took the record, so the
    retry must give it back (not `None`: the turn would be gone, and its approval lost)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    pool = redis.ConnectionPool.from_url(
        redis_url, connection_class=_LoseOneReply, retry=Retry(NoBackoff(), 3)
    )
    client = redis.Redis(connection_pool=pool)
    store = RedisStore(client=client, prefix=prefix)
    check = RedisStore(redis_url, prefix=prefix)
    try:
        await store.save_pending(KEY, "run-to-take", DATA)  # (the run id marks the take's command)
        _LoseOneReply.armed[:] = [True]
        assert await store.take_pending(KEY, "run-to-take") == DATA
        assert not _LoseOneReply.armed  # the reply was lost once, and the command retried
        assert await check.load_pending(KEY) is None
        assert await store.take_pending(KEY, "run-to-take") is None  # a later take finds nothing
    finally:
        _LoseOneReply.armed.clear()
        await store.aclose()
        await check.aclose()
        client.close()


# --- Redis: a resume whose claim's reply is lost runs the approved call once, or still waits ------


@pytest.fixture
def lost_reply(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Drop the reply of the next EVALSHA of a script (the server ran it): what a timeout or a dropped
    connection does; a client with retries sends the command again."""
    import redis
    import redis.connection

    state: dict[str, Any] = {"sha": None}
    send, read = (
        redis.connection.AbstractConnection.send_command,
        redis.connection.AbstractConnection.read_response,
    )

    def sending(self: Any, *args: Any, **kw: Any) -> Any:
        self._last_sent = args
        return send(self, *args, **kw)

    def reading(self: Any, *args: Any, **kw: Any) -> Any:
        reply = read(self, *args, **kw)
        last = getattr(self, "_last_sent", ())
        if state["sha"] is not None and last[:2] == ("EVALSHA", state["sha"]):
            state["sha"] = None
            self.disconnect()
            raise redis.ConnectionError("the reply was lost")
        return reply

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_command", sending)
    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", reading)
    return state


async def test_a_redis_claim_whose_reply_was_lost_and_retried_still_runs_the_approved_call(
    redis_url: str, lost_reply: Any
) -> None:
    import redis

    from agentrt.memory import RedisStore

    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    # A client of the user's own, as RedisStore(client=...) takes it: redis-py retries 3 times.
    store = RedisStore(client=redis.Redis(host=host, port=int(port)), prefix=f"test-{uuid.uuid4().hex[:8]}:")
    try:
        svc, _, shop = service(GATED_ROUND, ANSWER, store=store)
        approval = await suspended(svc)
        lost_reply["sha"] = store._take_pending.sha
        try:
            result = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
        except ApprovalNotFoundError:
            result = None
        # Either the claim counts (the call runs once) or the run still waits: never lost.
        assert result == "Done." or (await pending_of(svc)) is not None
        assert shop.ran.count(("refund", ("A1", 250.0))) == (1 if result == "Done." else 0)
    finally:
        await store.aclose()


async def test_a_redis_claim_whose_reply_was_lost_without_retries_puts_the_run_back(
    redis_url: str, lost_reply: Any
) -> None:
    import redis

    from agentrt.memory import RedisStore

    store = RedisStore(redis_url, prefix=f"test-{uuid.uuid4().hex[:8]}:")  # its own client: no retries
    try:
        svc, _, shop = service(GATED_ROUND, ANSWER, store=store)
        approval = await suspended(svc)
        lost_reply["sha"] = store._take_pending.sha
        with pytest.raises(redis.ConnectionError):
            await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
        assert (await pending_of(svc)) is not None and len(shop.ran) == 2
        assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
        assert shop.ran.count(("refund", ("A1", 250.0))) == 1
    finally:
        await store.aclose()
