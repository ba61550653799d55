"""Every Python block of README.md runs as written, in order, in one namespace.

The README leaves one name to the reader: `model` in the quickstart ("`model` is any
agentrt.ChatModel"). The test supplies a scripted model there and checks what the blocks sent. The
block that starts the local model server (`agentrt.local`) runs in the end-to-end tier
(tests/e2e/test_readme_local.py), where that server is installed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import agentrt
from agentrt.testing import ScriptedModel

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


async def run_block(source: str, namespace: dict[str, Any]) -> None:
    code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if result is not None:
        await result


async def run_readme(namespace: dict[str, Any], *, local: bool) -> list[str]:
    ran = []
    for block in python_blocks():
        if ("agentrt.local" in block) != local:
            continue
        await run_block(block, namespace)
        ran.append(block)
    return ran


async def test_every_readme_block_runs_as_written(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = ScriptedModel(
        "Order SO-2026-0001 ships tomorrow.",
        '{"origin": "Bern", "destination": "Basel"}',
        ["It ", "ships ", "today."],
        "Hello!",
    )
    namespace: dict[str, Any] = {"__name__": "readme", "model": model}

    ran = await run_readme(namespace, local=False)

    assert len(ran) == len(python_blocks()) - 1  # all but the local-server block
    assert namespace["answer"] == "Order SO-2026-0001 ships tomorrow."
    ticket = namespace["ticket"]
    assert isinstance(ticket, BaseModel) and ticket.model_dump() == {"origin": "Bern", "destination": "Basel"}
    assert isinstance(namespace["result"], agentrt.Result) and namespace["result"].value == "Hello!"
    assert "It ships today." in capsys.readouterr().out
    system = model.requests[0].messages[0]
    assert system == agentrt.SystemMessage(text="You are a support assistant for Acme.")
    assert all(stream.closed for stream in model.streams)
    for name in ("model", "support"):
        value = namespace.get(name)
        if hasattr(value, "aclose"):
            await value.aclose()
