"""Approval over `agentrt.sse.endpoint`'s own protocol: a turn that stops before a gated tool call
ends its stream with `approval_required`, and a request `{"approval": {"run_id", "decisions"}}` on
the same endpoint resumes it on the conversation the `memory_id` resolver gives. Run through httpx's
ASGI transport, and once over real HTTP (tests/servers/approval_app.py under uvicorn); a tool with a
side-effect counter shows what ran, and how often."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx
import pytest
from pydantic import TypeAdapter
from served import serve
from servers import approval_tools
from servers.approval_tools import Shop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import ConfigurationError, MemoryId, TokenStream, user_message
from agentrt.testing import CallTool, ScriptedModel


class Desk(approval_tools.Desk):
    async def lone(self, question: str) -> TokenStream: ...


class Clashing:
    @user_message("{{question}} {{approval}}")
    async def chat(
        self, conversation: Annotated[str, MemoryId], question: str, approval: str = ""
    ) -> TokenStream: ...


def by_user(request: Request) -> str:
    return request.headers.get("x-user", "ada")


def refund_and_look(*after: Any) -> ScriptedModel:
    """A round that asks for a gated refund of A and an ungated look-up of B, then `after`."""
    first = [
        "Checking. ",
        CallTool("refund", {"order": "A"}, id="c1"),
        CallTool("look", {"order": "B"}, id="c2"),
    ]
    return ScriptedModel(first, *(after or (["Refunded A."],)))


def parse_sse(text: str) -> list[tuple[str, Any]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":"))
        if "data" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    for name, data in events:  # every event has its documented shape
        TypeAdapter(agentrt.sse.EVENTS[name]).validate_python(data, strict=True)
    return events


class Setup:
    def __init__(self, model: ScriptedModel, method: str = "chat") -> None:
        self.model = model
        self.shop = Shop()
        memory = agentrt.memory.window() if method == "chat" else None
        self.service = agentrt.build(Desk, model=model, tools=[self.shop], memory=memory)
        options = {"memory_id": by_user} if method == "chat" else {}
        handler = agentrt.sse.endpoint(getattr(self.service, method), tool_details=True, **options)
        app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    async def post(self, body: Any, user: str = "ada") -> httpx.Response:
        return await self.http.post("/chat", json=body, headers={"x-user": user})

    async def ask(self, question: str = "Refund A", user: str = "ada") -> list[tuple[str, Any]]:
        response = await self.post({"question": question}, user)
        assert response.status_code == 200, response.text
        return parse_sse(response.text)

    async def decide(self, run_id: str, decisions: Any, user: str = "ada") -> httpx.Response:
        return await self.post({"approval": {"run_id": run_id, "decisions": decisions}}, user)

    async def stored(self, user: str = "ada") -> list[tuple[str, str]]:
        return [(m.role, m.text) for m in await agentrt.memory.access(self.service).read(user)]


async def test_a_gated_call_ends_the_stream_with_approval_required_and_an_approval_resumes_it() -> None:
    setup = Setup(refund_and_look())
    events = await setup.ask()
    name, pending = events[-1]
    assert name == "approval_required"  # the last event: no `done`
    assert [(n, d.get("id")) for n, d in events[:-1]] == [
        ("token", None),
        ("tool_call", "c1"),
        ("tool_call", "c2"),
        ("tool_result", "c2"),  # the ungated call of the round ran before the turn stopped
    ]
    assert pending["calls"] == [{"id": "c1", "name": "refund", "arguments": {"order": "A", "amount": 1.0}}]
    assert isinstance(pending["expires_at"], float)
    assert setup.shop.refunds == [] and setup.shop.looks == ["B"]
    assert await setup.stored() == []  # nothing of a waiting turn is in the conversation yet

    response = await setup.decide(pending["run_id"], {"c1": {"approve": True}})
    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    assert [(n, d.get("id"), d.get("outcome")) for n, d in events[:-1]] == [
        ("tool_result", "c1", "success"),
        ("token", None, None),
    ]
    assert events[-1][0] == "done" and events[-1][1]["text"] == "Refunded A."
    assert setup.shop.refunds == [("A", 1.0)] and setup.shop.looks == ["B"]  # each ran once
    # The model was asked again with both results, as in an uninterrupted turn.
    second = setup.model.requests[1].messages
    assert [(m.role, m.text) for m in second[-2:]] == [("tool", "refunded 1.0 on A"), ("tool", "B: shipped")]
    assert await setup.stored() == [
        ("user", "Refund A"),
        ("assistant", "Checking. "),
        ("tool", "refunded 1.0 on A"),
        ("tool", "B: shipped"),
        ("assistant", "Refunded A."),
    ]

    # The same approval again: the run is no longer pending; nothing runs twice.
    again = await setup.decide(pending["run_id"], {"c1": {"approve": True}})
    assert again.status_code == 404
    assert again.json()["error"]["type"] == "approval_not_found"
    assert setup.shop.refunds == [("A", 1.0)] and len(setup.model.requests) == 2


async def test_a_denial_with_a_reason_is_the_call_s_result_and_the_call_never_runs() -> None:
    setup = Setup(refund_and_look(["Not refunded."]))
    pending = (await setup.ask())[-1][1]
    response = await setup.decide(pending["run_id"], {"c1": {"approve": False, "reason": "too much"}})
    events = parse_sse(response.text)
    assert events[0] == (
        "tool_result",
        {
            "id": "c1",
            "name": "refund",
            "outcome": "denied",
            "result": "The user denied this call of 'refund'; it was not run. Reason: too much",
        },
    )
    assert events[-1][0] == "done"
    assert setup.shop.refunds == []
    told = setup.model.requests[1].messages[-2]
    assert told.role == "tool" and told.text.endswith("Reason: too much")


async def test_an_edit_runs_the_call_with_the_edited_arguments_and_a_bad_edit_is_refused() -> None:
    setup = Setup(refund_and_look())
    pending = (await setup.ask())[-1][1]
    bad = await setup.decide(
        pending["run_id"], {"c1": {"approve": True, "arguments": {"order": "A", "amount": "lots"}}}
    )
    assert bad.status_code == 400
    assert bad.json()["error"] == {
        "type": "approval_decision",
        "message": "the decisions do not fit the pending tool calls",
    }
    assert setup.shop.refunds == [] and len(setup.model.requests) == 1  # nothing ran; it still waits
    edited = {"c1": {"approve": True, "arguments": {"order": "A", "amount": 5}}}
    response = await setup.decide(pending["run_id"], edited)
    assert response.status_code == 200, response.text
    assert parse_sse(response.text)[-1][0] == "done"
    assert setup.shop.refunds == [("A", 5.0)]
    # The model is told of the call as it ran.
    [call, _] = setup.model.requests[1].messages[1].tool_calls
    assert json.loads(call.arguments) == {"order": "A", "amount": 5.0}


@pytest.mark.parametrize(
    "decisions",
    [
        {"c1": {"approve": True}, "c9": {"approve": True}},  # a call the server did not ask about
        {"c2": {"approve": True}},  # a call that was not gated (it ran already)
        {"c1": {"approve": True}, "c2": {"approve": True}},
        {},  # no decision on the pending call
    ],
)
async def test_decisions_on_calls_the_server_did_not_ask_about_are_refused_and_nothing_runs(
    decisions: dict[str, Any],
) -> None:
    setup = Setup(refund_and_look())
    pending = (await setup.ask())[-1][1]
    response = await setup.decide(pending["run_id"], decisions)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "approval_decision"
    assert setup.shop.refunds == [] and setup.shop.looks == ["B"] and len(setup.model.requests) == 1
    # The turn still waits for its own decision.
    done = await setup.decide(pending["run_id"], {"c1": {"approve": True}})
    assert parse_sse(done.text)[-1][0] == "done" and setup.shop.refunds == [("A", 1.0)]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"approval": {"run_id": "r", "decisions": {}}, "question": "Refund A"}, ["question"]),
        ({"approval": {"run_id": "r", "decisions": {"c1": {"approve": "yes"}}}}, None),
        ({"approval": {"run_id": "r", "decisions": {"c1": {"approve": False, "arguments": {}}}}}, None),
        ({"approval": {"decisions": {"c1": {"approve": True}}}}, ["approval", "run_id"]),
        ({"approval": "yes"}, ["approval"]),
    ],
)
async def test_a_resume_body_that_cannot_be_read_is_a_400(body: Any, where: list[Any] | None) -> None:
    setup = Setup(refund_and_look())
    pending = (await setup.ask())[-1][1]
    if isinstance(body["approval"], dict) and "run_id" in body["approval"]:
        body["approval"]["run_id"] = pending["run_id"]
    response = await setup.post(body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "approval_decision"
    if where is not None:
        assert response.json()["detail"][0]["loc"] == where
    assert setup.shop.refunds == [] and len(setup.model.requests) == 1


async def test_a_stale_run_and_another_conversation_s_run_are_not_found() -> None:
    setup = Setup(refund_and_look())
    pending = (await setup.ask())[-1][1]
    unknown = await setup.decide("0" * 32, {"c1": {"approve": True}})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "approval_not_found"
    # Eve knows Ada's run id, but the resolver gives Eve's conversation: not found there.
    forged = await setup.decide(pending["run_id"], {"c1": {"approve": True}}, user="eve")
    assert forged.status_code == 404 and forged.json()["error"]["type"] == "approval_not_found"
    assert setup.shop.refunds == [] and len(setup.model.requests) == 1
    assert parse_sse((await setup.decide(pending["run_id"], {"c1": {"approve": True}})).text)[-1][0] == "done"
    assert setup.shop.refunds == [("A", 1.0)]


async def test_a_new_message_while_a_turn_waits_is_a_409_that_names_the_waiting_turn() -> None:
    setup = Setup(refund_and_look())
    pending = (await setup.ask())[-1][1]
    response = await setup.post({"question": "Anything else?"})
    assert response.status_code == 409
    assert response.json()["error"] == {
        "type": "approval_pending",
        "message": "the conversation waits for a decision on tool calls",
        **pending,
    }
    assert len(setup.model.requests) == 1
    # Another user's conversation is not held up (the model's next script answers it).
    assert (await setup.ask("Hello", user="eve"))[-1][0] == "done"
    assert len(setup.model.requests) == 2


async def test_two_resumes_at_once_run_the_call_once() -> None:
    setup = Setup(refund_and_look())
    pending = (await setup.ask())[-1][1]
    statuses: list[int] = []

    async def decide() -> None:
        response = await setup.decide(pending["run_id"], {"c1": {"approve": True}})
        statuses.append(response.status_code)

    async with anyio.create_task_group() as group:
        group.start_soon(decide)
        group.start_soon(decide)
    assert sorted(statuses) == [200, 404]
    assert setup.shop.refunds == [("A", 1.0)] and len(setup.model.requests) == 2


async def test_a_resumed_turn_that_calls_a_gated_tool_again_stops_again() -> None:
    setup = Setup(refund_and_look([CallTool("refund", {"order": "B"}, id="c3")], ["Both refunded."]))
    first = (await setup.ask())[-1][1]
    response = await setup.decide(first["run_id"], {"c1": {"approve": True}})
    events = parse_sse(response.text)
    assert [n for n, _ in events] == ["tool_result", "tool_call", "approval_required"]
    second = events[-1][1]
    assert second["run_id"] != first["run_id"]
    assert second["calls"] == [{"id": "c3", "name": "refund", "arguments": {"order": "B", "amount": 1.0}}]
    assert await setup.stored() == []  # the turn is stored whole at its end
    done = parse_sse((await setup.decide(second["run_id"], {"c3": {"approve": True}})).text)
    assert done[-1] == ("done", done[-1][1]) and done[-1][1]["text"] == "Both refunded."
    assert setup.shop.refunds == [("A", 1.0), ("B", 1.0)]
    assert [role for role, _ in await setup.stored()] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_a_method_without_memory_is_resumed_by_its_run_id() -> None:
    setup = Setup(refund_and_look(), method="lone")
    pending = (await setup.ask())[-1][1]
    done = parse_sse((await setup.decide(pending["run_id"], {"c1": {"approve": True}})).text)
    assert done[-1][0] == "done" and setup.shop.refunds == [("A", 1.0)]


async def test_approval_is_a_method_parameter_of_its_own_only_where_no_call_waits() -> None:
    gated = agentrt.build(Clashing, model=ScriptedModel(), tools=[Shop()], memory=agentrt.memory.window())
    with pytest.raises(ConfigurationError, match=r"Clashing\.chat: .* a parameter of that name"):
        agentrt.sse.endpoint(gated.chat, memory_id=by_user)
    model = ScriptedModel(["ok"])
    plain = agentrt.build(Clashing, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(plain.chat, memory_id=by_user)
    app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/chat", json={"question": "q", "approval": "yes"})
    assert parse_sse(response.text)[-1][0] == "done"


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    for base in serve(Path(__file__).parent / "servers" / "approval_app.py"):
        yield base.removesuffix("/v1")


async def test_an_approval_over_real_http_runs_the_call_once(served: str, anyio_backend: Any) -> None:
    user = {"x-user": f"http-{anyio_backend[0]}"}
    async with httpx.AsyncClient(base_url=served, timeout=20, headers=user) as http:
        before = (await http.get("/refunds")).json()
        first = parse_sse((await http.post("/chat", json={"question": "Refund A"})).text)
        pending = first[-1][1]
        assert first[-1][0] == "approval_required" and [c["id"] for c in pending["calls"]] == ["call_1"]
        decisions = {"run_id": pending["run_id"], "decisions": {"call_1": {"approve": True}}}
        forged = await http.post("/chat", json={"approval": decisions}, headers={"x-user": "eve"})
        assert forged.status_code == 404
        done = parse_sse((await http.post("/chat", json={"approval": decisions})).text)
        assert done[-1][0] == "done" and done[-1][1]["text"] == "Done: refunded 1.0 on A; B: shipped"
        again = await http.post("/chat", json={"approval": decisions})
        assert again.status_code == 404
        assert (await http.get("/refunds")).json()[len(before) :] == [["A", 1.0]]


def test_the_approval_event_and_errors_are_documented() -> None:
    schema = agentrt.sse.event_schema()["approval_required"]
    assert schema["required"] == ["run_id", "calls", "expires_at"]
    assert {"approval_not_found", "approval_decision", "approval_pending"} <= set(agentrt.sse.ERROR_TYPES)
