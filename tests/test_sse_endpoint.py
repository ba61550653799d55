"""`agentrt.sse`: a streaming method mounted as a Server-Sent-Events endpoint (Starlette).

These run the endpoint in a Starlette app through httpx's ASGI transport: the body validation, the
events and their ids, the `done` payload, the HTTP errors before a stream, the memory id from the
resolver, what is (not) said of tools and errors. The model double records the requests it got.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from asgi_scope import post_scope
from pydantic import BaseModel, TypeAdapter
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tasks import in_another_task

import agentrt
import agentrt.sse
from agentrt import (
    AssistantMessage,
    Budget,
    ConfigurationError,
    ImageContent,
    MemoryId,
    RateLimitError,
    TokenStream,
    UserMessage,
    method_options,
    tool,
    user_message,
)
from agentrt.guardrails import fatal, input_guardrails
from agentrt.models import OpenAIChatModel
from agentrt.testing import CallTool, Hang, Raise, ScriptedModel


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    @user_message("{{question}} (tone: {{tone}})")
    async def ask(self, question: str, tone: str = "plain") -> TokenStream: ...

    async def awaited(self, question: str) -> str: ...

    @input_guardrails(lambda request: fatal("no secrets") if "secret" in request.user_message.text else None)
    async def guarded(self, question: str) -> TokenStream: ...


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of an SSE body: each with its `event`, `id` and JSON `data` (comments skipped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events


def app_for(*routes: tuple[str, Any]) -> httpx.AsyncClient:
    app = Starlette(routes=[Route(path, handler, methods=["POST"]) for path, handler in routes])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def user_of(request: Request) -> str:
    return request.headers["x-user"]


async def test_tokens_then_done_each_with_an_id() -> None:
    model = ScriptedModel(["Hello", " world"])
    svc = agentrt.build(Chat, model=model)
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
        response = await client.post("/ask", json={"question": "Hi", "tone": "warm"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert [(e["event"], e["id"]) for e in events] == [("token", "1"), ("token", "2"), ("done", "3")]
    assert [e["data"]["text"] for e in events[:2]] == ["Hello", " world"]
    done = events[-1]["data"]
    assert done["text"] == "Hello world" and done["value"] == "Hello world"
    assert done["finish_reason"] == "stop" and done["attempts"] == 1 and done["tool_executions"] == []
    assert set(done["usage"]) == {"input_tokens", "output_tokens", "total_tokens", "estimated"}
    assert model.requests[0].messages[-1] == UserMessage.of("Hi (tone: warm)")


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"{not json", None),
        (b'{"question": 3}', ["question"]),
        (b"{}", ["question"]),
        (b'{"question": "q", "conversation": "someone-else"}', ["conversation"]),  # not a field
    ],
)
async def test_a_bad_body_is_422_before_any_model_request(body: bytes, where: list[str] | None) -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model)
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
        response = await client.post("/ask", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    payload = response.json()
    assert payload["error"]["type"] == "invalid_request"
    if where is not None:
        assert [error["loc"] for error in payload["detail"]] == [where]
    assert model.requests == []


async def test_the_memory_id_comes_from_the_resolver_only() -> None:
    model = ScriptedModel("Hello Ada.", "Still you, Ada.")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of)
    async with app_for(("/chat", handler)) as client:
        first = await client.post("/chat", json={"question": "I am Ada"}, headers={"x-user": "ada"})
        naming = await client.post(
            "/chat", json={"question": "q", "conversation": "ada"}, headers={"x-user": "bob"}
        )
        second = await client.post("/chat", json={"question": "Who am I?"}, headers={"x-user": "ada"})
    assert first.status_code == 200 and second.status_code == 200
    assert naming.status_code == 422  # the body cannot choose a conversation
    conversations = agentrt.memory.access(svc)
    assert await conversations.read("ada") == [  # the resolver's conversation, and only it
        UserMessage.of("I am Ada"),
        AssistantMessage(text="Hello Ada."),
        UserMessage.of("Who am I?"),
        AssistantMessage(text="Still you, Ada."),
    ]
    assert await conversations.read("bob") == []


async def test_an_async_resolver_is_awaited() -> None:
    async def user(request: Request) -> str:
        return "carol"

    model = ScriptedModel("hi")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    async with app_for(("/chat", agentrt.sse.endpoint(svc.chat, memory_id=user))) as client:
        assert (await client.post("/chat", json={"question": "q"})).status_code == 200
    assert await agentrt.memory.access(svc).read("carol") == [
        UserMessage.of("q"),
        AssistantMessage(text="hi"),
    ]


async def test_errors_before_the_stream_are_http_errors() -> None:
    limited = RateLimitError("slow down, key sk-secret", retry_after=2.2, status=429)
    model = ScriptedModel([Raise(limited)])
    svc = agentrt.build(Chat, model=model)
    async with app_for(
        ("/ask", agentrt.sse.endpoint(svc.ask)), ("/guarded", agentrt.sse.endpoint(svc.guarded))
    ) as client:
        rate = await client.post("/ask", json={"question": "q"})
        refused = await client.post("/guarded", json={"question": "a secret"})
    assert rate.status_code == 429 and rate.headers["retry-after"] == "3"
    assert rate.json() == {
        "error": {"type": "rate_limited", "message": "the model is rate limited; try again later"}
    }
    assert "sk-secret" not in rate.text
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "input_refused"


async def test_an_error_mid_stream_is_an_error_event_with_a_safe_message() -> None:
    model = ScriptedModel(["Hel", Raise(RuntimeError("database password is hunter2"))])
    svc = agentrt.build(Chat, model=model)
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
        response = await client.post("/ask", json={"question": "q"})
    events = parse_sse(response.text)
    assert [e["event"] for e in events] == ["token", "error"]
    assert events[-1]["id"] == "2"
    assert events[-1]["data"] == {"type": "internal_error", "message": "internal error"}
    assert "hunter2" not in response.text
    assert model.streams[0].closed or model.streams[0].ended


class Lookup:
    @tool("Look up an order.")
    def order(self, order_id: str) -> str:
        return f"{order_id}: shipped to 4 Elm Street"


@pytest.mark.parametrize("details", [False, True])
async def test_tool_events_name_the_call_and_its_outcome(details: bool) -> None:
    model = ScriptedModel([CallTool("order", {"order_id": "SO-1"}, id="call_1")], "It shipped.")
    svc = agentrt.build(Chat, model=model, tools=[Lookup()])
    handler = agentrt.sse.endpoint(svc.ask, tool_details=details)
    async with app_for(("/ask", handler)) as client:
        response = await client.post("/ask", json={"question": "Where is SO-1?"})
    events = parse_sse(response.text)
    assert [e["event"] for e in events] == ["tool_call", "tool_result", "token", "done"]
    call, result = events[0]["data"], events[1]["data"]
    assert (call["id"], call["name"]) == ("call_1", "order")
    assert (result["id"], result["name"], result["outcome"]) == ("call_1", "order", "success")
    assert ("arguments" in call) is details and ("result" in result) is details
    assert ("4 Elm Street" in response.text) is details
    if details:
        assert json.loads(call["arguments"]) == {"order_id": "SO-1"}
    assert events[-1]["data"]["tool_executions"] == [{"id": "call_1", "name": "order", "outcome": "success"}]


async def test_the_endpoint_s_budget_bounds_each_request() -> None:
    model = ScriptedModel([CallTool("order", {"order_id": "SO-1"}, id="call_1")], "never asked")
    svc = agentrt.build(Chat, model=model, tools=[Lookup()])
    handler = agentrt.sse.endpoint(svc.ask, budget=Budget(model_requests=1))
    async with app_for(("/ask", handler)) as client:
        response = await client.post("/ask", json={"question": "q"})
    events = parse_sse(response.text)
    assert events[-1]["event"] == "error"
    assert events[-1]["data"] == {
        "type": "budget_exceeded",
        "message": "the request's budget was exhausted",
        "limit": "model_requests",
    }
    assert len(model.requests) == 1


def test_mistakes_are_configuration_errors() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel())
    with pytest.raises(ConfigurationError, match=r"takes a method of a built service"):
        agentrt.sse.endpoint(Chat.ask)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Chat\.awaited: an SSE endpoint streams"):
        agentrt.sse.endpoint(svc.awaited)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Chat\.chat: the method has a memory id"):
        agentrt.sse.endpoint(svc.chat)
    with pytest.raises(ConfigurationError, match=r"Chat\.ask: ping must be"):
        agentrt.sse.endpoint(svc.ask, ping=0)
    with pytest.raises(ConfigurationError, match=r"Chat\.ask: budget must be"):
        agentrt.sse.endpoint(svc.ask, budget={"seconds": 1})  # type: ignore[arg-type]


async def test_every_event_sent_has_the_shape_its_schema_says() -> None:
    from pydantic import TypeAdapter

    from agentrt.guardrails import output_guardrails, reprompt, success

    def polite(request: Any) -> Any:
        return success() if "please" in request.text else reprompt("impolite", "Say please.")

    class Guarded:
        @output_guardrails(polite, release="optimistic")
        async def ask(self, question: str) -> TokenStream: ...

    model = ScriptedModel(
        [CallTool("order", {"order_id": "SO-1"}, id="call_1")],
        ["It ", "shipped."],
        ["It shipped, ", "please."],
    )
    svc = agentrt.build(Guarded, model=model, tools=[Lookup()])
    handler = agentrt.sse.endpoint(svc.ask, tool_details=True)
    async with app_for(("/ask", handler)) as client:
        response = await client.post("/ask", json={"question": "q"})
    events = parse_sse(response.text)
    names = [e["event"] for e in events]
    assert {"tool_call", "tool_result", "token", "reset", "guardrail", "done"} <= set(names)
    assert [e["id"] for e in events] == [str(n) for n in range(1, len(events) + 1)]
    for event in events:
        TypeAdapter(agentrt.sse.EVENTS[event["event"]]).validate_python(event["data"], strict=True)
    schema = agentrt.sse.event_schema()
    assert set(schema) == set(agentrt.sse.EVENTS)
    assert schema["done"]["properties"]["usage"] == {"$ref": "#/$defs/_Usage"}
    assert schema["tool_call"]["required"] == ["id", "name"]


# --- found by an outside review ------------------------------------------------------------------------


class Order(BaseModel):
    id: str
    qty: int


class Kinds:
    @user_message("order {{order}}")
    async def order(self, order: Order) -> TokenStream: ...

    async def look(self, image: ImageContent) -> TokenStream: ...

    async def positional(self, question: str, /) -> TokenStream: ...

    @user_message("{{model_config}} {{json}}")
    async def odd_names(self, model_config: str, json: str) -> TokenStream: ...

    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


async def test_parameters_reach_the_method_as_a_direct_call_gets_them() -> None:
    model = ScriptedModel("a", "b", "c", "d", "e")
    svc = agentrt.build(Kinds, model=model)
    image = {"url": "https://example.test/cat.png"}
    routes = [
        (f"/{name}", agentrt.sse.endpoint(getattr(svc, name)))
        for name in ("order", "look", "positional", "odd_names")
    ]
    async with app_for(*routes) as client:
        bodies = {
            "/order": {"order": {"id": "A", "qty": 2}},
            "/look": {"image": image},
            "/positional": {"question": "q"},
            "/odd_names": {"model_config": "x", "json": "y"},
        }
        for path, body in bodies.items():
            assert (await client.post(path, json=body)).status_code == 200, path
    async for _ in await svc.order(Order(id="A", qty=2)):
        pass
    sent = [request.messages[-1] for request in model.requests]
    assert sent[0] == sent[4]  # the body's model, as the method's own call renders it
    assert sent[1].contents[-1] == ImageContent(url=image["url"])
    assert sent[2] == UserMessage.of("q")
    assert sent[3] == UserMessage.of("x y")


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_only_json_bodies_are_read(kind: str | None) -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    headers = {"x-user": "ada"} | ({"content-type": kind} if kind else {})
    async with app_for(("/chat", agentrt.sse.endpoint(svc.chat, memory_id=user_of))) as client:
        response = await client.post("/chat", content=b'{"question": "forged"}', headers=headers)
    assert response.status_code == 415
    assert model.requests == []
    assert await agentrt.memory.access(svc).read("ada") == []


async def test_a_resolver_s_http_exception_is_the_response() -> None:
    def refuse(request: Request) -> str:
        raise HTTPException(401, headers={"WWW-Authenticate": "Bearer"})

    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    async with app_for(("/chat", agentrt.sse.endpoint(svc.chat, memory_id=refuse))) as client:
        response = await client.post("/chat", json={"question": "q"})
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert model.requests == []


async def test_a_client_that_leaves_before_the_first_token_cancels_the_invocation() -> None:
    model = ScriptedModel([Hang()])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    app = Starlette(
        routes=[Route("/chat", agentrt.sse.endpoint(svc.chat, memory_id=user_of), methods=["POST"])]
    )
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b'{"question": "q"}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        while not model.streams:  # the model was asked; then the client goes away
            await anyio.lowlevel.checkpoint()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with anyio.fail_after(10):
        await app(post_scope("/chat", [(b"x-user", b"ada")]), receive, send)
    assert sent[0]["status"] == 499
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(svc).read("ada") == []


async def test_a_client_that_stops_reading_is_given_up_after_send_timeout() -> None:
    model = ScriptedModel(["a", Hang()])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, send_timeout=0.2)
    app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
    messages = [{"type": "http.request", "body": b'{"question": "q"}', "more_body": False}]
    stalled = anyio.Event()

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await anyio.sleep_forever()  # the client is connected; it just does not read
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            stalled.set()
            await anyio.sleep_forever()  # the client's window is full: this send never completes

    with anyio.fail_after(10), contextlib.suppress(Exception):
        await app(post_scope("/chat", [(b"x-user", b"ada")]), receive, send)
    assert stalled.is_set()
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(svc).read("ada") == []


class Opaque:
    """A class pydantic cannot read from JSON."""


def test_more_mistakes_are_configuration_errors() -> None:
    async def takes(self: object, thing: Opaque) -> TokenStream: ...

    odd = agentrt.build(type("Odd", (), {"takes": takes}), model=ScriptedModel())
    svc = agentrt.build(Chat, model=ScriptedModel())
    with pytest.raises(
        ConfigurationError, match=r"Odd\.takes: its parameters cannot be read from a JSON body"
    ):
        agentrt.sse.endpoint(odd.takes)
    with pytest.raises(ConfigurationError, match=r"Chat\.ask: ping must be"):
        agentrt.sse.endpoint(svc.ask, ping="5")  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError, match=r"Chat\.ask: memory_id is given, but the method has no memory id"
    ):
        agentrt.sse.endpoint(svc.ask, memory_id=user_of)
    with pytest.raises(ConfigurationError, match=r"Chat\.ask: send_timeout must be"):
        agentrt.sse.endpoint(svc.ask, send_timeout=0)


# --- budgets: the endpoint's is a cap, a request's may only tighten it -------------------------------


class Capped:
    @method_options(budget=Budget(model_requests=1))
    async def strict(self, question: str) -> TokenStream: ...

    async def ask(self, question: str) -> TokenStream: ...

    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


async def test_the_endpoint_s_budget_never_loosens_the_method_s() -> None:
    # The method allows one model request; the endpoint's looser cap of five leaves it at one.
    model = ScriptedModel([CallTool("order", {"order_id": "SO-1"}, id="call_1")], "never asked")
    svc = agentrt.build(Capped, model=model, tools=[Lookup()])
    handler = agentrt.sse.endpoint(svc.strict, budget=Budget(model_requests=5, seconds=30))
    async with app_for(("/strict", handler)) as client:
        response = await client.post("/strict", json={"question": "q"})
    events = parse_sse(response.text)
    assert events[-1]["data"]["limit"] == "model_requests"
    assert len(model.requests) == 1


async def test_a_request_may_ask_for_a_smaller_budget_never_a_larger_one() -> None:
    model = ScriptedModel(
        [CallTool("order", {"order_id": "SO-1"}, id="call_1")],
        [CallTool("order", {"order_id": "SO-2"}, id="call_2")],
        [CallTool("order", {"order_id": "SO-3"}, id="call_3")],
        "never asked",
    )
    svc = agentrt.build(Capped, model=model, tools=[Lookup()])
    handler = agentrt.sse.endpoint(svc.ask, budget=Budget(model_requests=2), request_budget=True)
    async with app_for(("/ask", handler)) as client:
        smaller = await client.post("/ask", json={"question": "q", "budget": {"model_requests": 1}})
        assert len(model.requests) == 1
        larger = await client.post("/ask", json={"question": "q", "budget": {"model_requests": 50}})
    assert parse_sse(smaller.text)[-1]["data"]["limit"] == "model_requests"
    assert parse_sse(larger.text)[-1]["data"]["limit"] == "model_requests"
    assert len(model.requests) == 3  # one, then two: the endpoint's cap, not the request's 50


@pytest.mark.parametrize(
    ("budget", "where"),
    [
        ({"model_requests": 0}, ["budget", "model_requests"]),
        ({"model_requests": True}, ["budget", "model_requests"]),
        ({"model_requests": 1.5}, ["budget", "model_requests"]),
        ({"seconds": -1}, ["budget", "seconds"]),
        ({"seconds": "soon"}, ["budget", "seconds"]),
        ({"dollars": 5}, ["budget", "dollars"]),
        ("lots", ["budget"]),
    ],
)
async def test_a_bad_request_budget_is_422(budget: Any, where: list[str]) -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Capped, model=model)
    handler = agentrt.sse.endpoint(svc.ask, request_budget=True)
    async with app_for(("/ask", handler)) as client:
        response = await client.post("/ask", json={"question": "q", "budget": budget})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][: len(where)] == where
    assert model.requests == []


async def test_without_request_budget_the_body_cannot_carry_one() -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Capped, model=model)
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
        response = await client.post("/ask", json={"question": "q", "budget": {"seconds": 1}})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["budget"]
    assert model.requests == []


def test_request_budget_with_a_parameter_named_budget_is_a_configuration_error() -> None:
    @user_message("{{budget}}")
    async def plan(self: object, budget: str) -> TokenStream: ...

    svc = agentrt.build(type("Planner", (), {"plan": plan}), model=ScriptedModel())
    agentrt.sse.endpoint(svc.plan)  # without request_budget, `budget` is the parameter
    with pytest.raises(ConfigurationError, match=r"Planner\.plan: request_budget=True reserves"):
        agentrt.sse.endpoint(svc.plan, request_budget=True)


async def test_a_time_budget_spent_waiting_for_a_busy_conversation_is_409() -> None:
    model = ScriptedModel(["first", Hang()], "never asked")
    svc = agentrt.build(Capped, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, budget=Budget(seconds=0.2))
    holding = await in_another_task(lambda: svc.chat("ada", "q1"))  # holds "ada" until closed
    try:
        async with app_for(("/chat", handler)) as client:
            response = await client.post("/chat", json={"question": "q2"}, headers={"x-user": "ada"})
    finally:
        await holding.aclose()
    assert response.status_code == 409
    assert response.json() == {
        "error": {"type": "conversation_busy", "message": "the conversation is busy with another request"}
    }
    assert len(model.requests) == 1  # the second request never reached the model


# --- the body: its size, and no resuming -----------------------------------------------------------


async def test_a_body_past_max_body_is_413() -> None:
    model = ScriptedModel("fits")
    svc = agentrt.build(Capped, model=model)
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask, max_body=1000))) as client:
        declared = await client.post("/ask", json={"question": "x" * 2000})  # by its content-length
        fits = await client.post("/ask", json={"question": "x" * 900})
    assert declared.status_code == 413
    assert declared.json()["error"]["type"] == "body_too_large"
    assert fits.status_code == 200
    assert len(model.requests) == 1


async def test_a_body_without_a_length_is_read_no_further_than_max_body() -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Capped, model=model)
    app = Starlette(routes=[Route("/chat", agentrt.sse.endpoint(svc.ask, max_body=1000), methods=["POST"])])
    chunk = b"x" * 100
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        await anyio.lowlevel.checkpoint()  # a reader that never stops is cut by fail_after
        return {"type": "http.request", "body": chunk, "more_body": True}  # a body without end

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with anyio.fail_after(10):
        await app(post_scope("/chat", [(b"x-user", b"ada")]), receive, send)
    assert sent[0]["status"] == 413
    assert read == 11  # the chunk that passed the limit was the last one read
    assert model.requests == []


async def test_a_reconnect_with_last_event_id_starts_nothing() -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Capped, model=model)
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
        response = await client.post("/ask", json={"question": "q"}, headers={"last-event-id": "3"})
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "not_resumable"
    assert model.requests == []


# --- error codes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (agentrt.InputGuardrailError("detail-1", failures=()), "input_refused", 400),
        (agentrt.ContextLengthExceededError("detail-2", status=400), "context_length_exceeded", 400),
        (RateLimitError("detail-3", status=429), "rate_limited", 429),
        (agentrt.OverloadedError("detail-4", status=529), "model_unavailable", 503),
        (agentrt.ServerError("detail-5", status=500), "model_unavailable", 502),
        (agentrt.ModelConnectionError("detail-6"), "model_unavailable", 502),
        (agentrt.AuthenticationError("detail-7 key sk-1", status=401), "model_error", 502),
        (agentrt.ContentRefusedError("detail-8"), "content_refused", 502),
        (agentrt.ToolExecutionError("detail-9", tool="t", call_id="c"), "tool_failed", 502),
        (agentrt.ConversationBusyError("detail-10", memory_id="u"), "conversation_busy", 409),
        (agentrt.ConversationLockLostError("detail-11"), "memory_unavailable", 503),
        (ValueError("detail-12"), "internal_error", 500),
    ],
)
async def test_errors_before_the_stream_have_a_stable_code_never_a_class_name(
    error: Exception, code: str, status: int
) -> None:
    svc = agentrt.build(Capped, model=ScriptedModel([Raise(error)]))
    async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
        response = await client.post("/ask", json={"question": "q"})
    assert response.status_code == status
    body = response.json()["error"]
    assert body["type"] == code and code in agentrt.sse.ERROR_TYPES
    assert "detail-" not in response.text and type(error).__name__ not in response.text


async def test_an_upstream_failure_before_the_stream_is_logged_with_what_identifies_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            401,
            json={"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}},
            headers={"x-request-id": "req_7f3a"},
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(upstream)) as http:
        model = OpenAIChatModel("m", base_url="https://llm.test/v1", client=http)
        svc = agentrt.build(Capped, model=model)
        with caplog.at_level(logging.WARNING, logger="agentrt"):
            async with app_for(("/ask", agentrt.sse.endpoint(svc.ask))) as client:
                response = await client.post("/ask", json={"question": "q"})
    assert response.status_code == 502 and response.json()["error"]["type"] == "model_error"
    [record] = [r for r in caplog.records if "before its stream" in r.getMessage()]
    message = record.getMessage()
    assert record.levelno == logging.ERROR
    # The upstream status, endpoint and request id, and the client's status: enough to find it.
    assert "Capped.ask" in message and "(502 model_error)" in message
    assert "status 401" in message and "https://llm.test/v1/chat/completions" in message
    assert "req_7f3a" in message
    # The traceback is the error's own, not the "NoneType: None" of a call outside `except`.
    assert record.exc_info is not None and isinstance(record.exc_info[1], agentrt.AuthenticationError)
    assert "NoneType: None" not in caplog.text


async def test_a_time_budget_before_the_first_token_is_504() -> None:
    svc = agentrt.build(Capped, model=ScriptedModel([Hang()]))
    handler = agentrt.sse.endpoint(svc.ask, budget=Budget(seconds=0.05))
    async with app_for(("/ask", handler)) as client:
        response = await client.post("/ask", json={"question": "q"})
    assert response.status_code == 504
    assert response.json()["error"] == {
        "type": "budget_exceeded",
        "message": "the request's time budget ran out",
        "limit": "seconds",
    }


# --- partial values -----------------------------------------------------------------------------------


class Profile(BaseModel):
    name: str
    tags: list[str]


class Profiles:
    async def profile(self, who: str) -> agentrt.PartialStream[Profile]: ...


async def test_a_partial_stream_sends_its_values_so_far() -> None:
    # A list grows by whole items: "engines" is in once the comma after it is.
    model = ScriptedModel(['{"name": "Ada", ', '"tags": ["math", ', '"engines"', ', "looms"', "]}"])
    svc = agentrt.build(Profiles, model=model, output_mode="instructions")
    async with app_for(("/profile", agentrt.sse.endpoint(svc.profile))) as client:
        response = await client.post("/profile", json={"who": "Ada"})
    events = parse_sse(response.text)
    assert [e["event"] for e in events] == ["partial", "partial", "partial", "done"]
    assert [e["data"]["value"] for e in events] == [
        {"name": "Ada", "tags": ["math"]},
        {"name": "Ada", "tags": ["math", "engines"]},
        {"name": "Ada", "tags": ["math", "engines", "looms"]},
        {"name": "Ada", "tags": ["math", "engines", "looms"]},
    ]
    for event in events:
        TypeAdapter(agentrt.sse.EVENTS[event["event"]]).validate_python(event["data"], strict=True)


async def test_partial_values_start_over_after_a_reset() -> None:
    # The first answer does not parse and is repaired: its values are withdrawn with a `reset`.
    model = ScriptedModel(['{"name": "Bob", "tags": ["x"', "], oops"], ['{"name": "Ada", "tags": []}'])
    svc = agentrt.build(Profiles, model=model, output_mode="instructions")
    async with app_for(("/profile", agentrt.sse.endpoint(svc.profile))) as client:
        response = await client.post("/profile", json={"who": "Ada"})
    events = parse_sse(response.text)
    names = [e["event"] for e in events]
    assert names[names.index("reset") + 1 :] == ["partial", "done"]
    assert events[names.index("reset") + 1]["data"]["value"] == {"name": "Ada", "tags": []}
    assert events[-1]["data"]["value"] == {"name": "Ada", "tags": []}


# --- found by a second outside review ------------------------------------------------------------------


@pytest.mark.parametrize("keep", [False, True])
async def test_a_client_gone_before_the_body_started_still_closes_the_model_stream(keep: bool) -> None:
    # The model accepted the request, the endpoint returned its response, and the client left before
    # sse-starlette first read the events: their generator never started.
    model = ScriptedModel(["a", Hang()], "second turn")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    inner = agentrt.sse.endpoint(svc.chat, memory_id=user_of)
    returned = anyio.Event()
    kept = []

    async def handler(request: Request) -> Any:
        response = await inner(request)
        if keep:
            kept.append(response)  # as a middleware or a log hook might: no help from refcounting
        returned.set()
        return response

    app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": b'{"question": "q"}', "more_body": False}
        await returned.wait()  # connected while the endpoint waits for the model
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await anyio.lowlevel.checkpoint()

    with anyio.fail_after(10):
        await app(post_scope("/chat", [(b"x-user", b"ada")]), receive, send)
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(svc).read("ada") == []
    with anyio.fail_after(5):  # the conversation is free for the next turn at once
        assert await (await svc.chat("ada", "next")).result() is not None


def test_a_method_without_a_memory_id_on_a_service_with_memory_is_refused() -> None:
    svc = agentrt.build(Chat, model=ScriptedModel(), memory=agentrt.memory.window())
    with pytest.raises(ConfigurationError, match=r"Chat\.ask: the service has chat memory, but the method"):
        agentrt.sse.endpoint(svc.ask)


class Counting:
    async def count(self, what: str) -> agentrt.PartialStream[list[int]]: ...


async def test_integers_past_64_bits_are_sent_as_json_numbers() -> None:
    big = 2**64
    model = ScriptedModel([f"[{big}, ", f"{big + 1}", "]"])
    svc = agentrt.build(Counting, model=model, output_mode="instructions")
    async with app_for(("/count", agentrt.sse.endpoint(svc.count))) as client:
        response = await client.post("/count", json={"what": "big"})
    events = parse_sse(response.text)
    assert [e["event"] for e in events][-1] == "done"
    assert [e["id"] for e in events] == [str(n) for n in range(1, len(events) + 1)]
    assert events[0]["data"] == {"value": [big]}
    assert events[-1]["data"]["value"] == [big, big + 1]


class Named:
    @user_message("{{p1}} {{p0}} {{tags}}")
    async def swap(self, p1: str, p0: int, tags: dict[str, int] | None = None) -> TokenStream: ...

    async def only(self, question: str, budget: Budget | None = None, /) -> TokenStream: ...


async def test_errors_are_located_by_the_body_s_own_names() -> None:
    svc = agentrt.build(Named, model=ScriptedModel("never"))
    async with app_for(("/swap", agentrt.sse.endpoint(svc.swap, request_budget=True))) as client:
        swapped = await client.post("/swap", json={"p1": 5, "p0": "x", "tags": {"p0": "y"}})
        unknown = await client.post("/swap", json={"p1": "a", "p0": 1, "agentrt_budget": {}})
    assert sorted(tuple(problem["loc"]) for problem in swapped.json()["detail"]) == [
        ("p0",),
        ("p1",),
        ("tags", "p0"),
    ]
    types = {tuple(problem["loc"]): problem["type"] for problem in swapped.json()["detail"]}
    assert types[("p1",)] == "string_type" and types[("p0",)] == "int_parsing"
    assert [problem["loc"] for problem in unknown.json()["detail"]] == [["agentrt_budget"]]


async def test_a_positional_only_option_parameter_keeps_its_default() -> None:
    model = ScriptedModel("hi")
    svc = agentrt.build(Named, model=model)
    async with app_for(("/only", agentrt.sse.endpoint(svc.only))) as client:
        response = await client.post("/only", json={"question": "q"})
    assert [e["event"] for e in parse_sse(response.text)] == ["token", "done"]
    assert model.requests[0].messages[-1] == UserMessage.of("q")


async def test_a_resolver_may_read_the_body_too() -> None:
    model = ScriptedModel("hi")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())

    async def from_body(request: Request) -> str:
        return "user-" + str(len((await request.json())["question"]))

    async with app_for(("/chat", agentrt.sse.endpoint(svc.chat, memory_id=from_body))) as client:
        response = await client.post("/chat", json={"question": "four"})
    assert response.status_code == 200
    assert await agentrt.memory.access(svc).read("user-4") != []


# --- the memory id resolver ----------------------------------------------------------------------------

BODIES: dict[str, dict[str, Any]] = {
    "agentrt": {"question": "q"},
    "vercel-ui": {
        "id": "c1",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "q"}]}],
    },
    "ag-ui": {"threadId": "t1", "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": "q"}]},
}


@pytest.mark.parametrize("protocol", list(BODIES))
async def test_a_resolver_that_raises_is_a_json_error_logged_with_its_cause(
    protocol: agentrt.sse.Protocol, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user_of, protocol=protocol)  # KeyError: no x-user
    app = Starlette(
        routes=[Route("/chat", handler, methods=["POST"]), Route("/stop", handler.stop, methods=["POST"])]
    )
    with caplog.at_level(logging.ERROR, logger="agentrt"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            response = await client.post("/chat", json=BODIES[protocol])
            stop = await client.post("/stop", json={"runId": "r1"})
    # The endpoint's own JSON error, as for any failure before the stream (not Starlette's plain text).
    error = {"type": "memory_id_failed", "message": "the request's conversation could not be resolved"}
    assert (response.status_code, response.json()) == (500, {"error": error})
    assert (stop.status_code, stop.json()) == (500, {"error": error})
    assert "memory_id_failed" in agentrt.sse.ERROR_TYPES
    assert model.requests == []
    records = [r for r in caplog.records if "memory_id resolver failed" in r.getMessage()]
    assert len(records) == 2 and "Chat.chat" in records[0].getMessage()
    assert records[0].exc_info is not None and isinstance(records[0].exc_info[1], KeyError)


@pytest.mark.parametrize("protocol", list(BODIES))
@pytest.mark.parametrize("blank", [None, "", ("ada", ""), (None, "c1")])
async def test_a_resolver_that_names_no_conversation_is_refused(
    protocol: agentrt.sse.Protocol, blank: Any
) -> None:
    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(svc.chat, memory_id=lambda request: blank, protocol=protocol)
    async with app_for(("/chat", handler)) as client:
        response = await client.post("/chat", json=BODIES[protocol])
    # Clients without the header would otherwise share one conversation.
    assert response.status_code == 400
    assert response.json() == {
        "error": {"type": "no_conversation", "message": "the request names no conversation"}
    }
    assert model.requests == []


@pytest.mark.parametrize("part", [float("nan"), float("inf"), float("-inf")])
async def test_a_memory_id_holding_a_float_json_cannot_carry_is_refused(part: float) -> None:
    # JSON has no NaN nor infinities: orjson writes them as null, so `("ada", nan)`, `("ada", inf)`
    # and `("ada", -inf)` were one conversation, `["ada",null]`, that of `("ada", None)` (which is
    # refused). A lone NaN was refused already (500 `memory_id_failed`), not one in a tuple.
    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(svc.chat, memory_id=lambda request: ("ada", part))
    async with app_for(("/chat", handler)) as http:
        response = await http.post("/chat", json={"question": "q"})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "memory_id_failed"
    assert model.requests == []


class NotSignedIn(Exception):
    pass


async def test_an_exception_the_app_handles_is_the_app_s_response() -> None:
    def signed_in(request: Request) -> str:
        raise NotSignedIn

    async def sign_in_first(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"sign_in": "/login"}, status_code=401)

    model = ScriptedModel("never")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    app = Starlette(
        routes=[Route("/chat", agentrt.sse.endpoint(svc.chat, memory_id=signed_in), methods=["POST"])],
        exception_handlers={NotSignedIn: sign_in_first},
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/chat", json={"question": "q"})
    assert (response.status_code, response.json()) == (401, {"sign_in": "/login"})
    assert model.requests == []


async def test_tuple_memory_ids_keep_users_and_chats_apart() -> None:
    # Joined with ":", user "a:b" in chat "c" and user "a" in chat "b:c" are one conversation; as
    # tuples (a memory id is any hashable JSON value) they are two.
    model = ScriptedModel("one", "two")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    first = agentrt.sse.endpoint(svc.chat, memory_id=lambda request: ("a:b", "c"))
    second = agentrt.sse.endpoint(svc.chat, memory_id=lambda request: ("a", "b:c"))
    async with app_for(("/first", first), ("/second", second)) as client:
        assert (await client.post("/first", json={"question": "mine"})).status_code == 200
        assert (await client.post("/second", json={"question": "theirs"})).status_code == 200
    conversations = agentrt.memory.access(svc)
    assert [m.text for m in await conversations.read(("a:b", "c"))] == ["mine", "one"]
    assert [m.text for m in await conversations.read(("a", "b:c"))] == ["theirs", "two"]
