"""The end-to-end tier: a real LLM server (llama-cpp-python + Gemma 3 270M) on loopback.

One server serves the whole session; it is started with `python -m agentrt.local serve` in its own
process group and stopped (SIGTERM, then SIGKILL) at the end. `make test-e2e` installs what it needs.
"""

from __future__ import annotations

import os
import signal
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


@pytest.fixture(scope="session")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    stderr = tmp_path_factory.mktemp("local-model") / "serve.log"
    with stderr.open("wb") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentrt.local", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,
        )
    assert process.stdout is not None
    url = process.stdout.readline().decode().strip()
    log = process.stdout.readline().decode().strip()
    if not url:
        process.wait(timeout=30)
        pytest.fail(f"the local model server did not start:\n{stderr.read_text(errors='replace')}")
    try:
        yield LocalServer(url, Path(log))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close()
