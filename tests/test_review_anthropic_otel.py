"""Outside review of issue 15: `AnthropicChatModel` and `agentrt.otel`.

Each defect the review found is a test here (fixed since; the comments say what was wrong); the
others cover corners the feature's own tests do not (SQLite memory, wire-format oddities,
cancellation of a real HTTP body, abandoned streams, retries after 529).

Several tests talk to `anthropic_like`, a MockTransport server that answers as the Messages API does
for the request rules it enforces (each rule is Anthropic's documented or observed 400), so that a
request the real API would refuse fails here too, with Anthropic's own error envelope.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx
import orjson
import pytest
from cassettes import Parts
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import agentrt
from agentrt import (
    AssistantMessage,
    CancelledEvent,
    ConfigurationError,
    ModelError,
    OverloadedError,
    P,
    TokenStream,
    ToolSettings,
    UserMessage,
    tool,
)
from agentrt.models import (
    AnthropicChatModel,
    FinishReason,
    ModelRequest,
    ModelSettings,
    OpenAIChatModel,
    RetryPolicy,
    complete,
)
from agentrt.otel import OTelListener, instrument
from agentrt.testing import CallTool, Hang, ScriptedModel

KEY = "sk-ant-api03-review-key-0123456789"

# --- the Messages API's wire format ---------------------------------------------------------------


def events(*payloads: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + p["type"].encode() + b"\ndata: " + orjson.dumps(p) + b"\n\n" for p in payloads
    )


def start() -> dict[str, Any]:
    message = {"id": "msg_r", "type": "message", "role": "assistant", "model": "claude-test", "content": []}
    return {"type": "message_start", "message": {**message, "usage": {"input_tokens": 7, "output_tokens": 1}}}


def block(index: int, content_block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content_block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str = "end_turn", stop_sequence: str | None = None) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]


def text_stream(text: str) -> bytes:
    return events(
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text=text),
        stop(0),
        *end(),
    )


def call_stream(call_id: str, query: str) -> bytes:
    return events(
        start(),
        block(0, {"type": "tool_use", "id": call_id, "name": "lookup", "input": {}}),
        delta(0, type="input_json_delta", partial_json=""),
        delta(0, type="input_json_delta", partial_json=orjson.dumps({"q": query}).decode()),
        stop(0),
        *end("tool_use"),
    )


def _refusal(message: str) -> httpx.Response:
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
        "request_id": "req_r",
    }
    return httpx.Response(400, headers={"content-type": "application/json", "request-id": "req_r"}, json=body)


def _api_refusal(body: dict[str, Any]) -> str | None:
    """What the Messages API says (400 invalid_request_error) about a request body, for the rules it
    enforces that these tests touch; `None` if it takes the body."""
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    if any(b["type"] in ("tool_use", "tool_result") for b in blocks) and not body.get("tools"):
        # anthropics/anthropic-sdk-python#494 (and every Bedrock/Vertex client since)
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    for number, message in enumerate(body["messages"]):
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = [p["text"] for p in parts if p["type"] == "text"]
        if texts and len(texts) == len(parts) and not any(t.strip() for t in texts):
            # The API refuses a message whose only content is whitespace text (LibreChat-AI/agents#124
            # checked it against messages.create: [text:' '] and [text:'\n'] alone are refused).
            return f"messages.{number}: text content blocks must contain non-whitespace text"
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking["budget_tokens"]
        if budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if body["max_tokens"] <= budget:
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
        if body.get("temperature", 1) != 1:
            return "`temperature` may only be set to 1 when thinking is enabled."
    return None


class AnthropicLike:
    """A MockTransport handler: replies in order, after checking each request as the API would."""

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        refusal = _api_refusal(json.loads(request.content))
        if refusal is not None:
            return _refusal(refusal)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self.replies.pop(0))

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.sent]


def anthropic(server: Callable[[httpx.Request], httpx.Response], **options: Any) -> AnthropicChatModel:
    client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    options.setdefault("retry", RetryPolicy.never())
    return AnthropicChatModel("claude-test", api_key=KEY, client=client, **options)


class Lookup:
    def __init__(self) -> None:
        self.asked: list[str] = []

    @tool("Look a thing up.")
    async def lookup(self, q: Annotated[str, P("what to look up")]) -> str:
        self.asked.append(q)
        return f"{q}: found"


@agentrt.system_message("You are terse.")
class Assistant:
    async def chat(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> str: ...

    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


# --- telemetry ------------------------------------------------------------------------------------


class OpenSpans(SpanProcessor):
    def __init__(self) -> None:
        self.open: dict[int, str] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.pop(span.context.span_id, None)


class Telemetry:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.open_spans = OpenSpans()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(self.open_spans)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def listener(self, **options: Any) -> OTelListener:
        return instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options)

    def spans(self) -> list[ReadableSpan]:
        return sorted(self.exporter.get_finished_spans(), key=lambda s: s.start_time or 0)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    found = Telemetry()
    yield found
    found.tracer_provider.shutdown()
    found.meter_provider.shutdown()


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# ==================================================================================================
# AnthropicChatModel: defects
# ==================================================================================================


async def test_a_final_answer_after_a_tool_limit_is_a_request_anthropic_accepts() -> None:
    # ToolSettings(on_limit="final_answer") promises "one more request without tools that asks the
    # model to answer with what it has". Against Anthropic that request carries the round's
    # tool_use and tool_result blocks with no `tools` field: "Requests which include tool_use or
    # tool_result blocks must define tools." Expected: the answer ("Final.") — e.g. keep the tools
    # and send tool_choice {"type": "none"}, which the adapter already maps. Actual: BadRequestError.
    server = AnthropicLike(call_stream("toolu_1", "a"), call_stream("toolu_2", "b"), text_stream("Final."))
    model = anthropic(server)
    async with model:
        service = agentrt.build(
            Assistant,
            model=model,
            tools=[Lookup()],
            tool_settings=ToolSettings(max_rounds=1, on_limit="final_answer"),
        )
        assert await service.ask("Find a and b") == "Final."


async def test_a_whitespace_answer_does_not_break_the_conversation() -> None:
    # The adapter drops empty answers ("nothing the API accepts: the neighbours merge instead"), but
    # not answers of whitespace only, which Claude does return (e.g. "\n\n" around a server tool).
    # Replayed, `[{"type": "text", "text": " \n"}]` is refused: "text content blocks must contain
    # non-whitespace text". Expected: the second turn answers. Actual: BadRequestError on every
    # later turn (the memory is poisoned).
    server = AnthropicLike(text_stream(" \n"), text_stream("second"))
    model = anthropic(server)
    async with model:
        service = agentrt.build(Assistant, model=model, memory=agentrt.memory.window(max_messages=20))
        assert await service.chat("c1", "first") == " \n"
        assert await service.chat("c1", "again") == "second"


@pytest.mark.parametrize(
    ("thinking", "settings", "why"),
    [
        pytest.param(
            2048,
            ModelSettings(max_tokens=1024),
            "max_tokens",
            id="build-max_tokens-below-budget",
        ),
        pytest.param(
            512,
            None,
            "budget",
            id="budget-below-1024",
        ),
        pytest.param(
            2048,
            ModelSettings(temperature=0.2),
            "temperature",
            id="temperature-with-thinking",
        ),
    ],
)
async def test_thinking_settings_the_api_refuses_fail_at_build_not_on_every_call(
    thinking: int, settings: ModelSettings | None, why: str
) -> None:
    # DESIGN §3 "Definition-time validation" (and _check_tool_choice: "Tool choices the model cannot
    # honour are build errors, not failures of every call"). The constructor checks the budget only
    # against the model's own max_tokens. Expected: ConfigurationError when the model or the service
    # is built — or a request the API takes. Actual: built fine, and every call is a 400.
    server = AnthropicLike(text_stream("ok"))
    try:
        model = anthropic(server, thinking=thinking)
        service = agentrt.build(Assistant, model=model, settings=settings)
    except ConfigurationError:
        return
    async with model:
        assert await service.ask("q") == "ok", why


async def test_an_error_event_is_an_error_whatever_its_json_says() -> None:
    # The OpenAI decoder (SSEChunkDecoder) fails on any `event: error`; this one tells events apart by
    # the data's `type` only, so `event: error` + `{"message": "upstream connect error"}` (what a
    # proxy or gateway in front of the API sends) is ignored like a ping. Expected: a ModelError
    # carrying "upstream connect error" (as for non-JSON error data, which works). Actual:
    # ModelResponseError "the stream ended before the response was complete".
    body = events(start(), block(0, {"type": "text", "text": ""}), delta(0, type="text_delta", text="Hal"))
    body += b'event: error\ndata: {"message": "upstream connect error"}\n\n'

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async with anthropic(server) as model:
        with pytest.raises(ModelError, match="upstream connect error"):
            await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))


async def test_a_billing_error_is_a_typed_error() -> None:
    # Anthropic documents 402 billing_error. README: typed errors (AuthenticationError,
    # RateLimitError, ... never a bare ModelError for a documented status). Anthropic's `error.type`
    # is not kept as `code` either, so the caller cannot tell billing from any other failure without
    # parsing `body`. Expected: a ModelError subclass (or at least code == "billing_error").
    def server(request: httpx.Request) -> httpx.Response:
        body = {"type": "error", "error": {"type": "billing_error", "message": "credit balance too low"}}
        return httpx.Response(402, headers={"content-type": "application/json"}, json=body)

    async with anthropic(server) as model:
        with pytest.raises(ModelError) as info:
            await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert type(info.value) is not ModelError or info.value.code == "billing_error"


# ==================================================================================================
# AnthropicChatModel: what held up (new coverage)
# ==================================================================================================

SIGNATURE = "EqQBCkgIAxABGAIiQL+/3c0ffee==\n/+\u2028é"  # opaque; unusual bytes on purpose


def _thinking_then_call() -> bytes:
    return events(
        start(),
        {"type": "ping"},
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Look it up ☃\u2028"),
        delta(0, type="thinking_delta", thinking=""),
        delta(0, type="signature_delta", signature=SIGNATURE),
        stop(0),
        block(1, {"type": "redacted_thinking", "data": "ENCRYPTED+/=="}),
        stop(1),
        block(2, {"type": "thinking", "thinking": "", "signature": ""}),  # display "omitted"
        delta(2, type="signature_delta", signature="SIG-omitted"),
        stop(2),
        block(3, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        delta(3, type="input_json_delta", partial_json=""),
        delta(3, type="input_json_delta", partial_json='{"q": "ca'),
        delta(3, type="input_json_delta", partial_json='ts"}'),
        stop(3),
        *end("tool_use"),
    )


async def test_thinking_with_tools_goes_back_byte_for_byte_through_sqlite_memory(tmp_path: Path) -> None:
    server = AnthropicLike(_thinking_then_call(), text_stream("Cats: found."), text_stream("Cats."))
    store = agentrt.memory.SQLiteStore(tmp_path / "memory.db")
    lookup = Lookup()
    model = anthropic(server, thinking=1024)
    async with model:
        service = agentrt.build(
            Assistant, model=model, tools=[lookup], memory=agentrt.memory.window(max_messages=20, store=store)
        )
        assert await service.chat("c1", "What about cats?") == "Cats: found."
        assert await service.chat("c1", "And?") == "Cats."
    assert lookup.asked == ["cats"]
    second_round, next_turn = server.bodies()[1:]
    replayed = [
        {"type": "thinking", "thinking": "Look it up ☃\u2028", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "ENCRYPTED+/=="},
        {"type": "thinking", "thinking": "", "signature": "SIG-omitted"},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "cats"}},
    ]
    assert second_round["messages"][1] == {"role": "assistant", "content": replayed}
    assert next_turn["messages"][1] == second_round["messages"][1]
    sealed = orjson.dumps(replayed[0])
    assert server.sent[1].content.count(sealed) == server.sent[2].content.count(sealed) == 1


async def test_wire_corners_fold_to_the_answer() -> None:
    body = events(
        start(),
        {"type": "ping"},
        {"type": "some_future_event", "x": 1},
        block(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
        delta(0, type="input_json_delta", partial_json='{"query": "x"}'),
        stop(0),
        block(1, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}),
        stop(1),
        block(2, {"type": "text", "text": ""}),
        delta(2, type="text_delta", text="Gr"),
        delta(2, type="citations_delta", citation={"type": "web_search_result_location"}),
        delta(2, type="some_future_delta"),
        delta(2, type="text_delta", text="üße ✓"),
        stop(2),
        *end("stop_sequence", stop_sequence="END"),
    )
    # every byte split, unicode included: the same as whole
    for cut in (1, 7, len(body) // 2, body.index("ü".encode()) + 1, len(body) - 1):

        def server(request: httpx.Request, cut: int = cut) -> httpx.Response:
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=Parts([body[:cut], body[cut:]])
            )

        async with anthropic(server) as model:
            response = await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
        assert response.message == AssistantMessage(text="Grüße ✓")
        assert response.finish_reason is FinishReason.STOP


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


@pytest.mark.virtual_clock
async def test_a_529_waits_for_its_retry_after_and_x_should_retry_false_is_final() -> None:
    overloaded = orjson.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    seen: list[float] = []
    answers = [
        httpx.Response(
            529, headers={"content-type": "application/json", "retry-after": "20"}, content=overloaded
        ),
        httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text_stream("Back.")),
    ]

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(anyio.current_time())
        return answers[len(seen) - 1]

    async with anthropic(server, retry=RetryPolicy(max_attempts=3)) as model:
        response = await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert response.message.text == "Back."
    assert seen[1] - seen[0] >= 20

    calls: list[int] = []

    def refusing(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        headers = {"content-type": "application/json", "x-should-retry": "false", "request-id": "req_9"}
        return httpx.Response(529, headers=headers, content=overloaded)

    async with anthropic(refusing, retry=RetryPolicy(max_attempts=3, initial_delay=0)) as model:
        with pytest.raises(OverloadedError) as info:
            await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert len(calls) == 1
    assert (info.value.status, info.value.request_id) == (529, "req_9")


# ==================================================================================================
# agentrt.otel: defects
# ==================================================================================================


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
        await anyio.sleep(5)
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


# ==================================================================================================
# agentrt.otel: what held up (new coverage)
# ==================================================================================================


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
