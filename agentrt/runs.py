"""Runs that outlive their connection: an event log per run, and the manager that owns the runs.

An SSE endpoint given a `Runs` manager (`agentrt.sse.endpoint(..., runs=runs)`) makes each request's
stream a *run* that the manager knows (and stops, here or asked from another worker). Every frame the
run sends is first appended to the run's log under an id `{run_id}:{seq}` (seq 1, 2, ...). The
response of the client that started the run reads its stream (no task switch a token); under
`on_disconnect="detach"` that client's hang-up hands the stream to the manager's task group, which
reads the rest into the log. A client that lost its connection reconnects with `Last-Event-ID` (on
any worker that shares the log) and reads the log: every frame after that id exactly once, then the
live tail.

Logs: `MemoryRunLog` (the default: one process; each run's frames bounded in bytes) and
`agentrt.runs.RedisRunLog` (Redis Streams: any worker; the `redis` extra). A run's log is kept `ttl`
seconds after the run ended, then it is gone (a resume answers 404).

    runs = agentrt.runs.Runs()                       # or Runs(RedisRunLog("redis://..."))
    app = Starlette(routes=[...], lifespan=runs.lifespan)

Leaving the manager (the app's shutdown) stops the runs still going, those its task group holds and
those their first clients' responses read; nothing outlives it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import typing
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc

from . import _backend

if typing.TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine

    from ._runs_redis import RedisRunLog

__all__ = ["MemoryRunLog", "RedisRunLog", "RunGone", "RunLog", "RunRecord", "Runs"]

logger = logging.getLogger("agentrt.runs")


def __getattr__(name: str) -> Any:
    # `RedisRunLog` is defined on this module's names (`RunGone`, `RunRecord`): imported when asked.
    if name == "RedisRunLog":
        from ._runs_redis import RedisRunLog

        return RedisRunLog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What a log knows of a run besides its frames: whose it is and what it continues.

    `owner` is the run's conversation as a key (`agentrt.sse`: its endpoint and memory id as JSON;
    for a method without memory, its endpoint only: then the run id is the only key); `thread` the
    client protocol's conversation id (Vercel's chat id, AG-UI's thread), if any."""

    id: str
    owner: str | None
    thread: str | None = None


class RunGone(Exception):
    """A run's frames cannot be read on: `reason` is `"expired"` (the run ended and its log
    expired, or it never was), `"lost"` (its writer stopped writing without ending it: the process
    that ran it died) or `"truncated"` (a reader fell behind past what the log keeps)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@typing.runtime_checkable
class RunLog(typing.Protocol):
    """Where runs' frames are kept. One writer per run (the process that runs it), any number of
    readers (in any process that shares the log).

    `append` must not block: it is called once per frame, on the per-token path, and a log that
    writes elsewhere buffers (and writes in batches, from `flush` or a task of its own)."""

    async def open(self, record: RunRecord) -> None:
        """A run begins (before its first frame)."""

    def append(self, run: str, seq: int, frame: bytes) -> None:
        """Add the run's frame `seq` (1, 2, ... with no gaps)."""

    async def flush(self, run: str) -> None:
        """Make every frame appended so far readable by other processes."""

    async def end(self, run: str) -> None:
        """The run ended after its last appended frame: readers stop after it; the log expires."""

    async def find(self, run: str) -> RunRecord | None:
        """The run's record, while its log is kept."""

    async def active(self, owner: str | None, thread: str) -> str | None:
        """The run of `owner` on `thread` that has not ended, if any (the latest)."""

    def read(self, run: str, after: int) -> AsyncIterator[tuple[int, bytes]]:
        """The run's frames after `after` (`(seq, frame)`), then the ones still to come, until the
        run's end. Raises `RunGone` when they cannot be read on.

        A log may also offer `read_batches(run, after)`, the same as `(first seq, frames)` with
        every frame it has at once (see `MemoryRunLog`): an SSE response then sends them in one
        write, where it sends a frame at a time from `read`."""

    async def request_stop(self, run: str) -> None:
        """Ask the process that runs `run` to stop it (see `serve`)."""

    async def serve(self, stop: Callable[[str], None]) -> None:
        """The log's own work while the manager runs (started in its task group, cancelled when it
        ends): call `stop(run)` for each run another process asks to stop (`request_stop`), and
        whatever else the log needs (batched writes, a heartbeat for the runs it writes). A log
        that needs none may return at once."""


_MAX_BYTES: Final = 8 * 1024 * 1024
_TTL: Final = 300.0
_BATCH: Final = 64
"""The most frames `MemoryRunLog.read_batches` gives at once (a response's write)."""


class _Entry:
    __slots__ = ("ended", "expires", "first", "frames", "record", "size", "waiting")

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.frames: list[bytes] = []
        self.first = 1  # the seq of frames[0]
        self.size = 0
        self.ended = False
        self.expires = 0.0
        self.waiting: list[_backend.Waiter] = []  # one per reader waiting for a frame

    def wake(self) -> None:
        waiting = self.waiting
        if waiting:
            self.waiting = []
            for waiter in waiting:
                if not waiter.done():  # a reader cancelled while it waited
                    waiter.set_result(None)


class MemoryRunLog:
    """The runs' logs in this process's memory (the default): a resume must reach the process that
    ran the run. Each run keeps its last `max_bytes` of frames (8 MiB by default; a reader further
    behind gets `RunGone("truncated")`) and is dropped `ttl` seconds after it ended."""

    def __init__(self, *, ttl: float = _TTL, max_bytes: int = _MAX_BYTES) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl >= 0:
            raise ValueError(f"MemoryRunLog: ttl must be a number of seconds >= 0, got {ttl!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"MemoryRunLog: max_bytes must be a positive int, got {max_bytes!r}")
        self.ttl = float(ttl)
        self.max_bytes = max_bytes
        self._runs: dict[str, _Entry] = {}
        self._active: dict[tuple[str | None, str], list[str]] = {}
        """(owner, thread) -> its runs that have not ended, in the order they began."""
        self._ending: collections.deque[tuple[float, str]] = collections.deque()
        """(expires, run) of the ended runs, in the order they ended (so, of their expiry: one ttl)."""

    def _sweep(self) -> None:
        # Only the runs that expired are looked at (not every run kept: this runs on each open).
        now = time.monotonic()
        ending = self._ending
        while ending and ending[0][0] <= now:
            _, run = ending.popleft()
            entry = self._runs.get(run)
            if entry is not None and entry.ended and entry.expires <= now:
                del self._runs[run]

    async def open(self, record: RunRecord) -> None:
        self._sweep()
        if record.id in self._runs:
            raise ValueError(f"run {record.id!r} is in the log already")
        self._runs[record.id] = _Entry(record)
        if record.thread is not None:
            self._active.setdefault((record.owner, record.thread), []).append(record.id)

    def append(self, run: str, seq: int, frame: bytes) -> None:
        entry = self._runs[run]
        frames = entry.frames
        assert seq == entry.first + len(frames), "frames are appended in order, without gaps"
        frames.append(frame)
        entry.size += len(frame)
        if entry.size > self.max_bytes:
            self._trim(entry)
        if entry.waiting:
            entry.wake()

    def _trim(self, entry: _Entry) -> None:
        frames = entry.frames
        drop = 0
        size = entry.size
        while size > self.max_bytes // 2 and drop < len(frames) - 1:
            size -= len(frames[drop])
            drop += 1
        del frames[:drop]
        entry.first += drop
        entry.size = size

    async def flush(self, run: str) -> None:
        return None

    async def end(self, run: str) -> None:
        entry = self._runs.get(run)
        if entry is None:
            return
        if entry.ended:
            return
        entry.ended = True
        entry.expires = time.monotonic() + self.ttl
        self._ending.append((entry.expires, run))
        record = entry.record
        if record.thread is not None:
            going = self._active.get((record.owner, record.thread))
            if going is not None and run in going:
                going.remove(run)
                if not going:
                    del self._active[record.owner, record.thread]
        entry.wake()

    def _entry(self, run: str) -> _Entry | None:
        entry = self._runs.get(run)
        if entry is not None and entry.ended and entry.expires <= time.monotonic():
            del self._runs[run]
            return None
        return entry

    async def find(self, run: str) -> RunRecord | None:
        entry = self._entry(run)
        return entry.record if entry is not None else None

    async def active(self, owner: str | None, thread: str) -> str | None:
        going = self._active.get((owner, thread))
        return going[-1] if going else None

    async def read(self, run: str, after: int) -> AsyncIterator[tuple[int, bytes]]:
        async for first, frames in self.read_batches(run, after):
            for frame in frames:
                yield first, frame
                first += 1

    async def read_batches(self, run: str, after: int) -> AsyncIterator[tuple[int, list[bytes]]]:
        """`read`, a batch at a time: `(seq of the first, frames)` with every frame there is (at
        most `_BATCH`), waiting only when there is none. What an SSE response reads: it sends a
        batch in one write, and is woken once for all the frames appended meanwhile."""
        entry = self._entry(run)
        if entry is None:
            raise RunGone("expired", "the run has ended and its log expired (or it never was)")
        waiter = _backend.waiters()  # the wait for the next frame: once a token, so no anyio.Event
        while True:
            frames = entry.frames
            index = after + 1 - entry.first
            if index < 0:
                raise RunGone("truncated", "the reader fell behind past what the run's log keeps")
            if index < len(frames):
                batch = frames[index : index + _BATCH]
                yield after + 1, batch
                after += len(batch)
                continue
            if entry.ended:
                return
            waiting = waiter()
            entry.waiting.append(waiting)
            try:
                await waiting
            except BaseException:  # cancelled: its waiter is no longer kept for a wake
                if waiting in entry.waiting:
                    entry.waiting.remove(waiting)
                raise

    async def request_stop(self, run: str) -> None:
        return None  # one process: the manager stops its own runs

    async def serve(self, stop: Callable[[str], None]) -> None:
        return None


class Runs:
    """The app's runs: the task group they run in, and their log (`MemoryRunLog` by default).

    Start it with the app (`Starlette(lifespan=runs.lifespan)`, or `async with runs:` inside a
    lifespan of your own); an endpoint given it (`endpoint(..., runs=runs)`) runs its streams here.
    Leaving it cancels the runs still going (each ends its log with the protocol's end for a stopped
    run)."""

    def __init__(self, log: RunLog | None = None) -> None:
        if log is not None and not isinstance(log, RunLog):
            raise TypeError(f"Runs: log must be a RunLog (MemoryRunLog, RedisRunLog), got {log!r}")
        self.log: RunLog = log if log is not None else MemoryRunLog()
        self._group: anyio.abc.TaskGroup | None = None
        self._live: dict[str, Callable[[], None]] = {}

    async def __aenter__(self) -> Runs:
        if self._group is not None:
            raise RuntimeError("Runs: started already")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self.log.serve, self._stop_here)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        group, self._group = self._group, None
        assert group is not None
        for stop in list(self._live.values()):
            stop()  # the runs their first clients' responses read, too
        group.cancel_scope.cancel()
        # The runs are cancelled and waited for; an exception of the block goes on as it is (not
        # wrapped in a group with them).
        await group.__aexit__(None, None, None)
        return None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """The manager as a Starlette lifespan: `Starlette(..., lifespan=runs.lifespan)`."""
        async with self:
            yield

    def require(self) -> None:
        """Raise `RuntimeError` unless the manager is started."""
        if self._group is None:
            raise RuntimeError(
                "agentrt.runs.Runs is not started: give the app its lifespan "
                "(Starlette(..., lifespan=runs.lifespan)) or enter it (async with runs: ...)"
            )

    def start(
        self, run: str, body: Callable[[], Coroutine[Any, Any, None]], stop: Callable[[], None]
    ) -> None:
        """Run `body()` in the manager's task group as run `run`; `stop` stops it (see `stop`)."""
        self.require()
        group = self._group
        assert group is not None
        self._live[run] = stop

        async def running() -> None:
            try:
                await body()
            except Exception:
                # One run's failure (its log's, say) must not fail the task group: that would
                # cancel every other run of the app, and the manager itself.
                logger.exception("agentrt.runs: run %r failed", run)
            finally:
                if self._live.get(run) is stop:
                    del self._live[run]

        group.start_soon(running)

    def reserve(self, run: str, stop: Callable[[], None]) -> None:
        """Let `stop` (here, or asked by another process) reach run `run`, which its first client's
        response reads until it ends or the manager takes it over (`start`): from when its log is
        opened (its record is then visible to the other processes). Leaving the manager stops it."""
        self._live[run] = stop

    def release(self, run: str, stop: Callable[[], None]) -> None:
        """Forget a run `reserve` named (it ended, or did not start)."""
        if self._live.get(run) is stop:
            del self._live[run]

    def _stop_here(self, run: str) -> None:
        stop = self._live.get(run)
        if stop is not None:
            stop()

    async def stop(self, run: str) -> None:
        """Stop run `run`: here if it runs in this process, else by asking the log's other
        processes."""
        stop = self._live.get(run)
        if stop is not None:
            stop()
            return
        await self.log.request_stop(run)
