"""Prompt templates: `{{name}}` placeholders, parsed once, rendered in one pass.

Rendering substitutes values and never looks at them again, so text a user passes in (even text that
contains `{{x}}`) is sent literally. Non-string values are formatted by `format_value`.
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Template", "format_value"]

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def format_value(value: Any) -> str:
    """How a template value becomes text: strings as they are, pydantic models as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


class Template:
    """A parsed template. `variables` lists the placeholder names in order of first use."""

    __slots__ = ("_parts", "source", "variables")

    def __init__(self, source: str, *, where: str = "template") -> None:
        if not isinstance(source, str):
            raise ConfigurationError(f"{where}: a template must be a str, got {type(source).__name__}")
        parts: list[str] = []
        names: list[str] = []
        position = 0
        for match in _PLACEHOLDER.finditer(source):
            name = match.group(1).strip()
            if not _NAME.fullmatch(name):
                raise ConfigurationError(
                    f"{where}: placeholder {match.group(0)!r} is not a variable name; "
                    "use {{name}} with a Python identifier"
                )
            parts.append(source[position : match.start()])
            parts.append(name)
            names.append(name)
            position = match.end()
        parts.append(source[position:])
        self.source = source
        # Even indexes are literal text, odd indexes are variable names.
        self._parts = tuple(parts)
        self.variables = tuple(dict.fromkeys(names))

    def render(self, values: Mapping[str, Any]) -> str:
        """The template with every placeholder replaced by its formatted value."""
        parts = self._parts
        if len(parts) == 1:
            return parts[0]
        out = [parts[0]]
        for i in range(1, len(parts), 2):
            out.append(format_value(values[parts[i]]))
            out.append(parts[i + 1])
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"
