"""A second outside review of issue 27 (runs that outlive their connection), of the change that makes
the first client's response read its run's stream itself (`agentrt.sse._response.respond` with a `Tee`) and
hands a detached run to the manager at its client's hang-up (`agentrt.sse._runs.adopt`).

The tests that pin a defect the review found failed on the code as reviewed (see
/work/notes/review27b.md: reproduction, cause, fix); the others ("held" in their commits) pin what
the review probed and found right: a detached run cut at any frame logs what a client that never
dropped got, the manager's shutdown ends every run's log once, nothing keeps a hung-up response
alive. asyncio and trio; the Redis tests use a real redis-server (tests/redis_server.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import threading
import uuid
import weakref
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
import redis
from pydantic import BaseModel
from starlette.requests import Request
from test_frontends import AGUI_BODY, VERCEL_BODY, by_thread
from test_run_logs import poll
from test_runs import Chat, Client, Gate, TwoGates, app_with, asgi, run_client, user_of
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt import AssistantMessage, MemoryId, PartialStream
from agentrt.memory import InMemoryStore
from agentrt.runs import MemoryRunLog, RedisRunLog, RunRecord, Runs
from agentrt.sse import _response, _runs
from agentrt.testing import CallTool, ScriptedModel

PROTOCOLS = ("agentrt", "vercel-ui", "ag-ui")
BODIES = {"agentrt": {"question": "Hi"}, "vercel-ui": VERCEL_BODY, "ag-ui": AGUI_BODY}
THREADS = {"agentrt": "None", "vercel-ui": "chat-1", "ag-ui": "t1"}


def frames(text: str | bytes) -> list[tuple[str | None, str]]:
    """An SSE body's frames as (id, kind): the native event name, or the JSON data's `type`, or the
    data itself (Vercel's `[DONE]`)."""
    if isinstance(text, bytes):
        text = text.decode()
    out: list[tuple[str | None, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" not in fields:
            continue
        kind = fields.get("event")
        if kind is None:
            try:
                data = json.loads(fields["data"])
            except ValueError:
                data = fields["data"]
            kind = data.get("type", "?") if isinstance(data, dict) else str(data)
        out.append((fields.get("id"), kind))
    return out


async def logged(runs: Runs, run: str) -> list[tuple[str | None, str]]:
    """What the run's log holds (what a resume from its start reads)."""
    with anyio.fail_after(10):  # a log that never ends fails here
        return frames(b"".join([frame async for _, frame in runs.log.read(run, 0)]))


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


def run_id_of(client: Client) -> str:
    return client.headers["agentrt-run-id"]


# --- a stop that reaches the run through its manager after the answer's end was sent ---------------


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


# --- a stop that lands while a detached run is handed over to the manager --------------------------


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


# --- a resume after the last frame a client got, while Redis has not written it yet ----------------


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


# --- a client that stops reading (a stalled connection) under "detach" ----------------------------


class Stalls(Client):
    """A client whose connection stalls (no FIN: a phone that lost its network): a send of a body
    that `stalls(body)` says never returns (the server's send times out: `send_timeout`)."""

    def __init__(self, body: bytes, stalls: Any) -> None:
        super().__init__(body)
        self.stalls = stalls
        self.stalled = anyio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        if self.stalls(message.get("body", b"")):
            self.stalled.set()
            await anyio.sleep_forever()
        await super().send(message)


async def respond(app: Any, client: Client, errors: list[BaseException]) -> None:
    try:
        await run_client(app, client)
    except Exception as error:  # what leaves the app (as a server would log it)
        errors.append(error)


@pytest.mark.virtual_clock
@pytest.mark.parametrize("what", ["a frame", "a keep-alive ping"])
async def test_detach_a_stalled_client_whose_send_times_out_leaves_the_run_going(what: str) -> None:
    # Under "detach" a client that is gone must not stop the run. A send that timed out hands the
    # run over when the send was a frame's (a GeneratorExit of the response's frames between two
    # sends). When it was a keep-alive ping's, sse-starlette cancels the response while it waits for
    # the stream's next event, which closes the stream: the run ended as a stopped one.
    gates = TwoGates()
    model = ScriptedModel(
        [CallTool("first_gate", {}, id="c1")], [CallTool("second_gate", {}, id="c2")], ["done"]
    )
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gates])
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach", ping=5, send_timeout=1
    )
    app = app_with(runs, handler)
    if what == "a frame":
        client = Stalls(b'{"question": "Hi"}', lambda body: b'"c2"' in body)  # the second tool call's
    else:
        client = Stalls(b'{"question": "Hi"}', lambda body: body.startswith(b": ping"))
    errors: list[BaseException] = []
    async with runs:
        async with anyio.create_task_group() as group:
            group.start_soon(respond, app, client, errors)
            await client.frames.wait()  # the first tool call
            run = run_id_of(client)
            if what == "a frame":
                gates.first.set()
            await client.stalled.wait()
            await anyio.sleep(2)  # virtual time: the send timed out
            assert not runs.log._runs[run].ended, await logged(runs, run)  # type: ignore[attr-defined]
            gates.first.set()
            gates.second.set()
        log = await logged(runs, run)
    kinds = [kind for _, kind in log]
    assert kinds == ["tool_call", "tool_result", "tool_call", "tool_result", "token", "done"]
    assert (await agentrt.memory.access(svc).read("ada"))[-1] == AssistantMessage(text="done")
    assert errors == []  # a run handed over is no failure of the app (no traceback in the log)


# --- what a resume reads equals what a client that never dropped reads ----------------------------


class Profile(BaseModel):
    name: str
    tags: list[str]


class Profiles:
    async def profile(
        self, conversation: Annotated[str, MemoryId], question: str
    ) -> PartialStream[Profile]: ...


def equal_run(protocol: str, kind: str) -> tuple[Any, Any]:
    """A service and its endpoint's method: a tool round and a withdrawn answer (`tokens`: an
    optimistic guardrail's reprompt; Vercel's chunked), a structured answer repaired once
    (`partial`), or a model that fails after a tool round (`error`)."""
    from test_frontends import Desk, Orders, conversation

    if kind == "tokens":
        svc = agentrt.build(Desk, model=conversation(), tools=[Orders()], memory=agentrt.memory.window())
        return svc, svc.chat if protocol == "vercel-ui" else svc.eager  # Vercel cannot withdraw text
    if kind == "error":  # the model fails after a tool round (its script runs out)
        model = ScriptedModel(["Looking. ", CallTool("order", {"order_id": "A"}, id="call_1")])
        svc = agentrt.build(Chat, model=model, tools=[Orders()], memory=agentrt.memory.window())
        return svc, svc.chat
    model = ScriptedModel(
        [CallTool("order", {"order_id": "A"}, id="call_1")],
        ['{"name": "Bob", "tags": ["x"', "], oops"],
        ['{"name": "Ada", ', '"tags": ["math", ', '"engines"', "]}"],
    )
    svc = agentrt.build(
        Profiles, model=model, tools=[Orders()], memory=agentrt.memory.window(), output_mode="instructions"
    )
    return svc, svc.profile


class CutsAfter(Client):
    """A client that hangs up once it got `cut` frames (`None`: never)."""

    def __init__(self, body: bytes, cut: int | None) -> None:
        super().__init__(body)
        self.cut = cut

    async def send(self, message: dict[str, Any]) -> None:
        await super().send(message)
        if self.cut is not None and not self.gone.is_set() and len(frames(self.text)) >= self.cut:
            self.hang_up()


def normalized(text: bytes, run: str) -> str:
    out = text.decode().replace(run, "RUN")
    return re.sub(r'"invocation_id": ?"[0-9a-f]+"', '"invocation_id":"..."', out)


@pytest.mark.parametrize("kind", ["tokens", "partial", "error"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_detach_a_run_cut_at_any_frame_logs_what_a_client_that_never_dropped_got(
    protocol: str, kind: str
) -> None:
    body = {**BODIES[protocol]}
    if protocol == "agentrt":
        body = {"question": "Where?"}

    async def one(cut: int | None) -> tuple[str, str, list[Any]]:
        svc, method = equal_run(protocol, kind)
        runs = Runs()
        handler = agentrt.sse.endpoint(
            method,
            memory_id=by_thread,
            runs=runs,
            protocol=protocol,  # type: ignore[arg-type]
            on_disconnect="detach",
            tool_details=True,
        )
        client = CutsAfter(json.dumps(body).encode(), cut)
        async with runs:
            await run_client(app_with(runs, handler), client)
            run = run_id_of(client)
            log = b"".join([frame async for _, frame in runs.log.read(run, 0)])
        stored = await agentrt.memory.access(svc).read(f"ada:{THREADS[protocol]}")
        return normalized(client.text.encode(), run), normalized(log, run), stored

    reference, logged_whole, stored_whole = await one(None)
    assert logged_whole == reference
    assert bool(stored_whole) is (kind != "error")
    count = len(frames(reference))
    for cut in range(count):
        got, log, stored = await one(cut)
        assert log == reference, cut
        assert reference.startswith(got) or cut == 0, cut
        assert stored == stored_whole, cut


# --- the manager's shutdown while responses read runs and the manager reads adopted ones -----------


@pytest.mark.parametrize("log_kind", ["memory", "redis"])
async def test_leaving_the_manager_ends_every_run_s_log_with_the_stopped_end(
    request: pytest.FixtureRequest, log_kind: str
) -> None:
    # Three runs when the app shuts down: one read by its client's response under "cancel", one
    # under "detach", one whose client hung up (the manager reads it). Each waits in a tool.
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    log: Any = (
        RedisRunLog(request.getfixturevalue("redis_url"), prefix=prefix) if log_kind == "redis" else None
    )
    runs = Runs(log)
    apps = {}
    gates = {}
    services = {}
    for name, policy in (("cancel", "cancel"), ("detach", "detach"), ("adopted", "detach")):
        gate = TwoGates()
        model = ScriptedModel(
            [CallTool("first_gate", {}, id="c1")], [CallTool("second_gate", {}, id="c2")], ["done"]
        )
        svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate])
        handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect=policy)  # type: ignore[arg-type]
        apps[name], gates[name], services[name] = app_with(runs, handler), gate, svc
    clients = {name: Client(b'{"question": "Hi"}') for name in apps}
    try:
        async with anyio.create_task_group() as group:
            async with runs:
                for name in apps:
                    group.start_soon(run_client, apps[name], clients[name])
                    await clients[name].frames.wait()
                adopted = clients["adopted"]
                adopted.hang_up()
                await anyio.wait_all_tasks_blocked()
                gates["adopted"].first.set()  # handed over: the manager waits at the second gate
                with anyio.fail_after(10):
                    while '"c2"' not in (await logged_so_far(runs, run_id_of(adopted))):
                        await anyio.lowlevel.checkpoint()
            # the app shut down
        for name, client in clients.items():
            run = run_id_of(client)
            log_frames = await logged(runs, run)
            kinds = [kind for _, kind in log_frames]
            assert kinds[-1] == "stopped", (name, kinds)
            assert kinds.count("stopped") == 1, (name, kinds)
            assert [seq for seq, _ in log_frames] == [f"{run}:{n}" for n in range(1, len(kinds) + 1)]
            assert await agentrt.memory.access(services[name]).read("ada") == [], name
        for name in ("cancel", "detach"):
            assert [kind for _, kind in frames(clients[name].text)] == ["tool_call", "stopped"], name
        assert not runs._live  # type: ignore[attr-defined]
    finally:
        if log is not None:
            await log.aclose()


async def logged_so_far(runs: Runs, run: str) -> str:
    """The run's log as it is now (memory, or what Redis has after a flush)."""
    await runs.log.flush(run)
    last = await runs.log.last_seq(run)  # type: ignore[attr-defined]
    got: list[bytes] = []
    if last:
        async with contextlib.aclosing(runs.log.read_batches(run, 0)) as reading:  # type: ignore[attr-defined]
            async for first, batch in reading:
                got += batch
                if first + len(batch) > last:
                    break
    return b"".join(got).decode()


# --- nothing keeps a hung-up response alive once the manager has its run ---------------------------


def alive(kind: type) -> int:
    gc.collect()
    return sum(1 for thing in gc.get_objects() if type(thing) is kind)


async def test_detach_once_the_manager_has_the_run_nothing_keeps_the_response_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[weakref.ref[Any]] = []  # the responses and requests of this test
    for kind in (_response.StreamResponse, Request):
        init = kind.__init__

        def tracking(self: Any, *args: Any, __init: Any = init, **kwargs: Any) -> None:
            __init(self, *args, **kwargs)
            made.append(weakref.ref(self))

        monkeypatch.setattr(kind, "__init__", tracking)
    runs_before, tees_before = alive(_response.Run), alive(_runs.Tee)  # other tests' leftovers
    gates = TwoGates()
    model = ScriptedModel(
        [CallTool("first_gate", {}, id="c1")], [CallTool("second_gate", {}, id="c2")], ["done"]
    )
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gates])
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach")
    app = app_with(runs, handler)
    client = Client(b'{"question": "Hi"}')
    responded = anyio.Event()

    async def respond() -> None:
        await run_client(app, client)
        responded.set()

    async with runs, anyio.create_task_group() as group:
        group.start_soon(respond)
        await client.frames.wait()
        client.hang_up()
        await anyio.wait_all_tasks_blocked()
        gates.first.set()
        with anyio.fail_after(10):
            await responded.wait()
        await anyio.wait_all_tasks_blocked()
        gc.collect()
        assert made and [r() for r in made] == [None] * len(made)  # the manager reads on (second gate)
        assert alive(_response.Run) == runs_before + 1
        gates.second.set()
    assert alive(_response.Run) == runs_before
    assert alive(_runs.Tee) == tees_before
    assert not runs._live  # type: ignore[attr-defined]


async def test_detach_an_approval_asked_after_the_manager_took_the_run_is_in_its_log_and_resumes() -> None:
    from servers.approval_tools import Shop

    gate = Gate()
    shop = Shop()
    model = ScriptedModel(
        [CallTool("wait_for_gate", {}, id="c0")], [CallTool("refund", {"order": "A"}, id="c1")], ["Refunded."]
    )
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate, shop])
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach")
    app = app_with(runs, handler)
    client = Client(b'{"question": "Refund A"}')
    async with runs:
        async with anyio.create_task_group() as group:
            group.start_soon(run_client, app, client)
            await client.frames.wait()
            client.hang_up()
            await anyio.wait_all_tasks_blocked()
            gate.open.set()
        run = run_id_of(client)
        async with asgi(app) as http:
            resumed = await http.get("/chat/resume", params={"run": run}, headers={"x-user": "ada"})
            events = parse_sse(resumed.text)
            assert [e["event"] for e in events][-2:] == ["tool_call", "approval_required"]
            pending = events[-1]["data"]
            decided = await http.post(
                "/chat",
                json={"approval": {"run_id": pending["run_id"], "decisions": {"c1": {"approve": True}}}},
                headers={"x-user": "ada"},
            )
    assert [e["event"] for e in parse_sse(decided.text)][-1] == "done"
    assert shop.refunds == [("A", 1.0)]
    assert (await agentrt.memory.access(svc).read("ada"))[-1] == AssistantMessage(text="Refunded.")


# --- MemoryRunLog.read closed early ---------------------------------------------------------------


async def test_a_memory_log_reader_closed_early_closes_its_batches_at_once() -> None:
    # `read` reads `read_batches`: closed at one of its frames, it left that generator to the
    # garbage collector (trio warns: "Async generator ... was garbage collected before it had been
    # exhausted"), where RedisRunLog.read closes it.
    log = MemoryRunLog()
    await log.open(RunRecord("r", None))
    for seq in (1, 2, 3):
        log.append("r", seq, b"%d" % seq)
    batches: list[Any] = []
    read_batches = log.read_batches

    def tracked(run: str, after: int) -> Any:
        batches.append(read_batches(run, after))
        return batches[-1]

    log.read_batches = tracked  # type: ignore[method-assign]
    async with contextlib.aclosing(log.read("r", 0)) as reading:
        async for seq, _ in reading:
            if seq == 2:
                break
    assert batches[0].ag_frame is None  # closed


class SlowPending(InMemoryStore):
    """A store whose write of a waiting turn (an approval's) waits for `saved` (a store across the
    network: the client may hang up meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.saving = anyio.Event()
        self.saved = anyio.Event()

    async def save_pending(self, key: str, run: str, data: bytes, *, owner: str | None = None) -> None:
        self.saving.set()
        await self.saved.wait()
        await super().save_pending(key, run, data, owner=owner)


async def test_detach_an_approval_after_its_client_hung_up_is_not_followed_by_a_stop() -> None:
    # The client hangs up while the approval is being stored; the approval ends the stream. Handed to
    # the manager there, the run could be stopped again (the endpoint had let it go: "the run ended")
    # and its log said `stopped` after `approval_required`, though the approval was stored.
    from servers.approval_tools import Shop

    store = SlowPending()
    model = ScriptedModel([CallTool("refund", {"order": "A"}, id="c1")], ["Refunded."])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(store=store), tools=[Shop()])
    runs = Runs()
    stop_on_hand_over(runs)
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect="detach")
    app = app_with(runs, handler)
    client = Client(b'{"question": "Refund A"}')
    async with runs:
        async with anyio.create_task_group() as group:
            group.start_soon(run_client, app, client)
            await store.saving.wait()
            client.hang_up()
            await anyio.wait_all_tasks_blocked()  # the response heard of it
            store.saved.set()
        run = run_id_of(client)
        log = await logged(runs, run)
    assert [kind for _, kind in log] == ["tool_call", "approval_required"]


# --- a stop from another worker reaches a run its manager took over --------------------------------


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
