"""What `agentrt.otel`'s listener costs per call and per streamed token.

The model is `agentrt.testing.FunctionModel`, answering from memory, so what is measured is agentrt and
the listener. Each row is compared with the same service without the listener:

- API only: the `otel` extra installed, no SDK configured (OpenTelemetry's no-op providers);
- SDK: an SDK `TracerProvider` whose spans are recorded and then dropped (no exporter: the export is
  the application's cost, whichever instrumentation made the spans), and an SDK `MeterProvider`;
- SDK with `capture_content=True`: the same, with messages serialized into the spans.

The listener never sees a text delta, so per token it should cost nothing.

    make bench      (or: .venv/bin/python benchmarks/bench_otel.py)
"""

from __future__ import annotations

import time
from typing import Any

import anyio

import agentrt
from agentrt import FinishReason, ModelRequest, TextDelta, TokenStream, Usage, tool
from agentrt.models import Finish, ModelChunk
from agentrt.testing import CallTool, FunctionModel, Script

try:
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import NoOpTracerProvider

    from agentrt import otel
except ImportError:  # pragma: no cover
    raise SystemExit(
        "bench_otel needs opentelemetry-api and opentelemetry-sdk (the dev dependencies)"
    ) from None

TOKENS = 10_000
CALLS = 1_000


class Service:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


@tool("Look up an order's status.")
async def order_status(order_id: str) -> str:
    return "shipped"


def answer(n: int) -> list[ModelChunk]:
    return [*(TextDelta(f" t{i}") for i in range(n)), Usage(10, n), Finish(FinishReason.STOP)]


ONE = answer(1)
MANY = answer(TOKENS)
CALL = [CallTool("order_status", {"order_id": "SO-1"}, id="c1"), Usage(10, 5)]


def plain(request: ModelRequest) -> Script:
    return ONE


def with_tool(request: ModelRequest) -> Script:
    """A tool round, then the answer: two model requests and one tool call per invocation."""
    return ONE if request.messages[-1].role == "tool" else CALL


def many(request: ModelRequest) -> Script:
    return MANY


def listeners(setup: str) -> list[Any]:
    if setup == "none":
        return []
    if setup == "api":
        return [otel.instrument(tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider())]
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SpanProcessor())  # ends spans, keeps none
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    listener = otel.instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=setup == "content",
        model="memory",
        provider="openai",
    )
    return [listener]


SETUPS = (
    ("no listener", "none"),
    ("otel, API only (no SDK configured)", "api"),
    ("otel, SDK tracer and meter (spans dropped, not exported)", "sdk"),
    ("otel, SDK, capture_content=True", "content"),
)
RUNS = 9


class Bench:
    """One setup's services; each body is one timed sample."""

    def __init__(self, setup: str) -> None:
        attached = listeners(setup)
        self.models = {
            name: FunctionModel(fn) for name, fn in (("plain", plain), ("tool", with_tool), ("many", many))
        }
        self.services = {
            name: agentrt.build(Service, model=model, listeners=attached, tools=[order_status])
            for name, model in self.models.items()
        }

    def forget(self) -> None:  # the test models record every request; keep memory flat between runs
        for model in self.models.values():
            model.requests.clear()
            model.streams.clear()

    async def calls(self, name: str) -> float:
        ask = self.services[name].ask
        start = time.perf_counter()
        for _ in range(CALLS):
            await ask("hello")
        elapsed = time.perf_counter() - start
        self.forget()
        return elapsed / CALLS

    async def tokens(self) -> float:
        text = []
        start = time.perf_counter()
        async for token in await self.services["many"].stream("hello"):
            text.append(token)
        elapsed = time.perf_counter() - start
        self.forget()
        return elapsed / TOKENS


async def measure() -> dict[str, dict[str, float]]:
    """The setups interleaved run by run (load from elsewhere hits them alike); the best run of each."""
    benches = {setup: Bench(setup) for _, setup in SETUPS}
    samples: dict[str, dict[str, list[float]]] = {
        setup: {"call_us": [], "tool_call_us": [], "token_us": []} for setup in benches
    }
    for _ in range(RUNS):
        for setup, bench in benches.items():
            samples[setup]["call_us"].append(await bench.calls("plain"))
            samples[setup]["tool_call_us"].append(await bench.calls("tool"))
            samples[setup]["token_us"].append(await bench.tokens())
    return {
        setup: {key: min(values) * 1e6 for key, values in kinds.items()} for setup, kinds in samples.items()
    }


def main() -> None:
    print("agentrt.otel listener cost (FunctionModel answering from memory; µs, and the difference")
    print("from the same service without a listener)")
    for backend in ("asyncio", "trio"):
        print(f"  {backend}:")
        results = anyio.run(measure, backend=backend)
        base = results["none"]
        for label, setup in SETUPS:
            result = results[setup]
            delta = {key: result[key] - base[key] for key in result}
            print(
                f"    {label}:\n"
                f"      per call: {result['call_us']:6.1f} ({delta['call_us']:+6.1f})   "
                f"with a tool round: {result['tool_call_us']:6.1f} ({delta['tool_call_us']:+6.1f})   "
                f"per streamed token: {result['token_us']:5.2f} ({delta['token_us']:+5.2f})"
            )


if __name__ == "__main__":
    main()
