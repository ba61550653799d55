"""The pieces under `agentrt.mcp`, without a server: a tool declared by a JSON schema (its arguments
checked and passed as sent, its approval predicates), a tool source asked at each invocation, and the
checks on what a server lists (schemas a model provider would refuse, arguments that break a schema).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from jsonschema.validators import validator_for

import agentrt
from agentrt import Approvals, ConfigurationError, Result, ToolRequest, ToolResultMessage, tool
from agentrt._mcp_convert import check_arguments, schema_refusal
from agentrt.mcp import HTTPServer, MCPTool, MCPTools, StdioServer
from agentrt.testing import CallTool, ScriptedModel
from agentrt.tools._declare import ToolDefinition, ToolSource, schema_tool

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
    "required": ["path"],
    "additionalProperties": False,
}


class Desk:
    async def ask(self, question: str) -> Result[str]: ...


def check(schema: dict[str, Any]) -> Any:
    return check_arguments(validator_for(schema)(schema))


class Files(ToolSource):
    """A tool source whose tools change between invocations; it records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[ToolRequest] = []
        self.calls: list[dict[str, Any]] = []
        self.names = ["read"]

    async def read(self, arguments: dict[str, Any]) -> str:
        self.calls.append(arguments)
        return f"read {arguments['path']}"

    async def __call__(self, request: ToolRequest) -> Sequence[ToolDefinition]:
        self.asked.append(request)
        return [
            schema_tool(name, f"Read a file ({name}).", SCHEMA, self.read, check=check(SCHEMA))
            for name in self.names
        ]


def results(model: ScriptedModel, request: int = -1) -> list[tuple[str, str, bool]]:
    return [
        (m.tool_call_id, m.text, m.is_error)
        for m in model.requests[request].messages
        if isinstance(m, ToolResultMessage)
    ]


async def test_a_schema_tool_gets_the_arguments_as_sent_and_refuses_what_breaks_the_schema() -> None:
    files = Files()
    model = ScriptedModel(
        [
            CallTool("read", {"path": "a.txt"}, id="c1"),
            CallTool("read", {"path": "b.txt", "limit": 0, "mode": "x"}, id="c2"),
            CallTool("read", "[1, 2]", id="c3"),
        ],
        "done",
    )
    service = agentrt.build(
        Desk, model=model, tools=[files], tool_settings=agentrt.ToolSettings(error_detail=True)
    )

    await service.ask("read")

    assert files.calls == [{"path": "a.txt"}]  # as sent: no defaults, no nulls for what was left out
    assert model.requests[0].tools[0].parameters == SCHEMA
    assert results(model) == [
        ("c1", "read a.txt", False),
        (
            "c2",
            "Error: tool 'read' was called with invalid arguments (ValidationError): arguments: "
            "Additional properties are not allowed ('mode' was unexpected); limit: does not match "
            "{'minimum': 1}.",
            True,
        ),
        (
            "c3",
            "Error: tool 'read' was called with invalid arguments (ValidationError): arguments: the "
            "arguments must be a JSON object.",
            True,
        ),
    ]


async def test_a_tool_source_is_asked_at_each_invocation_beside_the_build_s_tools_and_provider() -> None:
    files = Files()

    @tool("The time.")
    def clock() -> str:
        return "noon"

    @tool("The weather.")
    def weather() -> str:
        return "sunny"

    model = ScriptedModel("one", "two")
    service = agentrt.build(Desk, model=model, tools=[clock, files], tool_provider=lambda request: [weather])

    await service.ask("first")
    files.names = ["read", "read_again"]
    await service.ask("second")

    assert [r.user_message.text for r in files.asked] == ["first", "second"]
    assert [sorted(t.name for t in r.tools) for r in model.requests] == [
        ["clock", "read", "weather"],
        ["clock", "read", "read_again", "weather"],
    ]


async def test_approval_predicates_see_a_schema_tool_s_arguments_by_name() -> None:
    seen: list[dict[str, Any]] = []

    def needs(arguments: Any, context: Any) -> bool:
        seen.append(dict(arguments))
        return arguments["limit"] is not None

    files = Files()
    model = ScriptedModel(
        [CallTool("read", {"path": "a"}, id="c1"), CallTool("read", {"path": "b", "limit": 5}, id="c2")],
        "done",
    )
    service = agentrt.build(
        Desk, model=model, tools=[files], approvals=Approvals(needs_approval={"read": needs})
    )

    result = await service.ask("read")

    assert seen == [{"path": "a", "limit": None}, {"path": "b", "limit": 5}]
    assert result.approval is not None
    assert [(c.id, c.arguments) for c in result.approval.calls] == [("c2", {"path": "b", "limit": 5})]
    assert files.calls == [{"path": "a"}]


def test_schema_tools_refuse_names_and_settings_a_provider_or_agentrt_would_refuse() -> None:
    async def call(arguments: dict[str, Any]) -> None: ...

    with pytest.raises(ConfigurationError, match=r"tool 'files\.read': name 'files\.read' must match"):
        schema_tool("files.read", "Read.", SCHEMA, call, check=check(SCHEMA))
    with pytest.raises(ConfigurationError, match="timeout must be positive"):
        schema_tool("read", "Read.", SCHEMA, call, check=check(SCHEMA), timeout=0)
    with pytest.raises(ConfigurationError, match="needs_approval must be True, False or a predicate"):
        schema_tool("read", "Read.", SCHEMA, call, check=check(SCHEMA), needs_approval="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (SCHEMA, None),
        ({"type": "object"}, None),
        ([], "its input schema is not a JSON object"),
        ({"type": "array", "items": {}}, 'must have "type": "object" at the top'),
        ({"properties": {}}, 'must have "type": "object" at the top'),
        ({"type": "object", "oneOf": [{}, {}]}, "has oneOf at the top"),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": "1"}}},
            "not a valid JSON Schema",
        ),
    ],
)
def test_schemas_a_model_provider_would_refuse_are_named(schema: Any, why: str | None) -> None:
    refused = schema_refusal(schema)
    if why is None:
        assert refused is None
    else:
        assert refused is not None and why in refused


def test_argument_errors_name_where_and_the_schema_s_rule_never_the_values() -> None:
    nested = {
        "type": "object",
        "properties": {
            "card": {"type": "object", "properties": {"number": {"type": "string", "pattern": "^[0-9]+$"}}}
        },
    }
    with pytest.raises(
        ValueError, match=r"^card\.number: does not match \{'pattern': '\^\[0-9\]\+\$'\}$"
    ) as info:
        check(nested)({"card": {"number": "4111-SECRET"}})
    assert "SECRET" not in str(info.value)
    check(nested)({"card": {"number": "4111"}})


def test_servers_refuse_bad_settings_and_name_themselves() -> None:
    assert StdioServer("/usr/bin/files-server").label == "files-server"
    assert HTTPServer("https://mcp.example.com/mcp").label == "mcp.example.com"
    with pytest.raises(ConfigurationError, match=r"MCP server 'x': prefix 'a\.b' must match"):
        StdioServer("x", prefix="a.b")
    with pytest.raises(ConfigurationError, match="exclude is a collection of tool names, not one string"):
        StdioServer("x", exclude="add")
    with pytest.raises(ConfigurationError, match="needs_approval must be True, False or a predicate"):
        StdioServer("x", needs_approval="always")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="connect_timeout must be positive"):
        HTTPServer("http://localhost/mcp", connect_timeout=0)
    with pytest.raises(ConfigurationError, match="two servers are named 'x'"):
        MCPTools(StdioServer("x"), StdioServer("/bin/x"))
    with pytest.raises(ConfigurationError, match="give at least one server"):
        MCPTools()


@pytest.mark.parametrize(
    ("annotations", "read_only", "destructive"),
    [
        ({}, False, True),  # the MCP specification's defaults: not read-only, destructive
        ({"readOnlyHint": True}, True, False),
        ({"readOnlyHint": False, "destructiveHint": False}, False, False),
        ({"destructiveHint": True}, False, True),
        ({"readOnlyHint": True, "destructiveHint": True}, True, False),  # destructiveHint is for writers
    ],
)
def test_read_only_and_destructive_follow_the_specification_s_defaults(
    annotations: dict[str, bool], read_only: bool, destructive: bool
) -> None:
    info = MCPTool(
        name="t", server="s", remote_name="t", description="T.", parameters={}, annotations=annotations
    )
    assert (info.read_only, info.destructive) == (read_only, destructive)
