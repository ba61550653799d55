"""Stopping a run (`endpoint(...).stop`, `Runs.stop`): a stop that lands while the run's log opens (on
this worker or from another), or before the model answered, ends the run with the protocol's stopped
end and stores nothing. asyncio and trio, the Redis tests on a real redis-server
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
from asgi_scope import post_scope
from starlette.applications import Starlette
from starlette.routing import Route
from test_frontends import AGUI_BODY, by_thread
from test_runs import Chat, Client, asgi, run_client
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt.runs import RedisRunLog, Runs
from agentrt.testing import Hang, ScriptedModel

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
