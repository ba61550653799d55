"""An outside review of issue 30 (tools from MCP servers, images from tools, tool annotations): what
a demanding user does to it, as tests of what should happen. Real servers (tests/mcp_server.py over
stdio and Streamable HTTP, as tests/test_mcp.py starts them), adapters' bodies read off the wire.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import anyio
import httpx
import orjson
import pytest
from test_mcp import PATIENCE, Launcher

import agentrt
from agentrt import (
    AssistantMessage,
    ImageContent,
    MemoryId,
    ModelRequest,
    Result,
    ToolResultMessage,
    ToolReturn,
    UserMessage,
    tool,
)
from agentrt.mcp import MCPServerError, MCPTools
from agentrt.memory import InMemoryStore, access, window
from agentrt.models import OpenAIChatModel
from agentrt.models.ollama import OllamaChatModel
from agentrt.testing import CallTool, ScriptedModel

pytestmark = pytest.mark.filterwarnings("ignore:Async generator 'http(x|core)2\\.:ResourceWarning")

PNG = "iVBORw0KGgo="
PIXEL = ImageContent(data=PNG, media_type="image/png")
LINKED = ImageContent(url="https://example.test/chart.png")


class Desk:
    async def ask(self, question: str) -> Result[str]: ...


class Chat:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


@pytest.fixture(params=["stdio", "http"])
def launcher(request: pytest.FixtureRequest) -> Iterator[Launcher]:
    launched = Launcher(request.param)
    yield launched
    launched.close()


def results(model: ScriptedModel, request: int = -1) -> list[tuple[str, str, bool]]:
    return [
        (m.tool_call_id, m.text, m.is_error)
        for m in model.requests[request].messages
        if isinstance(m, ToolResultMessage)
    ]


# --- MCP: closing, cancelling, dying, sharing ------------------------------------------------------


async def test_closing_the_source_while_a_call_runs_fails_the_call_and_the_turn_goes_on(
    launcher: Launcher,
) -> None:
    source = MCPTools(launcher.server())
    model = ScriptedModel([CallTool("slow", id="c1")], "it stopped")
    parked = agentrt.build(Desk, model=model, tools=[source])
    check = agentrt.build(Desk, model=ScriptedModel([CallTool("is_parked", id="c2")], "yes"), tools=[source])
    finished: list[Result[str]] = []

    async def park() -> None:
        finished.append(await parked.ask("slow"))

    with anyio.fail_after(PATIENCE):
        async with anyio.create_task_group() as group:
            async with source:
                group.start_soon(park)
                await check.ask("is it parked?")  # returns once the server runs the call
            # (leaving closed the connection under the running call)

    assert [r.value for r in finished] == ["it stopped"]
    assert results(model) == [("c1", "Error: tool 'slow' failed (MCPServerError).", True)]


async def test_a_turn_cancelled_during_a_call_cancels_it_on_the_server_and_the_connection_goes_on(
    launcher: Launcher,
) -> None:
    source = MCPTools(launcher.server())
    parked = agentrt.build(Desk, model=ScriptedModel([CallTool("slow", id="c1")], "never"), tools=[source])
    check_model = ScriptedModel([CallTool("is_parked", id="c2")], "parked", [CallTool("pid", id="c3")], "p")
    check = agentrt.build(Desk, model=check_model, tools=[source])
    confirm_model = ScriptedModel([CallTool("was_cancelled", id="c4")], "it was")
    confirm = agentrt.build(Desk, model=confirm_model, tools=[source])
    with anyio.fail_after(PATIENCE):
        async with source:
            link = source._states[0].link
            async with anyio.create_task_group() as group:
                group.start_soon(parked.ask, "slow")
                await check.ask("is it parked?")
                group.cancel_scope.cancel()  # the caller gives up on the parked turn
            await confirm.ask("was it cancelled?")  # the server saw MCP's cancellation
            await check.ask("and your pid?")
            assert source._states[0].link is link  # the same connection carried on

    assert results(confirm_model) == [("c4", '{"result":"cancelled"}', False)]
    assert json.loads(results(check_model)[0][1])["result"] > 0


async def test_a_server_that_dies_while_its_changed_list_is_read_fails_that_turn_and_the_next_reconnects(
    launcher: Launcher,
) -> None:
    changed = anyio.Event()
    source = MCPTools(launcher.server(), on_change=lambda server: changed.set())
    model = ScriptedModel(
        [CallTool("die_at_next_listing", id="c1")], "armed", [CallTool("pid", id="c2")], "p"
    )
    service = agentrt.build(Desk, model=model, tools=[source])
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("arm it")
            await changed.wait()
            with pytest.raises(MCPServerError, match="'notes': could not list its tools") as info:
                await service.ask("the list is read again: the server dies")
            launcher.restart_killed()
            await service.ask("and now?")

    assert info.value.server == "notes"
    assert json.loads(results(model)[0][1])["result"] > 0


async def test_only_image_types_every_provider_takes_are_sent_the_others_are_named() -> None:
    stdio = Launcher("stdio")
    try:
        source = MCPTools(stdio.server())
        model = ScriptedModel([CallTool("drawings", id="d1")], "Seen.")
        desk = agentrt.build(Desk, model=model, tools=[source])
        with anyio.fail_after(PATIENCE):
            async with source:
                await desk.ask("draw")
    finally:
        stdio.close()
    (sent,) = [m for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]
    # the PNG (its type as the providers spell it) goes as an image; an SVG and an untyped image,
    # which providers refuse (and would refuse in every later request), are named
    assert sent.images == (PIXEL,)
    assert sent.text == "[image image/svg+xml, not shown]\n[image , not shown]"
    assert not sent.is_error


async def test_two_services_share_one_source_and_call_it_at_the_same_time(launcher: Launcher) -> None:
    source = MCPTools(launcher.server())
    left_model = ScriptedModel([CallTool("meet", id="c1")], "left met")
    right_model = ScriptedModel([CallTool("meet", id="c2")], "right met")
    left = agentrt.build(Desk, model=left_model, tools=[source])
    right = agentrt.build(Chat, model=right_model, tool_provider=source)
    with anyio.fail_after(PATIENCE):
        async with source:
            async with anyio.create_task_group() as group:  # `meet` returns once both run at once
                group.start_soon(left.ask, "meet")
                group.start_soon(right.ask, "u1", "meet")

    assert results(left_model) == [("c1", '{"result":"met"}', False)]
    assert results(right_model) == [("c2", '{"result":"met"}', False)]


# --- images from tools ----------------------------------------------------------------------------


class Charts:
    def __init__(self, *images: ImageContent) -> None:
        self.images = images

    @tool
    async def chart(self, series: str) -> ToolReturn:
        """Draw a chart of a series."""
        return ToolReturn(f"the chart of {series}", images=self.images)


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
        chat = agentrt.build(Chat, model=model, tools=[Charts(LINKED, PIXEL)], memory=window())
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


async def test_a_tools_images_count_in_the_token_estimates_as_a_users_do() -> None:
    # What a request's input is estimated at (usage when the model reports none, the budget's check
    # before a request, a max_tokens window) counts a tool's image as it counts one a user sent.
    def run(*images: ImageContent) -> Any:
        model = ScriptedModel([CallTool("chart", {"series": "s"}, id="c1")], "ok")
        return agentrt.build(Desk, model=model, tools=[Charts(*images)]).ask("chart it")

    plain, pictured = await run(), await run(PIXEL)
    assert pictured.usage.input_tokens - plain.usage.input_tokens == 64  # 256 characters, as a user's

    store = InMemoryStore()
    model = ScriptedModel([CallTool("chart", {"series": "s"}, id="c1")], "ok", "again")
    chat = agentrt.build(
        Chat, model=model, tools=[Charts(PIXEL, PIXEL, PIXEL)], memory=window(max_tokens=150, store=store)
    )
    await chat.ask("u1", "chart it")
    await chat.ask("u1", "hi")
    # three images are more than the window holds: the turn with them is left out
    assert [type(m).__name__ for m in model.requests[-1].messages] == ["UserMessage"]


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
    chat = agentrt.build(Chat, model=model, tools=[Charts(PIXEL)], memory=window(store=store))
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
    chat = agentrt.build(Chat, model=model, tools=[Charts(PIXEL), gated], memory=window(store=store))
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
        chat = agentrt.build(Chat, model=model, tools=[Charts(PIXEL, LINKED)], memory=window(store=store))
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
    result = await agentrt.build(Desk, model=model, tools=[Odd()]).ask("show me")
    sent = [(m.text, m.images) for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]
    # a ToolReturn in a ToolReturn: its value is the model's text, the images add up (they were
    # sent to the model as JSON text, base64 data and all)
    assert sent == [("", (PIXEL,)), ('{"points":3}', (LINKED, PIXEL))]
    assert [e.value for e in result.tool_executions] == ["", {"points": 3}]


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
        Chat,
        model=model,
        tools=[Charts(PIXEL), gated],
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


async def test_servers_that_must_connect_again_do_so_at_once_not_one_after_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each dead server may take its `connect_timeout` to fail: an invocation must not wait for the
    sum. Two servers to connect again: the second starts before the first has finished."""
    from agentrt import mcp as agentrt_mcp

    stdio = Launcher("stdio")
    try:
        source = MCPTools(stdio.server(name="a", prefix="a_"), stdio.server(name="b", prefix="b_"))
        with anyio.fail_after(PATIENCE):
            async with source:
                entered: list[str] = []
                both = anyio.Event()
                original = agentrt_mcp._State.ready

                async def ready(state: Any) -> Any:
                    entered.append(state.server.label)
                    if len(entered) == 2:
                        both.set()
                    with anyio.fail_after(10):  # one after another, the first waits here alone
                        await both.wait()
                    return await original(state)

                monkeypatch.setattr(agentrt_mcp._State, "ready", ready)
                for state in source._states:
                    state.stale = True  # both said their lists changed
                tools = await source()
    finally:
        stdio.close()
    assert sorted(entered) == ["a", "b"]
    assert {t.name for t in tools} >= {"a_add", "b_add"}
