"""What every `RunLog` promises (`agentrt.runs`), on `MemoryRunLog` and on `RedisRunLog` (a real
redis-server, tests/redis_server.py), on asyncio and trio.

A Redis test writes with one log instance and reads with another on the same prefix: two processes
as far as the log can tell (nothing is shared between them but Redis). The memory log is one process:
its writer and reader are the same instance. Waiting for time to pass (a TTL, a heartbeat that
stopped) polls what the log says, bounded by `fail_after`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import redis

from agentrt.runs import MemoryRunLog, RedisRunLog, RunGone, RunLog, RunRecord, Runs

BOUND = 10  # seconds: the most a test waits for anything


@dataclass
class Logs:
    """Makes a writer and a reader log of one kind (the same instance for memory)."""

    kind: str
    url: str | None
    prefix: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:12]}:")
    made: list[RedisRunLog] = field(default_factory=list)

    def pair(self, **options: Any) -> tuple[RunLog, RunLog]:
        """`ttl`, `keep` (about how many frames a run keeps), `heartbeat`, `lost_after`."""
        keep = options.pop("keep", None)
        if self.kind == "memory":
            options.pop("heartbeat", None)
            options.pop("lost_after", None)
            if keep is not None:
                options["max_bytes"] = keep * 10  # the tests' frames are 10 bytes
            log = MemoryRunLog(**options)
            return log, log
        if keep is not None:
            options["max_frames"] = keep
        assert self.url is not None
        writer = RedisRunLog(self.url, prefix=self.prefix, **options)
        reader = RedisRunLog(self.url, prefix=self.prefix, **options)
        self.made += [writer, reader]
        return writer, reader


@pytest.fixture(params=["memory", "redis"])
async def logs(request: pytest.FixtureRequest) -> AsyncIterator[Logs]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    logs = Logs(request.param, url)
    yield logs
    for log in logs.made:
        await log.aclose()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@contextlib.asynccontextmanager
async def serving(log: RunLog, stop: Callable[[str], None] = lambda run: None) -> AsyncIterator[None]:
    """The log's own work (batched writes, heartbeat, stop requests) while the block runs."""
    async with anyio.create_task_group() as group:
        group.start_soon(log.serve, stop)
        yield
        group.cancel_scope.cancel()


def frame(seq: int) -> bytes:
    return f"frame {seq:4d}".encode()  # 10 bytes


async def read_all(log: RunLog, run: str, after: int) -> list[tuple[int, bytes]]:
    with anyio.fail_after(BOUND):
        return [item async for item in log.read(run, after)]


async def gone(log: RunLog, run: str, after: int) -> str:
    with pytest.raises(RunGone) as raised:
        await read_all(log, run, after)
    return raised.value.reason


async def poll(check: Callable[[], Any]) -> None:
    """Until `check()` (awaited if it is a coroutine) is true, bounded."""
    with anyio.fail_after(BOUND):
        while True:
            done = check()
            if hasattr(done, "__await__"):
                done = await done
            if done:
                return
            await anyio.sleep(0.01)


# --- frames ---------------------------------------------------------------------------------------


async def test_a_reader_from_any_id_gets_every_later_frame_once_then_the_live_tail(logs: Logs) -> None:
    """Readers start from every id (0 to past the end) while the run is half written: each gets the
    frames after its id exactly once, in order, the ones written before it started and after, and
    stops at the run's end."""
    writer, reader = logs.pair()
    await writer.open(RunRecord("r", None))
    results: dict[int, list[tuple[int, bytes]]] = {}

    async def read_from(after: int) -> None:
        results[after] = await read_all(reader, "r", after)

    async with serving(writer), anyio.create_task_group() as group:
        for seq in range(1, 6):
            writer.append("r", seq, frame(seq))
        await writer.flush("r")
        for after in range(13):
            group.start_soon(read_from, after)
        for seq in range(6, 11):
            writer.append("r", seq, frame(seq))
            await anyio.lowlevel.checkpoint()
        await writer.flush("r")
        writer.append("r", 11, frame(11))
        writer.append("r", 12, frame(12))
        await writer.end("r")
    for after in range(13):
        assert results[after] == [(seq, frame(seq)) for seq in range(after + 1, 13)], after
    # after its end, from the start, and from past its end
    assert await read_all(reader, "r", 0) == [(seq, frame(seq)) for seq in range(1, 13)]
    assert await read_all(reader, "r", 20) == []


async def read_all_batches(log: RunLog, run: str, after: int) -> list[tuple[int, list[bytes]]]:
    with anyio.fail_after(BOUND):
        return [item async for item in log.read_batches(run, after)]  # type: ignore[attr-defined]


def flat(batches: list[tuple[int, list[bytes]]]) -> list[tuple[int, bytes]]:
    """The batches' frames with their seqs, checking that each batch follows the one before."""
    out: list[tuple[int, bytes]] = []
    for first, frames in batches:
        assert frames and len(frames) <= 64, (first, len(frames))
        assert not out or first == out[-1][0] + 1, (first, out[-1][0])
        out += [(first + n, f) for n, f in enumerate(frames)]
    return out


async def test_read_batches_is_read_a_batch_at_a_time(logs: Logs) -> None:
    """`read_batches` (what an SSE response reads) gives what `read` gives, as `(first seq, frames)`
    of consecutive frames, at most 64 a batch: every frame there is at once, from any id, while the
    run is written and once it ended."""
    writer, reader = logs.pair()
    await writer.open(RunRecord("r", None))
    results: dict[int, list[tuple[int, list[bytes]]]] = {}

    async def read_from(after: int) -> None:
        results[after] = await read_all_batches(reader, "r", after)

    async with serving(writer), anyio.create_task_group() as group:
        for seq in range(1, 101):
            writer.append("r", seq, frame(seq))
        await writer.flush("r")
        for after in (0, 1, 50, 99, 100):
            group.start_soon(read_from, after)
        for seq in range(101, 151):
            writer.append("r", seq, frame(seq))
            if seq % 10 == 0:
                await writer.flush("r")
                await anyio.lowlevel.checkpoint()
        await writer.end("r")
    for after, batches in results.items():
        assert flat(batches) == [(seq, frame(seq)) for seq in range(after + 1, 151)], after
    ended = await read_all_batches(reader, "r", 0)
    assert [(first, len(frames)) for first, frames in ended] == [(1, 64), (65, 64), (129, 22)]
    assert flat(ended) == [(seq, frame(seq)) for seq in range(1, 151)]
    assert await read_all_batches(reader, "r", 150) == []


async def test_read_batches_tells_a_reader_its_run_is_gone(logs: Logs) -> None:
    writer, reader = logs.pair(keep=10)
    await writer.open(RunRecord("r", None))
    for seq in range(1, 1001):
        writer.append("r", seq, frame(seq))
        if seq % 100 == 0:
            await writer.flush("r")
    await writer.end("r")
    for run, reason in (("r", "truncated"), ("nope", "expired")):
        with pytest.raises(RunGone) as raised:
            await read_all_batches(reader, run, 0)
        assert raised.value.reason == reason
    assert flat(await read_all_batches(reader, "r", 995)) == [(seq, frame(seq)) for seq in range(996, 1001)]


async def test_a_reader_at_the_tail_gets_frames_as_they_are_written_without_flush(logs: Logs) -> None:
    """With the log's `serve` running, an appended frame reaches a reader waiting at the tail with no
    `flush` (batched writes): the reader sees frame 1 before frame 2 is appended."""
    writer, reader = logs.pair()
    await writer.open(RunRecord("r", None))
    got: list[tuple[int, bytes]] = []
    arrived = [anyio.Event() for _ in range(3)]

    async def read() -> None:
        with anyio.fail_after(BOUND):
            async for item in reader.read("r", 0):
                got.append(item)
                arrived[item[0] - 1].set()

    async with serving(writer), anyio.create_task_group() as group:
        group.start_soon(read)
        for seq in (1, 2, 3):
            writer.append("r", seq, frame(seq))
            await arrived[seq - 1].wait()
            assert [s for s, _ in got] == list(range(1, seq + 1))
            if isinstance(writer, RedisRunLog):  # a frame written is no longer held by its writer
                assert writer._writing["r"].frames == []
        await writer.end("r")
    assert got == [(1, frame(1)), (2, frame(2)), (3, frame(3))]


async def test_a_run_without_frames_ends(logs: Logs) -> None:
    writer, reader = logs.pair()
    await writer.open(RunRecord("r", None))
    async with anyio.create_task_group() as group:
        group.start_soon(read_all, reader, "r", 0)
        await writer.end("r")
    assert await read_all(reader, "r", 0) == []


async def test_a_run_is_opened_once(logs: Logs) -> None:
    writer, reader = logs.pair()
    await writer.open(RunRecord("r", None))
    with pytest.raises(ValueError, match="in the log already"):
        await reader.open(RunRecord("r", None))
    with pytest.raises(ValueError, match="in the log already"):
        await writer.open(RunRecord("r", None))


async def test_a_reader_behind_what_the_log_keeps_is_told_it_was_truncated(logs: Logs) -> None:
    writer, reader = logs.pair(keep=10)
    await writer.open(RunRecord("r", None))
    for seq in range(1, 1001):
        writer.append("r", seq, frame(seq))
        if seq % 100 == 0:
            await writer.flush("r")
    await writer.end("r")
    assert await gone(reader, "r", 0) == "truncated"
    assert await gone(reader, "r", 500) == "truncated"
    assert await read_all(reader, "r", 995) == [(seq, frame(seq)) for seq in range(996, 1001)]


# --- records, the index, expiry -------------------------------------------------------------------


async def test_a_run_s_record_says_whose_it_is(logs: Logs) -> None:
    writer, reader = logs.pair()
    await writer.open(RunRecord("a", '"ada"', "t1"))
    await writer.open(RunRecord("b", None))
    await writer.open(RunRecord("c", '"ada"'))
    assert await reader.find("a") == RunRecord("a", '"ada"', "t1")
    assert await reader.find("b") == RunRecord("b", None, None)
    assert await reader.find("c") == RunRecord("c", '"ada"', None)
    assert await reader.find("nope") is None
    assert await gone(reader, "nope", 0) == "expired"


async def test_active_is_the_latest_run_of_the_conversation_not_ended(logs: Logs) -> None:
    writer, reader = logs.pair()
    await writer.open(RunRecord("first", '"ada"', "t"))
    await writer.open(RunRecord("other-thread", '"ada"', "u"))
    await writer.open(RunRecord("other-owner", '"eve"', "t"))
    await writer.open(RunRecord("no-owner", None, "t"))
    assert await reader.active('"ada"', "t") == "first"
    await writer.open(RunRecord("second", '"ada"', "t"))
    assert await reader.active('"ada"', "t") == "second"
    assert await reader.active('"eve"', "t") == "other-owner"
    assert await reader.active(None, "t") == "no-owner"
    assert await reader.active('"ada"', "v") is None
    await writer.end("second")
    assert await reader.active('"ada"', "t") == "first"
    await writer.end("first")
    assert await reader.active('"ada"', "t") is None
    assert await reader.active('"ada"', "u") == "other-thread"


async def test_an_ended_run_is_kept_ttl_seconds_then_gone(logs: Logs) -> None:
    kept_writer, kept_reader = logs.pair(ttl=60)
    await kept_writer.open(RunRecord("kept", '"ada"', "t"))
    kept_writer.append("kept", 1, frame(1))
    await kept_writer.end("kept")
    assert await kept_reader.find("kept") == RunRecord("kept", '"ada"', "t")
    assert await read_all(kept_reader, "kept", 0) == [(1, frame(1))]

    writer, reader = logs.pair(ttl=0.05)
    await writer.open(RunRecord("r", '"ada"', "t"))
    writer.append("r", 1, frame(1))
    assert await reader.active('"ada"', "t") == "r"
    await writer.end("r")
    assert await reader.active('"ada"', "t") is None
    await poll(lambda: _is_none(reader.find("r")))
    assert await gone(reader, "r", 0) == "expired"


async def _is_none(found: Any) -> bool:
    return await found is None


# --- stop requests --------------------------------------------------------------------------------


async def test_a_stop_asked_of_any_process_stops_the_run_where_it_runs(
    logs: Logs, request: pytest.FixtureRequest
) -> None:
    """`Runs.stop` in the process that runs the run stops it there; in another (another manager on
    the same Redis), it is relayed through the log to the one that runs it."""
    writer, reader = logs.pair()
    here = Runs(writer)
    there = here if writer is reader else Runs(reader)
    stopped = anyio.Event()
    ran = anyio.Event()

    async def body() -> None:
        ran.set()
        await stopped.wait()

    async with here, contextlib.AsyncExitStack() as stack:
        if there is not here:
            await stack.enter_async_context(there)
            raw = redis.Redis.from_url(request.getfixturevalue("redis_url"))
            stack.callback(raw.close)
            channel = f"{logs.prefix}runs:stop"

            def subscribed() -> bool:
                return dict(raw.pubsub_numsub(channel)).get(channel.encode(), 0) >= 2  # type: ignore[no-any-return]

            await poll(subscribed)  # both managers listen
        here.start("r", body, stopped.set)
        await ran.wait()
        await there.stop("nobody's")  # an unknown run: nothing happens
        with anyio.fail_after(BOUND):
            await there.stop("r")
            await stopped.wait()


# --- a writer that died ---------------------------------------------------------------------------


@pytest.mark.parametrize("logs", ["redis"], indirect=True)  # one process: a memory log dies with its readers
async def test_a_run_whose_writer_stopped_heartbeating_is_lost_for_its_readers(logs: Logs) -> None:
    """The writer's process beats for its runs; a reader waiting on a run whose beats stopped (the
    process died: here its `serve` is cancelled) gets `RunGone("lost")`, and the run is no longer
    active. While the writer beats, for longer than `lost_after`, the run is not lost."""
    writer, reader = logs.pair(heartbeat=0.02, lost_after=0.2)
    assert isinstance(writer, RedisRunLog)
    await writer.open(RunRecord("r", '"ada"', "t"))
    writer.append("r", 1, frame(1))
    outcome: list[Any] = []

    async def read() -> None:
        try:
            with anyio.fail_after(BOUND):
                async for item in reader.read("r", 0):
                    outcome.append(item)
        except RunGone as error:
            outcome.append(error.reason)

    client = redis.Redis.from_url(logs.url)  # type: ignore[arg-type]
    try:
        beats: set[bytes] = set()

        def beat_changed() -> bool:
            beats.add(client.hget(f"{logs.prefix}run:r", "beat"))  # type: ignore[arg-type]
            return len(beats) >= 15  # 14 beats at least: well past `lost_after`

        async with anyio.create_task_group() as group:
            async with serving(writer):
                group.start_soon(read)
                await poll(beat_changed)
                assert outcome == [(1, frame(1))]  # still reading: not lost
                assert await reader.active('"ada"', "t") == "r"
            # the writer is gone (no heartbeat, no end)
        assert outcome == [(1, frame(1)), "lost"]
        assert await reader.active('"ada"', "t") is None
        assert await gone(reader, "r", 1) == "lost"
    finally:
        client.close()


# --- Redis only -----------------------------------------------------------------------------------


async def test_every_key_of_a_redis_run_expires(redis_url: str, raw: redis.Redis) -> None:
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    log = RedisRunLog(redis_url, prefix=prefix, ttl=30, lost_after=20)
    try:
        await log.open(RunRecord("r", '"ada"', "t"))
        log.append("r", 1, frame(1))
        await log.flush("r")
        keys = sorted(raw.keys(f"{prefix}*"))  # type: ignore[arg-type]
        assert len(keys) == 3  # record, stream, the conversation's index
        for key in keys:
            assert 30_000 < raw.pttl(key) <= 50_000, key  # ttl + lost_after while it runs
        await log.end("r")
        for key in raw.keys(f"{prefix}run*"):  # type: ignore[union-attr]
            assert 0 < raw.pttl(key) <= 30_000, key
        assert raw.xlen(f"{prefix}runlog:r") == 2  # the frame, the end
    finally:
        await log.aclose()


async def test_a_redis_write_retried_after_a_lost_reply_appends_each_frame_once(
    redis_url: str, raw: redis.Redis
) -> None:
    """redis-py sends a command again when its reply was lost; the write skips the frames Redis has."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    log = RedisRunLog(redis_url, prefix=prefix)
    try:
        await log.open(RunRecord("r", None))
        sent: list[tuple[Any, Any]] = []
        script = log._write

        def twice(*, keys: Any, args: Any) -> Any:
            sent.append((keys, args))
            script(keys=keys, args=args)
            return script(keys=keys, args=args)

        log._write = twice  # type: ignore[assignment]
        log.append("r", 1, frame(1))
        log.append("r", 2, frame(2))
        await log.flush("r")
        log.append("r", 3, frame(3))
        await log.end("r")
        assert len(sent) == 2
        assert await read_all(log, "r", 0) == [(1, frame(1)), (2, frame(2)), (3, frame(3))]
        assert raw.xlen(f"{prefix}runlog:r") == 4
    finally:
        await log.aclose()


async def test_a_long_redis_buffer_is_written_in_bounded_batches(redis_url: str) -> None:
    """A script holds Redis while it runs: frames piled up (no `serve`) go in batches of at most
    `WRITE_FRAMES`, in order, the end with the last."""
    from agentrt._runs_redis_wire import WRITE_FRAMES

    log = RedisRunLog(redis_url, prefix=f"test-{uuid.uuid4().hex[:12]}:", max_frames=10 * WRITE_FRAMES)
    try:
        await log.open(RunRecord("r", None))
        sizes: list[int] = []
        script = log._write

        def counted(*, keys: Any, args: Any) -> Any:
            sizes.append(args[4])  # the one run's count of frames
            return script(keys=keys, args=args)

        log._write = counted  # type: ignore[assignment]
        total = 2 * WRITE_FRAMES + 500
        for seq in range(1, total + 1):
            log.append("r", seq, frame(seq))
        await log.end("r")
        assert sizes == [WRITE_FRAMES, WRITE_FRAMES, 500]
        assert await read_all(log, "r", 0) == [(seq, frame(seq)) for seq in range(1, total + 1)]
    finally:
        await log.aclose()


def test_redis_run_log_options_are_checked() -> None:
    with pytest.raises(ValueError, match="lost_after"):
        RedisRunLog(heartbeat=2, lost_after=1)
    with pytest.raises(ValueError, match="ttl"):
        RedisRunLog(ttl=-1)
    with pytest.raises(ValueError, match="max_frames"):
        RedisRunLog(max_frames=0)


async def test_agentrt_runs_imports_without_redis() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import agentrt.runs\n"
        "try:\n    agentrt.runs.RedisRunLog()\nexcept ImportError as e:\n    print(e)\n"
    )
    done = await anyio.run_process([__import__("sys").executable, "-c", code])
    assert "pip install 'agentrt[redis]'" in done.stdout.decode()
