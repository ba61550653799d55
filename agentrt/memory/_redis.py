"""`RedisStore`: chat memory that processes on several hosts share, kept in Redis.

A conversation is a Redis list at `{prefix}conv:{key}`, one JSON message per item (`message_to_json`),
so a commit appends without rewriting what is stored. Its lock is a string at `{prefix}lock:{key}`
holding the owner with a `PX` expiry (the lease), renewed by a `LeaseRenewer` thread while held (and
while the event loop that took it answers).

redis-py's asyncio client runs on asyncio only and agentrt also runs on trio, so the store uses the
blocking client (a thread-safe connection pool) and runs each operation in a worker thread with
`anyio.to_thread.run_sync`. A cancelled operation is never abandoned: the thread finishes it, so a
write happened entirely or not at all. Each operation is one round trip (one command or one Lua
script), so it is also atomic on the server: the owner check and the write cannot be split by another
client's command.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, cast

import anyio.to_thread

from .._errors import ConfigurationError, ConversationLockLostError
from .._messages import message_from_json, message_to_json
from ._lease import LeaseRenewer, check_lease_seconds
from ._store import TURNS_REMEMBERED

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    import redis
    from redis.commands.core import Script

    from .._messages import ChatMessage

__all__ = ["RedisStore"]

_DEFAULT_URL = "redis://127.0.0.1:6379/0"

# How long a write's id is remembered (ms). redis-py retries a command after a timeout or a dropped
# connection, and the first attempt may have run on the server: the retry must not append twice.
# Retries end within about a minute (3 retries, a 10 s socket timeout, backoff capped at 10 s).
_OP_MEMORY_MS = 300_000

# Lua's `unpack` puts every value on the stack: push long conversations in chunks.
# A commit with a turn id (ARGV[7], '' for none) is done once: the ids of the last TURNS_REMEMBERED
# (ARGV[8]) turns committed with one are a list at KEYS[4]; `delete` removes it with the conversation.
_WRITE = """
if redis.call('GET', KEYS[3]) == ARGV[1] then return 1 end
if ARGV[7] ~= '' and redis.call('LPOS', KEYS[4], ARGV[7]) then return 1 end
if ARGV[2] == '1' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
if ARGV[4] == 'commit' then
  local drop = tonumber(ARGV[5])
  if drop > 0 then redis.call('LTRIM', KEYS[1], drop, -1) end
else
  redis.call('DEL', KEYS[1])
end
if ARGV[4] == 'delete' then redis.call('DEL', KEYS[4]) end
if ARGV[7] ~= '' then
  redis.call('LPUSH', KEYS[4], ARGV[7])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[8]) - 1)
end
for i = 9, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[6])
return 1
"""

# The pending turn of a conversation: a hash {run, data} at `{prefix}pending:{key}`.
_SAVE_PENDING = """
if ARGV[1] == '1' and redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'run', ARGV[3], 'data', ARGV[4])
return 1
"""

# A take moves the hash to `{prefix}taken:{take id}` for a few minutes rather than deleting it: a take
# redis-py retries after a lost reply finds it there and returns the same data (else the retry would
# find nothing, and the turn would be gone with nobody holding it).
_TAKE_PENDING = """
local taken = redis.call('HGET', KEYS[3], 'data')
if taken then return {1, taken} end
if ARGV[1] == '1' and redis.call('GET', KEYS[2]) ~= ARGV[2] then return {0} end
if redis.call('HGET', KEYS[1], 'run') ~= ARGV[3] then return {1} end
local data = redis.call('HGET', KEYS[1], 'data')
redis.call('RENAME', KEYS[1], KEYS[3])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {1, data}
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# The lock for ARGV[1] if it is free (an expired lease is gone) or ARGV[1] holds it already.
_TAKE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

_RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
  else
    lost[#lost + 1] = i
  end
end
return lost
"""


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as error:
        raise ImportError(
            "RedisStore needs the redis client, which is not installed: pip install 'agentrt[redis]'"
        ) from error
    return redis


class RedisStore:
    """A `SharedChatMemoryStore` in Redis, for processes on several hosts.

    Give a `url` (a pool of connections is made for it, with a 10 s socket timeout so that a dead
    server fails an operation instead of hanging it) or your own `client` (a blocking `redis.Redis`:
    its pool, timeouts and retries are used as they are). Keys start with `prefix`. A lock is a lease
    of `lease_seconds`, renewed every third of it while held by a live event loop: a holder that
    crashed, or whose event loop is blocked, loses it within one lease (and a third).

    Every operation runs in a worker thread as one command or one Lua script. Writes carry an id the
    server remembers for a few minutes, so a write redis-py retries after a lost reply is applied once.
    Keys of one conversation are touched together by scripts: Redis Cluster is not supported.
    """

    def __init__(
        self,
        url: str = _DEFAULT_URL,
        *,
        client: redis.Redis | None = None,
        prefix: str = "agentrt:",
        lease_seconds: float = 30.0,
    ) -> None:
        lease_seconds = check_lease_seconds(lease_seconds, "RedisStore")
        if client is not None and url != _DEFAULT_URL:
            raise ConfigurationError("RedisStore: give either `url` or `client`, not both")
        if client is None:
            client = _import_redis().Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=10.0)
            self._owns_client = True
        else:
            self._owns_client = False
        self._client: redis.Redis = client
        self._prefix = prefix
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._write: Script = client.register_script(_WRITE)
        self._unlock: Script = client.register_script(_UNLOCK)
        self._take: Script = client.register_script(_TAKE)
        self._renew_script: Script = client.register_script(_RENEW)
        self._save_pending: Script = client.register_script(_SAVE_PENDING)
        self._take_pending: Script = client.register_script(_TAKE_PENDING)
        self._renewer = LeaseRenewer(self._renew, lease_seconds / 3, name=f"agentrt RedisStore {prefix}")

    @property
    def renewer(self) -> LeaseRenewer:
        """The thread that renews this store's held leases (`held()` lists them)."""
        return self._renewer

    def _conv(self, key: str) -> str:
        return f"{self._prefix}conv:{key}"

    def _lock(self, key: str) -> str:
        return f"{self._prefix}lock:{key}"

    def _op(self, key: str) -> str:
        return f"{self._prefix}op:{key}"

    async def load(self, key: str) -> list[ChatMessage]:
        """The conversation's messages, oldest first (one LRANGE)."""

        def read() -> list[bytes]:
            return cast("list[bytes]", self._client.lrange(self._conv(key), 0, -1))

        return [message_from_json(item) for item in await anyio.to_thread.run_sync(read)]

    async def commit(
        self,
        key: str,
        messages: Sequence[ChatMessage],
        *,
        drop: int = 0,
        owner: str | None = None,
        turn: str | None = None,
    ) -> None:
        """Drop the first `drop` messages and append `messages` in one script; with `owner`, only while
        it holds the lock (else `ConversationLockLostError`, nothing changed); with `turn`, only if
        no commit recorded that turn id (a list at `{prefix}turns:{key}`, written by the same
        script)."""
        if drop < 0:
            raise ValueError(f"drop must not be negative, not {drop}")
        await self._run_write(key, "commit", messages, drop, owner, turn)

    async def replace(self, key: str, messages: Sequence[ChatMessage], *, owner: str | None = None) -> None:
        """Make the conversation exactly `messages` in one script (`owner` as in `commit`)."""
        await self._run_write(key, "replace", messages, 0, owner)

    async def delete(self, key: str, *, owner: str | None = None) -> None:
        """Remove the conversation in one script (`owner` as in `commit`)."""
        await self._run_write(key, "delete", (), 0, owner)

    async def _run_write(
        self,
        key: str,
        mode: str,
        messages: Sequence[ChatMessage],
        drop: int,
        owner: str | None,
        turn: str | None = None,
    ) -> None:
        # Serialize here, before the thread: a message that does not serialize fails before any I/O.
        items = [message_to_json(m) for m in messages]
        args: list[str | bytes | int] = [
            uuid.uuid4().hex,
            "0" if owner is None else "1",
            owner or "",
            mode,
            drop,
            _OP_MEMORY_MS,
            turn or "",
            TURNS_REMEMBERED,
            *items,
        ]
        keys = [self._conv(key), self._lock(key), self._op(key), f"{self._prefix}turns:{key}"]
        done = await anyio.to_thread.run_sync(lambda: self._write(keys=keys, args=args))
        if not done:
            raise ConversationLockLostError(
                f"the lock on conversation {key!r} is no longer held by {owner!r}: nothing was written"
            )

    def _pending(self, key: str) -> str:
        return f"{self._prefix}pending:{key}"

    async def save_pending(self, key: str, run: str, data: bytes, *, owner: str | None = None) -> None:
        """Keep the conversation's pending turn (one script; `owner` as in `commit`). Saving the same
        run again writes the same value, so a retried command is harmless."""
        keys = [self._pending(key), self._lock(key)]
        args = ["0" if owner is None else "1", owner or "", run, data]
        if not await anyio.to_thread.run_sync(lambda: self._save_pending(keys=keys, args=args)):
            raise ConversationLockLostError(
                f"the lock on conversation {key!r} is no longer held by {owner!r}: nothing was written"
            )

    async def load_pending(self, key: str) -> tuple[str, bytes] | None:
        """The conversation's pending turn (run id, data), or `None` (one HMGET)."""

        def read() -> list[bytes | None]:
            return cast("list[bytes | None]", self._client.hmget(self._pending(key), ["run", "data"]))

        run, data = await anyio.to_thread.run_sync(read)
        if run is None or data is None:
            return None
        return run.decode(), data

    async def take_pending(self, key: str, run: str, *, owner: str | None = None) -> bytes | None:
        """Remove and return the pending turn `run` in one script (`None` if it is not there). The take
        carries an id, so a take redis-py retries after a lost reply returns the data once taken."""
        keys = [self._pending(key), self._lock(key), f"{self._prefix}taken:{uuid.uuid4().hex}"]
        args: list[str | int] = ["0" if owner is None else "1", owner or "", run, _OP_MEMORY_MS]
        reply = await anyio.to_thread.run_sync(lambda: self._take_pending(keys=keys, args=args))
        if not reply[0]:
            raise ConversationLockLostError(
                f"the lock on conversation {key!r} is no longer held by {owner!r}: nothing was taken"
            )
        return bytes(reply[1]) if len(reply) > 1 else None

    async def try_lock(self, key: str, owner: str) -> bool:
        """Take the lock with one script (free: an expired lease is gone; or held by `owner`
        already: its lease set again); when taken, the renewer renews it, and a caller that
        stopped waiting meanwhile has it given back (see `LeaseRenewer.attempt`)."""
        return await self._renewer.take(
            key,
            owner,
            lambda: bool(self._take(keys=[self._lock(key)], args=[owner, self._lease_ms])),
            lambda: self._give_back(key, owner),
        )

    async def unlock(self, key: str, owner: str) -> None:
        """Stop renewing, then delete the lock only if `owner` still holds it (compare and delete)."""
        await self._renewer.give_back(key, owner, lambda: self._give_back(key, owner))

    def _give_back(self, key: str, owner: str) -> None:
        self._unlock(keys=[self._lock(key)], args=[owner])

    def _renew(self, leases: Collection[tuple[str, str]]) -> Collection[tuple[str, str]]:
        """In the renewer's thread: extend every lease still held by its owner (one script) and
        return those another owner has now, or that expired."""
        pairs = list(leases)
        lost = self._renew_script(
            keys=[self._lock(key) for key, _ in pairs], args=[self._lease_ms, *(o for _, o in pairs)]
        )
        return [pairs[int(i) - 1] for i in lost]

    async def aclose(self) -> None:
        """Stop renewing every lease (they expire within a lease) and close the connections, if the
        store made them from a `url`."""
        for key, owner in self._renewer.held():
            self._renewer.release(key, owner)
        if self._owns_client:
            await anyio.to_thread.run_sync(self._client.close)
