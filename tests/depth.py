"""How deep the exhaustive tests go (`@pytest.mark.exhaustive`).

`make test` runs them thinned: the split sweeps cut a body where a decoder decides something (around
every line end, inside multi-byte characters, at both ends) and at an even stride through the rest,
and the property tests draw a tenth of their examples. `make test-deep` (`AGENTRT_TEST_DEPTH=full`,
run once by `.ci/run`) runs only these tests, at every offset and with every example.
"""

from __future__ import annotations

import os

FULL = os.environ.get("AGENTRT_TEST_DEPTH") == "full"


def examples(deep: int) -> int:
    """A property test's `max_examples`: `deep` under `make test-deep`, a tenth (at least 100) otherwise."""
    return deep if FULL else max(100, deep // 10)


def offsets(body: bytes, *, stride: int = 97) -> list[int]:
    """Where to cut `body` in two: every offset under `make test-deep`; otherwise the first and last
    16, every offset within 2 of a line end or a non-ASCII byte, and every `stride`-th offset."""
    if FULL:
        return list(range(len(body) + 1))
    chosen = set(range(min(16, len(body) + 1))) | set(range(max(0, len(body) - 15), len(body) + 1))
    chosen.update(range(0, len(body) + 1, stride))
    for i, byte in enumerate(body):
        if byte in b"\r\n" or byte >= 0x80:
            chosen.update(range(max(0, i - 1), min(len(body), i + 2) + 1))
    return sorted(chosen)
