"""Serving a test app in a child process on a socket opened here (for tests over real HTTP)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def serve(script: Path, *args: str, backlog: int = 64) -> Iterator[str]:
    """Run `script <fd> [args]` (it serves an ASGI app with uvicorn on the inherited socket) and yield the
    base URL. The socket listens before the process starts, so there is nothing to wait for:
    connections queue until uvicorn accepts them. The process is stopped when the generator ends."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(backlog)
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(script), str(listener.fileno()), *args],
        pass_fds=(listener.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    listener.close()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
