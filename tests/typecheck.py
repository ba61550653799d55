"""`mypy --strict` on a user's file, as users run it, for the tests that check what a type checker says.

mypy runs in a child process: its in-process API (`mypy.api.run`) leaves its whole analysis alive in
the test process (over a million objects), after which every full garbage collection there takes
seconds (tests/test_stream_closing.py collects several times a test). The cache directory is the
session's (`mypy_cache` in tests/conftest.py: one per xdist worker, never shared between processes),
so a later run reuses what the first one analysed of agentrt and its dependencies; mypy's
incremental mode reports what a full run does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mypy(target: Path, cache: Path) -> tuple[str, int]:
    """mypy's report on `target` (with the project's configuration) and its exit status."""
    config = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache)]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", str(target), "--strict", *config],
        cwd=ROOT,  # where mypy finds agentrt and examples, as the tests run them
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout, done.returncode
