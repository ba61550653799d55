"""What moderation and retrieval add to a call.

1. Overhead, with models that answer from memory at once: per call and per streamed token, with
   `@moderate` (a moderation model that answers at once) and with retrieval (one and two retrievers
   that answer at once), against the same service without.
2. Added latency when the moderation model is faster than the chat model (the issue's target: none
   beyond one task switch): time to the first token of a stream whose model answers its first chunk
   after 20 ms, with a moderation model that answers after 5 ms, against the same stream
   unmoderated. Both wait as for the network (woken by I/O, not by a timer). Real time, median of
   many runs, sampled alternately.

    make bench      (or: .venv/bin/python benchmarks/bench_moderation.py)
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

import agentrt
from agentrt import Capabilities, FinishReason, ModelRequest, TextDelta, TokenStream, Usage
from agentrt.models import Finish, ModelChunk
from agentrt.moderation import Moderation, moderate
from agentrt.rag import Content, Query, Retrieval

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine, Sequence

TOKENS = 10_000
CALLS = 2_000
LATENCY_RUNS = 200


async def arrives_after(seconds: float) -> None:
    """Wait as for a network answer: woken by I/O (a worker thread's completion), not by a timer of
    the event loop's. Two timers on one loop wake late (asyncio rounds epoll's timeout up to a whole
    millisecond), which a real model's socket does not."""
    await anyio.to_thread.run_sync(time.sleep, seconds)


class MemoryModel:
    name = "memory"
    capabilities = Capabilities(handles_deadline=True)

    def __init__(self, chunks: list[ModelChunk], first_after: float = 0.0) -> None:
        self.chunks = chunks
        self.first_after = first_after

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if self.first_after:
            await arrives_after(self.first_after)
        for chunk in self.chunks:
            yield chunk


class Judge:
    name = "judge"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        if self.delay:
            await arrives_after(self.delay)
        return [Moderation(False) for _ in texts]


FOUND = [Content("Dogs travel at half fare.", id="pets#0")]


async def instant(query: Query) -> list[Content]:
    return FOUND


async def instant_too(query: Query) -> list[Content]:
    return FOUND


class Plain:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


@moderate
class Moderated(Plain):
    pass


def chunks(n: int) -> list[ModelChunk]:
    return [*(TextDelta(f" t{i}") for i in range(n)), Usage(10, n), Finish(FinishReason.STOP)]


async def best_of(runs: int, body: Callable[[], Coroutine[Any, Any, None]]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await body()
        samples.append(time.perf_counter() - start)
    return statistics.median(sorted(samples)[: runs // 2 + 1])


def service(cls: type[Plain], model: MemoryModel, **options: Any) -> Plain:
    return agentrt.build(cls, model=model, **options)


async def overhead(cls: type[Plain], **options: Any) -> dict[str, float]:
    one, many = MemoryModel(chunks(1)), MemoryModel(chunks(TOKENS))
    ask, stream = service(cls, one, **options), service(cls, many, **options)
    base_ask, base_stream = service(Plain, one), service(Plain, many)

    async def calls(target: Plain) -> None:
        for _ in range(CALLS):
            await target.ask("hello")

    async def tokens(target: Plain) -> None:
        async for _token in await target.stream("hello"):
            pass

    call = (await best_of(7, lambda: calls(ask)) - await best_of(7, lambda: calls(base_ask))) / CALLS
    token = (
        await best_of(7, lambda: tokens(stream)) - await best_of(7, lambda: tokens(base_stream))
    ) / TOKENS
    return {"call_us": call * 1e6, "token_us": token * 1e6}


async def first_token_ms() -> tuple[float, float]:
    """Median time to the first token, unmoderated and moderated, sampled alternately (so that drift
    in the machine's load hits both alike)."""
    model = MemoryModel(chunks(5), first_after=0.020)
    plain = service(Plain, model)
    moderated = service(Moderated, model, moderation_model=Judge(0.005))
    samples: dict[int, list[float]] = {0: [], 1: []}
    for run in range(2 * LATENCY_RUNS):
        target = (plain, moderated)[run % 2]
        start = time.perf_counter()
        stream = await target.stream("hello")
        async for _token in stream:
            samples[run % 2].append(time.perf_counter() - start)
            break
        await stream.aclose()
    return statistics.median(samples[0]) * 1e3, statistics.median(samples[1]) * 1e3


def main() -> None:
    judge = Judge()
    rows: list[tuple[str, type[Plain], dict[str, Any]]] = [
        ("@moderate (moderation answers at once)", Moderated, {"moderation_model": judge}),
        ("retrieval, one retriever", Plain, {"retrieval": Retrieval(retrievers=[instant])}),
        (
            "retrieval, two retrievers (a task group)",
            Plain,
            {"retrieval": Retrieval(retrievers=[instant, instant_too])},
        ),
    ]
    print("what moderation and retrieval add (models answer from memory; vs. the same service without)")
    for label, cls, options in rows:
        print(f"  {label}:")
        for backend in ("asyncio", "trio"):
            result = anyio.run(lambda cls=cls, options=options: overhead(cls, **options), backend=backend)
            print(
                f"    {backend:8} per call: {result['call_us']:+7.1f} µs   "
                f"per streamed token: {result['token_us']:+5.2f} µs"
            )
    print("time to first token, chat model first chunk after 20 ms, moderation takes 5 ms (median)")
    for backend in ("asyncio", "trio"):
        plain, moderated = anyio.run(first_token_ms, backend=backend)
        print(
            f"    {backend:8} unmoderated {plain:6.2f} ms   moderated {moderated:6.2f} ms   "
            f"added {(moderated - plain) * 1e3:+7.1f} µs"
        )


if __name__ == "__main__":
    main()
