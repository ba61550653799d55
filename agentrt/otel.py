"""Traces and metrics by OpenTelemetry's GenAI semantic conventions, from the lifecycle events.

    from agentrt import otel

    support = agentrt.build(Support, model=model, listeners=[otel.instrument(model=model)])

Imported on its own, never by `agentrt` itself: without the `otel` extra (`opentelemetry-api`)
agentrt runs as before, and without this listener nothing of OpenTelemetry is imported. The
listener sees lifecycle events only (never a text delta), so the per-token path is untouched.

One invocation is one trace subtree:

    invoke_agent Support.chat        INTERNAL  the call (gen_ai.operation.name = invoke_agent)
    ├── chat gpt-4o                  CLIENT    one per model request (RequestIssued → ResponseReceived)
    ├── execute_tool order_status    INTERNAL  one per tool call (ToolCallRequested → ToolExecuted)
    ├── chat gpt-4o                  CLIENT    the next request, with the tool results
    └── events on the invoke_agent span: gen_ai.guardrail.result, agentrt.reset, retrieval, ...

The pipeline generator may be read by different tasks, so nothing here relies on the context
attached in the reader's task: the invocation span takes the caller's context when `Started`
arrives (the caller's task, for awaited calls and for `await service.stream(...)`), every child is
started with the invocation span as its explicit parent, state is kept by invocation id, and
`Completed`, `ApprovalRequested` (a turn that stops for a human: its resumed run starts a span of
its own), `FailedEvent` and `CancelledEvent` end every span the invocation still has open.

By default no content is recorded: no prompt, answer, tool argument or result, guardrail message,
memory id, retrieved text, nor exception message (an agentrt error's message may quote the answer,
a provider's may echo the prompt): a failure records its exception type only; a tool span carries
`agentrt.tool.arguments_hash`, which tells equal calls apart without the arguments.
`capture_content=True` adds the opt-in attributes of the conventions (`gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`,
`gen_ai.conversation.id`, ...) as JSON strings, and records exceptions with their message and stack
trace.

Errors (`error.type`, with status ERROR): on a failed invocation and the request under way, the
exception's class name (`RateLimitError`, `ModelTimeoutError`, `BudgetExceededError`,
`OutputGuardrailError`, `ModerationError`, `OutputParsingError`, ...); on a tool span, the tool's
exception class name, or `timeout`, `invalid_arguments`, `unknown_tool` (the call's outcome; the
invocation goes on). A cancelled invocation is not an error: its spans end with
`agentrt.cancelled = true` and no status, and its request records no duration.
"""

from __future__ import annotations

import logging
import time
import typing
from typing import Any, Final

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("agentrt.otel needs OpenTelemetry's API: pip install 'agentrt[otel]'") from exc

from . import __version__
from ._errors import ToolError
from ._events import (
    ApprovalRequested,
    CancelledEvent,
    Completed,
    FailedEvent,
    GuardrailVerdict,
    RequestIssued,
    Reset,
    ResponseReceived,
    Retrieved,
    Started,
    ToolCallRequested,
    ToolExecuted,
)
from ._otel_attributes import (
    error_type,
    guardrail_attributes,
    input_message,
    qualified,
    response_attributes,
    result_attributes,
    retrieval_attributes,
    snake,
    to_json,
)

if typing.TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from ._events import LifecycleEvent
    from ._otel_attributes import Attributes
    from .models._protocol import ChatModel

__all__ = ["OTelListener", "instrument"]

logger = logging.getLogger("agentrt.otel")

_TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                         16777216, 67108864)  # fmt: skip
_DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                            20.48, 40.96, 81.92)  # fmt: skip


def instrument(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    capture_content: bool = False,
    model: ChatModel | str | None = None,
    provider: str | None = None,
) -> OTelListener:
    """A listener (for `agentrt.build(listeners=[...])`) that records GenAI spans and metrics.

    - `tracer_provider`, `meter_provider`: default to the global ones (no-ops until the application
      configures OpenTelemetry's SDK).
    - `capture_content`: record prompts, answers, tool arguments and results, guardrail messages,
      the memory id and exception messages (off by default: they may hold personal data).
    - `model`, `provider`: override the model name and provider of every span. By default each
      invocation names its service's own (`Started.model`, `Started.provider`, as the adapter
      declares it: `openai`, `anthropic`, `ollama`), so one listener can serve several services;
      `_OTHER` where neither says.
    """
    return OTelListener(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=capture_content,
        model=model,
        provider=provider,
    )


class _Call:
    """What one invocation has open: its span (and the context naming it as parent), the model
    request under way, and the tool calls of the round."""

    __slots__ = ("chat", "chat_attributes", "chat_started", "context", "model", "provider", "span", "tools")

    def __init__(self, span: Span, context: Context, model: str | None, provider: str) -> None:
        self.span = span
        self.context = context
        self.model = model
        self.provider = provider
        self.chat: Span | None = None
        self.chat_started = 0.0
        self.chat_attributes: Attributes = {}
        self.tools: list[tuple[str, Span, int]] = []
        """Open tool spans: the call id, the span, when it started (ns since the epoch)."""


class OTelListener:
    """Turns lifecycle events into spans and metrics (see the module docstring). Never raises."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool = False,
        model: ChatModel | str | None = None,
        provider: str | None = None,
    ) -> None:
        self.capture_content = capture_content
        self._tracer = trace.get_tracer("agentrt", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("agentrt", __version__, meter_provider=meter_provider)
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._model = model if isinstance(model, str) or model is None else model.name
        self._provider = provider or (
            None if model is None or isinstance(model, str) else model.capabilities.provider
        )
        """The provider named by `instrument(...)`; else each service's model's (`Started.provider`)."""
        self._calls: dict[str, _Call] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            Started: self._started,
            RequestIssued: self._request,
            ResponseReceived: self._response,
            ToolCallRequested: self._tool_requested,
            ToolExecuted: self._tool_executed,
            GuardrailVerdict: self._verdict,
            Reset: self._reset,
            Retrieved: self._retrieved,
            Completed: self._completed,
            ApprovalRequested: self._approval,
            FailedEvent: self._failed,
            CancelledEvent: self._cancelled,
        }

    @property
    def open_invocations(self) -> int:
        """Invocations started and not yet ended (each holds open spans)."""
        return len(self._calls)

    def __call__(self, event: LifecycleEvent) -> None:
        try:
            handler = self._handlers.get(type(event))
            if handler is None:
                self._other(event)
            else:
                handler(event)
        except Exception:  # a telemetry bug must not reach agentrt's log as the listener's failure
            logger.exception("agentrt.otel could not record %s", type(event).__name__)

    # --- the invocation -----------------------------------------------------------------------

    def _started(self, event: Started) -> None:
        # `instrument(model=...)` names the model if given; else `Started.model` (the service's model).
        model = self._model or event.model
        provider = self._provider or event.provider or "_OTHER"
        attributes: Attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": provider,
            "gen_ai.agent.name": event.method,
            "agentrt.invocation.id": event.invocation_id,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if self.capture_content and event.memory_id is not None:
            attributes["gen_ai.conversation.id"] = str(event.memory_id)
        # Parented by the caller's context: `Started` is delivered in the caller's task.
        span = self._tracer.start_span(
            f"invoke_agent {event.method}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self._calls[event.invocation_id] = _Call(span, trace.set_span_in_context(span), model, provider)

    def _completed(self, event: Completed[Any]) -> None:
        call = self._calls.pop(event.invocation_id, None)
        if call is None:
            return
        span = call.span
        try:
            self._close_children(call, cancelled=False)
            if span.is_recording():
                span.set_attributes(result_attributes(event.result, self.capture_content))
        finally:  # whatever failed above, no span stays open
            span.end()

    def _approval(self, event: ApprovalRequested) -> None:
        # The turn stopped for a human: its span ends here (the resumed run has a span of its own,
        # with the same `agentrt.invocation.id`), saying which calls wait.
        call = self._calls.pop(event.invocation_id, None)
        if call is None:
            return
        span = call.span
        try:
            for _, tool, _ in call.tools:  # the calls that wait: the resumed run has their spans
                tool.set_attribute("agentrt.tool.outcome", "waiting_for_approval")
            self._close_children(call, cancelled=False)
            if span.is_recording():
                span.set_attributes(
                    {
                        "agentrt.approval.run_id": event.run_id,
                        "agentrt.approval.tools": tuple(pending.tool for pending in event.calls),
                    }
                )
        finally:
            span.end()

    def _failed(self, event: FailedEvent) -> None:
        call = self._calls.pop(event.invocation_id, None)
        if call is None:
            return
        error = event.error
        kind = error_type(error)
        try:
            chat = call.chat
            if chat is not None:
                call.chat = None
                self._fail(chat, error, kind)
                self._record_duration(call, kind)
            if isinstance(error, ToolError):  # the tool that failed the call: failed, not cancelled
                for index, (call_id, span, _) in enumerate(call.tools):
                    if call_id == error.call_id:
                        del call.tools[index]
                        self._fail(span, error.__cause__ or error, error_type(error.__cause__ or error))
                        break
            self._close_children(call, cancelled=True)
        finally:
            self._fail(call.span, error, kind)

    def _cancelled(self, event: CancelledEvent) -> None:
        # The caller stopped waiting (its task was cancelled, or it closed the stream early): the
        # operation did not fail, so the status stays unset; `agentrt.cancelled` says why it ended.
        call = self._calls.pop(event.invocation_id, None)
        if call is None:
            return
        try:
            self._close_children(call, cancelled=True)
            call.span.set_attribute("agentrt.cancelled", True)
        finally:
            call.span.end()

    def _fail(self, span: Span, error: BaseException, kind: str) -> None:
        try:
            if span.is_recording():
                span.set_attribute("error.type", kind)
                if self.capture_content:
                    span.record_exception(error)
                    span.set_status(Status(StatusCode.ERROR, str(error)))
                else:  # the type, never the message (it may quote the prompt or the answer)
                    span.add_event("exception", {"exception.type": qualified(error)})
                    span.set_status(Status(StatusCode.ERROR))
        finally:
            span.end()

    def _close_children(self, call: _Call, *, cancelled: bool) -> None:
        """End what the invocation still has open (nothing, when it went as the events promise)."""
        open_spans = [span for _, span, _ in call.tools]
        call.tools.clear()
        if call.chat is not None:
            open_spans.insert(0, call.chat)
            call.chat = None
        for span in open_spans:
            try:
                span.set_attribute("agentrt.cancelled", cancelled)
            finally:
                span.end()

    # --- model requests -----------------------------------------------------------------------

    def _request(self, event: RequestIssued) -> None:
        call = self._calls.get(event.invocation_id)
        if call is None:
            return
        if call.chat is not None:  # a request without its response (not expected): ended here
            call.chat.end()
        model = call.model
        attributes: Attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": call.provider,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        # The metrics' attributes: those known at the start (response.model and error.type follow).
        call.chat_attributes = dict(attributes)
        request = event.request
        settings = request.settings
        if settings is not None:
            for name, value in (
                ("gen_ai.request.temperature", settings.temperature),
                ("gen_ai.request.max_tokens", settings.max_tokens),
                ("gen_ai.request.top_p", settings.top_p),
                ("gen_ai.request.seed", settings.seed),
                ("gen_ai.request.presence_penalty", settings.presence_penalty),
                ("gen_ai.request.frequency_penalty", settings.frequency_penalty),
                ("gen_ai.request.stop_sequences", settings.stop),
            ):
                if value is not None:
                    attributes[name] = value
        if request.response_format is not None:
            attributes["gen_ai.output.type"] = "json"
        attributes["agentrt.round"] = event.round
        if self.capture_content:
            attributes["gen_ai.input.messages"] = to_json([input_message(m) for m in request.messages])
        call.chat = self._tracer.start_span(
            f"chat {model}" if model else "chat",
            context=call.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        call.chat_started = time.perf_counter()

    def _response(self, event: ResponseReceived) -> None:
        call = self._calls.get(event.invocation_id)
        if call is None or call.chat is None:
            return
        chat, call.chat = call.chat, None
        try:
            response = event.response
            if response.model:
                call.chat_attributes["gen_ai.response.model"] = response.model
            if chat.is_recording():
                chat.set_attributes(response_attributes(response, self.capture_content))
        finally:
            chat.end()
        self._record_duration(call, None)
        usage = response.usage
        if not usage.estimated:  # the conventions: no token metric without the provider's counts
            record = self._tokens.record
            record(usage.input_tokens, {**call.chat_attributes, "gen_ai.token.type": "input"})
            record(usage.output_tokens, {**call.chat_attributes, "gen_ai.token.type": "output"})

    def _record_duration(self, call: _Call, error: str | None) -> None:
        attributes = call.chat_attributes
        if error is not None:
            attributes = {**attributes, "error.type": error}
        self._duration.record(time.perf_counter() - call.chat_started, attributes)

    # --- tools ----------------------------------------------------------------------------------

    def _tool_requested(self, event: ToolCallRequested) -> None:
        call = self._calls.get(event.invocation_id)
        if call is None:
            return
        tool = event.call
        attributes: Attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool.name,
            "gen_ai.tool.call.id": tool.id,
            "gen_ai.tool.type": "function",
            "agentrt.round": event.round,
            # Tells equal calls apart (a loop calling a tool with the same arguments) without them.
            "agentrt.tool.arguments_hash": event.arguments_hash,
        }
        for key, value in event.annotations.items():
            # The owner's hints (an MCP server's readOnlyHint, destructiveHint, ...), when scalar.
            if isinstance(value, bool | int | float | str):
                attributes[f"agentrt.tool.annotation.{key}"] = value
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = tool.arguments
        started = time.time_ns()
        span = self._tracer.start_span(
            f"execute_tool {tool.name}",
            context=call.context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=started,
        )
        call.tools.append((tool.id, span, started))

    def _tool_executed(self, event: ToolExecuted) -> None:
        call = self._calls.get(event.invocation_id)
        if call is None:
            return
        execution = event.execution
        tools = call.tools
        # In the model's order, so the first open span of that id (ids may repeat in a round).
        index = next((i for i, (call_id, _, _) in enumerate(tools) if call_id == execution.call_id), None)
        if index is None:
            # A call decided in a resumed run (it waited for approval): its span is this run's.
            started = time.time_ns() - int(execution.duration * 1e9)
            span = self._tracer.start_span(
                f"execute_tool {execution.name}",
                context=call.context,
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": execution.name,
                    "gen_ai.tool.call.id": execution.call_id,
                    "gen_ai.tool.type": "function",
                    "agentrt.round": execution.round,
                    "agentrt.tool.arguments_hash": execution.arguments_hash,
                },
                start_time=started,
            )
        else:
            _, span, started = tools.pop(index)
        # `ToolExecuted` comes when the whole round is over: the span ends when the tool did.
        ended = min(started + int(execution.duration * 1e9), time.time_ns())
        try:
            if span.is_recording():
                span.set_attribute("agentrt.tool.outcome", execution.outcome.value)
                if execution.is_error:
                    span.set_attribute("error.type", execution.error_kind or execution.outcome.value)
                    span.set_status(Status(StatusCode.ERROR))
                elif self.capture_content:
                    span.set_attribute("gen_ai.tool.call.result", execution.result)
        finally:
            span.end(end_time=ended)

    # --- span events ----------------------------------------------------------------------------

    def _verdict(self, event: GuardrailVerdict) -> None:
        call = self._calls.get(event.invocation_id)
        if call is None or not call.span.is_recording():
            return
        attributes = guardrail_attributes(event, self.capture_content)
        call.span.add_event("gen_ai.guardrail.result", attributes)

    def _reset(self, event: Reset) -> None:
        call = self._calls.get(event.invocation_id)
        if call is not None:
            call.span.add_event(
                "agentrt.reset",
                {"agentrt.reset.reason": event.reason.value, "agentrt.attempt": event.attempt},
            )

    def _other(self, event: object) -> None:
        """Events this module does not know by type (any later one), as an event on the invocation
        span named for its class, without its fields."""
        invocation_id = getattr(event, "invocation_id", None)
        call = self._calls.get(invocation_id) if isinstance(invocation_id, str) else None
        if call is None or not call.span.is_recording():
            return
        call.span.add_event("agentrt." + snake(type(event).__name__))

    def _retrieved(self, event: Retrieved) -> None:
        call = self._calls.get(event.invocation_id)
        if call is None or not call.span.is_recording():
            return
        attributes = retrieval_attributes(event, self.capture_content)
        call.span.add_event("retrieval", attributes)
