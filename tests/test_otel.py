"""agentrt.otel: lifecycle events as spans and metrics by OpenTelemetry's GenAI conventions.

Spans go to the SDK's in-memory exporter, metrics to its in-memory reader; a span processor records
spans started and not ended, so that a leaked span fails the test that leaked it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import httpx
import orjson
import pytest
from anthropic_like import AnthropicLike, anthropic, block, delta, end, events, start, stop, text_stream
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import agentrt
from agentrt import (
    CancelledEvent,
    Capabilities,
    ModelSettings,
    ResponseReceived,
    Started,
    TokenStream,
    ToolSettings,
    Usage,
    tool,
)
from agentrt.guardrails import output_guardrails, retry, success
from agentrt.models import OpenAIChatModel, ResponseMeta
from agentrt.otel import OTelListener, instrument
from agentrt.rag import Content, Query, Retrieval
from agentrt.testing import CallTool, Hang, Raise, ScriptedModel

if TYPE_CHECKING:
    from collections.abc import Iterator

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import Span as SdkSpan

PROMPT = "PROMPT-7f3a where is my parcel"
ANSWER = ["ANSWER-91c2 ", "Basel is warmer."]
ARGUMENT = "ARG-5d0e"
RESULT = "RESULT-b6a1"
MEMORY = "MEMORY-0c4f user@example.com"
SECRETS = (PROMPT, "ANSWER-91c2", ARGUMENT, RESULT, MEMORY, "BOOM-e8d2")


class OpenSpans(SpanProcessor):
    """Spans started and not (yet) ended."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.pop(span.context.span_id, None)


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    open_spans: OpenSpans

    def listener(self, **options: Any) -> OTelListener:
        return instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options)

    def spans(self) -> list[ReadableSpan]:
        return sorted(self.exporter.get_finished_spans(), key=lambda s: s.start_time or 0)

    def points(self, metric: str) -> list[HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        found: list[HistogramDataPoint] = []
        if data is None:  # nothing recorded at all
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend(p for p in m.data.data_points if isinstance(p, HistogramDataPoint))
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    open_spans = OpenSpans()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(open_spans)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(tracer_provider, meter_provider, exporter, reader, open_spans)
    tracer_provider.shutdown()
    meter_provider.shutdown()


class Weather:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...

    async def chat(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> str: ...


@tool("Current temperature in a city, in °C.")
async def temperature(city: str, note: str = "") -> str:
    await anyio.lowlevel.checkpoint()  # lets concurrent invocations interleave
    return {"Bern": f"21.5 {RESULT}", "Basel": "23.0"}[city]


@tool("Convert °C to °F.")
def to_fahrenheit(celsius: float) -> float:
    return celsius * 9 / 5 + 32


def two_rounds() -> ScriptedModel:
    """Two tool rounds (two calls in parallel, then one), then the answer; usage on each response."""
    return ScriptedModel(
        [
            ResponseMeta(id="resp-1", model="scripted-2026"),
            CallTool("temperature", {"city": "Bern", "note": ARGUMENT}, id="c1"),
            CallTool("temperature", {"city": "Basel"}, id="c2"),
            Usage(20, 10),
        ],
        [CallTool("to_fahrenheit", {"celsius": 23.0}, id="c3"), Usage(40, 5)],
        [*ANSWER, Usage(60, 8)],
    )


def build(model: ScriptedModel, listener: OTelListener, **options: Any) -> Weather:
    return agentrt.build(
        Weather, model=model, tools=[temperature, to_fahrenheit], listeners=[listener], **options
    )


def tree(spans: list[ReadableSpan]) -> list[tuple[str, str | None, SpanKind]]:
    """Each span as (name, parent's name, kind), in start order."""
    names = {s.context.span_id: s.name for s in spans if s.context is not None}
    return [(s.name, names.get(s.parent.span_id) if s.parent else None, s.kind) for s in spans]


def values(spans: list[ReadableSpan]) -> Iterator[str]:
    """Every text a backend would see: names, attribute values, event names and values, statuses."""
    for span in spans:
        yield span.name
        yield str(span.status.description)
        yield from (str(v) for v in (span.attributes or {}).values())
        for event in span.events:
            yield event.name
            yield from (str(v) for v in (event.attributes or {}).values())


async def test_a_stream_with_two_tool_rounds_is_one_tree(telemetry: Telemetry) -> None:
    listener = telemetry.listener(model="gpt-test", provider="openai")
    svc = build(two_rounds(), listener, settings=ModelSettings(temperature=0.2, max_tokens=300))

    stream = await svc.stream(PROMPT)
    tokens = [t async for t in stream]

    assert "".join(tokens) == "".join(ANSWER)
    hashes = [e.arguments_hash for e in (await stream.result()).tool_executions]
    spans = telemetry.spans()
    invoke = "invoke_agent Weather.stream"
    assert tree(spans) == [
        (invoke, None, SpanKind.INTERNAL),
        ("chat gpt-test", invoke, SpanKind.CLIENT),
        ("execute_tool temperature", invoke, SpanKind.INTERNAL),
        ("execute_tool temperature", invoke, SpanKind.INTERNAL),
        ("chat gpt-test", invoke, SpanKind.CLIENT),
        ("execute_tool to_fahrenheit", invoke, SpanKind.INTERNAL),
        ("chat gpt-test", invoke, SpanKind.CLIENT),
    ]
    assert len({s.context.trace_id for s in spans if s.context is not None}) == 1
    root, chat1, tool1, tool2, chat2, tool3, chat3 = spans
    assert root.attributes is not None
    assert {k: v for k, v in root.attributes.items() if k != "agentrt.invocation.id"} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "openai",
        "gen_ai.agent.name": "Weather.stream",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.response.model": "scripted",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 23,
        "agentrt.attempts": 1,
    }
    assert dict(chat1.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.max_tokens": 300,
        "agentrt.round": 1,
        "gen_ai.response.id": "resp-1",
        "gen_ai.response.model": "scripted-2026",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": 20,
        "gen_ai.usage.output_tokens": 10,
    }
    assert [(s.attributes or {}).get("agentrt.round") for s in (chat2, chat3)] == [2, 3]
    assert (chat3.attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    assert dict(tool1.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "temperature",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "agentrt.round": 1,
        "agentrt.tool.arguments_hash": hashes[0],  # the arguments only with capture_content
        "agentrt.tool.outcome": "success",
    }
    assert [(s.attributes or {})["gen_ai.tool.call.id"] for s in (tool1, tool2, tool3)] == ["c1", "c2", "c3"]
    assert [(s.attributes or {})["agentrt.tool.arguments_hash"] for s in (tool1, tool2, tool3)] == hashes
    assert len(set(hashes)) == 3
    # Each model request ends before its tools start; each round's tools end before the next request.
    for before, after in ((chat1, tool1), (tool2, chat2), (chat2, tool3), (tool3, chat3)):
        assert before.end_time is not None and after.start_time is not None
        assert before.end_time <= after.start_time
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)
    assert telemetry.open_spans.open == {}
    assert listener.open_invocations == 0

    # The first response named its model and the others did not: two series of each token type.
    series = {
        tuple(sorted((p.attributes or {}).items())): (p.count, p.sum)
        for p in telemetry.points("gen_ai.client.token.usage")
    }
    common = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
    }
    expected = {
        ("input", None): (2, 100),
        ("output", None): (2, 13),
        ("input", "scripted-2026"): (1, 20),
        ("output", "scripted-2026"): (1, 10),
    }
    assert series == {
        tuple(
            sorted(
                {**common, "gen_ai.token.type": kind, **({"gen_ai.response.model": m} if m else {})}.items()
            )
        ): v
        for (kind, m), v in expected.items()
    }
    durations = telemetry.points("gen_ai.client.operation.duration")
    assert sum(p.count for p in durations) == 3
    assert all("error.type" not in (p.attributes or {}) for p in durations)


async def test_children_keep_their_parent_whichever_task_reads_the_stream(telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("test")
    svc = build(two_rounds(), telemetry.listener())

    with tracer.start_as_current_span("request"):
        stream = await svc.stream(PROMPT)

    async def read() -> None:
        # another task, under another span: nothing of the invocation may be parented to it
        with tracer.start_as_current_span("reader"):
            async for _ in stream:
                pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)

    parents = {name: parent for name, parent, _ in tree(telemetry.spans())}
    assert parents == {
        "request": None,
        "reader": None,
        "invoke_agent Weather.stream": "request",
        "chat scripted": "invoke_agent Weather.stream",
        "execute_tool temperature": "invoke_agent Weather.stream",
        "execute_tool to_fahrenheit": "invoke_agent Weather.stream",
    }
    assert telemetry.open_spans.open == {}


async def test_concurrent_invocations_do_not_mix(telemetry: Telemetry) -> None:
    listener = telemetry.listener()
    script = ([CallTool("temperature", {"city": "Basel"})], "done")
    first = build(ScriptedModel(*script), listener)
    second = build(ScriptedModel(*script), listener)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first.ask, "one")
        tg.start_soon(second.ask, "two")

    spans = telemetry.spans()
    by_trace: dict[int, list[str]] = {}
    for span in spans:
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span.name)
    assert (
        sorted(sorted(names) for names in by_trace.values())
        == [["chat scripted", "chat scripted", "execute_tool temperature", "invoke_agent Weather.ask"]] * 2
    )
    assert listener.open_invocations == 0


async def test_a_cancelled_stream_ends_every_span_without_an_error(telemetry: Telemetry) -> None:
    listener = telemetry.listener(model="gpt-test")
    svc = build(ScriptedModel(["Hel", "lo", Hang()]), listener)
    first = anyio.Event()

    async def read() -> None:
        async for _ in await svc.stream(PROMPT):
            first.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await first.wait()
        tg.cancel_scope.cancel()

    assert telemetry.open_spans.open == {}
    assert listener.open_invocations == 0
    invoke, chat = telemetry.spans()
    assert (invoke.name, chat.name) == ("invoke_agent Weather.stream", "chat gpt-test")
    for span in (invoke, chat):
        assert span.status.status_code is StatusCode.UNSET
        assert (span.attributes or {})["agentrt.cancelled"] is True
        assert "error.type" not in (span.attributes or {})
    # a request cut short by its caller says nothing of the model's latency
    assert telemetry.points("gen_ai.client.operation.duration") == []


async def test_a_cancelled_tool_round_ends_the_tool_spans(telemetry: Telemetry) -> None:
    started = anyio.Event()

    @tool("Waits forever.")
    async def wait() -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    listener = telemetry.listener()
    svc = agentrt.build(Weather, model=ScriptedModel([CallTool("wait")]), tools=[wait], listeners=[listener])
    async with anyio.create_task_group() as tg:
        tg.start_soon(svc.ask, PROMPT)
        await started.wait()
        tg.cancel_scope.cancel()

    assert telemetry.open_spans.open == {}
    assert listener.open_invocations == 0
    invoke, chat, wait_span = telemetry.spans()
    assert [s.name for s in (invoke, chat, wait_span)] == [
        "invoke_agent Weather.ask",
        "chat scripted",
        "execute_tool wait",
    ]
    assert (invoke.attributes or {})["agentrt.cancelled"] is True
    assert (wait_span.attributes or {})["agentrt.cancelled"] is True
    assert "agentrt.cancelled" not in (chat.attributes or {})  # its response had arrived
    assert wait_span.status.status_code is StatusCode.UNSET


async def test_a_model_error_fails_the_request_and_the_invocation(telemetry: Telemetry) -> None:
    listener = telemetry.listener(model="gpt-test")
    error = RuntimeError(f"BOOM-e8d2 the server echoed {PROMPT}")
    svc = build(ScriptedModel(["partial ", Raise(error)]), listener)

    with pytest.raises(RuntimeError, match="BOOM"):
        await svc.ask(PROMPT)

    assert telemetry.open_spans.open == {}
    assert listener.open_invocations == 0
    invoke, chat = telemetry.spans()
    for span in (invoke, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["error.type"] == "RuntimeError"
        [exception] = span.events
        assert exception.name == "exception"
        assert dict(exception.attributes or {}) == {"exception.type": "RuntimeError"}
    assert not any(secret in value for value in values([invoke, chat]) for secret in SECRETS)
    [duration] = telemetry.points("gen_ai.client.operation.duration")
    assert (duration.attributes or {})["error.type"] == "RuntimeError"
    assert telemetry.points("gen_ai.client.token.usage") == []  # no usage arrived


async def test_an_error_with_capture_content_records_the_exception(telemetry: Telemetry) -> None:
    svc = build(ScriptedModel([Raise(RuntimeError("BOOM-e8d2"))]), telemetry.listener(capture_content=True))

    with pytest.raises(RuntimeError):
        await svc.ask(PROMPT)

    invoke = telemetry.spans()[0]
    assert invoke.status.description == "BOOM-e8d2"
    assert (invoke.events[0].attributes or {})["exception.message"] == "BOOM-e8d2"


async def test_no_content_is_recorded_by_default(telemetry: Telemetry) -> None:
    svc = build(two_rounds(), telemetry.listener(), memory=agentrt.memory.window(max_messages=20))

    assert await svc.chat(MEMORY, PROMPT) == "".join(ANSWER)

    spans = telemetry.spans()
    assert len(spans) == 7
    leaked = [(secret, value) for value in values(spans) for secret in SECRETS if secret in value]
    assert leaked == []


async def test_capture_content_records_messages_by_the_conventions(telemetry: Telemetry) -> None:
    svc = build(
        two_rounds(), telemetry.listener(capture_content=True), memory=agentrt.memory.window(max_messages=20)
    )

    await svc.chat(MEMORY, PROMPT)

    root, chat1, tool1, _, _, _, chat3 = telemetry.spans()
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.conversation.id"] == MEMORY
    assert orjson_loads(attributes["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "".join(ANSWER)}],
            "finish_reason": "stop",
        }
    ]
    inputs = orjson_loads((chat1.attributes or {})["gen_ai.input.messages"])
    assert inputs[-1] == {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
    outputs = orjson_loads((chat1.attributes or {})["gen_ai.output.messages"])
    assert outputs == [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "temperature",
                 "arguments": {"city": "Bern", "note": ARGUMENT}},
                {"type": "tool_call", "id": "c2", "name": "temperature", "arguments": {"city": "Basel"}},
            ],
            "finish_reason": "tool_call",
        }
    ]  # fmt: skip
    last_inputs = orjson_loads((chat3.attributes or {})["gen_ai.input.messages"])
    assert {"type": "tool_call_response", "id": "c1", "response": f"21.5 {RESULT}"} in [
        part for message in last_inputs for part in message["parts"]
    ]
    assert ARGUMENT in (tool1.attributes or {})["gen_ai.tool.call.arguments"]
    assert (tool1.attributes or {})["gen_ai.tool.call.result"] == f"21.5 {RESULT}"


def orjson_loads(value: Any) -> Any:
    import orjson

    assert isinstance(value, str)
    return orjson.loads(value)


def polite(request: Any) -> Any:
    return retry(f"rude: {request.text}") if "rude" in request.text else success()


async def test_guardrail_verdicts_are_events_and_a_retry_is_a_second_request(telemetry: Telemetry) -> None:
    @output_guardrails(polite)
    class Guarded(Weather):  # a subclass: the decorator marks the class it is given
        pass

    model = ScriptedModel("rude ANSWER-91c2", "fine")
    svc = agentrt.build(Guarded, model=model, listeners=[telemetry.listener()])

    assert await svc.ask(PROMPT) == "fine"

    invoke, chat1, chat2 = telemetry.spans()
    assert [chat1.name, chat2.name] == ["chat scripted", "chat scripted"]
    assert [e.name for e in invoke.events] == ["gen_ai.guardrail.result"] * 2
    first, second = (dict(e.attributes or {}) for e in invoke.events)
    assert first["gen_ai.guardrail.component.name"] == second["gen_ai.guardrail.component.name"] == "polite"
    assert (first["gen_ai.guardrail.source"], first["gen_ai.guardrail.result.value"]) == ("output", "retry")
    assert (second["gen_ai.guardrail.result.value"], second["agentrt.guardrail.attempt"]) == ("success", 2)
    assert (invoke.attributes or {})["agentrt.attempts"] == 2
    assert not any(secret in value for value in values([invoke, chat1, chat2]) for secret in SECRETS)
    # estimated usage (the script sent none) is not reported as the provider's
    assert "gen_ai.usage.input_tokens" not in (chat1.attributes or {})
    assert (chat1.attributes or {})["agentrt.usage.estimated"] is True
    assert telemetry.points("gen_ai.client.token.usage") == []


@dataclass(frozen=True)
class MemoryLoaded:
    """An event agentrt.otel does not know (none such exists yet)."""

    invocation_id: str
    messages: tuple[str, ...]


async def faq(query: Query) -> list[Content]:
    return [Content(f"doc {RESULT}", {"source": "faq.md"}, 0.9, "faq-1")]


async def broken(query: Query) -> list[Content]:
    raise OSError(f"index down for {query.text}")


@pytest.mark.parametrize("capture_content", [False, True])
async def test_retrieval_is_an_event_of_the_invocation(telemetry: Telemetry, capture_content: bool) -> None:
    retrieval = Retrieval(retrievers=[faq, broken], on_error="skip")
    svc = agentrt.build(
        Weather,
        model=ScriptedModel("ok"),
        retrieval=retrieval,
        listeners=[telemetry.listener(capture_content=capture_content)],
    )

    await svc.ask(PROMPT)

    invoke, chat = telemetry.spans()
    [event] = invoke.events
    assert event.name == "retrieval"
    attributes = dict(event.attributes or {})
    assert attributes.pop("gen_ai.operation.name") == "retrieval"
    assert attributes.pop("agentrt.retrieval.count") == 1
    assert attributes.pop("agentrt.retrieval.skipped") == ("broken",)
    if capture_content:
        assert attributes.pop("gen_ai.retrieval.query.text") == PROMPT
        [document] = orjson_loads(attributes.pop("gen_ai.retrieval.documents"))
        assert isinstance(document.pop("score"), float)  # as fused (reciprocal rank), not the retriever's
        assert document == {"id": "faq-1", "content": f"doc {RESULT}", "metadata": {"source": "faq.md"}}
    else:
        assert not any(secret in value for value in values([invoke, chat]) for secret in SECRETS)
    assert attributes == {}


async def test_events_it_does_not_know_are_named_without_their_fields(telemetry: Telemetry) -> None:
    listener = telemetry.listener(capture_content=True)
    listener(Started("inv-1", "Weather.ask"))
    listener(MemoryLoaded("inv-1", (PROMPT,)))  # type: ignore[arg-type]
    listener(CancelledEvent("inv-1"))

    [invoke] = telemetry.spans()
    [event] = invoke.events
    assert (event.name, dict(event.attributes or {})) == ("agentrt.memory_loaded", {})


async def test_the_listener_never_raises(telemetry: Telemetry, caplog: pytest.LogCaptureFixture) -> None:
    listener = telemetry.listener()
    listener(Started("inv-1", "Weather.ask"))
    broken = ResponseReceived("inv-1", None, 1)  # type: ignore[arg-type]
    listener(issued("inv-1"))

    with caplog.at_level(logging.ERROR, logger="agentrt.otel"):
        listener(broken)

    assert "could not record ResponseReceived" in caplog.text
    listener(CancelledEvent("inv-1"))
    assert telemetry.open_spans.open == {}
    listener(CancelledEvent("unknown"))  # events of invocations it never saw are ignored


def issued(invocation_id: str) -> agentrt.RequestIssued:
    return agentrt.RequestIssued(invocation_id, agentrt.ModelRequest(messages=()), 1)


async def test_agentrt_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, agentrt, agentrt.testing; print(sorted(m for m in sys.modules if 'opentelemetry' in m))"
    )
    result = await anyio.run_process([sys.executable, "-c", code])
    assert result.stdout.decode().strip() == "[]"


# --- a terse assistant, on Anthropic's Messages API (tests/anthropic_like.py) or OpenAI's -------------------


@agentrt.system_message("You are terse.")
class Assistant:
    async def chat(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> str: ...

    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# --- providers named per service; tool spans that fail, and that last as long as their tool -----------------


def _openai_answer(request: httpx.Request) -> httpx.Response:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-test",
             "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}  # fmt: skip
    body = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)


async def test_one_listener_for_two_services_names_each_provider(telemetry: Telemetry) -> None:
    # README "Tracing": `listeners=[otel.instrument()]`, spans "following OpenTelemetry's GenAI
    # semantic conventions", where gen_ai.provider.name is required. `Started` carries the model's
    # name but not its provider, so only `instrument(model=...)` finds it — and then names that one
    # model and provider for every service sharing the listener. Expected: "anthropic" for the
    # Anthropic service's spans, "openai" for the OpenAI one's. Actual: "_OTHER" for both.
    listener = telemetry.listener()
    claude = anthropic(AnthropicLike(text_stream("ok")))
    gpt = OpenAIChatModel(
        "gpt-test", api_key="sk-test", client=httpx.AsyncClient(transport=httpx.MockTransport(_openai_answer))
    )
    async with claude, gpt:
        first = agentrt.build(Assistant, model=claude, listeners=[listener])
        second = agentrt.build(Assistant, model=gpt, listeners=[listener])
        assert await first.ask("q") == await second.ask("q") == "ok"
    providers = {
        (attributes(s)["gen_ai.request.model"], attributes(s)["gen_ai.provider.name"])
        for s in telemetry.spans()
    }
    assert providers == {("claude-test", "anthropic"), ("gpt-test", "openai")}


async def test_a_models_declared_provider_names_its_spans(telemetry: Telemetry) -> None:
    # A model of the user's own declares its provider as data (`Capabilities.provider`), as the
    # adapters do; `instrument(model=...)` takes that model's for every service it serves.
    acme = ScriptedModel("ok", name="acme-1", capabilities=Capabilities(provider="acme"))
    per_service = telemetry.listener()
    overriding = telemetry.listener(model=acme)
    runs = ((acme, per_service), (ScriptedModel("ok"), per_service), (ScriptedModel("ok"), overriding))
    for model, listener in runs:
        assert await agentrt.build(Assistant, model=model, listeners=[listener]).ask("q") == "ok"

    spans = [attributes(s) for s in telemetry.spans()]
    assert [a["gen_ai.provider.name"] for a in spans if a["gen_ai.operation.name"] == "chat"] == [
        "acme",
        "_OTHER",
        "acme",
    ]


async def test_a_tool_that_fails_the_call_has_an_error_span(telemetry: Telemetry) -> None:
    # agentrt.otel's docstring: "on a tool span, the tool's exception class name". With
    # ToolSettings(on_error="raise") no ToolExecuted arrives; FailedEvent ends every open tool span
    # with agentrt.cancelled=true, so the trace shows the invocation failing with
    # ToolExecutionError and the tool that raised it as merely cancelled. The ToolError carries
    # `call_id`, so the listener can tell which span failed. Expected: that span has ERROR status and
    # error.type; its sibling (cancelled by the failure) has agentrt.cancelled=true.
    @tool("Fails.")
    async def boom(x: str) -> str:
        raise ValueError(f"BOOM {x}")

    @tool("Slow.")
    async def slow(x: str) -> str:
        await anyio.lowlevel.checkpoint()  # still running when `boom` fails (the round waits for it)
        return "late"

    listener = telemetry.listener()
    model = ScriptedModel(
        [CallTool("boom", {"x": "1"}, id="a"), CallTool("slow", {"x": "2"}, id="b")], "done"
    )
    service = agentrt.build(
        Assistant,
        model=model,
        tools=[boom, slow],
        tool_settings=ToolSettings(on_error="raise"),
        listeners=[listener],
    )
    with pytest.raises(agentrt.ToolExecutionError):
        await service.ask("q")
    spans = {s.name: s for s in telemetry.spans()}
    assert telemetry.open_spans.open == {}
    failed, cancelled = spans["execute_tool boom"], spans["execute_tool slow"]
    assert attributes(cancelled)["agentrt.cancelled"] is True
    assert failed.status.status_code is StatusCode.ERROR
    assert "error.type" in attributes(failed)
    assert attributes(failed).get("agentrt.cancelled") is not True


async def test_a_tool_span_lasts_as_long_as_its_tool(telemetry: Telemetry) -> None:
    # ToolExecuted events are delivered after the whole round (the pipeline awaits all executions,
    # then notifies), and the listener ends each span on arrival; ToolExecution.duration, which has
    # the tool's own time, is not used. Expected: `execute_tool fast` lasts about its own time (well
    # under the slow tool's). Actual: both last the round (~0.4 s).
    @tool("Fast.")
    async def fast() -> str:
        return "f"

    @tool("Slow.")
    async def slow() -> str:
        await anyio.sleep(0.4)
        return "s"

    model = ScriptedModel([CallTool("fast", {}, id="a"), CallTool("slow", {}, id="b")], "done")
    service = agentrt.build(Assistant, model=model, tools=[fast, slow], listeners=[telemetry.listener()])
    await service.ask("q")
    seconds = {
        s.name: ((s.end_time or 0) - (s.start_time or 0)) / 1e9
        for s in telemetry.spans()
        if s.name.startswith("execute_tool")
    }
    assert seconds["execute_tool slow"] >= 0.4
    assert seconds["execute_tool fast"] < 0.2


# --- a stream cancelled or abandoned ends its spans (and closes the response) -------------------------------


class HangingBody(httpx.AsyncByteStream):
    """A 200 body that sends its first bytes, then nothing; records whether it was closed."""

    def __init__(self, first: bytes) -> None:
        self.first = first
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


async def test_cancelling_a_reader_mid_stream_closes_the_response_and_every_span(
    telemetry: Telemetry,
) -> None:
    body = HangingBody(
        events(start(), block(0, {"type": "text", "text": ""}), delta(0, type="text_delta", text="Hal"))
    )

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    listener = telemetry.listener()
    tokens: list[str] = []
    async with anthropic(server) as model:
        service = agentrt.build(Assistant, model=model, listeners=[listener])
        with anyio.move_on_after(0.2):
            async for token in await service.stream("q"):
                tokens.append(token)
    assert tokens == ["Hal"]
    assert body.closed
    assert listener.open_invocations == 0
    assert telemetry.open_spans.open == {}
    for span in telemetry.spans():
        assert attributes(span)["agentrt.cancelled"] is True
        assert span.status.status_code is StatusCode.UNSET


async def test_an_abandoned_stream_ends_its_spans_when_collected(telemetry: Telemetry) -> None:
    listener = telemetry.listener()
    closed = anyio.Event()

    def on_cancel(event: object) -> None:  # after the OTel listener saw the same event
        if isinstance(event, CancelledEvent):
            closed.set()

    model = ScriptedModel(["a", "b", Hang()])
    service = agentrt.build(Assistant, model=model, listeners=[listener, on_cancel])

    async def read_one() -> None:
        async for _ in await service.stream("q"):
            break  # nobody holds the stream: it warns, and is closed from a fresh task once collected

    with pytest.warns(ResourceWarning, match=r"^Assistant\.stream: a stream was collected"):
        await read_one()
    with anyio.fail_after(5):
        await closed.wait()
    assert listener.open_invocations == 0
    assert telemetry.open_spans.open == {}
    assert all(attributes(s)["agentrt.cancelled"] is True for s in telemetry.spans())


# --- without capture_content nothing said reaches a span, thinking and tool errors included -----------------


async def test_nothing_said_reaches_a_span_without_capture_content(telemetry: Telemetry) -> None:
    # A thinking Anthropic turn with a tool that fails (its message quotes the user), through memory.
    secret = "SECRET-4a1f user@example.com"

    @tool("Fails.")
    async def lookup(q: str) -> str:
        raise ValueError(f"no {q}")

    thought = events(
        start(),
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking=f"the user said {secret}"),
        delta(0, type="signature_delta", signature="SIG"),
        stop(0),
        block(1, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        delta(1, type="input_json_delta", partial_json=orjson.dumps({"q": secret}).decode()),
        stop(1),
        *end("tool_use"),
    )
    server = AnthropicLike(thought, text_stream(f"answer {secret}"))
    async with anthropic(server, thinking=1024) as model:
        service = agentrt.build(
            Assistant, model=model, tools=[lookup], memory=agentrt.memory.window(max_messages=9),
            listeners=[telemetry.listener()],
        )  # fmt: skip
        await service.chat(secret, secret)
    texts = []
    for span in telemetry.spans():
        texts += [span.name, str(span.status.description), *map(str, attributes(span).values())]
        for event in span.events:
            texts += [event.name, *map(str, (event.attributes or {}).values())]
    assert not [t for t in texts if "SECRET-4a1f" in t]
    tool_span = next(s for s in telemetry.spans() if s.name == "execute_tool lookup")
    assert attributes(tool_span)["error.type"] == "ValueError"


async def test_a_turn_that_waits_for_approval_ends_its_span_and_its_resume_has_its_own(
    telemetry: Telemetry,
) -> None:
    @tool("Email someone.", needs_approval=True)
    async def email(text: str) -> str:
        return "sent"

    listener = telemetry.listener()
    model = ScriptedModel([CallTool("email", {"text": "hi"}, id="e1")], "Sent it.")
    service = agentrt.build(
        Weather, model=model, tools=[email], listeners=[listener], memory=agentrt.memory.window()
    )
    with pytest.raises(agentrt.ApprovalRequired) as info:
        await service.chat("ada", "mail ada")
    approval = info.value.approval
    assert listener.open_invocations == 0  # the waiting turn holds no span open
    [first] = [s for s in telemetry.spans() if s.name.startswith("invoke_agent")]
    assert first.attributes is not None
    assert first.attributes["agentrt.approval.run_id"] == approval.run_id
    assert first.attributes["agentrt.approval.tools"] == ("email",)

    assert (
        await agentrt.resume(service, approval.run_id, {"e1": agentrt.Approve()}, memory_id="ada")
        == "Sent it."
    )
    assert listener.open_invocations == 0
    agents = [s for s in telemetry.spans() if s.name.startswith("invoke_agent")]
    assert len(agents) == 2
    second = agents[1]
    assert second.attributes is not None
    assert second.attributes["agentrt.invocation.id"] == first.attributes["agentrt.invocation.id"]
    assert "agentrt.approval.run_id" not in second.attributes
    waited, ran = [s for s in telemetry.spans() if s.name == "execute_tool email"]
    assert waited.parent is not None and first.context is not None
    assert waited.parent.span_id == first.context.span_id
    assert (
        waited.attributes is not None and waited.attributes["agentrt.tool.outcome"] == "waiting_for_approval"
    )
    assert ran.parent is not None and second.context is not None
    assert ran.parent.span_id == second.context.span_id  # the call ran in the resumed run
    assert ran.attributes is not None and ran.attributes["agentrt.tool.outcome"] == "success"
