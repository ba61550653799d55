"""Images from tools (issue 30): a tool returns `ToolReturn(value, images=...)` (an MCP tool's image
content becomes one), the loop puts them on the tool result message, memory and checkpoints keep them,
and each adapter sends them the way its API can carry them: in the tool result (Anthropic), in a user
message after the round's results when the model takes images (Chat Completions, Ollama), else named
in the result's text. The adapters' bodies are read off the wire (`httpx.MockTransport`)."""

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
