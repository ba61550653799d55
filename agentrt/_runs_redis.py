"""`RedisRunLog`: the runs' logs in Redis Streams, so that a run is read on from any worker.

A run is two keys and an index entry:

- `{prefix}run:{id}`: a hash, the run's record: `owner` and `thread` (when the run has them), `seq`
  (the last frame written), `beat` (when its writer last showed it is alive, Redis's clock, ms),
  `ended` (`1` once the run ended), `writer` (the id of the open, so that a retried open is one).
- `{prefix}runlog:{id}`: a stream, one entry per frame with the id `0-{seq}` and the frame in its
  field `f`; the run's end is one more entry, with a field `end`. It is capped at about `max_frames`
  entries (`XADD MAXLEN ~`): a reader further behind gets `RunGone("truncated")`.
- `{prefix}runs:{digest of owner and thread}`: a sorted set of the runs of a conversation that have
  not ended (for `active`, the Vercel client's resume of a chat), by start time.

While a run is written its keys expire `ttl + lost_after` seconds after the writer's last heartbeat
(each `heartbeat` seconds, from `serve`, for every run of the process, in one script); once it ended,
`ttl` seconds after its end. A reader waits on `XREAD BLOCK` (at most a second at a time); each time
it waited for nothing, it looks at the record: a run not ended whose writer has not shown it is alive
for `lost_after` seconds is lost (its process died): `RunGone("lost")`.

Frames are buffered in the writer's process (`append` is a list append) and written in batches: by
`serve` (at once when the first frame of a batch comes, then at most every `flush_interval`: one
script for every run of the process with frames to write), and by `flush` and `end`. A frame is held
in the process only until it is written; while Redis cannot be written (an outage) at most
`max_buffered_bytes` a run and `max_total_buffered_bytes` in all: the run whose frame goes over is
dropped from the log (its readers find it lost). Writes are scripts that skip the frames Redis has
already, so a write redis-py retries after a lost reply appends each frame once.

Like `RedisStore` the log uses redis-py's blocking client, each command in a worker thread (agentrt
runs on asyncio and trio; `redis.asyncio` runs on asyncio only): a reader waiting for frames holds
a thread and a connection, at most `max_readers` of them at once in the process (the others queue).
Redis Cluster is not supported.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import uuid
from typing import TYPE_CHECKING, Any, Final, cast

import anyio
import anyio.from_thread
import anyio.to_thread

from ._errors import ConfigurationError
from .runs import RunGone, RunRecord, _frames_of

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable

    import redis
    from redis.commands.core import Script

__all__ = ["RedisRunLog"]

logger = logging.getLogger("agentrt.runs")

_DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
_BATCH: Final = 1000  # entries a reader takes per XREAD
_SEND: Final = 64  # frames `read_batches` gives at most at once (a response's write; as MemoryRunLog)
_WRITE_FRAMES: Final = 2000  # frames written by one script, at most
_WRITE_BYTES: Final = 1 << 20  # and about as many bytes
_RETRY_SECONDS: Final = 1.0  # after a failed write or subscription, before the next attempt
_MAX_BUFFERED_BYTES: Final = 8 * 1024 * 1024
_MAX_TOTAL_BUFFERED_BYTES: Final = 256 * 1024 * 1024

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

# KEYS: record, index. ARGV: writer, live ms, run id, has owner, owner, has thread, thread.
_OPEN = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'writer') == ARGV[1] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'writer', ARGV[1], 'seq', 0, 'beat', now)
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'owner', ARGV[5]) end
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'thread', ARGV[7])
  redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# Every run with frames to write (or to end), in one script. KEYS: per run its record, stream and
# index. ARGV: max entries, live ms, ttl ms; then per run: its first frame's seq, the number of
# frames, `1` to end it, its id, and the frames. Frames Redis has (a retried write) are skipped. A run
# whose record is gone (expired) is answered 0, its frames dropped.
_WRITE = (
    _NOW
    + """
local maxlen, live, ttl = ARGV[1], ARGV[2], ARGV[3]
local a = 4
local out = {}
for r = 1, #KEYS, 3 do
  local rec, log, idx = KEYS[r], KEYS[r + 1], KEYS[r + 2]
  local first, count, ending, id = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  local state = redis.call('HMGET', rec, 'seq', 'ended')
  if not state[1] then
    out[#out + 1] = 0
  else
    local last = tonumber(state[1])
    for i = 0, count - 1 do
      local seq = first + i
      if seq > last then
        redis.call('XADD', log, 'MAXLEN', '~', maxlen, string.format('0-%d', seq), 'f', ARGV[a + i])
        last = seq
      end
    end
    if state[2] == '1' then
      out[#out + 1] = 1
    elseif ending == '1' then
      redis.call('XADD', log, 'MAXLEN', '~', maxlen, string.format('0-%d', last + 1), 'end', '1')
      redis.call('HSET', rec, 'seq', last, 'ended', '1', 'beat', now)
      redis.call('ZREM', idx, id)
      redis.call('PEXPIRE', rec, ttl)
      redis.call('PEXPIRE', log, ttl)
      out[#out + 1] = 1
    else
      redis.call('HSET', rec, 'seq', last, 'beat', now)
      redis.call('PEXPIRE', rec, live)
      redis.call('PEXPIRE', log, live)
      out[#out + 1] = 1
    end
  end
  a = a + count
end
return out
"""
)

# The writer's heartbeat for its runs. KEYS: per run its record and stream, then the indexes.
# ARGV: live ms, the number of runs.
_BEAT = (
    _NOW
    + """
local runs = tonumber(ARGV[2])
for r = 1, runs * 2, 2 do
  local state = redis.call('HMGET', KEYS[r], 'beat', 'ended')
  if state[1] and state[2] ~= '1' then
    redis.call('HSET', KEYS[r], 'beat', now)
    redis.call('PEXPIRE', KEYS[r], ARGV[1])
    redis.call('PEXPIRE', KEYS[r + 1], ARGV[1])
  end
end
for i = runs * 2 + 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
return 1
"""
)

# What a reader that waited for nothing needs to know. KEYS: record. ARGV: lost ms.
# 0: no such run (expired), 1: ended, 2: lost (no heartbeat for lost ms), 3: going.
_STATE = (
    _NOW
    + """
local state = redis.call('HMGET', KEYS[1], 'ended', 'beat')
if not state[2] then return 0 end
if state[1] == '1' then return 1 end
if now - tonumber(state[2]) > tonumber(ARGV[1]) then return 2 end
return 3
"""
)

# The latest run of a conversation that has not ended and whose writer is alive. KEYS: index.
# ARGV: the records' key prefix, lost ms, has owner, owner.
_ACTIVE = (
    _NOW
    + """
local lost = tonumber(ARGV[2])
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, -1)) do
  local state = redis.call('HMGET', ARGV[1] .. id, 'ended', 'beat', 'owner')
  if not state[2] then
    redis.call('ZREM', KEYS[1], id)
  elseif state[1] ~= '1' and now - tonumber(state[2]) <= lost
      and ((ARGV[3] == '0' and not state[3]) or state[3] == ARGV[4]) then
    return id
  end
end
return false
"""
)


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as error:
        raise ImportError(
            "RedisRunLog needs the redis client, which is not installed: pip install 'agentrt[redis]'"
        ) from error
    return redis


def _seconds(value: object, name: str, *, positive: bool = True) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value > 0 if positive else value >= 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"RedisRunLog: {name} must be a number of seconds {bound}, got {value!r}")
    return float(value)


class _Writing:
    """A run this log writes: its frames not yet written (`first` is the seq of `frames[0]`, `size`
    their bytes)."""

    __slots__ = ("ending", "first", "frames", "id", "index", "log", "queued", "record", "size")

    def __init__(self, run: str, record: str, log: str, index: str) -> None:
        self.id = run
        self.record = record
        self.log = log
        self.index = index
        self.frames: list[bytes] = []
        self.first = 1
        self.size = 0
        self.queued = False
        self.ending = False


class RedisRunLog:
    """A `RunLog` in Redis Streams that every worker of an app shares (the `redis` extra).

    Give a `url` (a pool of connections is made for it, with a 10 s socket timeout) or your own
    `client` (a blocking `redis.Redis` that does not decode responses). Keys start with `prefix`.

    - `ttl`: seconds a run's log is kept after the run ended (then a resume answers 404).
    - `max_frames`: about how many frames a run's stream keeps (its oldest are trimmed): a reader
      further behind than that gets `RunGone("truncated")`. 50 000 by default.
    - `flush_interval`: the most a frame waits in the writer's process before it is written while a
      run streams (10 ms): frames appended meanwhile are written together, in one script.
    - `heartbeat`, `lost_after`: the writer's process shows Redis that its runs are alive every
      `heartbeat` seconds (2); a reader of a run not ended whose writer has not done so for
      `lost_after` seconds (10) gets `RunGone("lost")`: the process that ran it died.
    - `max_readers`: readers of this process that wait for frames at once (each in a thread, on a
      connection of its own); more queue.
    - `max_buffered_bytes`, `max_total_buffered_bytes`: the most bytes of frames not yet written that
      the process holds for a run (8 MiB) and for all its runs (256 MiB): reached only while Redis
      cannot be written (an outage: the writes are tried again each second). The run whose frame
      goes over is dropped from the log (logged): its frames are freed, its later ones not kept, its
      heartbeat stops, so its readers get `RunGone("lost")` (an `error` event `run_lost`).

    `active(owner, thread)` is the latest run of the conversation that has not ended and whose writer
    is alive (a lost run is not resumed: the Vercel client's resume of the chat answers 204).

    `serve` (the `Runs` manager runs it) does the batched writes, the heartbeat, and relays stop
    requests between processes (Redis pub/sub): without it, frames are written only by `flush` and
    `end`, and a run longer than `lost_after` seems lost to its readers.
    """

    def __init__(
        self,
        url: str = _DEFAULT_URL,
        *,
        client: redis.Redis | None = None,
        prefix: str = "agentrt:",
        ttl: float = 300.0,
        max_frames: int = 50_000,
        flush_interval: float = 0.01,
        heartbeat: float = 2.0,
        lost_after: float = 10.0,
        max_readers: int = 100,
        max_buffered_bytes: int = _MAX_BUFFERED_BYTES,
        max_total_buffered_bytes: int = _MAX_TOTAL_BUFFERED_BYTES,
    ) -> None:
        self.ttl = _seconds(ttl, "ttl", positive=False)
        self.flush_interval = _seconds(flush_interval, "flush_interval", positive=False)
        self.heartbeat = _seconds(heartbeat, "heartbeat")
        self.lost_after = _seconds(lost_after, "lost_after")
        if self.lost_after <= self.heartbeat:
            raise ValueError(
                f"RedisRunLog: lost_after ({lost_after}) must be longer than the heartbeat ({heartbeat})"
            )
        for name, count in (
            ("max_frames", max_frames),
            ("max_readers", max_readers),
            ("max_buffered_bytes", max_buffered_bytes),
            ("max_total_buffered_bytes", max_total_buffered_bytes),
        ):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"RedisRunLog: {name} must be a positive int, got {count!r}")
        if max_total_buffered_bytes < max_buffered_bytes:
            raise ValueError(
                f"RedisRunLog: max_total_buffered_bytes ({max_total_buffered_bytes}) must be at least "
                f"max_buffered_bytes ({max_buffered_bytes})"
            )
        if client is not None and url != _DEFAULT_URL:
            raise ConfigurationError("RedisRunLog: give either `url` or `client`, not both")
        if client is None:
            client = _import_redis().Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=10.0)
            self._owns_client = True
        else:
            if client.get_connection_kwargs().get("decode_responses"):
                raise ConfigurationError(
                    "RedisRunLog: the client must not decode responses (frames are bytes)"
                )
            self._owns_client = False
        self.max_frames = max_frames
        self.max_readers = max_readers
        self.max_buffered_bytes = max_buffered_bytes
        self.max_total_buffered_bytes = max_total_buffered_bytes
        self._buffered = 0  # the bytes of every run's frames not yet written (not those being written)
        self._client: redis.Redis = client
        self._prefix = prefix
        self._channel = f"{prefix}runs:stop"
        self._id = uuid.uuid4().hex
        self._live_ms = max(1, round((self.ttl + self.lost_after) * 1000))
        self._ttl_ms = round(self.ttl * 1000)
        self._lost_ms = max(1, round(self.lost_after * 1000))
        self._block_ms = max(1, round(min(1.0, self.lost_after / 4) * 1000))
        self._open: Script = client.register_script(_OPEN)
        self._write: Script = client.register_script(_WRITE)
        self._beat: Script = client.register_script(_BEAT)
        self._state: Script = client.register_script(_STATE)
        self._active: Script = client.register_script(_ACTIVE)
        self._writing: dict[str, _Writing] = {}
        self._queue: list[_Writing] = []
        self._wake: anyio.Event | None = None
        self._sending: anyio.Lock | None = None
        self._readers: anyio.CapacityLimiter | None = None

    # --- keys -------------------------------------------------------------------------------------

    def _record(self, run: str) -> str:
        return f"{self._prefix}run:{run}"

    def _log(self, run: str) -> str:
        return f"{self._prefix}runlog:{run}"

    def _index(self, owner: str | None, thread: str | None) -> str:
        if thread is None:
            return f"{self._prefix}runs:-"
        who = "\x00" if owner is None else f"\x01{owner}"
        digest = hashlib.sha256(f"{who}\x00{thread}".encode()).hexdigest()[:32]
        return f"{self._prefix}runs:{digest}"

    # --- the writer -------------------------------------------------------------------------------

    async def open(self, record: RunRecord) -> None:
        run = record.id
        if run in self._writing:
            raise ValueError(f"run {run!r} is in the log already")
        keys = [self._record(run), self._index(record.owner, record.thread)]
        args: list[str | int] = [
            f"{self._id}:{run}",
            self._live_ms,
            run,
            "0" if record.owner is None else "1",
            record.owner or "",
            "0" if record.thread is None else "1",
            record.thread or "",
        ]
        opened = await anyio.to_thread.run_sync(lambda: self._open(keys=keys, args=args))
        if not opened:
            raise ValueError(f"run {run!r} is in the log already")
        self._writing[run] = _Writing(run, keys[0], self._log(run), keys[1])

    def append(self, run: str, seq: int, frame: bytes) -> None:
        writing = self._writing.get(run)
        if writing is None:
            return  # its record expired in Redis (or Redis lost it): `_send` forgot the run, said so
        frames = writing.frames
        assert seq == writing.first + len(frames), "frames are appended in order, without gaps"
        frames.append(frame)
        size = len(frame)
        writing.size += size
        self._buffered += size
        if writing.size > self.max_buffered_bytes or self._buffered > self.max_total_buffered_bytes:
            self._overflow(writing)
            return
        if not writing.queued:
            writing.queued = True
            self._queue.append(writing)
            if self._wake is not None:
                self._wake.set()

    def _overflow(self, writing: _Writing) -> None:
        """A run whose frames could not be written (Redis is down) past `max_buffered_bytes` (or all
        runs' past `max_total_buffered_bytes`): dropped from the log. No heartbeat for it: its
        readers find it lost."""
        logger.error(
            "agentrt.runs: run %r: %d bytes of its frames (%d of all runs) could not be written to Redis, "
            "past max_buffered_bytes=%d or max_total_buffered_bytes=%d: the run is dropped from the log "
            "(its readers will find it lost)",
            writing.id,
            writing.size,
            self._buffered,
            self.max_buffered_bytes,
            self.max_total_buffered_bytes,
        )
        self._forget(writing)

    def _forget(self, writing: _Writing) -> None:
        """The log writes `writing` no more: its buffered frames go."""
        if self._writing.get(writing.id) is writing:
            del self._writing[writing.id]
        self._buffered -= writing.size
        writing.frames = []
        writing.size = 0

    async def flush(self, run: str) -> None:
        writing = self._writing.get(run)
        if writing is not None:
            await self._send([writing])

    async def end(self, run: str) -> None:
        writing = self._writing.get(run)
        if writing is None:
            return
        writing.ending = True
        await self._send([writing])

    async def _send(self, runs: list[_Writing]) -> bool:
        """Write the runs' buffered frames (and the end of those `ending`): one script per batch of
        at most `_WRITE_FRAMES` frames or about `_WRITE_BYTES` (a script holds Redis while it runs).
        On failure the frames go back to their buffers and the runs to the queue (`serve` tries
        again), and the answer is `False`."""
        if self._sending is None:
            self._sending = anyio.Lock()
        async with self._sending:
            while True:
                taken, keys, args = self._batch(runs)
                if not taken:
                    return True
                try:
                    # Shielded: the thread writes to its end anyway, and what it wrote is accounted for.
                    with anyio.CancelScope(shield=True):
                        write = functools.partial(self._write, keys=keys, args=args)
                        written = await anyio.to_thread.run_sync(write)
                except Exception as error:
                    for writing, first, frames, _ in taken:
                        if self._writing.get(writing.id) is not writing:
                            continue  # dropped meanwhile
                        writing.frames[:0] = frames
                        writing.first = first
                        size = sum(map(len, frames))
                        writing.size += size
                        self._buffered += size
                        if not writing.queued:
                            writing.queued = True
                            self._queue.append(writing)
                    if self._wake is not None:
                        self._wake.set()
                    logger.warning(
                        "agentrt.runs: writing %d run(s) to Redis failed (%s: %s); trying again",
                        len(taken),
                        type(error).__name__,
                        error,
                    )
                    return False
                for (writing, _, _, ending), done in zip(taken, written, strict=True):
                    if not done:
                        logger.warning(
                            "agentrt.runs: run %r has expired in Redis: its frames are dropped", writing.id
                        )
                    if ending or not done:
                        self._forget(writing)

    def _batch(
        self, runs: list[_Writing]
    ) -> tuple[list[tuple[_Writing, int, list[bytes], bool]], list[str], list[str | int | bytes]]:
        """Take the next batch of the runs' frames from their buffers: the runs taken from (with the
        seq of their first frame taken, the frames, and whether the batch ends the run), and the
        write script's keys and arguments."""
        taken: list[tuple[_Writing, int, list[bytes], bool]] = []
        keys: list[str] = []
        args: list[str | int | bytes] = [self.max_frames, self._live_ms, self._ttl_ms]
        room, size = _WRITE_FRAMES, 0
        for writing in runs:
            if room <= 0 or size >= _WRITE_BYTES:
                break
            frames = writing.frames
            if writing.id not in self._writing or not (frames or writing.ending):
                continue
            count = took = 0
            while count < len(frames) and count < room and size + took < _WRITE_BYTES:
                took += len(frames[count])
                count += 1
            size += took
            writing.size -= took
            self._buffered -= took
            if count == len(frames):
                writing.frames = []
            else:
                writing.frames = frames[count:]
                frames = frames[:count]
            room -= count
            first = writing.first
            writing.first += count
            ending = writing.ending and not writing.frames
            taken.append((writing, first, frames, ending))
            keys += [writing.record, writing.log, writing.index]
            args += [first, count, "1" if ending else "0", writing.id, *frames]
        return taken, keys, args

    async def _flushing(self) -> None:
        while True:
            wake = self._wake = anyio.Event()
            if not self._queue:
                await wake.wait()
            queue, self._queue = self._queue, []
            for writing in queue:
                writing.queued = False
            sent = await self._send(queue)
            await anyio.sleep(self.flush_interval if sent else _RETRY_SECONDS)

    async def _beating(self) -> None:
        while True:
            await anyio.sleep(self.heartbeat)
            writing = list(self._writing.values())
            if not writing:
                continue
            keys = [key for w in writing for key in (w.record, w.log)]
            keys += sorted({w.index for w in writing})
            args = [self._live_ms, len(writing)]
            try:
                await anyio.to_thread.run_sync(functools.partial(self._beat, keys=keys, args=args))
            except Exception as error:
                logger.warning(
                    "agentrt.runs: the heartbeat of %d run(s) failed (%s: %s)",
                    len(writing),
                    type(error).__name__,
                    error,
                )

    # --- readers ------------------------------------------------------------------------------------

    async def find(self, run: str) -> RunRecord | None:
        def get() -> list[bytes | None]:
            return cast(
                "list[bytes | None]", self._client.hmget(self._record(run), ["beat", "owner", "thread"])
            )

        beat, owner, thread = await anyio.to_thread.run_sync(get)
        if beat is None:
            return None
        return RunRecord(run, _text(owner), _text(thread))

    async def last_seq(self, run: str) -> int | None:
        """The seq of the run's last frame (0 before the first), `None` for a run not kept, or for
        a live run another process writes: its frames reach Redis in batches after its client was
        sent them (`flush_interval`, longer while Redis is slow or down), so an id past what Redis
        has may be one that client got. For a run this process writes, its frames not written yet
        count."""

        def get() -> list[bytes | None]:
            return cast("list[bytes | None]", self._client.hmget(self._record(run), ["seq", "ended"]))

        seq, ended = await anyio.to_thread.run_sync(get)
        if seq is None:
            return None
        writing = self._writing.get(run)
        if writing is not None:
            return max(int(seq), writing.first + len(writing.frames) - 1)
        if ended is None:
            return None
        return int(seq)

    async def active(self, owner: str | None, thread: str) -> str | None:
        keys = [self._index(owner, thread)]
        args: list[str | int] = [
            f"{self._prefix}run:",
            self._lost_ms,
            "0" if owner is None else "1",
            owner or "",
        ]
        found = await anyio.to_thread.run_sync(lambda: self._active(keys=keys, args=args))
        return found.decode() if isinstance(found, bytes) else None

    async def _run_state(self, run: str) -> int:
        keys, args = [self._record(run)], [self._lost_ms]
        return int(await anyio.to_thread.run_sync(lambda: self._state(keys=keys, args=args)))

    def read(self, run: str, after: int) -> AsyncIterator[tuple[int, bytes]]:
        return _frames_of(self.read_batches(run, after))

    async def read_batches(self, run: str, after: int) -> AsyncGenerator[tuple[int, list[bytes]], None]:
        """`read`, a batch at a time: `(seq of the first, frames)`, every frame an XREAD got (at
        most `_SEND` a batch). What an SSE response reads: it sends a batch in one write."""
        state = await self._run_state(run)
        if state == 0:
            raise RunGone("expired", "the run has ended and its log expired (or it never was)")
        if self._readers is None:
            self._readers = anyio.CapacityLimiter(self.max_readers)
        log = self._log(run)
        client = self._client
        ended = state == 1  # its frames are all there: read without waiting
        block: int | None = self._block_ms if state == 3 else None  # lost: no more will come

        def xread() -> Any:
            return client.xread({log: f"0-{after}"}, count=_BATCH, block=block)

        while True:
            reply = await anyio.to_thread.run_sync(xread, abandon_on_cancel=True, limiter=self._readers)
            entries = _entries(reply)
            if not entries:
                if ended:
                    return  # it ended before `after` (an id past its end)
                state = await self._run_state(run)
                if state == 0:
                    raise RunGone("expired", "the run's log expired while it was read")
                if state == 2:
                    raise RunGone(
                        "lost", "the run's writer stopped without ending it: the process that ran it died"
                    )
                if state == 1:  # its end was written after the read: read once more, without waiting
                    ended = True
                    block = None
                else:
                    block = self._block_ms
                continue
            first = after + 1
            frames: list[bytes] = []
            gap = end = False
            for entry_id, fields in entries:
                if int(entry_id.rpartition(b"-")[2]) != after + 1:
                    gap = True  # trimmed: the stream's oldest entries are gone
                    break
                frame = fields.get(b"f")
                if frame is None:
                    end = True
                    break
                after += 1
                frames.append(frame)
            for at in range(0, len(frames), _SEND):
                yield first + at, frames[at : at + _SEND]
            if gap:
                raise RunGone("truncated", "the reader fell behind past what the run's log keeps")
            if end:
                return

    # --- stop requests ------------------------------------------------------------------------------

    async def request_stop(self, run: str) -> None:
        await anyio.to_thread.run_sync(lambda: self._client.publish(self._channel, run))

    async def serve(self, stop: Callable[[str], None]) -> None:
        """Write the buffered frames in batches, heartbeat the runs this process writes, and call
        `stop(run)` for each stop request published by `request_stop` (in any process)."""
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._flushing)
                group.start_soon(self._beating)
                await self._listen(stop)
        finally:
            self._wake = None

    async def _listen(self, stop: Callable[[str], None]) -> None:
        stopping = threading.Event()
        client, channel = self._client, self._channel

        def listen() -> None:
            while not stopping.is_set():
                try:
                    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                    try:
                        pubsub.subscribe(channel)
                        while not stopping.is_set():
                            message = pubsub.get_message(timeout=0.2)
                            if message is not None and message.get("type") == "message":
                                anyio.from_thread.run_sync(stop, _text(message["data"]))
                    finally:
                        pubsub.close()
                except Exception as error:
                    if stopping.is_set():
                        return
                    logger.warning(
                        "agentrt.runs: the subscription to stop requests failed (%s: %s); subscribing again",
                        type(error).__name__,
                        error,
                    )
                    stopping.wait(_RETRY_SECONDS)

        try:
            await anyio.to_thread.run_sync(listen, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))
        finally:
            stopping.set()

    async def aclose(self) -> None:
        """Close the connections, if the log made them from a `url`."""
        if self._owns_client:
            await anyio.to_thread.run_sync(self._client.close)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an XREAD reply on one stream (RESP2: `[[key, entries]]`; RESP3: `{key:
    [entries]}`)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        (streams,) = reply.values()
        return cast("list[tuple[bytes, dict[bytes, bytes]]]", streams[0])
    return cast("list[tuple[bytes, dict[bytes, bytes]]]", reply[0][1])
