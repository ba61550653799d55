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

import httpx
import pytest

from agentrt.local import EMBEDDING_ALIAS, MODEL_ALIAS


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
        server = LocalServer((state / "url").read_text().strip(), Path((state / "log").read_text().strip()))
        _first_requests(server)
        yield server
    finally:
        stopped = _local("stop", state)
        assert stopped.returncode == 0, stopped.stderr
        assert not (state / "pid").exists()


def _first_requests(server: LocalServer) -> None:
    """One token and one embedding: a server that answers /models but dies on its first inference
    (a llama.cpp build whose kernels this CPU cannot run) fails here, once, with its log, rather
    than as a connection error in every test."""
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            chat = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
            client.post("/chat/completions", json=chat).raise_for_status()
            client.post("/embeddings", json={"model": EMBEDDING_ALIAS, "input": ["Hi"]}).raise_for_status()
    except httpx.HTTPError as exc:
        pytest.fail(f"the local model server failed its first requests ({exc!r}); {_log_tail(server)}")


def _log_tail(server: LocalServer, lines: int = 30) -> str:
    try:
        text = server.log.read_text(errors="replace")
    except OSError as exc:
        return f"its log {server.log} could not be read: {exc}"
    return f"its log {server.log} ends:\n" + "\n".join(text.splitlines()[-lines:])
