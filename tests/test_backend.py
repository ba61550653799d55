"""Backend-specific code lives in `agentrt/_backend.py` alone.

ruff refuses `import asyncio` / `import trio` elsewhere in the package (banned-api, pyproject.toml);
this catches what an import ban cannot see: a backend module reached through `sys.modules` or
`importlib` under its name. `agentrt/testing.py` names the backends by design (an asyncio event loop
on virtual time, trio's mock clock). A plain test: it reads source files.
"""

from __future__ import annotations

import ast
from pathlib import Path

import agentrt

PACKAGE = Path(agentrt.__file__).parent
BACKENDS = {"asyncio", "trio", "sniffio"}
ALLOWED = {PACKAGE / "_backend.py", PACKAGE / "testing.py"}


def backend_names(path: Path) -> list[str]:
    """Where `path` names a backend module in code: a variable or a string (docstrings aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id in BACKENDS:
            found.append(f"{path.name}:{node.lineno}: name {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.split(".")[0] in BACKENDS:
                found.append(f"{path.name}:{node.lineno}: string {node.value!r}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            banned = [m for m in modules if m.split(".")[0] in BACKENDS]
            found += [f"{path.name}:{node.lineno}: import {m}" for m in banned]
    return found


def test_only_the_backend_module_names_the_async_backends() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert PACKAGE / "_backend.py" in sources
    found = [hit for path in sources if path not in ALLOWED for hit in backend_names(path)]
    assert found == []


def test_the_check_sees_a_backend_reached_through_sys_modules(tmp_path: Path) -> None:
    module = tmp_path / "sneaky.py"
    module.write_text('import sys\ntrio = sys.modules.get("trio")\nfrom asyncio import sleep\n')
    assert sorted(backend_names(module)) == [
        "sneaky.py:2: name trio",
        "sneaky.py:2: string 'trio'",
        "sneaky.py:3: import asyncio",
    ]
