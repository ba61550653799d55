"""Under `on_disconnect="detach"` a run outlives its client: the response that started it hands it to
the run manager at the client's hang-up and ends, and the run goes on to its end. What the manager
takes over is whole: a stalled client whose send times out (a frame's or a keep-alive ping's) leaves
the run going; a run cut at any frame logs exactly what a client that never dropped got, a structured
answer's repair and a failure included; an approval asked after the hand-over is in the log and
resumes, one that ends the run as its client hangs up is not followed by a stop; nothing keeps the
hung-up response alive; a hang-up before the model answered leaves the run going too. The basic
hand-over is in tests/test_runs.py, stops that land during it in tests/test_sse_stop.py. asyncio and
trio.
"""

from __future__ import annotations

import gc
import json
import re
import weakref
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel
from starlette.requests import Request
from test_frontends import BODIES, PROTOCOLS, THREADS, by_thread
from test_runs import (
    Chat,
    Client,
    Gate,
    TwoGates,
    app_with,
    asgi,
    frames,
    logged,
    run_client,
    run_id_of,
    user_of,
)
from test_sse_endpoint import parse_sse
from test_sse_stop import stop_on_hand_over

import agentrt
import agentrt.sse
from agentrt import AssistantMessage, MemoryId, PartialStream
from agentrt.memory import InMemoryStore
from agentrt.runs import Runs
from agentrt.sse import _response, _runs
from agentrt.testing import CallTool, ScriptedModel

# --- a client that stops reading (a stalled connection) -------------------------------------------


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


# --- nothing keeps a hung-up response alive once the manager has its run --------------------------


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


# --- an approval asked after the hand-over, or as the client hangs up -----------------------------


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


# --- a hang-up before the model answered ----------------------------------------------------------


class Loading(agentrt.memory.InMemoryStore):
    """A store whose first load waits for the test (a remote store's round trip, a busy conversation)."""

    def __init__(self) -> None:
        super().__init__()
        self.loading = anyio.Event()
        self.gate = anyio.Event()

    async def load(self, key: str) -> Any:
        self.loading.set()
        await self.gate.wait()
        return await super().load(key)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_detach_a_hang_up_before_the_model_answered_leaves_the_run_going(protocol: str) -> None:
    # resumable-runs.md: "detach" lets a run "run to its end (or its budget), store the turn, and
    # keep its log for a client that comes back". A phone that drops while the model has not
    # answered (its first-token latency, a busy conversation, a slow store) lost the question: 499,
    # nothing asked, nothing stored, no run to resume (AG-UI's client knows its runId: 404).
    store = Loading()
    model = ScriptedModel(["Hello", " world"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(store=store))
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        protocol=protocol,  # type: ignore[arg-type]
        runs=runs,
        on_disconnect="detach",
    )
    client = Client(json.dumps(BODIES[protocol]).encode())
    async with runs:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(run_client, app_with(runs, handler), client)
                await store.loading.wait()
                client.hang_up()
                for _ in range(10):  # the hang-up is heard
                    await anyio.lowlevel.checkpoint()
                store.gate.set()
        conversation = agentrt.memory.access(svc)
        for _ in range(1000):  # the manager reads the run to its end (checkpoints, not time)
            if await conversation.read(f"ada:{THREADS[protocol]}"):
                break
            await anyio.lowlevel.checkpoint()
    stored = [m.text for m in await conversation.read(f"ada:{THREADS[protocol]}")]
    assert stored[-1:] == ["Hello world"]
