"""The bounds and failure answers of runs that outlive their connection (`agentrt.runs`,
`endpoint(runs=...)`), from the outside reviews of issue 27 (F8-F12, /work/notes/review27.md, and
those after it) and what came with them: what a run log holds in all (memory) and what its sweep
looks at, what it buffers while Redis is down, a run the manager could not start, a Redis log that
lost its keys, the answers when the log is unavailable, a Last-Event-ID past a run's end, not a
number, or past what Redis has written yet, memory ids and client ids the endpoint cannot key a run
by (AG-UI's, a memoryless AG-UI endpoint's, one run id named by two users at once), and a log read
that fails mid-response.

Each test failed before its fix. asyncio and trio; the Redis tests use a real redis-server
(tests/redis_server.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
import redis
from redis_server import _free_port
from starlette.applications import Starlette
from test_frontends import AGUI_BODY, BODIES, VERCEL_BODY, by_thread
from test_run_logs import frame, gone, read_all, serving
from test_runs import Chat, Client, Gate, TwoGates, app_with, asgi, frames, run_client, run_id_of, user_of
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt import AssistantMessage, ConfigurationError
from agentrt.runs import MemoryRunLog, RedisRunLog, RunGone, RunRecord, Runs
from agentrt.testing import CallTool, Hang, ScriptedModel


def http(app: Starlette) -> httpx.AsyncClient:
    """httpx over ASGI, with the app's exceptions as the plain 500 a server answers them with."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://test"
    )


# --- F8: what the in-memory log holds in all ------------------------------------------------------


async def test_the_memory_log_evicts_ended_runs_oldest_first_when_its_total_is_exceeded() -> None:
    log = MemoryRunLog(max_bytes=100, max_total_bytes=100)
    for run in ("a", "b", "c"):
        await log.open(RunRecord(run, None))
        for seq in (1, 2, 3):
            log.append(run, seq, frame(seq))  # 10 bytes each
    await log.end("b")
    await log.end("a")  # ended after b: evicted after it
    await log.open(RunRecord("d", None))
    log.append("d", 1, frame(1))
    assert log.total_bytes == 100  # at the total: nothing evicted
    assert [await log.find(run) is not None for run in "abcd"] == [True] * 4
    log.append("d", 2, frame(2))  # over: the run that ended first (b) goes, only it
    assert log.total_bytes == 80
    assert [await log.find(run) is not None for run in "abcd"] == [True, False, True, True]
    for seq in (3, 4, 5):
        log.append("d", seq, frame(seq))
    assert log.total_bytes == 80  # a went too: c and d are live (30 + 50)
    assert [await log.find(run) is not None for run in "abcd"] == [False, False, True, True]
    await log.end("c")
    await log.end("d")
    assert await read_all(log, "c", 0) == [(seq, frame(seq)) for seq in (1, 2, 3)]
    assert await read_all(log, "d", 0) == [(seq, frame(seq)) for seq in range(1, 6)]


async def test_a_live_run_is_never_evicted_the_run_whose_frame_goes_over_the_total_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Live runs alone past the total: the run whose frame went over is dropped from the log (its
    # readers, waiting at its tail too, get `truncated`; its later frames are not kept), so the log
    # never holds more than its total. The other live runs are read whole.
    log = MemoryRunLog(max_bytes=100, max_total_bytes=100)
    await log.open(RunRecord("big", None))
    await log.open(RunRecord("next", None))
    for seq in range(1, 7):
        log.append("big", seq, frame(seq))
    outcome: list[Any] = []

    async def read_next() -> None:
        try:
            async for item in log.read("next", 0):
                outcome.append(item)
        except RunGone as error:
            outcome.append(error.reason)

    with caplog.at_level(logging.WARNING, logger="agentrt.runs"):
        async with anyio.create_task_group() as group:
            group.start_soon(read_next)
            for seq in range(1, 5):
                log.append("next", seq, frame(seq))
                await anyio.lowlevel.checkpoint()
            with anyio.fail_after(5):
                while outcome[-1:] != [(4, frame(4))]:
                    await anyio.lowlevel.checkpoint()
            log.append("next", 5, frame(5))  # 110: over, and nothing has ended
        for seq in range(6, 20):
            log.append("next", seq, frame(seq))  # not kept
    assert outcome == [(seq, frame(seq)) for seq in range(1, 5)] + ["truncated"]
    assert log.total_bytes == 60
    assert len([r for r in caplog.records if "max_total_bytes" in r.getMessage()]) == 1
    await log.end("next")
    await log.end("big")
    assert await log.find("next") == RunRecord("next", None)  # kept: a resume is told it was dropped
    assert await gone(log, "next", 0) == "truncated"
    assert await gone(log, "next", 19) == "truncated"
    assert await read_all(log, "big", 0) == [(seq, frame(seq)) for seq in range(1, 7)]


async def test_the_memory_log_s_total_counts_trims_and_expiries() -> None:
    log = MemoryRunLog(max_bytes=40, max_total_bytes=1000, ttl=0)
    await log.open(RunRecord("r", None))
    for seq in range(1, 6):
        log.append("r", seq, frame(seq))
    assert log.total_bytes == 20  # 50 > 40: trimmed to its last 20
    await log.end("r")
    await log.open(RunRecord("s", None))  # the sweep: r expired (ttl 0)
    assert await log.find("r") is None
    assert log.total_bytes == 0


class CountingRuns(dict[str, Any]):
    looked = 0

    def __iter__(self) -> Any:
        for item in super().__iter__():
            CountingRuns.looked += 1
            yield item

    def items(self) -> Any:
        for item in super().items():
            CountingRuns.looked += 1
            yield item

    def values(self) -> Any:
        for value in super().values():
            CountingRuns.looked += 1
            yield value


async def test_the_memory_log_s_total_is_kept_without_looking_at_the_other_runs() -> None:
    log = MemoryRunLog(max_bytes=1000, max_total_bytes=2000 * 10 + 15)
    log._runs = CountingRuns()
    for n in range(2000):
        await log.open(RunRecord(f"r{n}", None))
        log.append(f"r{n}", 1, frame(1))
        await log.end(f"r{n}")
    await log.open(RunRecord("live", None))
    CountingRuns.looked = 0
    log.append("live", 1, frame(1))  # 20 010: under
    log.append("live", 2, frame(2))  # 20 020: over by 5, the oldest ended run is evicted
    assert CountingRuns.looked == 0
    assert await log.find("r0") is None
    assert await log.find("r1") is not None
    assert log.total_bytes == 2000 * 10 + 10


async def test_the_memory_log_s_sweep_does_not_look_at_every_kept_run_on_each_open() -> None:
    # `MemoryRunLog.open` sweeps by scanning every run it keeps (`_sweep`), on the event loop: with
    # the default ttl (300 s) an app that starts 170 runs a second keeps 50 000, and each open then
    # takes ~3 ms of loop time (measured), for every request of the app.
    log = MemoryRunLog(ttl=300)
    log._runs = CountingRuns()
    for n in range(2000):
        await log.open(RunRecord(f"r{n}", None))
        log.append(f"r{n}", 1, b"x")
        await log.end(f"r{n}")
    CountingRuns.looked = 0
    await log.open(RunRecord("next", None))
    assert CountingRuns.looked < 100


def test_memory_run_log_total_is_checked() -> None:
    assert MemoryRunLog().max_total_bytes == 256 * 1024 * 1024
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="max_total_bytes"):
            MemoryRunLog(max_total_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_total_bytes"):
        MemoryRunLog(max_bytes=200, max_total_bytes=100)  # one run could not reach its own bound


# --- F9: what a Redis log buffers while Redis cannot be written -----------------------------------


def failing_writes(log: RedisRunLog) -> Any:
    """Make `log`'s writes fail as during a Redis outage; returns the real write script."""
    script = log._write

    def down(*, keys: Any, args: Any) -> Any:
        raise redis.ConnectionError("Redis is down")

    log._write = down  # type: ignore[assignment]
    return script


async def test_a_redis_outage_does_not_grow_a_run_s_buffer_past_its_bound(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # While Redis cannot be written, a run's frames stay in its writer's buffer; past
    # `max_buffered_bytes` the run is dropped from the log (logged once): its buffer is freed, its
    # later frames are not kept, and with no heartbeat for it its readers find it lost.
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    options: dict[str, Any] = {"prefix": prefix, "heartbeat": 0.02, "lost_after": 0.2}
    writer = RedisRunLog(redis_url, max_buffered_bytes=100, **options)
    reader = RedisRunLog(redis_url, **options)
    try:
        await writer.open(RunRecord("r", None))
        script = failing_writes(writer)
        with caplog.at_level(logging.WARNING, logger="agentrt.runs"):
            for seq in range(1, 11):
                writer.append("r", seq, frame(seq))
            assert writer._buffered == 100  # at the bound
            await writer.flush("r")  # fails: the frames stay
            assert writer._buffered == 100
            for seq in range(11, 1000):
                writer.append("r", seq, frame(seq))  # the first goes over
        assert "r" not in writer._writing
        assert writer._buffered == 0
        assert len([r for r in caplog.records if "max_buffered_bytes" in r.getMessage()]) == 1
        writer._write = script  # Redis is back
        async with serving(writer):
            await writer.end("r")  # nothing to end: the log forgot it
            assert await gone(reader, "r", 0) == "lost"
    finally:
        await writer.aclose()
        await reader.aclose()


async def test_a_redis_outage_does_not_grow_the_writer_s_buffers_past_their_total(redis_url: str) -> None:
    # `max_total_buffered_bytes` bounds the buffers of all the writer's runs: the run whose frame
    # goes over is dropped; the others are written once Redis is back.
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    writer = RedisRunLog(redis_url, prefix=prefix, max_buffered_bytes=100, max_total_buffered_bytes=150)
    try:
        await writer.open(RunRecord("a", None))
        await writer.open(RunRecord("b", None))
        script = failing_writes(writer)
        for seq in range(1, 9):
            writer.append("a", seq, frame(seq))
        for seq in range(1, 8):
            writer.append("b", seq, frame(seq))
        assert writer._buffered == 150
        await writer.flush("a")  # fails
        assert writer._buffered == 150  # the failed write's frames are back in their buffer
        writer.append("b", 8, frame(8))  # 160: b goes over
        assert sorted(writer._writing) == ["a"]
        assert writer._buffered == 80
        writer._write = script
        await writer.end("a")
        assert writer._buffered == 0
        assert await read_all(writer, "a", 0) == [(seq, frame(seq)) for seq in range(1, 9)]
    finally:
        await writer.aclose()


def test_redis_run_log_buffer_bounds_are_checked() -> None:
    log = RedisRunLog()
    assert (log.max_buffered_bytes, log.max_total_buffered_bytes) == (8 * 1024 * 1024, 256 * 1024 * 1024)
    for name in ("max_buffered_bytes", "max_total_buffered_bytes"):
        with pytest.raises(ValueError, match=name):
            RedisRunLog(**{name: 0})
    with pytest.raises(ValueError, match="max_total_buffered_bytes"):
        RedisRunLog(max_buffered_bytes=200, max_total_buffered_bytes=100)


# --- a run the manager could not start, or whose Redis log lost its keys --------------------------


async def test_a_run_the_manager_could_not_start_is_not_left_active_in_its_log() -> None:
    # `start_run` opens the run's log (`log.open`) before `runs.start`, which raises when the manager
    # is not running (not started, or already left at shutdown); nothing ends the log then. The
    # record stays "active" for its conversation, so the Vercel client's resume of the chat (GET
    # /{id}/stream) reads a run that will never write a frame: the response never ends.
    svc = agentrt.build(Chat, model=ScriptedModel(["a"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=by_thread, protocol="vercel-ui", runs=runs)
    app = app_with(runs, handler)
    async with http(app) as client:
        refused = await client.post("/chat", json=VERCEL_BODY, headers={"x-user": "ada"})
        async with runs:
            with anyio.move_on_after(5) as hung:  # bound on a hang, not a timed assertion
                resumed = await client.get("/chat/chat-1/stream", headers={"x-user": "ada"})
    assert refused.status_code == 500
    assert not hung.cancelled_caught, "the resume of the chat never ended"
    assert resumed.status_code == 204


async def test_a_redis_restart_mid_run_ends_that_run_and_leaves_the_manager_going(redis_url: str) -> None:
    # Redis restarted without persistence (its keys deleted here) while a run streams: the next
    # batched write finds the run's record gone and forgets the run (`_send`), so its next `append`
    # raises KeyError, in `write`'s `except Exception` too (it appends the error frame), out of the
    # run's task: the manager's task group fails, every other run of the app is cancelled, the
    # manager's block raises, and no run starts any more.
    gates, other_gate = TwoGates(), Gate()
    model = ScriptedModel(
        [CallTool("first_gate", {}, id="c1")], [CallTool("second_gate", {}, id="c2")], ["done"]
    )
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gates])
    other_model = ScriptedModel([CallTool("wait_for_gate", {}, id="o1")], ["fine"])
    other_svc = agentrt.build(Chat, model=other_model, memory=agentrt.memory.window(), tools=[other_gate])
    prefix = f"test-restart-{uuid.uuid4().hex[:8]}:"
    log = RedisRunLog(redis_url, prefix=prefix)
    runs = Runs(log)
    app = app_with(runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach"))
    other_app = app_with(
        runs, agentrt.sse.endpoint(other_svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach")
    )
    raw = redis.Redis.from_url(redis_url)
    client, other = Client(b'{"question": "Hi"}'), Client(b'{"question": "Hi"}', user=b"bob")
    failure: BaseException | None = None
    try:
        async with runs, anyio.create_task_group() as group:
            group.start_soon(run_client, app, client)
            await client.frames.wait()  # the first tool call was written to Redis and read back
            run = client.headers["agentrt-run-id"]
            for key in raw.scan_iter(f"{prefix}*"):  # the restart: Redis lost every key
                raw.delete(key)
            gates.first.set()  # the tool's result, the next call: written, refused, the run forgotten
            with anyio.fail_after(10):
                while run in log._writing:
                    await anyio.lowlevel.checkpoint()
            group.start_soon(run_client, other_app, other)  # a run after the restart
            await other.frames.wait()
            gates.second.set()  # the first run's next frame: KeyError
            other_gate.open.set()
    except BaseException as error:
        failure = error
    finally:
        raw.close()
        await log.aclose()
    assert failure is None, repr(failure)
    # The run that lost its log streams on to its client, which reads the stream itself (not the
    # log), but its log is gone for a resume; the run after it runs to its end.
    assert client.events()[-1]["event"] == "done"
    async with http(app) as resumer:
        resumed = await resumer.get("/chat/resume", params={"run": run}, headers={"x-user": "ada"})
    assert (resumed.status_code, resumed.json()["error"]["type"]) == (404, "run_not_found")
    assert [e["event"] for e in other.events()][-1] == "done"
    assert (await agentrt.memory.access(other_svc).read("bob"))[-1] == AssistantMessage(text="fine")


# --- F9b: a run log that cannot be reached --------------------------------------------------------


def endpoint_for(protocol: str, svc: Any, runs: Runs, **options: Any) -> Any:
    extra = {"message": "question"} if protocol == "ag-ui" else {}
    return agentrt.sse.endpoint(
        svc.chat, memory_id=by_thread, protocol=protocol, runs=runs, **extra, **options
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui", "ag-ui"])
async def test_a_run_log_that_cannot_be_reached_is_a_json_503_runs_unavailable(
    protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis is down as a run starts (its `open`), as a run is resumed (`find`, `active`) or stopped
    # (`find`): each is a JSON 503 `runs_unavailable`, logged, not a plain-text 500. The stream that
    # had started is closed, and nothing is stored.
    model = ScriptedModel(["a"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    log = RedisRunLog(f"redis://127.0.0.1:{_free_port()}/0")  # nothing listens there
    runs = Runs(log)
    app = app_with(runs, endpoint_for(protocol, svc, runs))
    ada = {"x-user": "ada"}
    try:
        with caplog.at_level(logging.ERROR, logger="agentrt"):
            async with runs, http(app) as client:
                answers = [
                    await client.post("/chat", json=BODIES[protocol], headers=ada),
                    await client.post("/chat", json={}, headers={**ada, "last-event-id": "run-x:1"}),
                    await client.get("/chat/resume", params={"run": "run-x"}, headers=ada),
                    await client.get("/chat/chat-1/stream", headers=ada),
                    await client.post("/chat/stop", json={"runId": "run-x", "threadId": "t1"}, headers=ada),
                ]
    finally:
        await log.aclose()
    for answer in answers:
        assert answer.status_code == 503, (answer.request.url, answer.text)
        assert answer.json()["error"]["type"] == "runs_unavailable"
    assert len([r for r in caplog.records if "run log" in r.getMessage()]) == len(answers)
    # AG-UI's run id is checked in the log before the model is asked; the others' open comes after
    asked = [] if protocol == "ag-ui" else [True]
    assert [stream.closed for stream in model.streams] == asked  # and released
    assert await agentrt.memory.access(svc).read("ada:t1") == []
    assert await agentrt.memory.access(svc).read("ada:chat-1") == []
    assert "runs_unavailable" in agentrt.sse.ERROR_TYPES


# --- F10: a Last-Event-ID past the run's end ------------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def run_log(request: pytest.FixtureRequest) -> AsyncIterator[MemoryRunLog | RedisRunLog]:
    if request.param == "memory":
        yield MemoryRunLog()
        return
    log = RedisRunLog(request.getfixturevalue("redis_url"), prefix=f"test-{uuid.uuid4().hex[:12]}:")
    yield log
    await log.aclose()


async def test_a_log_says_the_seq_of_a_run_s_last_frame(run_log: MemoryRunLog | RedisRunLog) -> None:
    await run_log.open(RunRecord("r", None))
    assert await run_log.last_seq("r") == 0
    for seq in (1, 2, 3):
        run_log.append("r", seq, frame(seq))
    await run_log.flush("r")
    assert await run_log.last_seq("r") == 3
    await run_log.end("r")
    assert await run_log.last_seq("r") == 3
    assert await run_log.last_seq("nope") is None


async def test_a_last_event_id_past_the_run_s_last_event_is_a_400(
    run_log: MemoryRunLog | RedisRunLog,
) -> None:
    # An ended run: a resume after its last event gets nothing (200); past it, a 400 (it was an empty
    # 200). A live run: past what it has sent so far, a 400 (the reader skipped every event up to it).
    gate = Gate()
    model = ScriptedModel(["done"], [CallTool("wait_for_gate", {}, id="c1")], ["after the gate"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate])
    runs = Runs(run_log)
    app = app_with(runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs))
    ada = {"x-user": "ada"}

    def after(run: str, seq: int) -> dict[str, str]:
        return {**ada, "last-event-id": f"{run}:{seq}"}

    async with runs, http(app) as client:
        first = await client.post("/chat", json={"question": "Hi"}, headers=ada)
        ended = first.headers["agentrt-run-id"]
        assert [e["event"] for e in parse_sse(first.text)] == ["token", "done"]
        at_end = await client.get("/chat/resume", headers=after(ended, 2))
        past = [await client.get("/chat/resume", headers=after(ended, seq)) for seq in (3, 99)]
        posted_past = await client.post("/chat", json={}, headers=after(ended, 3))

        going = Client(b'{"question": "Go"}')
        async with anyio.create_task_group() as group:
            group.start_soon(run_client, app, going)
            await going.frames.wait()  # its tool_call: event 1
            live = going.headers["agentrt-run-id"]
            live_past = await client.get("/chat/resume", headers=after(live, 2))
            resumed: list[httpx.Response] = []

            async def resume_at_1() -> None:
                resumed.append(await client.get("/chat/resume", headers=after(live, 1)))

            group.start_soon(resume_at_1)
            gate.open.set()
    assert (at_end.status_code, at_end.text) == (200, "")
    for answer in [*past, posted_past, live_past]:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "bad_event_id"
    assert [e["event"] for e in parse_sse(resumed[0].text)] == ["tool_result", "token", "done"]


# --- a Last-Event-ID that is not a number, or past what Redis has written -------------------------


async def finished_run(runs: Runs, app: Starlette) -> str:
    client = Client(b'{"question": "Hi"}')
    await run_client(app, client)
    return client.headers["agentrt-run-id"]


@pytest.mark.parametrize("digit", [b"\xb2", b"\xb9", b"\xb3"])  # latin-1 superscripts: '2', '1', '3'
async def test_a_last_event_id_with_a_non_ascii_digit_is_a_400_not_a_500(digit: bytes) -> None:
    # Starlette decodes header bytes as latin-1: b"\xb2" is "²", which str.isdigit() accepts and
    # int() refuses (ValueError: a 500, or an exception out of the app).
    svc = agentrt.build(Chat, model=ScriptedModel(["a"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs)
    app = app_with(runs, handler)
    async with runs:
        run = await finished_run(runs, app)
        transport = http(app)
        async with transport as client:
            got = await client.get(
                "/chat/resume", headers={"x-user": "ada", "last-event-id": run.encode() + b":" + digit}
            )
            posted = await client.post(
                "/chat", json={}, headers={"x-user": "ada", "last-event-id": run.encode() + b":1" + digit}
            )
    assert (got.status_code, got.text) == (400, got.text) and got.json()["error"]["type"] == "bad_event_id"
    assert posted.status_code == 400 and posted.json()["error"]["type"] == "bad_event_id"


@pytest.mark.parametrize("where", ["same worker", "another worker"])
async def test_a_resume_after_the_last_frame_its_client_got_is_not_refused_before_redis_has_it(
    redis_url: str, where: str
) -> None:
    # The first client's response sends each frame as soon as it is appended to the log, and
    # RedisRunLog writes its frames to Redis in batches (after `flush_interval`, or seconds later
    # while Redis is slow or down). A client cut there resumes after the last id it got: the check
    # for an id past the run's end (`last_seq`) looked at Redis only, and refused it (400
    # `bad_event_id`): the client could not resume its run at all.
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    gates = TwoGates()
    model = ScriptedModel(
        [CallTool("first_gate", {}, id="c1")], [CallTool("second_gate", {}, id="c2")], ["done"]
    )
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gates])
    log = RedisRunLog(redis_url, prefix=prefix)
    writes = threading.Event()  # cleared: Redis takes the writer's writes only once it is set again
    writes.set()
    script = log._write  # type: ignore[attr-defined]

    def slow_write(**kw: Any) -> Any:
        writes.wait(10)
        return script(**kw)

    log._write = slow_write  # type: ignore[attr-defined]
    runs = Runs(log)
    app = app_with(runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach"))
    if where == "same worker":
        other_log, other_runs, other_app = log, runs, app
    else:
        other_log = RedisRunLog(redis_url, prefix=prefix)
        other_runs = Runs(other_log)
        other_app = app_with(other_runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=other_runs))
    reading = anyio.Event()
    read_batches = other_log.read_batches

    def reads(run: str, after: int) -> Any:
        reading.set()  # the resume was accepted: it reads the log
        return read_batches(run, after)

    other_log.read_batches = reads  # type: ignore[method-assign]
    client = Client(b'{"question": "Hi"}')
    resumed: list[Any] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(runs)
            if other_runs is not runs:
                await stack.enter_async_context(other_runs)
            group = await stack.enter_async_context(anyio.create_task_group())
            group.start_soon(run_client, app, client)
            await client.frames.wait()  # the first tool call (frame 1)
            run = run_id_of(client)
            await log.flush(run)  # Redis has frame 1
            writes.clear()  # and, for now, nothing after it
            gates.first.set()
            with anyio.fail_after(10):
                while '"c2"' not in client.text:  # the second tool call (frame 3) reached the client
                    await anyio.lowlevel.checkpoint()
            client.hang_up()
            last = frames(client.text)[-1][0]
            assert last == f"{run}:3"

            async def resume() -> None:
                async with asgi(other_app) as http:
                    resumed.append(
                        await http.get("/chat/resume", headers={"x-user": "ada", "last-event-id": last})
                    )

            group.start_soon(resume)
            with anyio.fail_after(10):
                while not (reading.is_set() or resumed):
                    await anyio.lowlevel.checkpoint()
            writes.set()
            gates.second.set()
    finally:
        writes.set()
        await log.aclose()
        if other_log is not log:
            await other_log.aclose()
    assert resumed[0].status_code == 200, resumed[0].text
    assert [kind for _, kind in frames(resumed[0].text)] == ["tool_result", "token", "done"]


# --- F11: a memory id that cannot key a run -------------------------------------------------------


@pytest.mark.parametrize("with_runs", [True, False], ids=["runs", "no-runs"])
@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui", "ag-ui"])
@pytest.mark.parametrize(
    "conversation", [["ada"], {"user": "ada"}, ("ada", ["t1"])], ids=["list", "dict", "tuple"]
)
async def test_an_unhashable_memory_id_is_the_same_json_500_everywhere(
    protocol: str, with_runs: bool, conversation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A resolver breaking its contract (a memory id is hashable): with runs `key in local` raised
    # TypeError out of the endpoint (a plain-text 500); without, the native endpoint answered 500
    # `internal_error` from deep in the invocation. Now every protocol, with or without runs, answers
    # 500 `memory_id_failed` (logged) before the model is asked, as for a resolver that failed.
    model = ScriptedModel(["a"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    runs = Runs() if with_runs else None
    extra = {"message": "question"} if protocol == "ag-ui" else {}
    handler = agentrt.sse.endpoint(
        svc.chat, memory_id=lambda request: conversation, protocol=protocol, runs=runs, **extra
    )  # type: ignore[arg-type]
    app = app_with(Runs(), handler)
    ada = {"x-user": "ada"}
    with caplog.at_level(logging.ERROR, logger="agentrt"):
        async with runs if runs is not None else Runs(), http(app) as client:
            answers = [await client.post("/chat", json=BODIES[protocol], headers=ada)]
            answers.append(
                await client.post("/chat/stop", json={"runId": "r1", "threadId": "t1"}, headers=ada)
            )
            if runs is not None:
                answers.append(await client.get("/chat/chat-1/stream", headers=ada))  # its active run
    for answer in answers:
        assert answer.status_code == 500, (answer.request.url, answer.text)
        assert answer.json()["error"]["type"] == "memory_id_failed"
    assert len([r for r in caplog.records if "memory id" in r.getMessage()]) == len(answers)
    assert model.streams == []


# --- F12: AG-UI's client ids ----------------------------------------------------------------------


async def test_ag_ui_run_and_thread_ids_longer_than_a_resume_takes_are_refused_at_the_post() -> None:
    # `parse_event_id` takes a run id of at most 200 characters: a run named longer ran, but its own
    # event ids were refused on resume (and became Redis keys as they were).
    model = ScriptedModel(["a"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    runs = Runs()
    app = app_with(runs, endpoint_for("ag-ui", svc, runs))
    ada = {"x-user": "ada"}
    async with runs, http(app) as client:
        refused = [
            await client.post("/chat", json={**AGUI_BODY, "runId": "r" * 201}, headers=ada),
            await client.post("/chat", json={**AGUI_BODY, "threadId": "t" * 201}, headers=ada),
        ]
        longest = "r" * 200
        ran = await client.post(
            "/chat", json={**AGUI_BODY, "runId": longest, "threadId": "t" * 200}, headers=ada
        )
        resumed = await client.get("/chat/resume", headers={**ada, "last-event-id": f"{longest}:1"})
    for answer, field in zip(refused, ["runId", "threadId"], strict=True):
        # as any body the endpoint cannot read: 422 `invalid_request`, naming the field
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["type"] == "invalid_request"
        assert [problem["loc"] for problem in answer.json()["detail"]] == [[field]]
    assert len(model.streams) == 1
    assert ran.status_code == 200 and ran.headers["agentrt-run-id"] == longest
    assert resumed.status_code == 200
    assert parse_sse(resumed.text) == parse_sse(ran.text)[1:]


class Stateless:
    async def answer(self, question: str) -> agentrt.TokenStream: ...


def test_a_memoryless_ag_ui_endpoint_keeps_no_runs() -> None:
    # A method without memory keeps no owner: "the unguessable run id is the only key". But AG-UI's
    # client names its runs (`runId` in its body): the id is the client's, as guessable as it
    # makes it ("r1", a counter), and another client that named it would read the run (and stop
    # it). Such an endpoint is refused a run manager.
    svc = agentrt.build(Stateless, model=ScriptedModel(["secret"]))
    with pytest.raises(ConfigurationError, match="names its runs"):
        agentrt.sse.endpoint(svc.answer, protocol="ag-ui", runs=Runs())
    agentrt.sse.endpoint(svc.answer, protocol="ag-ui")  # without runs, as before
    agentrt.sse.endpoint(svc.answer, protocol="vercel-ui", runs=Runs())  # the server names those


class Gated(agentrt.memory.InMemoryStore):
    """A store whose loads wait for the test, one conversation at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.loading: dict[str, anyio.Event] = {}
        self.gates: dict[str, anyio.Event] = {}

    async def load(self, key: str, *args: Any, **kwargs: Any) -> Any:
        user = "bob" if "bob" in key else "ada"
        self.loading.setdefault(user, anyio.Event()).set()
        await self.gates.setdefault(user, anyio.Event()).wait()
        return await super().load(key, *args, **kwargs)


async def test_a_run_id_another_user_starts_at_the_same_time_does_not_unhook_the_first_run() -> None:
    # An AG-UI client names its runs, and the check that a run id is new (`find`) comes before the
    # model is asked; the run is registered with the manager (`reserve`) after. Two users naming one
    # run id at once both passed the check; the second's `reserve` replaced the first's stop, and
    # its refusal (409 `run_exists` at the log's `open`) removed it: leaving the manager no longer
    # stopped the first user's run, which went on after the app's runs had ended.
    store = Gated()
    model = ScriptedModel(["Hel", Hang()], "never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(store=store))
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=by_thread, protocol="ag-ui", runs=runs)
    app = app_with(runs, handler)
    ada = Client(json.dumps(AGUI_BODY).encode())
    bob = Client(json.dumps(AGUI_BODY).encode(), user=b"bob")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            async with runs:
                group.start_soon(run_client, app, ada)
                await store.loading.setdefault("ada", anyio.Event()).wait()
                group.start_soon(run_client, app, bob)
                await store.loading.setdefault("bob", anyio.Event()).wait()
                store.gates.setdefault("ada", anyio.Event()).set()
                await ada.frames.wait()  # ada's run streams
                store.gates.setdefault("bob", anyio.Event()).set()
                while not bob.sent:
                    await anyio.lowlevel.checkpoint()
                assert bob.status == 409
            # Leaving the manager stops ada's run (`fail_after` fails the test if it goes on).
    assert [kind for _, kind in frames(ada.text)][-1] == "RUN_FINISHED"
    assert model.streams[0].closed


# --- a log read that fails mid-response -----------------------------------------------------------


def events_of(text: str) -> list[Any]:
    """A response's events' data (Vercel's `[DONE]` as the string)."""
    return [e["data"] for e in parse_sse(text.replace("data: [DONE]", 'data: "[DONE]"'))]


class FailingReads(MemoryRunLog):
    """A log whose reads fail after their first batch once `failing` is set (its store went away)."""

    failing = False

    async def read_batches(self, run: str, after: int) -> AsyncIterator[tuple[int, list[bytes]]]:
        async with contextlib.aclosing(super().read_batches(run, after)) as reading:
            async for batch in reading:
                yield batch
                if self.failing:
                    raise ConnectionError("the log's store went away")


UNAVAILABLE = {
    "agentrt": lambda data: data.get("type") == "runs_unavailable",
    "vercel-ui": lambda data: data.get("type") == "error" and "run log" in data["errorText"],
    "ag-ui": lambda data: data.get("type") == "RUN_ERROR" and data["code"] == "runs_unavailable",
}


@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui", "ag-ui"])
async def test_a_log_read_that_fails_ends_the_response_with_the_protocol_s_error(
    protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The log's read raised out of the response: its body stopped with no terminal event (the client
    # could not tell a cut from an end). Now the error is logged and the protocol's error event ends
    # the response (`runs_unavailable`: resume later), Vercel's `[DONE]` after it.
    svc = agentrt.build(Chat, model=ScriptedModel(["one ", "two"]), memory=agentrt.memory.window())
    log = FailingReads()
    runs = Runs(log)
    app = app_with(runs, endpoint_for(protocol, svc, runs))
    ada = {"x-user": "ada"}
    with caplog.at_level(logging.ERROR, logger="agentrt"):
        async with runs, http(app) as client:
            ran = await client.post("/chat", json=BODIES[protocol], headers=ada)
            run = ran.headers["agentrt-run-id"]
            log.failing = True
            resumed = await client.get("/chat/resume", params={"run": run}, headers=ada)
    whole = events_of(ran.text)
    got = events_of(resumed.text)
    assert resumed.status_code == 200
    assert got[0] == whole[0]  # the first batch, then the error
    end = got[1:-1] if protocol == "vercel-ui" else got[1:]
    assert len(end) >= 1 and UNAVAILABLE[protocol](end[-1]), got
    if protocol == "vercel-ui":
        assert got[-1] == "[DONE]"
    assert len([r for r in caplog.records if "reading run" in r.getMessage()]) == 1


async def test_a_redis_read_that_fails_ends_the_response_with_an_error_event(redis_url: str) -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(["one ", "two"]), memory=agentrt.memory.window())
    log = RedisRunLog(redis_url, prefix=f"test-{uuid.uuid4().hex[:12]}:")
    runs = Runs(log)
    app = app_with(runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs))
    ada = {"x-user": "ada"}
    try:
        async with runs, http(app) as client:
            ran = await client.post("/chat", json={"question": "Hi"}, headers=ada)
            run = ran.headers["agentrt-run-id"]

            def down(*args: Any, **kwargs: Any) -> Any:
                raise redis.ConnectionError("Redis is down")

            log._client.xread = down  # type: ignore[method-assign]
            resumed = await client.get("/chat/resume", params={"run": run}, headers=ada)
    finally:
        await log.aclose()
    assert [e["event"] for e in parse_sse(ran.text)] == ["token", "token", "done"]
    assert [(e["event"], e["data"]["type"]) for e in parse_sse(resumed.text)] == [
        ("error", "runs_unavailable")
    ]


class RacedLog(MemoryRunLog):
    """A log whose `find` misses every run: as when another request (another worker) opens the
    same run id between the endpoint's check and its `open`."""

    async def find(self, run: str) -> RunRecord | None:
        return None


async def test_an_ag_ui_run_id_taken_between_the_check_and_the_open_is_a_409_run_exists() -> None:
    model = ScriptedModel(["a"], ["b"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    runs = Runs(RacedLog())
    app = app_with(runs, endpoint_for("ag-ui", svc, runs))
    async with runs, http(app) as client:
        first = await client.post("/chat", json=AGUI_BODY, headers={"x-user": "ada"})
        again = await client.post("/chat", json=AGUI_BODY, headers={"x-user": "ada"})
    assert first.status_code == 200
    assert again.status_code == 409 and again.json()["error"]["type"] == "run_exists", again.text
    assert [stream.closed for stream in model.streams] == [True, True]
