"""Stopping a run (`endpoint(...).stop`, `Runs.stop`): a stop that lands while the run's log opens (on
this worker or from another), or before the model answered, ends the run with the protocol's stopped
end and stores nothing; one after the answer's end was sent comes too late, as without a manager,
and one after the run ended is a 404, with a manager too; one that lands as a detached run is handed
over to the manager ends its log once; one from another worker reaches a run the manager took over.
A request cancelled from outside leaves no run to stop, and the stop route reads JSON only, no more
than `max_body`, as the endpoint does. asyncio and trio, the Redis tests on a real redis-server
(tests/redis_server.py). The stop route's basics are in tests/test_runs.py and
tests/test_frontends.py, a stop across uvicorn workers in tests/test_runs_processes.py.
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
from test_frontends import AGUI_BODY, BODIES, PROTOCOLS, THREADS, by_thread
from test_run_logs import poll
from test_runs import (
    Chat,
    Client,
    Gate,
    TwoGates,
    app_with,
    asgi,
    chat_app,
    frames,
    logged,
    run_client,
    run_id_of,
    user_of,
)
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt import AssistantMessage
from agentrt.runs import RedisRunLog, Runs
from agentrt.testing import CallTool, Hang, ScriptedModel


def stopped_end(protocol: str) -> list[str]:
    return {
        "agentrt": ["stopped"],
        "vercel-ui": ["abort", "[DONE]"],
        "ag-ui": ["RUN_FINISHED"],
    }[protocol]


def gated(protocol: str, policy: str) -> tuple[Any, Runs, Any, Client, ScriptedModel, Gate]:
    gate = Gate()
    model = ScriptedModel([CallTool("wait_for_gate", {}, id="c1")], ["The", " answer"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate])
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        runs=runs,
        protocol=protocol,  # type: ignore[arg-type]
        on_disconnect=policy,  # type: ignore[arg-type]
    )
    client = Client(json.dumps(BODIES[protocol]).encode())
    return svc, runs, app_with(runs, handler), client, model, gate


# --- a stop that lands while the run's log opens --------------------------------------------------


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
    log = PausingRedisLog(redis_url, prefix=f"test-stop-open-{uuid.uuid4().hex[:8]}:")
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
    prefix = f"test-remote-stop-{uuid.uuid4().hex[:8]}:"
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


# --- a stop before the model answered -------------------------------------------------------------


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


# --- a stop that reaches the run through its manager after the answer's end was sent --------------


class StopsOnTheEnd(Client):
    """A client whose user presses stop just as the answer's final frame reached it: the stop
    (`Runs.stop`, what the stop route and another worker's request call) lands right after the
    final frame's send returned."""

    def __init__(self, body: bytes, final: bytes, runs: Runs) -> None:
        super().__init__(body)
        self.final = final
        self.runs = runs

    async def send(self, message: dict[str, Any]) -> None:
        await super().send(message)
        if self.final in message.get("body", b""):
            await self.runs.stop(run_id_of(self))


FINALS = {"agentrt": b"event: done", "vercel-ui": b'"type":"finish"', "ag-ui": b'"type":"RUN_FINISHED"'}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("policy", ["cancel", "detach"])
async def test_a_stop_after_the_answer_s_end_was_sent_is_too_late_as_without_a_manager(
    protocol: str, policy: str
) -> None:
    # Without a manager the endpoint forgets the run at `Completed` ("a stop now would come too
    # late"): the stop route answers 404 and the turn is stored. With one, the manager still knew
    # the run: the stop cancelled the response in its settle turns, so under "cancel" the turn the
    # client was sent the end of was not stored, and the client (and the log) got a stopped end
    # after the answer's end.
    svc = agentrt.build(Chat, model=ScriptedModel(["The", " answer"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        runs=runs,
        protocol=protocol,  # type: ignore[arg-type]
        on_disconnect=policy,  # type: ignore[arg-type]
    )
    client = StopsOnTheEnd(json.dumps(BODIES[protocol]).encode(), FINALS[protocol], runs)
    async with runs:
        await run_client(app_with(runs, handler), client)
        run = run_id_of(client)
        log = await logged(runs, run)
    got = frames(client.text)
    assert got == log
    kinds = [kind for _, kind in got]
    assert not set(kinds) & {"stopped", "abort", "RUN_ERROR"}, kinds
    assert kinds.count("RUN_FINISHED") <= 1 and kinds.count("[DONE]") <= 1, kinds
    stored = await agentrt.memory.access(svc).read(f"ada:{THREADS[protocol]}")
    assert stored[-1:] == [AssistantMessage(text="The answer")]
    assert not runs._live  # type: ignore[attr-defined]


# --- a stop after the run ended -------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("log", ["memory", "redis"])
async def test_a_stop_after_the_run_ended_is_404_with_a_run_manager_too(
    protocol: str, log: str, request: pytest.FixtureRequest
) -> None:
    # frontends.md: "Once the run's end was sent ... a stop comes too late: the run completes (404
    # after its end)". Without a manager it is; with one the stop found the run's record (kept for
    # resumes) and answered 202 `{"stopped": ...}` for a run that had ended and been stored.
    svc = agentrt.build(Chat, model=ScriptedModel(["Hello"]), memory=agentrt.memory.window())
    if log == "redis":
        url = request.getfixturevalue("redis_url")
        runs = Runs(RedisRunLog(url, prefix=f"test-late-stop-{uuid.uuid4().hex[:8]}:"))
    else:
        runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=by_thread, protocol=protocol, runs=runs)  # type: ignore[arg-type]
    async with runs, asgi(app_with(runs, handler)) as http:
        answer = await http.post("/chat", json=BODIES[protocol])
        stop = {"runId": answer.headers["agentrt-run-id"], "threadId": THREADS[protocol]}
        late = await http.post("/chat/stop", json=stop)
    assert [kind for _, kind in frames(answer.text)][-1] in ("done", "[DONE]", "RUN_FINISHED")
    assert late.status_code == 404
    assert late.json()["error"]["type"] == "run_not_found"


# --- a stop that lands while a detached run is handed over to the manager -------------------------


def stop_on_hand_over(runs: Runs) -> list[str]:
    """Make a stop land between `adopt`'s start of the manager's task and that task's first step
    (as the stop route's or another worker's stop can: they run in tasks of their own). The runs
    handed over are listed."""
    start = runs.start
    handed: list[str] = []

    def starting(run: str, body: Any, stop: Any) -> None:
        async def stopped_first() -> None:
            stop()
            await body()

        handed.append(run)
        start(run, stopped_first, stop)

    runs.start = starting  # type: ignore[method-assign]
    return handed


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_stop_landing_as_a_detached_run_is_handed_over_ends_its_log_once(protocol: str) -> None:
    svc, runs, app, client, model, gate = gated(protocol, "detach")
    stop_on_hand_over(runs)
    async with runs, anyio.create_task_group() as group:
        group.start_soon(run_client, app, client)
        await client.frames.wait()  # the tool call was sent; the tool waits
        client.hang_up()
        await anyio.wait_all_tasks_blocked()  # the response heard of it
        gate.open.set()  # the next event: the run is handed over, and stopped as it is
        run = run_id_of(client)
        log = await logged(runs, run)
    kinds = [kind for _, kind in log]
    assert kinds[-len(stopped_end(protocol)) :] == stopped_end(protocol), kinds
    assert [seq for seq, _ in log] == [f"{run}:{n}" for n in range(1, len(log) + 1)]
    assert not set(kinds) & {"error", "RUN_ERROR"}, kinds
    for kind in ("[DONE]", "RUN_FINISHED", "stopped", "abort"):
        assert kinds.count(kind) <= 1, kinds
    assert await agentrt.memory.access(svc).read(f"ada:{THREADS[protocol]}") == []
    assert len(model.requests) == 1  # stopped: no second request
    assert not runs._live  # type: ignore[attr-defined]


# --- a stop from another worker reaches a run its manager took over -------------------------------


async def test_a_stop_from_another_worker_stops_a_run_the_manager_took_over(redis_url: str) -> None:
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    gates = TwoGates()
    model = ScriptedModel(
        [CallTool("first_gate", {}, id="c1")], [CallTool("second_gate", {}, id="c2")], ["done"]
    )
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gates])
    log, other_log = RedisRunLog(redis_url, prefix=prefix), RedisRunLog(redis_url, prefix=prefix)
    runs, other = Runs(log), Runs(other_log)
    app = app_with(runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach"))
    other_app = app_with(other, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=other))
    raw = redis.Redis.from_url(redis_url)
    client = Client(b'{"question": "Hi"}')
    responded = anyio.Event()

    async def respond() -> None:
        await run_client(app, client)
        responded.set()

    try:
        async with runs, other, anyio.create_task_group() as group:
            channel = f"{prefix}runs:stop"
            await poll(lambda: dict(raw.pubsub_numsub(channel)).get(channel.encode(), 0) >= 2)
            group.start_soon(respond)
            await client.frames.wait()
            client.hang_up()
            await anyio.wait_all_tasks_blocked()
            gates.first.set()  # handed over: the manager waits at the second gate
            with anyio.fail_after(10):
                await responded.wait()
            run = run_id_of(client)
            async with asgi(other_app) as http:
                stopped = await http.post("/chat/stop", json={"runId": run}, headers={"x-user": "ada"})
            assert stopped.status_code == 202
            log_frames = await logged(runs, run)  # ends once the stop reached the run
    finally:
        raw.close()
        await log.aclose()
        await other_log.aclose()
    assert [kind for _, kind in log_frames] == ["tool_call", "tool_result", "tool_call", "stopped"]
    assert await agentrt.memory.access(svc).read("ada") == []
    assert not gates.second.is_set() and len(model.requests) == 2


# --- a request cancelled from outside leaves nothing to stop --------------------------------------


@pytest.mark.parametrize("with_runs", [False, True])
async def test_a_request_cancelled_while_the_model_is_asked_leaves_no_run_behind(with_runs: bool) -> None:
    # The server's task is cancelled (a shutdown, a timeout middleware) while the model has not
    # answered: the run was stoppable from the moment it was named, and stayed so for good: its
    # stop answered 202, and the client's next request with that run id 409 `run_in_progress`.
    model = ScriptedModel([Hang()], "Hello")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    runs = Runs() if with_runs else None
    handler = agentrt.sse.endpoint(svc.chat, memory_id=by_thread, protocol="ag-ui", runs=runs)
    app = chat_app(handler)
    client = Client(json.dumps(AGUI_BODY).encode())
    async with Runs() if runs is None else runs:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(app, client.scope, client.receive, client.send)
                while not model.streams:  # the model was asked, and has not answered
                    await anyio.lowlevel.checkpoint()
                group.cancel_scope.cancel()
        assert model.streams[0].closed
        async with asgi(app) as http:
            stop = await http.post("/chat/stop", json={"runId": "r1", "threadId": "t1"})
            again = await http.post("/chat", json=AGUI_BODY)
    assert stop.status_code == 404
    assert again.status_code == 200
    assert [kind for _, kind in frames(again.text)][-1] == "RUN_FINISHED"


# --- the stop route reads what the endpoint reads -------------------------------------------------


@pytest.mark.parametrize("protocol", ["vercel-ui", "ag-ui"])
async def test_the_stop_route_takes_json_only_and_no_more_than_max_body(protocol: str) -> None:
    # The endpoint refuses a body that is not JSON (a form or text/plain POST needs no CORS
    # preflight: any site could make a signed-in user's browser send one) and one past `max_body`;
    # its stop route read any body whole, and stopped the user's run from a text/plain POST.
    model = ScriptedModel(["Hel", Hang()])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        protocol=protocol,  # type: ignore[arg-type]
        max_body=1024,
    )
    app = chat_app(handler)
    client = Client(json.dumps(BODIES[protocol]).encode())
    async with asgi(app) as http, anyio.create_task_group() as group:
        with anyio.fail_after(10):
            group.start_soon(run_client, app, client)
            await client.frames.wait()
            stop = {"runId": client.headers["agentrt-run-id"], "threadId": THREADS[protocol]}
            text = await http.post(
                "/chat/stop", content=json.dumps(stop), headers={"content-type": "text/plain"}
            )
            large = await http.post("/chat/stop", json={**stop, "pad": "x" * 2048})
            json_stop = await http.post("/chat/stop", json=stop)
    assert text.status_code == 415
    assert text.json()["error"]["type"] == "unsupported_media_type"
    assert large.status_code == 413
    assert large.json()["error"]["type"] == "body_too_large"
    assert json_stop.status_code == 202
    assert model.streams[0].closed
