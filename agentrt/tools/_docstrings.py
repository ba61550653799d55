"""A tool's description and its parameters' descriptions, from its docstring (Google or Sphinx style),
for `define_tool` (`agentrt.tools._declare`)."""

from __future__ import annotations

import inspect
import re

_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:\S+\s+)?(\w+):\s*(.+)$")


def _docstring_parts(doc: str | None) -> tuple[str | None, dict[str, str]]:
    """(summary paragraph, parameter descriptions) from a Google- or Sphinx-style docstring."""
    if not doc:
        return None, {}
    doc = inspect.cleandoc(doc)
    summary = doc.split("\n\n", 1)[0].strip()
    if summary.startswith((":param", "Args:")):
        summary = ""
    params: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            params[sphinx.group(1)] = sphinx.group(2).strip()
            continue
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if not stripped:
                current = None
                continue
            if not line.startswith((" ", "\t")):
                in_args = False
                continue
            match = re.match(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
            if match and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
    return summary or None, params
