"""What the embedded retrievers cost: BM25 over 10k chunks, exact vector search over 10k x 384.

- BM25 (`BM25Retriever`, scored by bm25s): the index build over `CHUNKS` chunks of about 60 words
  (Zipf-distributed over a vocabulary of `VOCABULARY` words), on the calling thread and through
  `add` in a worker thread; then the latency of `QUERIES` queries of 2 to 5 words, awaited one after
  another, on the event loop (`in_thread=False`) and in a worker thread (`in_thread=True`).
- Vectors: `CHUNKS` random unit vectors of `DIMENSION` floats. `InMemoryVectorIndex`: time to add
  them, search latency on the loop and in a thread. `SQLiteVectorIndex` (a temporary file): time to
  add them (one transaction), to open and load the file again, and search latency (searches read
  the in-memory matrix, so they cost what the in-memory index's do).

Latencies are per awaited call, p50 and p99 over the queries, in milliseconds. The "loop stall" is
how late a heartbeat task on the same loop, asking for a turn every `TICK` seconds, got it at worst
while the queries ran: what the other tasks of an application feel.

numpy's matrix product uses OpenBLAS's threads: on a busy machine they contend with everything else
(run with OPENBLAS_NUM_THREADS=1 to compare).

It prints, it never asserts.

    .venv/bin/python -m benchmarks.bench_rag            (asyncio)
    .venv/bin/python -m benchmarks.bench_rag --backend trio
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from agentrt.rag._bm25 import BM25Retriever
from agentrt.rag._sqlite_vectors import SQLiteVectorIndex
from agentrt.rag._types import Content, Query
from agentrt.rag._vectors import InMemoryVectorIndex

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

CHUNKS = 10_000
WORDS_PER_CHUNK = 60
VOCABULARY = 5_000
DIMENSION = 384
QUERIES = 500
TICK = 0.0005


def corpus(rng: random.Random) -> tuple[list[Content], list[str]]:
    words = [f"w{i}" for i in range(VOCABULARY)]
    weights = [1 / (rank + 1) for rank in range(VOCABULARY)]  # Zipf: a few frequent words, a long tail
    contents = [
        Content(" ".join(rng.choices(words, weights, k=WORDS_PER_CHUNK)), id=str(i)) for i in range(CHUNKS)
    ]
    questions = [" ".join(rng.choices(words, weights, k=rng.randint(2, 5))) for _ in range(QUERIES)]
    return contents, questions


async def latencies(call: Callable[[int], Awaitable[Any]]) -> tuple[float, float, float]:
    """p50 and p99 seconds per awaited call over `QUERIES` calls, and the longest loop stall a
    heartbeat task saw meanwhile."""
    for i in range(10):  # warm up: worker threads, caches
        await call(i)
    samples: list[float] = []
    stall = 0.0
    done = False

    async def heartbeat() -> None:
        # Asks for a turn every TICK seconds; a late turn is a stall. (A busy loop of sleep(0)
        # would hold the GIL and slow the worker threads it watches.)
        nonlocal stall
        while not done:
            start = time.perf_counter()
            await anyio.sleep(TICK)
            stall = max(stall, time.perf_counter() - start - TICK)

    async with anyio.create_task_group() as group:
        group.start_soon(heartbeat)
        for i in range(QUERIES):
            start = time.perf_counter()
            await call(i)
            samples.append(time.perf_counter() - start)
        done = True
    quantiles = statistics.quantiles(samples, n=100)
    return statistics.median(samples), quantiles[98], stall


def row(label: str, p50: float, p99: float, stall: float) -> None:
    print(f"    {label:34} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {stall * 1e3:11.3f}")


def header() -> None:
    print(f"    {'':34} {'p50 ms':>8} {'p99 ms':>8} {'loop stall':>11}")


async def bench_bm25(contents: list[Content], questions: list[str]) -> None:
    start = time.perf_counter()
    on_loop = BM25Retriever(contents, k=5, in_thread=False)
    built = time.perf_counter() - start
    threaded = BM25Retriever(k=5, in_thread=True)
    start = time.perf_counter()
    await threaded.add(contents)
    added = time.perf_counter() - start
    print(f"  BM25 (bm25s), {len(contents):,} chunks of {WORDS_PER_CHUNK} words:")
    print(
        f"    index build: {built * 1e3:.0f} ms on the calling thread,"
        f" {added * 1e3:.0f} ms by add() in a thread"
    )
    header()
    for label, retriever in (("query on the loop", on_loop), ("query in a thread", threaded)):
        row(label, *await latencies(lambda i, r=retriever: r.retrieve(Query(questions[i]))))  # type: ignore[misc]


async def bench_vectors(contents: list[Content], directory: Path) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(contents), DIMENSION), dtype=np.float32)
    queries = rng.standard_normal((QUERIES + 10, DIMENSION), dtype=np.float32)
    print(f"  vectors, {len(contents):,} x {DIMENSION} float32, exact cosine, k=5:")

    await InMemoryVectorIndex().add(contents[:10], vectors[:10])  # type: ignore[arg-type]  # warm up numpy
    memory = InMemoryVectorIndex(in_thread=False)
    start = time.perf_counter()
    await memory.add(contents, vectors)  # type: ignore[arg-type]
    print(f"    in-memory add: {(time.perf_counter() - start) * 1e3:.0f} ms")

    path = directory / "vectors.db"
    stored = SQLiteVectorIndex(path, in_thread=False)
    start = time.perf_counter()
    await stored.add(contents, vectors)  # type: ignore[arg-type]
    written = time.perf_counter() - start
    await stored.aclose()
    start = time.perf_counter()
    assert await stored.count() == len(contents)
    loaded = time.perf_counter() - start
    size = path.stat().st_size  # the WAL was checkpointed into the file on close
    print(
        f"    SQLite add: {written * 1e3:.0f} ms (one transaction), open and load: {loaded * 1e3:.0f} ms,"
        f" file {size / 2**20:.1f} MiB"
    )
    threaded = InMemoryVectorIndex(in_thread=True)
    await threaded.add(contents, vectors)  # type: ignore[arg-type]
    header()
    for label, index in (
        ("in-memory search on the loop", memory),
        ("in-memory search in a thread", threaded),
        ("SQLite search on the loop", stored),
    ):
        row(label, *await latencies(lambda i, x=index: x.search(queries[i], k=5)))  # type: ignore[misc]
    await stored.aclose()


async def measure(directory: Path) -> None:
    contents, questions = corpus(random.Random(0))
    await bench_bm25(contents, questions)
    await bench_vectors(contents, directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("asyncio", "trio", "both"), default="asyncio")
    backends = ("asyncio", "trio") if (backend := parser.parse_args().backend) == "both" else (backend,)
    print("agentrt retrieval cost (BM25 by bm25s, vector search by numpy)")
    for name in backends:
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-rag-") as tmp:
            print(f" {name}:")
            anyio.run(measure, Path(tmp), backend=name)


if __name__ == "__main__":
    main()
