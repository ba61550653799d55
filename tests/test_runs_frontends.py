"""Runs that outlive their connection over the client protocols (`endpoint(protocol=..., runs=...)`).

AG-UI: a client cut after any event resumes the run by its id (`Last-Event-ID: {runId}:{seq}`, the
ids the endpoint sent) and gets exactly the rest, a tool round and an optimistic guardrail's
withdrawal included; a run id the client used already is refused before anything runs. Vercel: an
approval's answer continues the client's message in a run of its own (the message's first run keeps
its log). The clients' own libraries read these streams in tests/test_frontends_node.py.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from servers.frontends_app import Orders, answer, polite, user_and_thread
from starlette.applications import Starlette
from starlette.routing import Route
from test_runs import Client, asgi, run_client
from test_sse_endpoint import parse_sse

import agentrt
import agentrt.sse
from agentrt import MemoryId, TokenStream
from agentrt.guardrails import output_guardrails
from agentrt.runs import Runs
from agentrt.testing import FunctionModel


class Desk:
    @output_guardrails(polite, release="optimistic")
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def agui_app(runs: Runs) -> tuple[Any, Starlette, FunctionModel]:
    # frontends_app.answer: a round of two look-ups, an answer the guardrail withdraws (it was
    # streamed: optimistic), then the one that passes.
    model = FunctionModel(answer)
    svc = agentrt.build(Desk, model=model, tools=[Orders()], memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=user_and_thread,
        protocol="ag-ui",
        runs=runs,
        on_disconnect="detach",
        thinking=True,
        tool_details=True,
        ping=None,
    )
    app = Starlette(
        routes=[
            Route("/agui", handler, methods=["POST"]),
            Route("/agui/resume", handler.resume, methods=["GET"]),
        ]
    )
    return svc, app, model


def agui_body(thread: str, run: str) -> bytes:
    return (
        b'{"threadId": "%s", "runId": "%s", "state": {}, "tools": [], "context": [], "forwardedProps": {},'
        b' "messages": [{"id": "u1", "role": "user", "content": "Where are A and B?"}]}'
        % (thread.encode(), run.encode())
    )


class CutClient(Client):
    """A client whose connection drops once it got at least `cut` events (0: as the response
    starts; a response writes what the run's log holds at once, so a cut falls after a write)."""

    def __init__(self, body: bytes, cut: int, path: str = "/agui") -> None:
        super().__init__(body, user=b"ada")
        self.scope = {**self.scope, "path": path, "raw_path": path.encode()}
        self.cut = cut

    async def send(self, message: dict[str, Any]) -> None:
        await super().send(message)
        if message["type"] == "http.response.start" and self.cut == 0:
            self.hang_up()
        elif not self.gone.is_set() and self.cut > 0 and len(self.events()) >= self.cut:
            self.hang_up()  # a write may carry several events (what the log held): cut after it


async def test_ag_ui_a_run_cut_after_any_event_resumes_by_its_id_with_exactly_the_rest() -> None:
    runs = Runs()
    svc, app, _model = agui_app(runs)
    async with runs, asgi(app) as http:
        whole = CutClient(agui_body("t-whole", "r-whole"), cut=-1)
        await run_client(app, whole)
        reference = [e["data"]["type"] for e in whole.events()]
        # The stream has what a resume must not lose or repeat: a tool round, the withdrawn answer.
        assert "TOOL_CALL_RESULT" in reference and reference[-1] == "RUN_FINISHED"
        for cut in range(len(reference) + 1):
            run = f"r-{cut}"
            client = CutClient(agui_body(f"t-{cut}", run), cut)
            await run_client(app, client)
            got = client.events()
            assert len(got) >= cut
            last = got[-1]["id"] if got else f"{run}:0"
            resumed = await http.get("/agui/resume", headers={"x-user": "ada", "last-event-id": last})
            assert resumed.status_code == 200
            assert resumed.headers["agentrt-run-id"] == run
            rest = parse_sse(resumed.text)
            assembled = got + rest
            # Every event once, in order, with the id the log gave it; the same run as uncut.
            assert [e["id"] for e in assembled] == [f"{run}:{n}" for n in range(1, len(reference) + 1)]
            assert [e["data"]["type"] for e in assembled] == reference
            whole_again = await http.get(
                "/agui/resume", headers={"x-user": "ada", "last-event-id": f"{run}:0"}
            )
            assert parse_sse(whole_again.text) == assembled
            finished = assembled[-1]["data"]
            assert (finished["threadId"], finished["runId"]) == (f"t-{cut}", run)
            stored = await agentrt.memory.access(svc).read(f"ada:t-{cut}")
            assert stored[-1].text == finished["result"]["text"] == "Both shipped, please."


async def test_ag_ui_a_run_id_used_before_is_refused_and_nothing_runs() -> None:
    runs = Runs()
    svc, app, model = agui_app(runs)
    async with runs, asgi(app) as http:
        first = CutClient(agui_body("t-1", "r-1"), cut=-1)
        await run_client(app, first)
        calls = len(model.requests)
        again = await http.post(
            "/agui",
            content=agui_body("t-2", "r-1"),
            headers={"x-user": "ada", "content-type": "application/json"},
        )
        other = await http.post(
            "/agui",
            content=agui_body("t-1", "r-1"),
            headers={"x-user": "eve", "content-type": "application/json"},
        )
    for response in (again, other):
        assert response.status_code == 409
        assert response.json()["error"]["type"] == "run_exists"
    assert len(model.requests) == calls  # nothing ran
    assert await agentrt.memory.access(svc).read("ada:t-2") == []


def frames(text: str) -> list[dict[str, Any]]:
    """A UI message stream's events (its `[DONE]` as the string)."""
    return parse_sse(text.replace("data: [DONE]", 'data: "[DONE]"'))


async def test_vercel_an_approval_answer_continues_the_message_in_a_run_of_its_own() -> None:
    from servers.approval_tools import Desk as Shopfront
    from servers.approval_tools import Shop
    from test_frontends_approval import USER, answered, by_thread, vercel

    from agentrt.testing import CallTool, ScriptedModel

    shop = Shop()
    model = ScriptedModel(
        [
            "Checking. ",
            CallTool("refund", {"order": "A"}, id="c1"),
            CallTool("look", {"order": "B"}, id="c2"),
        ],
        ["Refunded A."],
    )
    svc = agentrt.build(Shopfront, model=model, tools=[shop], memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        protocol="vercel-ui",
        tool_details=True,
        runs=runs,
        on_disconnect="detach",
    )
    app = Starlette(
        routes=[
            Route("/chat", handler, methods=["POST"]),
            Route("/chat/{id}/stream", handler.resume, methods=["GET"]),
        ]
    )
    async with runs, asgi(app) as http:
        asked = await http.post("/chat", json=vercel(USER), headers={"x-user": "ada"})
        first = frames(asked.text)
        message_id = first[0]["data"]["messageId"]
        assert asked.headers["agentrt-run-id"] == message_id
        approval_id = next(
            e["data"]["approvalId"] for e in first if e["data"] != "[DONE]" and "approvalId" in e["data"]
        )
        answer = vercel(USER, answered(message_id, approval_id, True))
        went_on = await http.post("/chat", json=answer, headers={"x-user": "ada"})
        assert went_on.status_code == 200, went_on.text
        run = went_on.headers["agentrt-run-id"]
        rest = frames(went_on.text)
        # The continuation is its own run (its own ids); its stream continues the client's message.
        # Its log begins with the message as the answer carried it (what a resume's replay starts
        # the message again with); the client that sent the answer has it, and reads from after it.
        replay = answer_replay(message_id, approval_id)
        assert run != message_id
        skipped = len(replay)
        assert [e["id"] for e in rest] == [f"{run}:{n}" for n in range(skipped + 1, skipped + len(rest) + 1)]
        assert rest[0]["data"] == {"type": "start", "messageId": message_id}
        assert rest[-2]["data"]["type"] == "finish"
        whole = await http.get("/chat/chat-1/stream", headers={"x-user": "ada", "last-event-id": f"{run}:0"})
        assert [e["data"] for e in frames(whole.text)] == replay + [e["data"] for e in rest]
        # The message's first run keeps its log: it can still be read, as it was sent.
        again = await http.get(
            "/chat/chat-1/stream", headers={"x-user": "ada", "last-event-id": f"{message_id}:0"}
        )
        assert frames(again.text) == first
        none = await http.get("/chat/chat-1/stream", headers={"x-user": "ada"})
        assert none.status_code == 204  # both ended: nothing to resume
    assert shop.refunds == [("A", 1.0)]
    stored = await agentrt.memory.access(svc).read("ada:chat-1")
    assert stored[-1].text == "Refunded A."


def answer_replay(message_id: str, approval_id: str) -> list[dict[str, Any]]:
    """The chunks that rebuild the message `test_frontends_approval.answered` carries (the refund
    approved): what the log of the run that continues it begins with."""
    return [
        {"type": "start", "messageId": message_id},
        {"type": "text-start", "id": "part_0"},
        {"type": "text-delta", "id": "part_0", "delta": "Checking. "},
        {"type": "text-end", "id": "part_0"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "refund", "input": {"order": "A"}},
        {"type": "tool-approval-request", "approvalId": approval_id, "toolCallId": "c1"},
        {"type": "tool-approval-response", "approvalId": approval_id, "approved": True},
        {"type": "tool-input-available", "toolCallId": "c2", "toolName": "look", "input": {"order": "B"}},
        {"type": "tool-output-available", "toolCallId": "c2", "output": "B: shipped"},
    ]


async def test_vercel_a_resume_of_an_approval_s_continuation_replays_the_whole_message() -> None:
    # useChat's resume (GET {api}/{chat}/stream) replays a run from its first `start`, and the SDK
    # starts the message again there: the replay of the run that continues a message must hold the
    # message's parts from before the answer (tests/test_frontends_node.py: the SDK itself).
    import anyio
    from servers.approval_tools import Desk as Shopfront
    from servers.approval_tools import Shop
    from test_frontends_approval import USER, answered, by_thread, vercel

    from agentrt import ModelRequest
    from agentrt.testing import CallTool

    gate = anyio.Event()

    async def rounds(request: ModelRequest) -> Any:
        called = sum(1 for m in request.messages if m.role == "assistant" and m.tool_calls)
        if called == 0:
            return [
                "Checking. ",
                CallTool("refund", {"order": "A"}, id="c1"),
                CallTool("look", {"order": "B"}, id="c2"),
            ]
        if called == 1:
            return ["Then C. ", CallTool("look", {"order": "C"}, id="c3")]
        await gate.wait()  # the continuation goes on once the resume reads it
        return ["Refunded A."]

    shop = Shop()
    svc = agentrt.build(Shopfront, model=FunctionModel(rounds), tools=[shop], memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        protocol="vercel-ui",
        tool_details=True,
        runs=runs,
        on_disconnect="detach",
    )

    async def resume_then_open(request: Any) -> Any:
        response = await handler.resume(request)
        gate.set()
        return response

    app = Starlette(
        routes=[
            Route("/chat", handler, methods=["POST"]),
            Route("/chat/{id}/stream", resume_then_open, methods=["GET"]),
        ]
    )
    async with runs, asgi(app) as http:
        asked = await http.post("/chat", json=vercel(USER), headers={"x-user": "ada"})
        first = frames(asked.text)
        message_id = first[0]["data"]["messageId"]
        approval_id = next(e["data"]["approvalId"] for e in first if "approvalId" in e["data"])
        # The answer's response is dropped as it starts; its run goes on (detach) to the gate.
        body = vercel(USER, answered(message_id, approval_id, True))
        client = CutClient(json.dumps(body).encode(), cut=0, path="/chat")
        await run_client(app, client)
        assert client.status == 200
        run = client.headers["agentrt-run-id"]
        resumed = await http.get("/chat/chat-1/stream", headers={"x-user": "ada"})
    assert resumed.status_code == 200 and resumed.headers["agentrt-run-id"] == run
    replayed = frames(resumed.text)
    replay = answer_replay(message_id, approval_id)
    skipped = len(replay)
    assert [e["id"] for e in replayed] == [f"{run}:{n}" for n in range(1, len(replayed) + 1)]
    assert [e["data"] for e in replayed[:skipped]] == replay
    # Then the continuation's own stream, as its client would have read it: `start` (the same
    # message: the SDK does not start it again), the refund's output, the next round, the answer.
    went_on = [e["data"] for e in replayed[skipped:]]
    assert went_on[0] == {"type": "start", "messageId": message_id}
    assert went_on[-1] == "[DONE]"
    assert [c["type"] for c in went_on[1:-1]] == [
        "tool-output-available",
        "text-start",
        "text-delta",
        "text-end",
        "tool-input-start",
        "tool-input-delta",
        "tool-input-available",
        "tool-output-available",
        "text-start",
        "text-delta",
        "text-end",
        "finish",
    ]
    assert went_on[1] == {"type": "tool-output-available", "toolCallId": "c1", "output": "refunded 1.0 on A"}
    assert shop.refunds == [("A", 1.0)]
    stored = await agentrt.memory.access(svc).read("ada:chat-1")
    assert [(m.role, m.text) for m in stored] == [
        ("user", "Refund A"),
        ("assistant", "Checking. "),
        ("tool", "refunded 1.0 on A"),
        ("tool", "B: shipped"),
        ("assistant", "Then C. "),
        ("tool", "C: shipped"),
        ("assistant", "Refunded A."),
    ]
