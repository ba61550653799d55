"""Runs that outlive their connection (`agentrt.runs`, `endpoint(runs=..., on_disconnect=...)`).

The endpoint is driven by hand over ASGI (its own `receive` and `send`) so that a client's hang-up
lands exactly where a test puts it; resumes go through httpx's ASGI transport. What is asserted: the
frames each client got (ids, bytes, exactly once), what memory stored, what the model was asked.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from asgi_scope import post_scope
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt import AssistantMessage, ConfigurationError, MemoryId, TokenStream, UserMessage, tool
from agentrt.runs import MemoryRunLog, RedisRunLog, RunGone, RunRecord, Runs
from agentrt.testing import CallTool, ScriptedModel


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def user_of(request: Request) -> str:
    return request.headers["x-user"]


class Gate:
    def __init__(self) -> None:
        self.open = anyio.Event()

    @tool("Waits until the test opens the gate.")
    async def wait_for_gate(self) -> str:
        await self.open.wait()
        return "opened"


def app_with(runs: Runs, handler: Any) -> Starlette:
    return Starlette(
        routes=[
            Route("/chat", handler, methods=["POST"]),
            Route("/chat/stop", handler.stop, methods=["POST"]),
            Route("/chat/resume", handler.resume, methods=["GET"]),
            Route("/chat/{id}/stream", handler.resume, methods=["GET"]),
        ]
    )


def chat_app(handler: Any) -> Starlette:
    """The endpoint and its stop route (the resume routes are `app_with`'s)."""
    return Starlette(
        routes=[
            Route("/chat", handler, methods=["POST"]),
            Route("/chat/stop", handler.stop, methods=["POST"]),
        ]
    )


class Client:
    """One ASGI request driven by hand: `receive` gives the body, then waits until `hang_up()`."""

    def __init__(self, body: bytes, user: bytes = b"ada") -> None:
        self.scope = post_scope("/chat", [(b"x-user", user)])
        self.body = body
        self.sent: list[dict[str, Any]] = []
        self.gone = anyio.Event()
        self.frames = anyio.Event()
        self._read = False

    async def receive(self) -> dict[str, Any]:
        if not self._read:
            self._read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone.is_set() and message["type"] == "http.response.body":
            return  # a server drops writes to a connection it knows is gone
        self.sent.append(message)
        if message.get("body"):
            self.frames.set()

    def hang_up(self) -> None:
        self.gone.set()

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent[1:]).decode()

    def events(self) -> list[dict[str, Any]]:
        return parse_sse(self.text)


async def run_client(app: Starlette, client: Client) -> None:
    with anyio.fail_after(10):
        await app(client.scope, client.receive, client.send)


def asgi(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


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


def run_id_of(client: Client) -> str:
    return client.headers["agentrt-run-id"]


async def test_every_frame_has_a_run_scoped_id_and_the_turn_is_stored() -> None:
    model = ScriptedModel(["Hello", " world"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs)
    async with runs:
        client = Client(b'{"question": "Hi"}')
        await run_client(app_with(runs, handler), client)
    run = client.headers["agentrt-run-id"]
    events = client.events()
    assert [(e["event"], e["id"]) for e in events] == [
        ("token", f"{run}:1"),
        ("token", f"{run}:2"),
        ("done", f"{run}:3"),
    ]
    assert events[-1]["data"]["text"] == "Hello world"
    assert await agentrt.memory.access(svc).read("ada") == [
        UserMessage.of("Hi"),
        AssistantMessage(text="Hello world"),
    ]


async def test_a_resume_after_any_id_gets_the_rest_exactly_once() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(["a", "b", "c", "d"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs)
    app = app_with(runs, handler)
    async with runs:
        client = Client(b'{"question": "Hi"}')
        await run_client(app, client)
        run = client.headers["agentrt-run-id"]
        whole = client.events()
        async with asgi(app) as http:
            for cut in range(len(whole) + 1):
                response = await http.post(
                    "/chat", json={}, headers={"x-user": "ada", "last-event-id": f"{run}:{cut}"}
                )
                assert response.status_code == 200
                assert parse_sse(response.text) == whole[cut:]
                again = await http.get(
                    "/chat/resume", headers={"x-user": "ada", "last-event-id": f"{run}:{cut}"}
                )
                assert parse_sse(again.text) == whole[cut:]


async def test_only_the_conversation_s_owner_may_resume_and_unknown_runs_are_404() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(["a"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs)
    app = app_with(runs, handler)
    async with runs:
        client = Client(b'{"question": "Hi"}')
        await run_client(app, client)
        run = client.headers["agentrt-run-id"]
        async with asgi(app) as http:
            other = await http.get("/chat/resume", headers={"x-user": "eve", "last-event-id": f"{run}:0"})
            unknown = await http.get("/chat/resume", headers={"x-user": "ada", "last-event-id": "run_x:0"})
            bad = await http.get("/chat/resume", headers={"x-user": "ada", "last-event-id": "7"})
            unnamed = await http.get("/chat/resume", headers={"x-user": "ada"})
    assert (other.status_code, other.json()["error"]["type"]) == (404, "run_not_found")
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "run_not_found")
    assert (bad.status_code, bad.json()["error"]["type"]) == (400, "bad_event_id")
    assert (unnamed.status_code, unnamed.json()["error"]["type"]) == (400, "no_run")


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


async def gated_run(policy: str) -> tuple[Any, Runs, Starlette, Client, ScriptedModel, Gate]:
    gate = Gate()
    model = ScriptedModel([CallTool("wait_for_gate", {}, id="c1")], ["The", " answer"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate])
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, on_disconnect=policy)  # type: ignore[arg-type]
    return svc, runs, app_with(runs, handler), Client(b'{"question": "Hi"}'), model, gate


async def test_detach_a_hang_up_leaves_the_run_going_and_a_resume_gets_the_rest() -> None:
    svc, runs, app, client, model, gate = await gated_run("detach")
    async with runs, anyio.create_task_group() as group:
        group.start_soon(run_client, app, client)
        await client.frames.wait()  # the tool call was sent; the tool waits
        client.hang_up()
        got = client.events()
        run = client.headers["agentrt-run-id"]
        gate.open.set()  # the run goes on with nobody connected
        async with asgi(app) as http:
            resumed = await http.get(
                "/chat/resume", headers={"x-user": "ada", "last-event-id": got[-1]["id"]}
            )
    rest = parse_sse(resumed.text)
    assert [e["event"] for e in got + rest] == ["tool_call", "tool_result", "token", "token", "done"]
    assert [e["id"] for e in got + rest] == [f"{run}:{n}" for n in range(1, 6)]
    stored = await agentrt.memory.access(svc).read("ada")
    assert stored[-1] == AssistantMessage(text="The answer")
    assert rest[-1]["data"]["text"] == "The answer"
    assert len(model.requests) == 2


async def test_cancel_a_hang_up_stops_the_run_and_nothing_is_stored() -> None:
    svc, runs, app, client, model, _gate = await gated_run("cancel")
    async with runs, anyio.create_task_group() as group:
        group.start_soon(run_client, app, client)
        await client.frames.wait()
        client.hang_up()
        run = None
        while run is None:
            await anyio.lowlevel.checkpoint()
            run = client.headers.get("agentrt-run-id") if client.sent else None
        async with asgi(app) as http:
            with anyio.fail_after(10):  # a run the hang-up did not stop would never end
                resumed = await http.get(
                    "/chat/resume", headers={"x-user": "ada", "last-event-id": f"{run}:0"}
                )
    events = parse_sse(resumed.text)
    assert [e["event"] for e in events] == ["tool_call", "stopped"]
    assert await agentrt.memory.access(svc).read("ada") == []
    assert len(model.requests) == 1  # the run stopped in its tool round: no second request


async def test_a_stop_from_the_stop_route_ends_the_run_with_stopped() -> None:
    svc, runs, app, client, _model, _gate = await gated_run("detach")
    async with runs, anyio.create_task_group() as group:
        group.start_soon(run_client, app, client)
        await client.frames.wait()
        run = client.headers["agentrt-run-id"]
        async with asgi(app) as http:
            other = await http.post("/chat/stop", json={"runId": run}, headers={"x-user": "eve"})
            stopped = await http.post("/chat/stop", json={"runId": run}, headers={"x-user": "ada"})
    assert other.status_code == 404
    assert stopped.status_code == 202
    assert [e["event"] for e in client.events()] == ["tool_call", "stopped"]
    assert await agentrt.memory.access(svc).read("ada") == []


def test_detach_needs_a_run_manager() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(), memory=agentrt.memory.window())
    with pytest.raises(ConfigurationError, match="detach"):
        agentrt.sse.endpoint(svc.chat, memory_id=user_of, on_disconnect="detach")
    with pytest.raises(ConfigurationError, match="on_disconnect"):
        agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=Runs(), on_disconnect="later")  # type: ignore[arg-type]


async def test_a_run_manager_that_was_not_started_says_so() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(["a"]), memory=agentrt.memory.window())
    runs = Runs()
    app = app_with(runs, agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs))
    client = Client(b'{"question": "Hi"}')
    with pytest.raises(RuntimeError, match="lifespan"):
        await run_client(app, client)
    assert await agentrt.memory.access(svc).read("ada") == []


# --- the in-memory log ---------------------------------------------------------------------------


async def read_all(log: MemoryRunLog, run: str, after: int) -> list[tuple[int, bytes]]:
    return [item async for item in log.read(run, after)]


async def test_the_memory_log_keeps_a_bounded_tail_and_says_when_a_reader_fell_behind() -> None:
    log = MemoryRunLog(max_bytes=100)
    await log.open(RunRecord("r", None))
    for seq in range(1, 21):
        log.append("r", seq, b"x" * 10)
    await log.end("r")
    kept = await read_all(log, "r", 15)
    assert [seq for seq, _ in kept] == [16, 17, 18, 19, 20]
    with pytest.raises(RunGone) as gone:
        await read_all(log, "r", 0)
    assert gone.value.reason == "truncated"


async def test_the_memory_log_forgets_an_ended_run_after_its_ttl() -> None:
    log = MemoryRunLog(ttl=0)
    await log.open(RunRecord("r", '"ada"', "t"))
    log.append("r", 1, b"a")
    assert await log.active('"ada"', "t") == "r"
    await log.end("r")
    assert await log.active('"ada"', "t") is None
    assert await log.find("r") is None
    with pytest.raises(RunGone) as gone:
        await read_all(log, "r", 0)
    assert gone.value.reason == "expired"


async def test_a_reader_at_the_tail_gets_each_frame_as_it_is_appended() -> None:
    log = MemoryRunLog()
    await log.open(RunRecord("r", None))
    got: list[tuple[int, bytes]] = []

    async def reader() -> None:
        got.extend(await read_all(log, "r", 0))

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        await anyio.lowlevel.checkpoint()
        log.append("r", 1, b"a")
        log.append("r", 2, b"b")
        await anyio.lowlevel.checkpoint()
        log.append("r", 3, b"c")
        await log.end("r")
    assert got == [(1, b"a"), (2, b"b"), (3, b"c")]


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


# --- every protocol: a run through the manager sends what the endpoint sends without one -----------


@pytest.mark.parametrize(
    ("protocol", "method"),
    [
        ("agentrt", "chat"),
        ("agentrt", "eager"),
        ("vercel-ui", "chat"),
        ("ag-ui", "chat"),
        ("ag-ui", "eager"),
    ],
)
@pytest.mark.parametrize("policy", ["cancel", "detach"])
async def test_a_run_sends_what_the_endpoint_sends_without_a_manager(
    protocol: str, method: str, policy: str
) -> None:
    from test_frontends import AGUI_BODY, VERCEL_BODY, Desk, Orders, by_thread, conversation

    body = {"agentrt": {"question": "Where?"}, "vercel-ui": VERCEL_BODY, "ag-ui": AGUI_BODY}[protocol]
    texts = []
    stored = []
    for runs in (None, Runs()):
        svc = agentrt.build(Desk, model=conversation(), tools=[Orders()], memory=agentrt.memory.window())
        options: dict[str, Any] = {"runs": runs, "on_disconnect": policy} if runs is not None else {}
        handler = agentrt.sse.endpoint(
            getattr(svc, method),
            memory_id=by_thread,
            protocol=protocol,
            tool_details=True,
            **options,  # type: ignore[arg-type]
        )
        app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
        async with contextlib.AsyncExitStack() as stack:
            if runs is not None:
                await stack.enter_async_context(runs)
            http = await stack.enter_async_context(asgi(app))
            response = await http.post("/chat", json=body, headers={"x-user": "ada"})
        assert response.status_code == 200
        run = response.headers.get("agentrt-run-id", "")
        text = response.text.replace("\r\n", "\n")
        ids = [line[4:] for line in text.split("\n") if line.startswith("id: ")]
        if runs is not None:
            assert ids == [f"{run}:{n}" for n in range(1, len(ids) + 1)]
            assert len(ids) == text.count("data: ")  # every frame has its id
        text = "\n".join(line for line in text.split("\n") if not line.startswith("id: "))
        text = re.sub(r'"invocation_id":"[0-9a-f]+"', '"invocation_id":"..."', text)
        texts.append(text.replace(run, "RUN") if protocol == "vercel-ui" else text)
        thread = {"agentrt": "None", "vercel-ui": "chat-1", "ag-ui": "t1"}[protocol]
        stored.append(await agentrt.memory.access(svc).read(f"ada:{thread}"))
    direct, logged = texts
    assert logged == direct
    assert stored[0] == stored[1] and stored[0][-1].text == "Both shipped, please."


async def test_leaving_the_manager_ends_its_runs_as_stopped_ones() -> None:
    svc, runs, app, client, _model, gate = await gated_run("detach")
    async with anyio.create_task_group() as group:
        async with runs:
            group.start_soon(run_client, app, client)
            await client.frames.wait()
            run = client.headers["agentrt-run-id"]
        # the app shut down: the run was cancelled, and its log says how it ended
    frames = [frame async for _, frame in runs.log.read(run, 0)]
    events = parse_sse(b"".join(frames).decode())
    assert [e["event"] for e in events] == ["tool_call", "stopped"]
    assert [e["event"] for e in client.events()] == ["tool_call", "stopped"]
    assert await agentrt.memory.access(svc).read("ada") == []
    assert not gate.open.is_set()


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


async def test_a_client_protocol_run_is_resumed_by_its_id_for_its_user_only() -> None:
    from test_frontends import VERCEL_BODY, by_thread

    svc = agentrt.build(Chat, model=ScriptedModel(["a", "b"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=by_thread, protocol="vercel-ui", runs=runs)
    app = app_with(runs, handler)
    async with runs, asgi(app) as http:
        first = await http.post("/chat", json=VERCEL_BODY, headers={"x-user": "ada"})
        run = first.headers["agentrt-run-id"]
        last = f"{run}:2"
        mine = await http.get("/chat/resume", headers={"x-user": "ada", "last-event-id": last})
        theirs = await http.get("/chat/resume", headers={"x-user": "eve", "last-event-id": last})
        by_chat = await http.get("/chat/chat-1/stream", headers={"x-user": "ada"})
    frames = [f for f in first.text.split("\n\n") if f]
    assert mine.status_code == 200 and [f for f in mine.text.split("\n\n") if f] == frames[2:]
    assert theirs.status_code == 404
    assert by_chat.status_code == 204  # the run has ended: nothing to resume


async def test_a_reader_gets_every_frame_there_is_in_one_batch_of_at_most_64() -> None:
    log = MemoryRunLog()
    await log.open(RunRecord("r", None))
    for seq in range(1, 71):
        log.append("r", seq, b"%d" % seq)
    await log.end("r")
    batches = [(first, len(frames)) async for first, frames in log.read_batches("r", 2)]
    assert batches == [(3, 64), (67, 4)]
    assert [seq for seq, _ in await read_all(log, "r", 0)] == list(range(1, 71))


async def test_a_reader_cancelled_while_it_waits_leaves_the_others_waiting() -> None:
    log = MemoryRunLog()
    await log.open(RunRecord("r", None))
    got: list[tuple[int, bytes]] = []

    async def reader() -> None:
        got.extend(await read_all(log, "r", 0))

    with anyio.fail_after(5):  # a reader left waiting for a wake that never comes fails here
        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            with anyio.CancelScope() as gone:
                async with anyio.create_task_group() as other:
                    other.start_soon(reader)
                    await anyio.lowlevel.checkpoint()  # both wait for the first frame
                    gone.cancel()
            log.append("r", 1, b"a")
            await log.end("r")
    assert got == [(1, b"a")]


async def test_a_run_s_frames_carry_its_ids_in_order_and_the_final_one_goes_alone_and_last() -> None:
    svc = agentrt.build(
        Chat, model=ScriptedModel([f"t{i} " for i in range(200)]), memory=agentrt.memory.window()
    )
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs)
    async with runs:
        client = Client(b'{"question": "Hi"}')
        await run_client(app_with(runs, handler), client)
    run = client.headers["agentrt-run-id"]
    events = client.events()
    assert [e["id"] for e in events] == [f"{run}:{seq}" for seq in range(1, 202)]
    writes = [m["body"] for m in client.sent[1:] if m.get("body")]
    assert parse_sse(writes[-1].decode()) == [events[-1]]  # the answer's end: alone, and last
    assert events[-1]["event"] == "done"
    assert len(await agentrt.memory.access(svc).read("ada")) == 2


class HangsUpOnTheEnd(Client):
    """A client whose connection the server finds gone right after the answer's final frame was
    handed to it (the hang-up is read in the turns after the send: the turn is not stored)."""

    def __init__(self, body: bytes, final: bytes) -> None:
        super().__init__(body)
        self.final = final

    async def send(self, message: dict[str, Any]) -> None:
        await super().send(message)
        if self.final in message.get("body", b""):
            self.hang_up()


@pytest.mark.parametrize(
    ("protocol", "final", "stopped"),
    [("agentrt", b"event: done", "stopped"), ("vercel-ui", b'"finish"', "abort")],
)
async def test_cancel_a_final_frame_not_written_before_the_hang_up_is_not_in_the_run_s_log(
    protocol: str, final: bytes, stopped: str
) -> None:
    # Under "cancel" the turn is stored only once the final frame was written; a hang-up read in the
    # turns after its send stops the run. A resume must then not show the answer's end either: the
    # log ends with the stopped end only, never the final frame followed by it.
    svc = agentrt.build(Chat, model=ScriptedModel(["The", " answer"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, runs=runs, protocol=protocol)  # type: ignore[arg-type]
    app = app_with(runs, handler)
    from test_frontends import VERCEL_BODY

    body = b'{"question": "Hi"}' if protocol == "agentrt" else json.dumps(VERCEL_BODY).encode()
    client = HangsUpOnTheEnd(body, final)
    async with runs:
        await run_client(app, client)
        run = client.headers["agentrt-run-id"]
        async with asgi(app) as http:
            resumed = await http.get("/chat/resume", params={"run": run}, headers={"x-user": "ada"})
    assert await agentrt.memory.access(svc).read("ada") == []
    assert final in client.text.encode()  # the client was handed the end
    assert resumed.status_code == 200
    assert final not in resumed.content, resumed.text
    assert stopped.encode() in resumed.content, resumed.text


class TwoGates:
    def __init__(self) -> None:
        self.first = anyio.Event()
        self.second = anyio.Event()

    @tool("Waits for the first gate.")
    async def first_gate(self) -> str:
        await self.first.wait()
        return "one"

    @tool("Waits for the second gate.")
    async def second_gate(self) -> str:
        await self.second.wait()
        return "two"


async def test_detach_the_manager_takes_the_run_over_and_the_hung_up_response_ends() -> None:
    # The response of the client that started the run reads its stream; at that client's hang-up
    # (under "detach") it hands the stream to the manager at the next event and ends, while the run
    # goes on in the manager to its end.
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
        await client.frames.wait()  # the first tool call was sent; its tool waits
        client.hang_up()
        await anyio.wait_all_tasks_blocked()  # the response heard of it
        gates.first.set()  # the next event: the run is handed over
        with anyio.fail_after(10):
            await responded.wait()  # the response ended while the second tool still waits
        run = client.headers["agentrt-run-id"]
        record = await runs.log.find(run)
        assert record is not None and not runs.log._runs[run].ended  # type: ignore[attr-defined]
        gates.second.set()
        async with asgi(app) as http:
            resumed = await http.get("/chat/resume", params={"run": run}, headers={"x-user": "ada"})
    assert [e["event"] for e in parse_sse(resumed.text)][-1] == "done"
    assert (await agentrt.memory.access(svc).read("ada"))[-1] == AssistantMessage(text="done")
