"""An outside review of issue 27 (runs that outlive their connection): each test pins a defect the
review found (it fails on the code as reviewed, and passes once the defect is fixed).

See /work/notes/review27.md for the findings: reproduction, cause, suggested fix.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import redis
from asgi_scope import post_scope
from starlette.applications import Starlette
from starlette.routing import Route
from test_frontends import AGUI_BODY, VERCEL_BODY, by_thread
from test_runs import Chat, Client, Gate, app_with, asgi, run_client, user_of
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt import AssistantMessage, ConfigurationError
from agentrt.runs import MemoryRunLog, RedisRunLog, Runs
from agentrt.testing import CallTool, Hang, ScriptedModel


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
        transport = agentrt_transport(app)
        async with transport as http:
            got = await http.get(
                "/chat/resume", headers={"x-user": "ada", "last-event-id": run.encode() + b":" + digit}
            )
            posted = await http.post(
                "/chat", json={}, headers={"x-user": "ada", "last-event-id": run.encode() + b":1" + digit}
            )
    assert (got.status_code, got.text) == (400, got.text) and got.json()["error"]["type"] == "bad_event_id"
    assert posted.status_code == 400 and posted.json()["error"]["type"] == "bad_event_id"


def agentrt_transport(app: Starlette) -> Any:
    """httpx over ASGI, with the app's exceptions as 500s (as a server answers them)."""
    import httpx

    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://test"
    )


class TwoGates:
    def __init__(self) -> None:
        self.first = anyio.Event()
        self.second = anyio.Event()

    @agentrt.tool("Waits for the first gate.")
    async def first_gate(self) -> str:
        await self.first.wait()
        return "one"

    @agentrt.tool("Waits for the second gate.")
    async def second_gate(self) -> str:
        await self.second.wait()
        return "two"


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
    prefix = f"review-restart-{uuid.uuid4().hex[:8]}:"
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
    async with agentrt_transport(app) as http:
        resumed = await http.get("/chat/resume", params={"run": run}, headers={"x-user": "ada"})
    assert (resumed.status_code, resumed.json()["error"]["type"]) == (404, "run_not_found")
    assert [e["event"] for e in other.events()][-1] == "done"
    assert (await agentrt.memory.access(other_svc).read("bob"))[-1] == AssistantMessage(text="fine")


async def test_a_run_of_one_endpoint_is_not_resumed_or_stopped_through_another_sharing_the_manager() -> None:
    # One `Runs` for the app's endpoints (the documented set-up: one lifespan). A run's record keeps
    # its owner's key only (`_owner_key`: the memory id as JSON), not the endpoint, so another
    # endpoint whose resolver gives the same key (the same user) reads the run (its frames are the
    # other protocol's: a native stream under AG-UI's headers) and stops it.
    gate = Gate()
    model = ScriptedModel([CallTool("wait_for_gate", {}, id="c1")], ["a"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate])
    other = agentrt.build(Chat, model=ScriptedModel(["b"]), memory=agentrt.memory.window())
    runs = Runs()
    native = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach")
    agui = agentrt.sse.endpoint(
        other.chat, memory_id=user_of, runs=runs, protocol="ag-ui", message="question"
    )
    app = Starlette(
        routes=[
            Route("/chat", native, methods=["POST"]),
            Route("/agui/resume", agui.resume, methods=["GET"]),
            Route("/agui/stop", agui.stop, methods=["POST"]),
        ]
    )
    client = Client(b'{"question": "Hi"}')
    async with runs, anyio.create_task_group() as group, asgi(app) as http:
        group.start_soon(run_client, app, client)
        await client.frames.wait()
        run = client.headers["agentrt-run-id"]
        stopped = await http.post(
            "/agui/stop", json={"runId": run, "threadId": "t"}, headers={"x-user": "ada"}
        )
        gate.open.set()
        read = await http.get("/agui/resume", params={"run": run}, headers={"x-user": "ada"})
    assert (read.status_code, stopped.status_code) == (404, 404)
    assert [e["event"] for e in client.events()] == ["tool_call", "tool_result", "token", "done"]


async def test_a_run_the_manager_could_not_start_is_not_left_active_in_its_log() -> None:
    # `start_run` opens the run's log (`log.open`) before `runs.start`, which raises when the manager
    # is not running (not started, or already left at shutdown); nothing ends the log then. The
    # record stays "active" for its conversation, so the Vercel client's resume of the chat (GET
    # /{id}/stream) reads a run that will never write a frame: the response never ends.
    svc = agentrt.build(Chat, model=ScriptedModel(["a"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=by_thread, protocol="vercel-ui", runs=runs)
    app = app_with(runs, handler)
    async with agentrt_transport(app) as http:
        refused = await http.post("/chat", json=VERCEL_BODY, headers={"x-user": "ada"})
        async with runs:
            with anyio.move_on_after(5) as hung:  # bound on a hang, not a timed assertion
                resumed = await http.get("/chat/chat-1/stream", headers={"x-user": "ada"})
    assert refused.status_code == 500
    assert not hung.cancelled_caught, "the resume of the chat never ended"
    assert resumed.status_code == 204


class CountingRuns(dict[str, Any]):
    """`MemoryRunLog._runs`, counting the entries its sweep looks at."""

    looked = 0

    def items(self) -> Any:
        for item in super().items():
            CountingRuns.looked += 1
            yield item

    def values(self) -> Any:
        for value in super().values():
            CountingRuns.looked += 1
            yield value


async def test_the_memory_log_s_sweep_does_not_look_at_every_kept_run_on_each_open() -> None:
    # `MemoryRunLog.open` sweeps by scanning every run it keeps (`_sweep`), on the event loop: with
    # the default ttl (300 s) an app that starts 170 runs a second keeps 50 000, and each open then
    # takes ~3 ms of loop time (measured), for every request of the app.
    from agentrt.runs import RunRecord

    log = MemoryRunLog(ttl=300)
    log._runs = CountingRuns()
    for n in range(2000):
        await log.open(RunRecord(f"r{n}", None))
        log.append(f"r{n}", 1, b"x")
        await log.end(f"r{n}")
    CountingRuns.looked = 0
    await log.open(RunRecord("next", None))
    assert CountingRuns.looked < 100


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


class PausingRedisLog(RedisRunLog):
    """A `RedisRunLog` whose `open` returns only when the test says (its Redis round trip, long)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened = anyio.Event()
        self.proceed = anyio.Event()

    async def open(self, record: Any) -> None:
        await super().open(record)
        self.opened.set()
        await self.proceed.wait()


async def test_a_stop_that_lands_while_the_run_s_log_opens_stops_the_run(redis_url: str) -> None:
    # `start_run` copies `run.stopped` to the run's `Live` before `await log.open(...)`; a stop that
    # lands during that await (a Redis round trip) sets `run.stopped` on the `_Run` only (its scope
    # is None by then), answers 202, and the run goes on to its end and is stored.
    model = ScriptedModel(["the whole answer"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    log = PausingRedisLog(redis_url, prefix=f"review-stop-open-{uuid.uuid4().hex[:8]}:")
    runs = Runs(log)
    handler = agentrt.sse.endpoint(
        svc.chat, memory_id=by_thread, protocol="ag-ui", message="question", runs=runs
    )
    app = Starlette(
        routes=[
            Route("/agui", handler, methods=["POST"]),
            Route("/agui/stop", handler.stop, methods=["POST"]),
        ]
    )
    try:
        async with runs, asgi(app) as http, anyio.create_task_group() as group:
            got: list[Any] = []

            async def post() -> None:
                got.append(await http.post("/agui", json=AGUI_BODY, headers={"x-user": "ada"}))

            group.start_soon(post)
            with anyio.fail_after(10):
                await log.opened.wait()
            stop = {"runId": AGUI_BODY["runId"], "threadId": AGUI_BODY["threadId"]}
            stopped = await http.post("/agui/stop", json=stop, headers={"x-user": "ada"})
            log.proceed.set()
    finally:
        await log.aclose()
    assert stopped.status_code == 202
    kinds = [e["data"]["type"] for e in parse_sse(got[0].text)]
    assert "TEXT_MESSAGE_CONTENT" not in kinds, kinds  # stopped before the model's answer was streamed
    assert await agentrt.memory.access(svc).read("ada:t1") == []


async def test_a_stop_from_another_worker_while_the_run_s_log_opens_stops_the_run(redis_url: str) -> None:
    # Worker B's stop route finds the run's record (the open wrote it) and publishes the stop; worker
    # A's manager looks the run up in `Runs._live`, which `runs.start` fills only after the open:
    # the stop is dropped there, B answered 202, and the run streams its answer and is stored.
    prefix = f"review-remote-stop-{uuid.uuid4().hex[:8]}:"
    svc = agentrt.build(Chat, model=ScriptedModel(["the whole answer"]), memory=agentrt.memory.window())
    log_a = PausingRedisLog(redis_url, prefix=prefix)
    log_b = RedisRunLog(redis_url, prefix=prefix)
    runs_a, runs_b = Runs(log_a), Runs(log_b)
    heard = anyio.Event()
    stop_here = runs_a._stop_here

    def hear(run: str) -> None:
        stop_here(run)
        heard.set()

    runs_a._stop_here = hear  # type: ignore[method-assign]

    def worker(runs: Runs) -> Starlette:
        handler = agentrt.sse.endpoint(
            svc.chat, memory_id=by_thread, protocol="ag-ui", message="question", runs=runs
        )
        return Starlette(
            routes=[
                Route("/agui", handler, methods=["POST"]),
                Route("/agui/stop", handler.stop, methods=["POST"]),
            ]
        )

    got: list[Any] = []
    try:
        async with runs_a, runs_b, asgi(worker(runs_a)) as a, asgi(worker(runs_b)) as b:
            async with anyio.create_task_group() as group:

                async def post() -> None:
                    got.append(await a.post("/agui", json=AGUI_BODY, headers={"x-user": "ada"}))

                group.start_soon(post)
                with anyio.fail_after(10):
                    await log_a.opened.wait()
                stop = {"runId": AGUI_BODY["runId"], "threadId": AGUI_BODY["threadId"]}
                stopped = await b.post("/agui/stop", json=stop, headers={"x-user": "ada"})
                with anyio.fail_after(10):
                    await heard.wait()  # worker A got the stop request
                log_a.proceed.set()
    finally:
        await log_a.aclose()
        await log_b.aclose()
    assert stopped.status_code == 202
    kinds = [e["data"]["type"] for e in parse_sse(got[0].text)]
    assert "TEXT_MESSAGE_CONTENT" not in kinds, kinds
    assert await agentrt.memory.access(svc).read("ada:t1") == []


@pytest.mark.parametrize("policy", ["cancel", "detach"])
async def test_a_run_stopped_before_the_model_answered_ends_its_log_with_the_stopped_end(policy: str) -> None:
    # AG-UI names its run before the answer starts, so its stop can come while the model has not
    # answered. Without a manager the stream ends RUN_FINISHED (cancelled); with one, `write` got
    # `stream=None` and `live.stopped`, cancelled a scope with no checkpoint in it (so
    # `cancelled_caught` stayed False) and appended no end: the client got RUN_STARTED and nothing
    # more (native: an empty stream), and a resume the same.
    model = ScriptedModel([Hang()])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat, memory_id=by_thread, protocol="ag-ui", message="question", runs=runs, on_disconnect=policy
    )  # type: ignore[arg-type]
    app = Starlette(
        routes=[Route("/chat", handler, methods=["POST"]), Route("/stop", handler.stop, methods=["POST"])]
    )
    client = Client(json.dumps(AGUI_BODY).encode())
    client.scope = post_scope("/chat", [(b"x-user", b"ada")])
    async with runs, asgi(app) as http, anyio.create_task_group() as group:
        group.start_soon(run_client, app, client)
        with anyio.fail_after(10):
            while not model.streams:  # the model was asked, and has not answered
                await anyio.lowlevel.checkpoint()
        stop = {"runId": AGUI_BODY["runId"], "threadId": AGUI_BODY["threadId"]}
        assert (await http.post("/stop", json=stop, headers={"x-user": "ada"})).status_code == 202
    kinds = [e["data"]["type"] for e in client.events()]
    assert kinds[0] == "RUN_STARTED"
    assert client.events()[-1]["data"] == {
        "type": "RUN_FINISHED",
        "threadId": "t1",
        "runId": "r1",
        "outcome": {"type": "cancelled"},
    }, kinds  # as without a manager (tests/test_frontends.py)
