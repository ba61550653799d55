"""A real `redis-server` for tests, on a free loopback port, with nothing persisted.

`redis_server()` starts one and yields its URL; `redis_url` is a session fixture around it (import it
into a test module, or wrap `redis_server()` in a fixture of your own). Without `redis-server` on PATH
the tests that need it are skipped, except under CI (`CI=true`), where they fail: CI installs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_SECONDS = 10.0
# Another process may take the free port between choosing it and the server binding it: another
# test session's redis-server too (pytest-xdist workers each start one), so a server that answers on
# the port must be ours (its process id), not a neighbour's.
ATTEMPTS = 5


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(port: int, pid: int) -> bool:
    """Whether the redis-server of process `pid` answers on `port` (its INFO names its process)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
            conn.sendall(b"INFO server\r\n")
            reply = b""
            while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    return False
                reply += chunk
            return f"\r\nprocess_id:{pid}\r\n".encode() in reply
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _start(executable: str, directory: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start a server on a free port and wait until it answers there; `None` when it exited first
    (most likely the port was taken meanwhile). Raise when it neither answers nor exits in time."""
    port = _free_port()
    log = directory / "redis.log"
    args = [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(directory), "--daemonize", "no", "--logfile", str(log)]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if _answers(port, process.pid):
            return process, port
        if process.poll() is not None:
            return None
        time.sleep(0.05)
    _stop(process)
    output = log.read_text(errors="replace") if log.exists() else "(no log)"
    raise RuntimeError(f"redis-server did not answer within {STARTUP_SECONDS} s:\n{output}")


def redis_server() -> Iterator[str]:
    """Run a `redis-server` for as long as the generator is open; yield its URL (database 0)."""
    executable = shutil.which("redis-server")
    if executable is None:
        reason = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: CI must run the Redis tests", pytrace=False)
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="agentrt-redis-") as tmp:
        directory = Path(tmp)
        for _ in range(ATTEMPTS):
            started = _start(executable, directory)
            if started is not None:
                break
        else:
            log = directory / "redis.log"
            output = log.read_text(errors="replace") if log.exists() else "(no log)"
            raise RuntimeError(f"redis-server exited at startup {ATTEMPTS} times:\n{output}")
        process, port = started
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            _stop(process)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of a `redis-server` shared by the session (see `redis_server`)."""
    yield from redis_server()
