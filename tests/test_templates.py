"""Templates render in one pass; values are never rendered again."""

from __future__ import annotations

import enum

import pytest
from pydantic import BaseModel

from agentrt import ConfigurationError
from agentrt._templates import Template, format_value


async def test_render_substitutes_each_placeholder_once() -> None:
    template = Template("Hi {{name}}, {{ name }} likes {{thing}}.")

    assert template.variables == ("name", "thing")
    assert template.render({"name": "{{thing}}", "thing": "tea"}) == ("Hi {{thing}}, {{thing}} likes tea.")


async def test_template_without_placeholders_and_single_braces() -> None:
    assert Template("{a} plain {").render({}) == "{a} plain {"


@pytest.mark.parametrize("source", ["{{}}", "{{ a b }}", "{{a.b}}", "{{1x}}"])
async def test_malformed_placeholders_are_configuration_errors(source: str) -> None:
    with pytest.raises(ConfigurationError, match="is not a variable name"):
        Template(source, where="Service.method")


async def test_format_value() -> None:
    class Colour(enum.Enum):
        RED = "red"

    class Point(BaseModel):
        x: int

    assert format_value("text") == "text"
    assert format_value(3) == "3"
    assert format_value(Colour.RED) == "red"
    assert format_value(Point(x=1)) == '{"x":1}'
