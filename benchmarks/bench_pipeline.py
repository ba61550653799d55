"""Overhead of agentrt's pipeline over reading the same model chunks directly.

The model here streams pre-built chunks from memory, so what is measured is agentrt alone: binding,
rendering, events, listeners, the fold, parsing. Prints microseconds per call and per token for
asyncio and trio; compare with the brief's budget (about 200 µs per call, 10 µs per token).

    make bench      (or: .venv/bin/python benchmarks/bench_pipeline.py)
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

import agentrt
from agentrt import Capabilities, FinishReason, LifecycleEvent, ModelRequest, TextDelta, TokenStream, Usage
from agentrt.models import Finish, ModelChunk

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine

S = TypeVar("S")

TOKENS = 10_000
CALLS = 2_000


class MemoryModel:
    """Streams the same chunks for every request, from memory.

    Like the HTTP adapters it declares `Capabilities.handles_deadline`: it never waits, so no
    deadline can pass inside it. `GenericModel` does not, and shows what the pipeline's own
    per-chunk deadline costs.
    """

    name = "memory"
    capabilities = Capabilities(handles_deadline=True)

    def __init__(self, chunks: list[ModelChunk]) -> None:
        self.chunks = chunks

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for chunk in self.chunks:
            yield chunk


class GenericModel(MemoryModel):
    capabilities = Capabilities()


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


def chunks(n: int) -> list[ModelChunk]:
    """Word tokens, a sentence every 20 (where a `chunked` release checks the answer so far)."""
    words = (TextDelta(f" t{i}." if i % 20 == 19 else f" t{i}") for i in range(n))
    return [*words, Usage(10, n), Finish(FinishReason.STOP)]


async def best_of(runs: int, body: Callable[[], Coroutine[Any, Any, None]]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await body()
        samples.append(time.perf_counter() - start)
    return min(samples) if runs < 5 else statistics.median(sorted(samples)[: runs // 2 + 1])


@agentrt.guardrails.partial_text
def passes(request: Any) -> Any:
    """An output guardrail that passes every answer (what holding text back costs, and no more)."""
    return agentrt.guardrails.success()


def guarded_by(release: str, base: type[S]) -> type[S]:
    """`base` (a service class) with `passes` as its output guardrail, released by `release`."""

    @agentrt.guardrails.output_guardrails(passes, release=release)  # type: ignore[arg-type]
    class Guarded(base):  # type: ignore[valid-type,misc]
        pass

    return Guarded  # type: ignore[no-any-return]


async def measure(
    budget: Any = None, kind: type[MemoryModel] = MemoryModel, release: str | None = None
) -> dict[str, float]:
    listener_events: list[LifecycleEvent] = []
    one = kind(chunks(1))
    many = kind(chunks(TOKENS))
    extra: dict[str, Any] = {"budget": budget} if budget is not None else {}
    cls = guarded_by(release, Service) if release is not None else Service
    ask = agentrt.build(cls, model=one, listeners=[listener_events.append], **extra)
    stream = agentrt.build(cls, model=many, listeners=[listener_events.append], **extra)

    async def raw_call() -> None:
        for _ in range(CALLS):
            async for _chunk in one.stream(ModelRequest(messages=())):
                pass

    async def agentrt_call() -> None:
        for _ in range(CALLS):
            await ask.ask("hello")
        listener_events.clear()

    async def raw_tokens() -> None:
        text = []
        async for chunk in many.stream(ModelRequest(messages=())):
            if type(chunk) is TextDelta:
                text.append(chunk.text)

    async def agentrt_tokens() -> None:
        text = []
        async for token in await stream.stream("hello"):
            text.append(token)
        listener_events.clear()

    call = (await best_of(7, agentrt_call) - await best_of(7, raw_call)) / CALLS
    token = (await best_of(7, agentrt_tokens) - await best_of(7, raw_tokens)) / TOKENS
    return {"call_us": call * 1e6, "token_us": token * 1e6}


def main() -> None:
    print("agentrt pipeline overhead (listeners on; model streams from memory)")
    # A budget that never binds but is checked all the way: a deadline, and a token limit that the
    # stream is watched against chunk by chunk.
    budgeted = agentrt.Budget(seconds=3600, total_tokens=10**9) if hasattr(agentrt, "Budget") else None
    rows = (
        ("no budget", None, MemoryModel, None),
        ("with a budget (seconds and total tokens)", budgeted, MemoryModel, None),
        ("with a budget, model without handles_deadline", budgeted, GenericModel, None),
        ("a pass-through output guardrail, release buffer (held back)", None, MemoryModel, "buffer"),
        ("a pass-through output guardrail, release chunked (per sentence)", None, MemoryModel, "chunked"),
        ("a pass-through output guardrail, release optimistic", None, MemoryModel, "optimistic"),
    )
    plain: dict[str, float] = {}
    for label, budget, kind, release in rows:
        if label != "no budget" and budget is None and release is None:
            continue
        print(f"  {label}:")
        for backend in ("asyncio", "trio"):
            result = anyio.run(measure, budget, kind, release, backend=backend)
            if label == "no budget":
                plain[backend] = result["token_us"]
            ratio = ""
            if release is not None and plain.get(backend):
                ratio = f"   ({result['token_us'] / plain[backend]:.2f}x no guardrail per token)"
            print(
                f"    {backend:8} per call: {result['call_us']:7.1f} µs   "
                f"per streamed token: {result['token_us']:5.2f} µs{ratio}"
            )


if __name__ == "__main__":
    main()
