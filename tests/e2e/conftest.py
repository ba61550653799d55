"""The end-to-end tier: a real LLM server (llama-cpp-python + Gemma 3 270M) on loopback.

One server serves the whole session, started and stopped the documented way
(`python -m agentrt.local start|stop`, what `make local-model-start|stop` run). `make test-e2e`
installs what it needs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class LocalServer:
    base_url: str
    log: Path


def _local(action: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrt.local", action, "--state-dir", str(state)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="session")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    state = tmp_path_factory.mktemp("local-model")
    started = _local("start", state)
    if started.returncode != 0 or not (state / "url").exists():
        pytest.fail(f"the local model server did not start:\n{started.stdout}\n{started.stderr}")
    try:
        yield LocalServer((state / "url").read_text().strip(), Path((state / "log").read_text().strip()))
    finally:
        stopped = _local("stop", state)
        assert stopped.returncode == 0, stopped.stderr
        assert not (state / "pid").exists()
