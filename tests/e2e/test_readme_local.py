"""The README block that starts a real local model server runs as written (needs agentrt[local])."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_readme import python_blocks, readme_models, run_readme

pytestmark = pytest.mark.e2e


async def test_the_local_server_block_of_the_readme_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # the memory block writes chat.db
    namespace: dict[str, Any] = {"__name__": "readme"}
    await run_readme(namespace, local=False, models=list(readme_models().values()))
    await namespace["stream"].aclose()

    ran = await run_readme(namespace, local=True)

    assert len(ran) == 1 and ran[0] in python_blocks()
    service = namespace["support"]
    assert type(service).__qualname__ == "Support"
    assert namespace["server"].chat_model().name == namespace["model"].name
