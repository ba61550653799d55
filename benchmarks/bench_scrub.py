"""How long scrubbing an error body for API keys takes: a 16 KiB JSON-like body full of the characters
the keys' escaped forms start with (the worst case for the scrubber's searches).

    .venv/bin/python benchmarks/bench_scrub.py
"""

from __future__ import annotations

import statistics
import time

from agentrt.models._failures import ErrorContext

ENDPOINT = "http://llm.test/v1/chat/completions"
KEYS = ("gw-AbCdEf0123/GhIjKl4567+MnOp==", "sk-proj-Zq7SECRETx9Kw4mNbV2-4f9a2b7cD1eF")


def main() -> None:
    context = ErrorContext(ENDPOINT, KEYS)
    chunk = '{"message":"a\\/b \\u00e9 100%25 sk-proj gw-Ab","type":"invalid_request_error"}, '
    body = (chunk * (16 * 1024 // len(chunk) + 1))[: 16 * 1024]
    assert context.scrub(body) == body
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        context.scrub(body)
        timings.append(time.perf_counter() - started)
    print(f"scrubbing a 16 KiB body with two keys: {statistics.median(timings) * 1e3:.3f} ms (median of 200)")


if __name__ == "__main__":
    main()
