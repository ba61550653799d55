"""A real Postgres server for tests, in a temporary directory, on a free loopback port.

`postgres_server()` makes a cluster (`initdb`, trust authentication for its one user), starts it
with `pg_ctl` and yields its URL without a database (append `/name`: DBOS creates the database);
`postgres_url` is a session fixture around it. The binaries are looked up on PATH, then in Debian's
`/usr/lib/postgresql/<version>/bin` (package `postgresql`). Without them the tests that need it are
skipped, except under CI (`CI=true`), where they fail: CI installs the package. The server refuses to
run as root: as root, the cluster belongs to the `postgres` user and its commands run through
`runuser -u postgres`.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_SECONDS = 30
# Another process may take the free port between choosing it and the server binding it.
ATTEMPTS = 5


def _binaries() -> str | None:
    """The directory of `initdb` and `pg_ctl` (they find `postgres` beside them)."""
    found = shutil.which("pg_ctl")
    if found is not None and shutil.which("initdb") is not None:
        return str(Path(os.path.realpath(found)).parent)
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(directory, "pg_ctl"), os.X_OK):
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def postgres_server() -> Iterator[str]:
    """Run a Postgres server for as long as the generator is open; yield its `postgresql://` URL
    (without a database)."""
    binaries = _binaries()
    if binaries is None:
        reason = "Postgres is not installed (apt-get install postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: CI must run the Postgres tests", pytrace=False)
        pytest.skip(reason)
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    tmp = tempfile.mkdtemp(prefix="agentrt-postgres-")
    try:
        if as_root:
            shutil.chown(tmp, "postgres")
        data = os.path.join(tmp, "data")
        log = os.path.join(tmp, "server.log")
        subprocess.run(
            [*prefix, f"{binaries}/initdb", "-D", data, "-U", "agentrt", "--auth=trust", "-E", "UTF8"],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(ATTEMPTS):
            port = _free_port()
            options = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off"
            command = [*prefix, f"{binaries}/pg_ctl", "-D", data, "-l", log, "-o", options]
            started = subprocess.run(
                [*command, "-w", "-t", str(STARTUP_SECONDS), "start"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if started.returncode == 0:
                break
        else:
            output = Path(log).read_text(errors="replace") if os.path.exists(log) else "(no log)"
            raise RuntimeError(f"postgres did not start in {ATTEMPTS} attempts:\n{output}")
        try:
            yield f"postgresql://agentrt@127.0.0.1:{port}"
        finally:
            subprocess.run(
                [*prefix, f"{binaries}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a Postgres server shared by the session (see `postgres_server`)."""
    yield from postgres_server()
