"""Images from tools (issue 30): a tool returns `ToolReturn(value, images=...)` (an MCP tool's image
content becomes one), the loop puts them on the tool result message, memory and checkpoints keep them
(across an approval's wait too), token estimates count them as a user's, and each adapter sends them
the way its API can carry them: in the tool result (Anthropic), in a user message after the round's
results when the model takes images (Chat Completions, Ollama), else named in the result's text. The
adapters' bodies are read off the wire (`httpx.MockTransport`)."""

from __future__ import annotations

import base64
from typing import Annotated, Any

import httpx
import orjson
import pytest

import agentrt
from agentrt import (
    AssistantMessage,
    Capabilities,
    ImageContent,
    MemoryId,
    ModelRequest,
    Result,
    ToolCall,
    ToolOutcome,
    ToolResultMessage,
    ToolReturn,
    UserMessage,
    tool,
)
from agentrt.memory import InMemoryStore, access, window
from agentrt.models import OpenAIChatModel
from agentrt.models.anthropic import AnthropicChatModel
from agentrt.models.ollama import OllamaChatModel
from agentrt.testing import CallTool, ScriptedModel

pytestmark = pytest.mark.anyio

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
PIXEL = ImageContent(data=PNG, media_type="image/png")
LINKED = ImageContent(url="https://example.test/chart.png")


class Desk:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


class Charts:
    def __init__(self) -> None:
        self.images: list[Any] = [PIXEL]

    @tool
    async def chart(self, series: str) -> ToolReturn:
        """Draw a chart of a series."""
        return ToolReturn({"series": series, "points": 3}, images=self.images)

    @tool
    async def plain(self) -> str:
        """No picture."""
        return "nothing to see"


class ChartsOf:
    """A chart tool whose result is text, with the images it was made with."""

    def __init__(self, *images: ImageContent) -> None:
        self.images = images

    @tool
    async def chart(self, series: str) -> ToolReturn:
        """Draw a chart of a series."""
        return ToolReturn(f"the chart of {series}", images=self.images)


class Stateless:
    """A method without memory, answering with its `Result`."""

    async def ask(self, question: str) -> Result[str]: ...


# --- through the loop -----------------------------------------------------------------------------


async def test_a_tools_images_reach_the_model_on_its_result_and_are_stored_with_the_turn() -> None:
    store = InMemoryStore()
    model = ScriptedModel(
        [CallTool("chart", {"series": "sales"}, id="c1"), CallTool("plain", id="c2")], "Up."
    )
    desk = agentrt.build(Desk, model=model, tools=[Charts()], memory=window(store=store))
    assert await desk.ask("u1", "How are sales?") == "Up."

    sent = [m for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert [(m.tool_call_id, m.text, m.images) for m in sent] == [
        ("c1", '{"series":"sales","points":3}', (PIXEL,)),  # the value as text, the images beside it
        ("c2", "nothing to see", ()),
    ]
    stored = await access(desk).read("u1")
    assert [m.images for m in stored if isinstance(m, ToolResultMessage)] == [(PIXEL,), ()]
    # a message without images is stored as before (no "images" key)
    assert [("images" in m) for m in orjson.loads(agentrt.messages_to_json(sent))] == [True, False]
    assert agentrt.messages_from_json(agentrt.messages_to_json(sent)) == sent


async def test_the_execution_has_the_images_and_the_value_the_tool_meant() -> None:
    model = ScriptedModel([CallTool("chart", {"series": "sales"}, id="c1")], "Up.")

    class Results:
        async def ask(self, question: str) -> agentrt.Result[str]: ...

    result = await agentrt.build(Results, model=model, tools=[Charts()]).ask("How are sales?")
    (execution,) = result.tool_executions
    assert execution.outcome is ToolOutcome.SUCCESS
    assert execution.images == (PIXEL,)
    assert execution.value == {"series": "sales", "points": 3}


class Views:
    async def awaited(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def result(self, conversation: Annotated[str, MemoryId], question: str) -> agentrt.Result[str]: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> agentrt.TokenStream: ...


@pytest.mark.parametrize("view", ["awaited", "result", "stream"])
async def test_every_view_sends_and_stores_a_tools_images(view: str) -> None:
    """One tool loop: the awaited, `Result` and streaming views all send the images and store them."""
    model = ScriptedModel([CallTool("chart", {"series": "s"}, id="c1")], ["Up", "."])
    views = agentrt.build(Views, model=model, tools=[Charts()], memory=window())
    if view == "stream":
        async with await views.stream("u1", "chart") as tokens:
            assert "".join([t async for t in tokens]) == "Up."
    else:
        await getattr(views, view)("u1", "chart")
    (sent,) = [m for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert sent.images == (PIXEL,)
    stored = await access(views).read("u1")
    assert [m.images for m in stored if isinstance(m, ToolResultMessage)] == [(PIXEL,)]


@pytest.mark.parametrize("bad", [["not an image"], [agentrt.TextContent(text="x")], 7])
async def test_images_that_are_not_image_content_fail_the_call(bad: Any) -> None:
    charts = Charts()
    charts.images = bad
    model = ScriptedModel([CallTool("chart", {"series": "s"}, id="c1")], "Sorry.")
    desk = agentrt.build(Desk, model=model, tools=[charts])
    assert await desk.ask("u1", "chart") == "Sorry."
    (sent,) = [m for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert sent.is_error and sent.images == ()
    assert sent.text == "Error: tool 'chart' failed (TypeError)."


async def test_a_checkpoint_keeps_an_executions_images() -> None:
    from agentrt._pipeline._checkpoint import _event, _loaded

    execution = agentrt.ToolExecution("chart", "c1", "h", "{}", images=(PIXEL, LINKED))
    event = agentrt.ToolExecuted("inv", execution)
    assert _loaded(orjson.loads(orjson.dumps(_event(event))), "inv") == event


async def test_odd_tool_returns_images_only_empty_text_and_a_tool_return_inside_one() -> None:
    class Odd:
        @tool
        async def only_images(self) -> ToolReturn:
            """Only a picture."""
            return ToolReturn("", images=[PIXEL])

        @tool
        async def wrapped(self) -> ToolReturn:
            """A picture, through a wrapper that adds another."""
            return ToolReturn(ToolReturn({"points": 3}, images=[PIXEL]), images=[LINKED])

    model = ScriptedModel([CallTool("only_images", id="c1"), CallTool("wrapped", id="c2")], "seen")
    result = await agentrt.build(Stateless, model=model, tools=[Odd()]).ask("show me")
    sent = [(m.text, m.images) for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]
    # a ToolReturn in a ToolReturn: its value is the model's text, the images add up (they were
    # sent to the model as JSON text, base64 data and all)
    assert sent == [("", (PIXEL,)), ('{"points":3}', (LINKED, PIXEL))]
    assert [e.value for e in result.tool_executions] == ["", {"points": 3}]


async def test_a_tools_images_count_in_the_token_estimates_as_a_users_do() -> None:
    # What a request's input is estimated at (usage when the model reports none, the budget's check
    # before a request, a max_tokens window) counts a tool's image as it counts one a user sent.
    def run(*images: ImageContent) -> Any:
        model = ScriptedModel([CallTool("chart", {"series": "s"}, id="c1")], "ok")
        return agentrt.build(Stateless, model=model, tools=[ChartsOf(*images)]).ask("chart it")

    plain, pictured = await run(), await run(PIXEL)
    assert pictured.usage.input_tokens - plain.usage.input_tokens == 64  # 256 characters, as a user's

    store = InMemoryStore()
    model = ScriptedModel([CallTool("chart", {"series": "s"}, id="c1")], "ok", "again")
    chat = agentrt.build(
        Desk, model=model, tools=[ChartsOf(PIXEL, PIXEL, PIXEL)], memory=window(max_tokens=150, store=store)
    )
    await chat.ask("u1", "chart it")
    await chat.ask("u1", "hi")
    # three images are more than the window holds: the turn with them is left out
    assert [type(m).__name__ for m in model.requests[-1].messages] == ["UserMessage"]


async def test_a_turn_with_a_tools_images_restored_at_any_boundary_sends_and_stores_the_same() -> None:
    from agentrt._pipeline import Invocation
    from agentrt._service import _RUNTIMES

    script = [
        [CallTool("chart", {"series": "s"}, id="c1")],
        [CallTool("chart", {"series": "t"}, id="c2")],
        "ok",
    ]

    class Stop(Exception):
        pass

    def run(store: InMemoryStore, script: list[Any]) -> tuple[Any, ScriptedModel, Any]:
        model = ScriptedModel(*script)
        chat = agentrt.build(Desk, model=model, tools=[ChartsOf(PIXEL, LINKED)], memory=window(store=store))
        return chat, model, (_RUNTIMES[type(chat)], chat.ask.__agentrt_spec__)

    chat, model, (runtime, spec) = run(InMemoryStore(), script)
    whole = Invocation(runtime, spec, {"conversation": "u1", "question": "chart"})
    phases: list[Any] = []
    whole.on_boundary(phases.append)
    await whole.result()
    expected = (model.requests[-1].messages, await access(chat).read("u1"))
    assert sum(len(m.images) for m in expected[1] if isinstance(m, ToolResultMessage)) == 4

    for stop_at in range(len(phases)):
        store = InMemoryStore()
        chat, model, (runtime, spec) = run(store, script)
        stopped = Invocation(runtime, spec, {"conversation": "u1", "question": "chart"})
        saved: list[Any] = []

        def boundary(
            phase: Any, stopped: Invocation = stopped, saved: list[Any] = saved, stop_at: int = stop_at
        ) -> None:
            if len(saved) == stop_at:
                saved.append(orjson.loads(orjson.dumps(stopped.checkpoint())))  # through JSON text
                raise Stop
            saved.append(None)

        stopped.on_boundary(boundary)
        with pytest.raises(Stop):
            await stopped.result()
        again, again_model, (runtime, spec) = run(store, script[len(model.requests) :])
        await Invocation.restore(runtime, spec, saved[-1]).result()
        last = (again_model.requests or model.requests)[-1]
        assert (last.messages, await access(again).read("u1")) == expected, f"stopped at {phases[stop_at]}"


# --- through an approval's wait -------------------------------------------------------------------


class Gated:
    def __init__(self) -> None:
        self.ran: list[str] = []

    @tool("Delete a chart.", needs_approval=True)
    async def delete_chart(self, series: str) -> ToolReturn:
        self.ran.append(series)
        return ToolReturn(f"deleted {series}", images=[LINKED])


async def test_images_of_a_round_that_waits_for_approval_reach_the_model_and_memory_on_resume() -> None:
    store = InMemoryStore()
    gated = Gated()
    model = ScriptedModel(
        [
            CallTool("chart", {"series": "sales"}, id="c1"),
            CallTool("delete_chart", {"series": "old"}, id="c2"),
        ],
        "done",
    )
    chat = agentrt.build(Desk, model=model, tools=[ChartsOf(PIXEL), gated], memory=window(store=store))
    with pytest.raises(agentrt.ApprovalRequired) as stopped:
        await chat.ask("u1", "chart sales, delete old")
    pending = stopped.value.approval
    assert await agentrt.resume(chat, pending.run_id, {"c2": agentrt.Approve()}, memory_id="u1") == "done"

    sent = [
        (m.tool_call_id, m.text, m.images)
        for m in model.requests[-1].messages
        if isinstance(m, ToolResultMessage)
    ]
    assert sent == [("c1", "the chart of sales", (PIXEL,)), ("c2", "deleted old", (LINKED,))]
    stored = [m for m in await access(chat).read("u1") if isinstance(m, ToolResultMessage)]
    assert [m.images for m in stored] == [(PIXEL,), (LINKED,)]
    assert gated.ran == ["old"]


async def test_a_waiting_turn_denied_by_a_new_message_keeps_the_images_of_the_calls_that_ran() -> None:
    store = InMemoryStore()
    gated = Gated()
    model = ScriptedModel(
        [
            CallTool("chart", {"series": "sales"}, id="c1"),
            CallTool("delete_chart", {"series": "old"}, id="c2"),
        ],
        "next answer",
    )
    chat = agentrt.build(
        Desk,
        model=model,
        tools=[ChartsOf(PIXEL), gated],
        memory=window(store=store),
        approvals=agentrt.Approvals(while_pending="deny"),
    )
    with pytest.raises(agentrt.ApprovalRequired):
        await chat.ask("u1", "chart sales, delete old")
    assert await chat.ask("u1", "never mind") == "next answer"  # the waiting calls are denied

    sent = {m.tool_call_id: m.images for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)}
    assert sent == {"c1": (PIXEL,), "c2": ()}
    stored = {
        m.tool_call_id: m.images for m in await access(chat).read("u1") if isinstance(m, ToolResultMessage)
    }
    assert stored == {"c1": (PIXEL,), "c2": ()}
    assert gated.ran == []


# --- on the wire ----------------------------------------------------------------------------------

ROUND = (
    UserMessage.of("How are sales?"),
    AssistantMessage(
        tool_calls=(
            ToolCall(id="c1", name="chart", arguments='{"series": "sales"}'),
            ToolCall(id="c2", name="plain", arguments="{}"),
        )
    ),
    ToolResultMessage(tool_call_id="c1", tool_name="chart", text="the chart", images=(PIXEL,)),
    ToolResultMessage(tool_call_id="c2", tool_name="plain", text="nothing to see"),
)


async def sent_body(model_for: Any, response: bytes, content_type: str) -> dict[str, Any]:
    bodies: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(orjson.loads(request.content))
        return httpx.Response(200, content=response, headers={"content-type": content_type})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        model = model_for(client)
        async for _ in model.stream(ModelRequest(messages=ROUND)):
            pass
    (body,) = bodies
    return body


OPENAI_DONE = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


async def test_chat_completions_sends_a_tools_images_in_a_user_message_after_the_rounds_results() -> None:
    body = await sent_body(
        lambda client: OpenAIChatModel("m", base_url="http://x.test/v1", api_key="k", client=client),
        OPENAI_DONE,
        "text/event-stream",
    )
    assert body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "the chart"},
        {"role": "tool", "tool_call_id": "c2", "content": "nothing to see"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "The tool call c1 (chart) returned 1 image:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
    ]


async def test_a_model_without_image_input_gets_the_images_named_in_the_text() -> None:
    body = await sent_body(
        lambda client: OpenAIChatModel(
            "m",
            base_url="http://x.test/v1",
            api_key="k",
            client=client,
            capabilities=Capabilities(image_input=False),
        ),
        OPENAI_DONE,
        "text/event-stream",
    )
    assert body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "the chart\n[image image/png, not shown]"},
        {"role": "tool", "tool_call_id": "c2", "content": "nothing to see"},
    ]


_ANTHROPIC_EVENTS = [
    {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
     "content": [], "model": "c", "usage": {"input_tokens": 1, "output_tokens": 0}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
    {"type": "message_stop"},
]  # fmt: skip
ANTHROPIC_DONE = b"".join(
    b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in _ANTHROPIC_EVENTS
)


async def test_anthropic_sends_a_tools_images_inside_its_tool_result() -> None:
    body = await sent_body(
        lambda client: AnthropicChatModel("claude-test", api_key="k", client=client),
        ANTHROPIC_DONE,
        "text/event-stream",
    )
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "c1",
                "content": [
                    {"type": "text", "text": "the chart"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                ],
            },
            {"type": "tool_result", "tool_use_id": "c2", "content": "nothing to see"},
        ],
    }


async def test_anthropic_names_a_tools_images_for_a_model_without_image_input() -> None:
    body = await sent_body(
        lambda client: AnthropicChatModel(
            "claude-test", api_key="k", client=client, capabilities=Capabilities(image_input=False)
        ),
        ANTHROPIC_DONE,
        "text/event-stream",
    )
    assert body["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "c1",
        "content": "the chart\n[image image/png, not shown]",
    }


async def test_ollama_sends_a_tools_images_in_a_user_message_after_the_rounds_results() -> None:
    done = orjson.dumps(
        {"model": "m", "message": {"role": "assistant", "content": "ok"}, "done": True, "done_reason": "stop"}
    )
    body = await sent_body(
        lambda client: OllamaChatModel("m", base_url="http://x.test", client=client),
        done + b"\n",
        "application/x-ndjson",
    )
    assert body["messages"][2:] == [
        {"role": "tool", "content": "the chart", "tool_name": "chart", "tool_call_id": "c1"},
        {"role": "tool", "content": "nothing to see", "tool_name": "plain", "tool_call_id": "c2"},
        {"role": "user", "content": "The tool call c1 (chart) returned 1 image:", "images": [PNG]},
    ]


OLLAMA_DONE = orjson.dumps(
    {"model": "m", "message": {"role": "assistant", "content": "ok"}, "done": True, "done_reason": "stop"}
)


async def test_on_ollama_a_tools_image_by_url_is_named_and_does_not_break_the_conversation() -> None:
    # Ollama takes inline images only: one by URL in a stored tool result made every later request
    # of the conversation a BadRequestError.
    bodies: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        bodies.append(body)
        if len(bodies) == 1:
            message = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "function": {"name": "chart", "arguments": {"series": "sales"}}}
            ]}  # fmt: skip
            return httpx.Response(
                200,
                content=orjson.dumps({"model": "m", "message": message, "done": True}) + b"\n",
                headers={"content-type": "application/x-ndjson"},
            )
        return httpx.Response(
            200, content=OLLAMA_DONE + b"\n", headers={"content-type": "application/x-ndjson"}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        model = OllamaChatModel("m", base_url="http://x.test", client=client)
        chat = agentrt.build(Desk, model=model, tools=[ChartsOf(LINKED, PIXEL)], memory=window())
        assert await chat.ask("u1", "How are sales?") == "ok"
        assert await chat.ask("u1", "And then?") == "ok"

    for body in bodies[1:]:
        tool_message = next(m for m in body["messages"] if m["role"] == "tool")
        assert tool_message["content"] == "the chart of sales\n[image by URL, not shown]"
        after = body["messages"][body["messages"].index(tool_message) + 1]
        assert after == {
            "role": "user",
            "content": "The tool call c1 (chart) returned 1 image:",
            "images": [PNG],
        }


def chat_completions_well_formed(messages: list[dict[str, Any]]) -> None:
    """What Chat Completions requires: each tool message right after the assistant message with its
    call or another tool message, each call answered before anything else."""
    open_calls: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, messages
            open_calls.remove(message["tool_call_id"])
            continue
        assert open_calls == [], messages
        if message["role"] == "assistant":
            open_calls = [call["id"] for call in message.get("tool_calls", [])]
    assert open_calls == []


async def test_images_across_rounds_turns_and_windows_keep_chat_completions_order() -> None:
    store = InMemoryStore()
    script: list[Any] = []
    for turn in range(3):
        two = [
            CallTool("chart", {"series": "a"}, id=f"t{turn}a"),
            CallTool("chart", {"series": "b"}, id=f"t{turn}b"),
        ]
        script += [two, [CallTool("chart", {"series": "c"}, id=f"t{turn}c")], f"answer {turn}"]
    model = ScriptedModel(*script)
    chat = agentrt.build(Desk, model=model, tools=[ChartsOf(PIXEL)], memory=window(store=store))
    for turn in range(3):
        await chat.ask("u1", f"question {turn}")
    history = list(await access(chat).read("u1"))

    openai = OpenAIChatModel("m", base_url="http://x.test/v1", api_key="k")
    try:
        for start in range(len(history)):  # every cut a window could make, and those it never makes
            kept = history[start:]
            while kept and not isinstance(kept[0], UserMessage):
                kept = kept[1:]
            body = openai.request_body(ModelRequest(messages=(*kept, UserMessage.of("next"))))
            chat_completions_well_formed(body["messages"])
            images = [m for m in body["messages"] if m["role"] == "user" and "returned" in str(m["content"])]
            rounds = [m for m in kept if isinstance(m, AssistantMessage) and m.tool_calls]
            assert len(images) == len(rounds)  # one message after each round's results
        last = openai.request_body(model.requests[-1])["messages"]
    finally:
        await openai.aclose()
    assert [m["role"] for m in last[-7:]] == [
        "assistant",
        "tool",
        "tool",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert [c["type"] for c in last[-4]["content"]] == ["text", "image_url", "text", "image_url"]
    assert last[-4]["content"][2]["text"] == "The tool call t2b (chart) returned 1 image:"
