"""Tools from MCP servers (issue 30), against real servers the tests start: tests/mcp_server.py,
written with the SDK's server API, as a stdio subprocess and over Streamable HTTP under uvicorn on a
loopback socket; on asyncio and trio.

Every test reads what happened: the requests the model received (tools offered, tool results), the
errors raised, and the server's own state, asked through its tools (its process id, how often its
tools were listed, whether it saw a call cancelled). Transport-sensitive behaviour (connecting,
cancellation, a list change, a server killed) runs on both transports and on both protocol eras the
SDK speaks (`mode="auto"` negotiates 2026-07-28 with this server; `"legacy"` the initialize
handshake of 2025-11-25, as most servers deployed today).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from mcp_server import PIXEL

import agentrt
from agentrt import (
    Approvals,
    Approve,
    Budget,
    BudgetExceededError,
    ConfigurationError,
    Deny,
    MemoryId,
    Result,
    ToolCallRequested,
    ToolExecuted,
    ToolExecutionError,
    ToolOutcome,
    ToolResultMessage,
    ToolSettings,
    tool,
)
from agentrt.mcp import HTTPServer, MCPServerError, MCPToolError, MCPTools, StdioServer
from agentrt.testing import CallTool, ScriptedModel

# On trio, the SDK's Streamable HTTP client leaves the async generators of the SSE responses it read
# (or stopped reading) to the garbage collector, and trio warns for each (on asyncio the loop's
# finalizer closes them quietly). Harmless, and the SDK's: not ours to close.
pytestmark = pytest.mark.filterwarnings("ignore:Async generator 'http(x|core)2\\.:ResourceWarning")

SERVER = Path(__file__).with_name("mcp_server.py")
TOKEN = "t0k3n"
PATIENCE = 60  # seconds a test may take at most (process starts are slow on a busy machine)


class Desk:
    async def ask(self, question: str) -> Result[str]: ...


class Chat:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


class Launcher:
    """Starts tests/mcp_server.py servers over one transport (and era) and stops them at the end.

    An HTTP server listens on a socket this process opened (and keeps open), so there is nothing to
    wait for: connections queue until uvicorn accepts them, also while a killed server is started
    again on the same socket."""

    def __init__(self, transport: str) -> None:
        self.transport, _, era = transport.partition("-")
        self.mode = era or "auto"
        self.processes: list[tuple[socket.socket, list[subprocess.Popen[bytes]], list[str]]] = []

    def server(self, *flags: str, **options: Any) -> StdioServer | HTTPServer:
        options.setdefault("mode", self.mode)
        options.setdefault("name", "notes")
        if self.transport == "stdio":
            return StdioServer(sys.executable, [str(SERVER), *flags], **options)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        args = [*flags, "--token", TOKEN]
        self.processes.append((listener, [self._start(listener, args)], args))
        headers = options.pop("headers", {"Authorization": f"Bearer {TOKEN}"})
        port = listener.getsockname()[1]
        return HTTPServer(f"http://127.0.0.1:{port}/mcp", headers=headers, **options)

    def _start(self, listener: socket.socket, args: list[str]) -> subprocess.Popen[bytes]:
        fd = listener.fileno()
        return subprocess.Popen(
            [sys.executable, str(SERVER), "--http", str(fd), *args], pass_fds=(fd,), stdin=subprocess.DEVNULL
        )

    def restart_killed(self) -> None:
        """Start the HTTP servers again whose process died (a stdio server is started by the next
        connection itself)."""
        for listener, started, args in self.processes:
            if started[-1].wait(timeout=PATIENCE) is not None:
                started.append(self._start(listener, args))

    def close(self) -> None:
        for listener, started, _ in self.processes:
            for process in started:
                process.kill()
                process.wait()
            listener.close()


@pytest.fixture(params=["stdio", "http"])
def launcher(request: pytest.FixtureRequest) -> Iterator[Launcher]:
    launched = Launcher(request.param)
    yield launched
    launched.close()


@pytest.fixture
def stdio() -> Iterator[Launcher]:
    """For what does not depend on the transport: the stdio server only."""
    launched = Launcher("stdio")
    yield launched
    launched.close()


@pytest.fixture(params=["stdio", "http", "stdio-legacy", "http-legacy"])
def any_era(request: pytest.FixtureRequest) -> Iterator[Launcher]:
    launched = Launcher(request.param)
    yield launched
    launched.close()


def desk(source: MCPTools, *script: Any, **build: Any) -> tuple[Desk, ScriptedModel]:
    model = ScriptedModel(*script)
    return agentrt.build(Desk, model=model, tools=[source], **build), model


def results(model: ScriptedModel, request: int = -1) -> list[tuple[str, str, bool]]:
    return [
        (m.tool_call_id, m.text, m.is_error)
        for m in model.requests[request].messages
        if isinstance(m, ToolResultMessage)
    ]


def offered(model: ScriptedModel, request: int = 0) -> list[str]:
    return sorted(spec.name for spec in model.requests[request].tools)


# --- tools, arguments, results, errors ------------------------------------------------------------


async def test_the_tools_go_to_the_model_as_the_server_gave_them_and_are_listed_once(
    launcher: Launcher,
) -> None:
    source = MCPTools(launcher.server())
    script = [[CallTool("listings", id="c1")], "one listing"]
    service, model = desk(source, "hello", "again", *script)
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("hi")
            await service.ask("hi again")
            await service.ask("how often were your tools listed?")

    add = next(spec for spec in model.requests[0].tools if spec.name == "add")
    assert add.description == "Add two integers."
    assert add.parameters == {  # the server's schema as it is, titles included
        "type": "object",
        "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
        "required": ["a", "b"],
        "title": "addArguments",
    }
    assert offered(model) == offered(model, 1) == offered(model, 2)
    assert "delete_note" in offered(model)
    assert results(model) == [("c1", '{"result":1}', False)]  # read once, when it connected
    assert source.tools == {}  # closed


async def test_arguments_structured_and_text_results_and_errors_reach_the_model(launcher: Launcher) -> None:
    source = MCPTools(launcher.server())
    round_ = [
        CallTool("add", {"a": 2, "b": 3}, id="c1"),
        CallTool("echo", {"text": "plain text"}, id="c2"),
        CallTool("read_note", {"title": "missing"}, id="c3"),
        CallTool("add", {"a": "two", "c": 1}, id="c4"),
        CallTool("picture", id="c5"),
    ]
    events: list[object] = []
    service, model = desk(source, round_, "done", listeners=[events.append])
    detailed, detailed_model = desk(source, round_, "done", tool_settings=ToolSettings(error_detail=True))
    with anyio.fail_after(PATIENCE):
        async with source:
            result = await service.ask("go")
            await detailed.ask("go")

    assert results(model) == [
        ("c1", '{"result":5}', False),  # structured content
        ("c2", "plain text", False),  # text content
        ("c3", "Error: tool 'read_note' failed (MCPToolError).", True),  # isError: sanitized
        ("c4", "Error: tool 'add' was called with invalid arguments (ValidationError).", True),
        ("c5", "a pixel", False),  # its image goes beside the text, as an image
    ]
    (picture,) = [m for m in model.requests[-1].messages if getattr(m, "tool_call_id", None) == "c5"]
    assert picture.images == (agentrt.ImageContent(data=PIXEL, media_type="image/png"),)
    assert results(detailed_model)[2:4] == [
        (
            "c3",
            "Error: tool 'read_note' failed (MCPToolError): Error executing tool read_note: no note "
            "'missing' in /srv/notes/private.",
            True,
        ),
        (
            "c4",
            "Error: tool 'add' was called with invalid arguments (ValidationError): arguments: 'b' is a "
            "required property; a: does not match {'type': 'integer'}.",  # the schema's words, not the values
            True,
        ),
    ]
    # One loop: the calls are counted, with the same events and executions as local tools.
    assert [(e.name, e.outcome) for e in result.tool_executions] == [
        ("add", ToolOutcome.SUCCESS),
        ("echo", ToolOutcome.SUCCESS),
        ("read_note", ToolOutcome.ERROR),
        ("add", ToolOutcome.INVALID_ARGUMENTS),
        ("picture", ToolOutcome.SUCCESS),
    ]
    assert result.tool_executions[0].value == {"result": 5}
    assert result.tool_executions[2].error_kind == "MCPToolError"
    assert [type(e).__name__ for e in events if isinstance(e, ToolCallRequested | ToolExecuted)] == [
        *["ToolCallRequested"] * 5,
        *["ToolExecuted"] * 5,
    ]


async def test_only_image_types_every_provider_takes_are_sent_the_others_are_named(stdio: Launcher) -> None:
    source = MCPTools(stdio.server())
    model = ScriptedModel([CallTool("drawings", id="d1")], "Seen.")
    desk = agentrt.build(Desk, model=model, tools=[source])
    with anyio.fail_after(PATIENCE):
        async with source:
            await desk.ask("draw")
    (sent,) = [m for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]
    # the PNG (its type as the providers spell it) goes as an image; an SVG and an untyped image,
    # which providers refuse (and would refuse in every later request), are named
    assert sent.images == (agentrt.ImageContent(data=PIXEL, media_type="image/png"),)
    assert sent.text == "[image image/svg+xml, not shown]\n[image , not shown]"
    assert not sent.is_error


async def test_a_round_s_calls_run_in_parallel_and_raise_typed_errors_by_policy(launcher: Launcher) -> None:
    source = MCPTools(launcher.server())
    # `meet` returns only once two calls of it are running at the same time.
    together = [CallTool("meet", id="c1"), CallTool("meet", id="c2")]
    service, model = desk(source, together, "met")
    raising, _ = desk(
        source,
        [CallTool("read_note", {"title": "nope"}, id="c3")],
        tool_settings=ToolSettings(on_error="raise"),
    )
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("meet")
            with pytest.raises(ToolExecutionError) as info:
                await raising.ask("read")

    assert results(model) == [("c1", '{"result":"met"}', False), ("c2", '{"result":"met"}', False)]
    error = info.value.__cause__
    assert isinstance(error, MCPToolError)
    assert (error.server, error.tool) == ("notes", "read_note")
    assert "no note 'nope'" in str(error)


# --- budgets, cancellation ------------------------------------------------------------------------


async def test_a_slow_call_cut_by_the_time_budget_is_cancelled_on_the_server(any_era: Launcher) -> None:
    source = MCPTools(any_era.server())
    service, _ = desk(source, [CallTool("slow", id="c1")], budget=Budget(seconds=0.5))
    check, model = desk(source, [CallTool("was_cancelled", id="c2")], "it was")
    with anyio.fail_after(PATIENCE):
        async with source:
            with pytest.raises(BudgetExceededError) as info:
                await service.ask("take your time")
            await check.ask("was it cancelled?")  # waits on the server until it saw the cancellation

    assert info.value.limit == "seconds"
    assert results(model) == [("c2", '{"result":"cancelled"}', False)]


async def test_a_budget_counts_mcp_calls_as_tool_calls(stdio: Launcher) -> None:
    source = MCPTools(stdio.server())
    two = [CallTool("add", {"a": 1, "b": 1}, id="c1"), CallTool("add", {"a": 2, "b": 2}, id="c2")]
    service, _ = desk(source, two, "4", budget=Budget(tool_calls=1))
    with anyio.fail_after(PATIENCE):
        async with source:
            with pytest.raises(BudgetExceededError) as info:
                await service.ask("add twice")
    assert info.value.limit == "tool_calls"


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


# --- the tool list changes --------------------------------------------------------------------------


async def test_a_tool_list_change_mid_conversation_is_offered_from_the_next_turn(any_era: Launcher) -> None:
    changed = anyio.Event()
    source = MCPTools(any_era.server(), on_change=lambda server: changed.set())
    service, model = desk(
        source,
        [CallTool("enable_extra", id="c1")],
        "enabled",
        [CallTool("extra", {"word": "hey"}, id="c2"), CallTool("listings", id="c3")],
        "hey hey",
    )
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("enable the extra tool")
            await changed.wait()  # the server's notification arrived (it may trail the call's result)
            await service.ask("use it")

    assert "extra" not in offered(model, 0) and "extra" not in offered(model, 1)
    assert "extra" in offered(model, 2)
    assert results(model) == [
        ("c2", '{"result":"hey hey"}', False),
        ("c3", '{"result":2}', False),
    ]  # listed again once


# --- a server that dies ---------------------------------------------------------------------------


async def test_a_server_killed_mid_call_is_an_error_naming_it_and_the_next_call_reconnects(
    any_era: Launcher,
) -> None:
    source = MCPTools(any_era.server())
    service, model = desk(
        source,
        [CallTool("pid", id="c1")],
        [CallTool("crash", id="c2")],
        "it crashed",
        [CallTool("pid", id="c3")],
        "back",
    )
    raising, _ = desk(source, [CallTool("crash", id="c4")], tool_settings=ToolSettings(on_error="raise"))
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("crash")
            any_era.restart_killed()
            await service.ask("and now?")
            with pytest.raises(ToolExecutionError) as info:
                await raising.ask("crash again")
            any_era.restart_killed()  # (an HTTP session is ended when it closes)

    first = json.loads(results(model, 1)[0][1])["result"]
    assert results(model, 2)[1] == ("c2", "Error: tool 'crash' failed (MCPServerError).", True)
    again = json.loads(results(model, 4)[-1][1])["result"]
    if any_era.transport == "stdio":
        assert again != first  # a new process
    error = info.value.__cause__
    assert isinstance(error, MCPServerError) and error.server == "notes"
    assert "'notes'" in str(error) and "closed during a call of 'crash'" in str(error)


async def test_a_stdio_server_that_died_between_calls_is_started_again_by_the_next_one(
    stdio: Launcher,
) -> None:
    source = MCPTools(stdio.server())
    service, model = desk(source, [CallTool("pid", id="c1")], "first", [CallTool("pid", id="c2")], "second")
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("pid?")
            first = json.loads(results(model)[0][1])["result"]
            link = source._states[0].link
            assert link is not None
            os.kill(first, signal.SIGKILL)
            await link.gone.wait()  # its end of the pipe closed (no call was in flight)
            await service.ask("pid again?")

    second = json.loads(results(model)[0][1])["result"]
    assert second != first  # no error: the call started it again


async def test_a_server_that_died_stays_an_error_when_reconnect_is_off(launcher: Launcher) -> None:
    source = MCPTools(launcher.server(reconnect=False))
    service, model = desk(source, [CallTool("crash", id="c1")], "crashed", [CallTool("pid", id="c2")])
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("crash")
            launcher.restart_killed()
            with pytest.raises(MCPServerError, match="'notes': the connection closed, and reconnect is off"):
                await service.ask("pid?")
    assert results(model) == [("c1", "Error: tool 'crash' failed (MCPServerError).", True)]


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


async def test_servers_that_must_connect_again_do_so_at_once_not_one_after_another(
    stdio: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each dead server may take its `connect_timeout` to fail: an invocation must not wait for the
    sum. Two servers to connect again: the second starts before the first has finished."""
    from agentrt import mcp as agentrt_mcp

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
    assert sorted(entered) == ["a", "b"]
    assert {t.name for t in tools} >= {"a_add", "b_add"}


# --- connecting -----------------------------------------------------------------------------------


async def test_two_servers_with_clashing_tool_names_fail_to_connect_until_prefixed(
    launcher: Launcher,
) -> None:
    clashing = MCPTools(launcher.server(name="left"), launcher.server(name="right"))
    with anyio.fail_after(PATIENCE):
        with pytest.raises(
            ConfigurationError, match="MCP servers 'left' and 'right' both offer a tool named 'add'"
        ):
            async with clashing:
                pass

    prefixed = MCPTools(launcher.server(name="left", prefix="l_"), launcher.server(name="right", prefix="r_"))
    service, model = desk(prefixed, [CallTool("l_pid", id="c1"), CallTool("r_pid", id="c2")], "two")
    with anyio.fail_after(PATIENCE):
        async with prefixed:
            await service.ask("your pids?")
    assert "l_add" in offered(model) and "r_add" in offered(model) and "add" not in offered(model)
    left, right = (json.loads(text)["result"] for _, text, _ in results(model))
    if launcher.transport == "stdio":
        assert left != right  # each call went to its own server


async def test_a_schema_the_provider_would_refuse_names_the_tool_and_can_be_left_out(
    stdio: Launcher,
) -> None:
    refused = MCPTools(stdio.server("--bad-schema"))
    with anyio.fail_after(PATIENCE):
        with pytest.raises(
            ConfigurationError, match=r"MCP server 'notes', tool 'add': its input schema has anyOf at the top"
        ):
            async with refused:
                pass

    left_out = MCPTools(stdio.server("--bad-schema", exclude=["add"]))
    service, model = desk(left_out, "fine")
    with anyio.fail_after(PATIENCE):
        async with left_out:
            await service.ask("hi")
    assert "add" not in offered(model) and "echo" in offered(model)


async def test_unreachable_servers_and_use_outside_async_with_are_errors_naming_the_server(
    launcher: Launcher,
) -> None:
    if launcher.transport == "stdio":
        broken = StdioServer(sys.executable, ["-c", "raise SystemExit(3)"], name="broken")
    else:
        broken = launcher.server(name="broken", headers={"Authorization": "Bearer wrong"})
    with anyio.fail_after(PATIENCE):
        with pytest.raises(MCPServerError, match="MCP server 'broken': could not connect") as info:
            async with MCPTools(broken):
                pass
    assert info.value.server == "broken"

    service, _ = desk(MCPTools(broken), "never asked")
    with pytest.raises(MCPServerError, match="not connected: enter it with `async with` first"):
        await service.ask("hi")


# --- approval -------------------------------------------------------------------------------------


async def test_a_destructive_tool_waits_for_approval_and_read_only_ones_do_not(launcher: Launcher) -> None:
    source = MCPTools(launcher.server())
    service, model = desk(
        source,
        [
            CallTool("read_note", {"title": "groceries"}, id="c1"),
            CallTool("delete_note", {"title": "groceries"}, id="c2"),
        ],
        "deleted",
        [CallTool("read_note", {"title": "groceries"}, id="c3")],
        "gone",
    )
    with anyio.fail_after(PATIENCE):
        async with source:
            assert source.tools["delete_note"].destructive and not source.tools["read_note"].destructive
            assert source.tools["delete_note"].annotations == {"destructiveHint": True}
            approval = (await service.ask("delete my groceries note")).approval
            assert approval is not None
            assert [(c.tool, c.arguments) for c in approval.calls] == [
                ("delete_note", {"title": "groceries"})
            ]
            assert results(model, 0) == []  # nothing sent back yet; the read ran, the delete waits
            await agentrt.resume(service, approval.run_id, {"c2": Approve()})
            await service.ask("read it")

    assert results(model, 1) == [
        ("c1", '{"result":"milk, eggs"}', False),
        ("c2", '{"result":"deleted groceries"}', False),
    ]
    assert results(model) == [("c3", "Error: tool 'read_note' failed (MCPToolError).", True)]


async def test_the_user_says_otherwise_per_server_or_per_tool_and_denied_calls_never_reach_the_server(
    stdio: Launcher,
) -> None:
    free = MCPTools(stdio.server(needs_approval=False))
    service, model = desk(free, [CallTool("delete_note", {"title": "groceries"}, id="c1")], "deleted")
    gated = MCPTools(stdio.server())
    checked, checked_model = desk(
        gated,
        [
            CallTool("delete_note", {"title": "other"}, id="c2"),
            CallTool("delete_note", {"title": "groceries"}, id="c3"),
        ],
        "partly",
        [CallTool("read_note", {"title": "groceries"}, id="c4")],
        "still there",
        approvals=Approvals(needs_approval={"delete_note": lambda args, ctx: args["title"] == "groceries"}),
    )
    with anyio.fail_after(PATIENCE):
        async with free, gated:
            await service.ask("delete it")
            approval = (await checked.ask("delete two")).approval
            assert approval is not None
            await agentrt.resume(checked, approval.run_id, {"c3": Deny("keep it")})
            await checked.ask("read it")

    assert results(model) == [("c1", '{"result":"deleted groceries"}', False)]
    assert [c.id for c in approval.calls] == ["c3"]
    assert results(checked_model, 1)[0] == ("c2", '{"result":"deleted other"}', False)
    assert results(checked_model, 1)[1][1].startswith("The user denied this call of 'delete_note'")
    assert results(checked_model) == [("c4", '{"result":"milk, eggs"}', False)]


# --- as a tool provider, beside local tools -------------------------------------------------------


@tool("The time of day.")
def clock() -> str:
    return "noon"


async def test_a_tool_provider_and_local_tools_work_beside_it_and_a_clash_is_an_error(
    stdio: Launcher,
) -> None:
    source = MCPTools(stdio.server())
    model = ScriptedModel([CallTool("clock", id="c1"), CallTool("echo", {"text": "hi"}, id="c2")], "both")
    service = agentrt.build(Desk, model=model, tools=[clock], tool_provider=source)

    @tool("Not the server's echo.")
    def echo(text: str) -> str:
        return text

    clashing = agentrt.build(Desk, model=ScriptedModel("never"), tools=[echo, source])
    with anyio.fail_after(PATIENCE):
        async with source:
            await service.ask("time and echo")
            with pytest.raises(ConfigurationError, match=r"returned \['echo'\], which the build already has"):
                await clashing.ask("hi")

    assert results(model) == [("c1", "noon", False), ("c2", "hi", False)]


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


async def test_a_calls_event_sse_data_and_span_carry_its_tools_annotations(stdio: Launcher) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentrt.otel import instrument
    from agentrt.sse._native import encode

    @tool
    def shout(text: str) -> str:
        """Say it loudly."""
        return text.upper()

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    source = MCPTools(stdio.server())
    events: list[Any] = []
    model = ScriptedModel(
        [
            CallTool("read_note", {"title": "groceries"}, id="c1"),
            CallTool("add_note", {"title": "todo", "text": "call"}, id="c2"),
            CallTool("shout", {"text": "hi"}, id="c3"),
        ],
        "done",
    )
    listeners = [events.append, instrument(tracer_provider=provider)]
    service = agentrt.build(Desk, model=model, tools=[source, shout], listeners=listeners)
    with anyio.fail_after(PATIENCE):
        async with source:
            assert (await service.ask("notes")).value == "done"
    provider.shutdown()

    requested = [e for e in events if isinstance(e, ToolCallRequested)]
    assert [(e.call.name, e.annotations) for e in requested] == [
        ("read_note", {"readOnlyHint": True}),
        ("add_note", {"readOnlyHint": False, "destructiveHint": False}),
        ("shout", {}),
    ]
    assert [encode(e, thinking=False, tool_details=False) for e in requested] == [
        ("tool_call", {"id": "c1", "name": "read_note", "annotations": {"readOnlyHint": True}}),
        (
            "tool_call",
            {
                "id": "c2",
                "name": "add_note",
                "annotations": {"readOnlyHint": False, "destructiveHint": False},
            },
        ),
        ("tool_call", {"id": "c3", "name": "shout"}),  # a Python tool's owner says nothing
    ]
    hints = {
        span.name: {
            k: v for k, v in (span.attributes or {}).items() if k.startswith("agentrt.tool.annotation.")
        }
        for span in exporter.get_finished_spans()
        if span.name.startswith("execute_tool")
    }
    assert hints == {
        "execute_tool read_note": {"agentrt.tool.annotation.readOnlyHint": True},
        "execute_tool add_note": {
            "agentrt.tool.annotation.readOnlyHint": False,
            "agentrt.tool.annotation.destructiveHint": False,
        },
        "execute_tool shout": {},
    }
