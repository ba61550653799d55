"""Overhead of agentrt's pipeline over reading the same model chunks directly.

The model here streams pre-built chunks from memory, so what is measured is agentrt alone: binding,
rendering, events, listeners, the fold, parsing. Prints microseconds per call and per token for
asyncio and trio; compare with the brief's budget (about 200 µs per call, 10 µs per token).

    make bench      (or: .venv/bin/python benchmarks/bench_pipeline.py)
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import anyio

import agentrt
from agentrt import LifecycleEvent, TokenStream
from agentrt.models import Capabilities, Finish, FinishReason, ModelChunk, ModelRequest, TextDelta, Usage

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine

TOKENS = 10_000
CALLS = 2_000


class MemoryModel:
    """Streams the same chunks for every request, from memory.

    Like the HTTP adapters it declares `handles_deadline`: it never waits, so no deadline can pass
    inside it. `GenericModel` does not, and shows what the pipeline's own per-chunk deadline costs.
    """

    name = "memory"
    capabilities = Capabilities()
    handles_deadline = True

    def __init__(self, chunks: list[ModelChunk]) -> None:
        self.chunks = chunks

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for chunk in self.chunks:
            yield chunk


class GenericModel(MemoryModel):
    handles_deadline = False


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


def chunks(n: int) -> list[ModelChunk]:
    return [*(TextDelta(f"t{i} ") for i in range(n)), Usage(10, n), Finish(FinishReason.STOP)]


async def best_of(runs: int, body: Callable[[], Coroutine[Any, Any, None]]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await body()
        samples.append(time.perf_counter() - start)
    return min(samples) if runs < 5 else statistics.median(sorted(samples)[: runs // 2 + 1])


def passes(request: Any) -> Any:
    """An output guardrail that passes every answer (what holding text back costs, and no more)."""
    return agentrt.guardrails.success()


async def measure(
    budget: Any = None, kind: type[MemoryModel] = MemoryModel, guarded: bool = False
) -> dict[str, float]:
    listener_events: list[LifecycleEvent] = []
    one = kind(chunks(1))
    many = kind(chunks(TOKENS))
    extra: dict[str, Any] = {"budget": budget} if budget is not None else {}
    if guarded:
        extra["output_guardrails"] = [passes]
    ask = agentrt.build(Service, model=one, listeners=[listener_events.append], **extra)
    stream = agentrt.build(Service, model=many, listeners=[listener_events.append], **extra)

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
        ("no budget", None, MemoryModel, False),
        ("with a budget (seconds and total tokens)", budgeted, MemoryModel, False),
        ("with a budget, model without handles_deadline", budgeted, GenericModel, False),
        ("a pass-through output guardrail (text held back: buffer)", None, MemoryModel, True),
    )
    plain: dict[str, float] = {}
    for label, budget, kind, guarded in rows:
        if label != "no budget" and budget is None and not guarded:
            continue
        print(f"  {label}:")
        for backend in ("asyncio", "trio"):
            result = anyio.run(measure, budget, kind, guarded, backend=backend)
            if label == "no budget":
                plain[backend] = result["token_us"]
            ratio = ""
            if guarded and plain.get(backend):
                ratio = f"   ({result['token_us'] / plain[backend]:.2f}x no guardrail per token)"
            print(
                f"    {backend:8} per call: {result['call_us']:7.1f} µs   "
                f"per streamed token: {result['token_us']:5.2f} µs{ratio}"
            )


if __name__ == "__main__":
    main()
