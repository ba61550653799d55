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
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine

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
        """A run begins (before its first frame). Raises if the log cannot take it: `ValueError` if
        the run is in the log already (`agentrt.sse.endpoint` answers 409 `run_exists`), anything
        else (Redis down) a 503 `runs_unavailable`, as does a failure of `find`, `active` or
        `request_stop`."""

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
        write, where it sends a frame at a time from `read`. And `last_seq(run)`: the seq of the
        run's last frame appended (0 before the first; `None` for a run not kept, or when the log
        cannot tell: a live run whose frames another process writes, which its client may have been
        sent before the log has them): a resume after a later seq (an id the run never sent) is then
        refused (400 `bad_event_id`) rather than left waiting past frames it would skip."""

    async def request_stop(self, run: str) -> None:
        """Ask the process that runs `run` to stop it (see `serve`)."""

    async def serve(self, stop: Callable[[str], None]) -> None:
        """The log's own work while the manager runs (started in its task group, cancelled when it
        ends): call `stop(run)` for each run another process asks to stop (`request_stop`), and
        whatever else the log needs (batched writes, a heartbeat for the runs it writes). A log
        that needs none may return at once."""


def _positive_ints(kind: str, **values: object) -> None:
    """`ValueError` for the first of a run log's `values` that is not a positive int."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{kind}: {name} must be a positive int, got {value!r}")


async def _frames_of(
    batches: AsyncGenerator[tuple[int, list[bytes]], None],
) -> AsyncIterator[tuple[int, bytes]]:
    """A log's `read` made of its `read_batches`: a frame at a time (closed, it closes them)."""
    async with contextlib.aclosing(batches) as reading:
        async for first, frames in reading:
            for frame in frames:
                yield first, frame
                first += 1


_MAX_BYTES: Final = 8 * 1024 * 1024
_MAX_TOTAL_BYTES: Final = 256 * 1024 * 1024
_TTL: Final = 300.0
_BATCH: Final = 64
"""The most frames `MemoryRunLog.read_batches` gives at once (a response's write)."""


class _Entry:
    __slots__ = ("dropped", "ended", "expires", "first", "frames", "record", "size", "waiting")

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.frames: list[bytes] = []
        self.first = 1  # the seq of frames[0]
        self.size = 0
        self.ended = False
        self.dropped = False  # past the log's total: its frames are gone, its later ones not kept
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
    behind gets `RunGone("truncated")`) and is dropped `ttl` seconds after it ended.

    `max_total_bytes` (256 MiB by default) bounds the frames of all runs together: the log never
    holds more. A native-protocol answer is about 85 bytes a token (a 1000-token answer 85 KB), so
    the default keeps about 3000 such answers. Past it, the runs that ended are evicted first, the
    oldest first (before their `ttl`: a resume of one answers 404). A live run is never evicted for
    another: when the live runs alone would hold more, the run whose frame goes over is dropped from
    the log (logged): its readers get `RunGone("truncated")` (an `error` event `run_truncated`; with
    `on_disconnect="cancel"` that stops it) and its later frames are not kept. Since no run keeps more
    than `max_bytes`, no single run can take the log over. `total_bytes` is what it holds now."""

    def __init__(
        self, *, ttl: float = _TTL, max_bytes: int = _MAX_BYTES, max_total_bytes: int = _MAX_TOTAL_BYTES
    ) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl >= 0:
            raise ValueError(f"MemoryRunLog: ttl must be a number of seconds >= 0, got {ttl!r}")
        _positive_ints("MemoryRunLog", max_bytes=max_bytes, max_total_bytes=max_total_bytes)
        if max_total_bytes < max_bytes:
            raise ValueError(
                f"MemoryRunLog: max_total_bytes ({max_total_bytes}) must be at least max_bytes "
                f"({max_bytes}), the most one run keeps"
            )
        self.ttl = float(ttl)
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self._total = 0
        self._runs: dict[str, _Entry] = {}
        self._active: dict[tuple[str | None, str], list[str]] = {}
        """(owner, thread) -> its runs that have not ended, in the order they began."""
        self._ending: collections.deque[tuple[float, str]] = collections.deque()
        """(expires, run) of the ended runs, in the order they ended (so, of their expiry: one ttl)."""

    @property
    def total_bytes(self) -> int:
        """The bytes of frames the log holds now, all runs together (at most `max_total_bytes`)."""
        return self._total

    def _forget(self, run: str, entry: _Entry) -> None:
        del self._runs[run]
        self._total -= entry.size

    def _sweep(self) -> None:
        # Only the runs that expired are looked at (not every run kept: this runs on each open).
        now = time.monotonic()
        ending = self._ending
        while ending and ending[0][0] <= now:
            _, run = ending.popleft()
            entry = self._runs.get(run)
            if entry is not None and entry.ended and entry.expires <= now:
                self._forget(run, entry)

    async def open(self, record: RunRecord) -> None:
        self._sweep()
        if record.id in self._runs:
            raise ValueError(f"run {record.id!r} is in the log already")
        self._runs[record.id] = _Entry(record)
        if record.thread is not None:
            self._active.setdefault((record.owner, record.thread), []).append(record.id)

    def append(self, run: str, seq: int, frame: bytes) -> None:
        entry = self._runs[run]
        if entry.dropped:
            return
        frames = entry.frames
        assert seq == entry.first + len(frames), "frames are appended in order, without gaps"
        frames.append(frame)
        size = len(frame)
        entry.size += size
        self._total += size
        if entry.size > self.max_bytes:
            self._trim(entry)
        if self._total > self.max_total_bytes:
            self._over(run, entry)
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
        self._total -= entry.size - size
        entry.size = size

    def _over(self, run: str, entry: _Entry) -> None:
        """Past `max_total_bytes` with `entry`'s frame: evict the runs that ended, oldest first (each
        once: amortized O(1) a frame), then, if the live runs alone hold more, drop `entry`."""
        ending = self._ending
        runs = self._runs
        while self._total > self.max_total_bytes and ending:
            expires, ended = ending.popleft()
            kept = runs.get(ended)
            if kept is not None and kept.ended and kept.expires == expires:
                self._forget(ended, kept)
        if self._total > self.max_total_bytes:
            logger.warning(
                "agentrt.runs: the runs' log is full (max_total_bytes=%d, every run in it is live): "
                "run %r (%d bytes) is dropped from it, its readers are told it was truncated",
                self.max_total_bytes,
                run,
                entry.size,
            )
            self._total -= entry.size
            entry.first += len(entry.frames)
            entry.frames = []
            entry.size = 0
            entry.dropped = True

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
            self._forget(run, entry)
            return None
        return entry

    async def find(self, run: str) -> RunRecord | None:
        entry = self._entry(run)
        return entry.record if entry is not None else None

    async def last_seq(self, run: str) -> int | None:
        """The seq of the run's last frame (0 before the first), `None` for a run not kept."""
        entry = self._entry(run)
        return entry.first + len(entry.frames) - 1 if entry is not None else None

    async def active(self, owner: str | None, thread: str) -> str | None:
        going = self._active.get((owner, thread))
        return going[-1] if going else None

    def read(self, run: str, after: int) -> AsyncIterator[tuple[int, bytes]]:
        return _frames_of(self.read_batches(run, after))

    async def read_batches(self, run: str, after: int) -> AsyncGenerator[tuple[int, list[bytes]], None]:
        """`read`, a batch at a time: `(seq of the first, frames)` with every frame there is (at
        most `_BATCH`), waiting only when there is none. What an SSE response reads: it sends a
        batch in one write, and is woken once for all the frames appended meanwhile."""
        entry = self._entry(run)
        if entry is None:
            raise RunGone("expired", "the run has ended and its log expired (or it never was)")
        waiter = _backend.waiters()  # the wait for the next frame: once a token, so no anyio.Event
        while True:
            if entry.dropped:
                raise RunGone("truncated", "the run was dropped from the log: the log is full")
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
        opened (its record is then visible to the other processes). Leaving the manager stops it.
        `ValueError` if another run of that id is live here (two requests naming one run at once:
        the one refused must not take the other's place)."""
        live = self._live.get(run)
        if live is not None and live is not stop:
            raise ValueError(f"run {run!r} is live already")
        self._live[run] = stop

    def release(self, run: str, stop: Callable[[], None]) -> None:
        """Forget a run `reserve` named (it ended, or did not start)."""
        if self._live.get(run) is stop:
            del self._live[run]

    def _stop_here(self, run: str) -> None:
        stop = self._live.get(run)
        if stop is not None:
            stop()

    async def stop(self, run: str) -> bool:
        """Stop run `run`: here if it runs in this process, else by asking the log's other
        processes. False, and nothing is asked, when the run is not live here and its log knows its
        last frame (`last_seq`, for a log that has it: a run that ended, or one this process is
        ending, whose end was sent: a stop comes too late)."""
        stop = self._live.get(run)
        if stop is not None:
            stop()
            return True
        last_seq = getattr(self.log, "last_seq", None)
        if last_seq is not None and await last_seq(run) is not None:
            return False
        await self.log.request_stop(run)
        return True
