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
import anyio.to_thread

from ._errors import ConfigurationError
from ._runs_redis_wire import (
    ACTIVE,
    BEAT,
    OPEN,
    RETRY_SECONDS,
    STATE,
    WRITE,
    Writing,
    frames_after,
    put_back,
    relay_stops,
    take_batch,
    text,
    xread_entries,
)
from .runs import RunGone, RunRecord, _frames_of, _positive_ints

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable

    import redis
    from redis.commands.core import Script

__all__ = ["RedisRunLog"]

logger = logging.getLogger("agentrt.runs")

_DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
_BATCH: Final = 1000  # entries a reader takes per XREAD
_SEND: Final = 64  # frames `read_batches` gives at most at once (a response's write; as MemoryRunLog)
_MAX_BUFFERED_BYTES: Final = 8 * 1024 * 1024
_MAX_TOTAL_BUFFERED_BYTES: Final = 256 * 1024 * 1024


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
        _positive_ints(
            "RedisRunLog",
            max_frames=max_frames,
            max_readers=max_readers,
            max_buffered_bytes=max_buffered_bytes,
            max_total_buffered_bytes=max_total_buffered_bytes,
        )
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
        self._open: Script = client.register_script(OPEN)
        self._write: Script = client.register_script(WRITE)
        self._beat: Script = client.register_script(BEAT)
        self._state: Script = client.register_script(STATE)
        self._active: Script = client.register_script(ACTIVE)
        self._writing: dict[str, Writing] = {}
        self._queue: list[Writing] = []
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
        self._writing[run] = Writing(run, keys[0], self._log(run), keys[1])

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

    def _overflow(self, writing: Writing) -> None:
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

    def _forget(self, writing: Writing) -> None:
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

    async def _send(self, runs: list[Writing]) -> bool:
        """Write the runs' buffered frames (and the end of those `ending`): one script per batch of
        at most `WRITE_FRAMES` frames or about about 1 MiB (a script holds Redis while it runs).
        On failure the frames go back to their buffers and the runs to the queue (`serve` tries
        again), and the answer is `False`."""
        if self._sending is None:
            self._sending = anyio.Lock()
        async with self._sending:
            while True:
                head: list[str | int] = [self.max_frames, self._live_ms, self._ttl_ms]
                taken, keys, args, size = take_batch(runs, self._writing, head)
                self._buffered -= size
                if not taken:
                    return True
                try:
                    # Shielded: the thread writes to its end anyway, and what it wrote is accounted for.
                    with anyio.CancelScope(shield=True):
                        write = functools.partial(self._write, keys=keys, args=args)
                        written = await anyio.to_thread.run_sync(write)
                except Exception as error:
                    self._buffered += put_back(taken, self._writing, self._queue)
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

    async def _flushing(self) -> None:
        while True:
            wake = self._wake = anyio.Event()
            if not self._queue:
                await wake.wait()
            queue, self._queue = self._queue, []
            for writing in queue:
                writing.queued = False
            sent = await self._send(queue)
            await anyio.sleep(self.flush_interval if sent else RETRY_SECONDS)

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
        return RunRecord(run, text(owner), text(thread))

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
            entries = xread_entries(reply)
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
            frames, gap, end = frames_after(after, entries)
            after += len(frames)
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
        listen = functools.partial(relay_stops, self._client, self._channel, stop, stopping)
        try:
            await anyio.to_thread.run_sync(listen, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))
        finally:
            stopping.set()

    async def aclose(self) -> None:
        """Close the connections, if the log made them from a `url`."""
        if self._owns_client:
            await anyio.to_thread.run_sync(self._client.close)
