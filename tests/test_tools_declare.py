"""Declaring tools: schemas from type hints, descriptions, injected parameters, build-time errors."""

from __future__ import annotations

import datetime
import enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel

import agentrt
from agentrt import ConfigurationError, Description, MemoryId, ToolContext, tool
from agentrt.testing import ScriptedModel
from agentrt.tools._declare import collect_tools, define_tool
from agentrt.tools._run import result_text


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Address(BaseModel):
    street: str
    zip_code: str | None = None


class Kitchen:
    @tool("Plan a delivery.", name="plan_delivery")
    async def plan(
        self,
        item: Annotated[str, Description("what to deliver")],
        quantity: int,
        weight: float,
        fragile: bool,
        priority: Priority,
        mode: Literal["van", "bike"],
        note: str | None,
        tags: list[str],
        extras: dict[str, int],
        address: Address,
        day: datetime.date,
        conversation: Annotated[str, MemoryId],
        context: ToolContext,
        retries: int = 2,
    ) -> str:
        return "planned"


def test_schema_snapshot_for_every_supported_parameter_type() -> None:
    (definition,) = collect_tools([Kitchen()], where="test").values()

    assert definition.name == "plan_delivery"
    assert definition.description == "Plan a delivery."
    assert definition.injected == {"conversation": "memory_id", "context": "context"}
    assert definition.parameters == {
        "$defs": {
            "Address": {
                "properties": {
                    "street": {"type": "string"},
                    "zip_code": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                },
                "required": ["street"],
                "type": "object",
            },
            "Priority": {"enum": ["low", "high"], "type": "string"},
        },
        "additionalProperties": False,
        "properties": {
            "item": {"description": "what to deliver", "type": "string"},
            "quantity": {"type": "integer"},
            "weight": {"type": "number"},
            "fragile": {"type": "boolean"},
            "priority": {"$ref": "#/$defs/Priority"},
            "mode": {"enum": ["van", "bike"], "type": "string"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "tags": {"items": {"type": "string"}, "type": "array"},
            "extras": {"additionalProperties": {"type": "integer"}, "type": "object"},
            "address": {"$ref": "#/$defs/Address"},
            "day": {"format": "date", "type": "string"},
            "retries": {"default": 2, "type": "integer"},
        },
        "required": [
            "item",
            "quantity",
            "weight",
            "fragile",
            "priority",
            "mode",
            "note",
            "tags",
            "extras",
            "address",
            "day",
        ],
        "type": "object",
    }


def test_descriptions_from_google_and_sphinx_docstrings() -> None:
    @tool
    def google(city: str, days: int = 1) -> str:
        """Forecast the weather.

        Args:
            city: the city name,
                as the user wrote it
            days (int): how many days ahead
        """
        return ""

    @tool(name="sphinx_forecast")
    def sphinx(city: str) -> str:
        """Forecast the weather.

        :param city: the city name
        """
        return ""

    g, s = define_tool(google), define_tool(sphinx)

    assert g.description == "Forecast the weather."
    assert g.parameters["properties"]["city"]["description"] == "the city name, as the user wrote it"
    assert g.parameters["properties"]["days"]["description"] == "how many days ahead"
    assert s.name == "sphinx_forecast"
    assert s.parameters["properties"]["city"]["description"] == "the city name"


def test_plain_functions_async_and_sync_are_tools() -> None:
    @tool("Add.")
    def add(a: int, b: int) -> int:
        return a + b

    @tool("Now.")
    async def now() -> str:
        return "now"

    tools = collect_tools([add, now], where="test")

    assert tools["add"].is_async is False
    assert tools["now"].is_async is True
    assert tools["now"].parameters == {"additionalProperties": False, "properties": {}, "type": "object"}


def test_duplicate_tool_names_are_rejected_at_build() -> None:
    @tool("One.", name="lookup")
    def one() -> str:
        return ""

    @tool("Two.", name="lookup")
    def two() -> str:
        return ""

    class Service:
        async def ask(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match="two tools are named 'lookup'"):
        agentrt.build(Service, model=ScriptedModel(), tools=[one, two])


class Socket:
    """A type pydantic cannot describe."""


def test_a_parameter_type_without_schema_is_rejected_naming_the_tool() -> None:
    @tool("Send.")
    def send(connection: Socket) -> str:
        return ""

    with pytest.raises(ConfigurationError, match=r"tool 'send': parameter 'connection' .* no JSON schema"):
        define_tool(send)


@pytest.mark.parametrize("item", [42, "a string", Priority, object()])
def test_non_tools_are_rejected(item: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"is not a tool|has no @tool methods"):
        collect_tools([item], where="Service")


def test_a_tool_needs_a_description_and_annotations() -> None:
    def undocumented(x: int) -> int:
        return x

    @tool("Untyped.")
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(ConfigurationError, match="give a description"):
        define_tool(undocumented)
    with pytest.raises(ConfigurationError, match="parameter 'x' needs a type annotation"):
        define_tool(untyped)


def test_tools_need_the_model_capability() -> None:
    class Service:
        async def ask(self, question: str) -> str: ...

    model = ScriptedModel(capabilities=agentrt.Capabilities(tools=False))
    with pytest.raises(ConfigurationError, match=r"Capabilities\.tools"):
        agentrt.build(Service, model=model, tools=[Kitchen()])


def test_result_text() -> None:
    assert result_text("plain") == "plain"
    assert result_text(None) == "Success"
    assert result_text(Address(street="Main 1")) == '{"street":"Main 1","zip_code":null}'
    assert result_text({"a": [1, 2], 3: Address(street="x")}) == (
        '{"a":[1,2],"3":{"street":"x","zip_code":null}}'
    )


def test_positional_only_parameters_are_rejected() -> None:
    @tool("Add.")
    def add(a: int, /, b: int) -> int:
        return a + b

    with pytest.raises(ConfigurationError, match="parameter 'a' is positional-only"):
        define_tool(add)


def test_async_is_decided_on_the_callable_that_is_called() -> None:
    import functools

    def sync_lookup(key: str) -> str:
        return key

    @functools.wraps(sync_lookup)
    async def async_wrapper(key: str) -> str:
        return sync_lookup(key)

    class Caller:
        async def __call__(self, key: str) -> str:
            return key

    async_wrapper.__doc__ = "Look up."
    caller = tool("Look up.", name="caller")(Caller())

    assert define_tool(async_wrapper).is_async
    assert define_tool(caller).is_async
    assert not define_tool(tool("Sync.")(sync_lookup)).is_async
