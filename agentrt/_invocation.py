"""The pipeline: one invocation of a service method as one async stream of events.

There is one loop. Awaiting a method, reading a `TokenStream`, or (later) an SSE endpoint are all folds
over `Invocation.events()`. Stages, in order: bind (done by the caller) → render → input guardrails →
memory → retrieval → output format → model ⇄ tools → output guardrails → parse → commit. Stages that
later work fills are explicit methods here that currently pass their input through.

The generator runs in the reader's task. It never holds a task group or a cancel scope across a
`yield`; the only scope it enters is a shield around closing the model stream, so the adapter's cleanup
finishes even on trio, where cancellation is level-triggered.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

import anyio

from ._errors import ConfigurationError, ContentRefusedError, ToolLoopLimitError
from ._events import (
    CancelledEvent,
    Completed,
    Event,
    FailedEvent,
    LifecycleEvent,
    ModelResponse,
    RefusalDelta,
    RequestIssued,
    ResponseReceived,
    Result,
    Started,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
    ToolExecution,
    Usage,
)
from ._messages import ChatMessage, SystemMessage, TextContent, ToolCall, UserMessage
from .models._protocol import (
    ChatModel,
    ModelRequest,
    ModelSettings,
    ResponseAccumulator,
    aclose_iterator,
)
from .tools._declare import ToolContext, ToolDefinition, collect_tools
from .tools._run import (
    FINAL_ANSWER_PROMPT,
    LoopLimit,
    ThreadLimiter,
    ToolLoop,
    ToolSettings,
    arguments_hash,
)

if TYPE_CHECKING:
    from ._spec import MethodSpec

__all__ = [
    "Invocation",
    "Listener",
    "Runtime",
    "SystemMessageProvider",
    "ToolProvider",
    "ToolRequest",
]

logger = logging.getLogger("agentrt")

Listener = Callable[[LifecycleEvent], None]
"""Receives lifecycle events (not text deltas). Exceptions it raises are logged and ignored."""

SystemMessageProvider = Callable[[Any], "str | Awaitable[str | None] | None"]
"""Gives the system message for a memory id (used when neither method nor class declares one).

Its text is used literally; it is not rendered as a template. It may be async."""

DEFAULT_MEMORY_ID: Final = "default"

# Chunks the pipeline forwards to readers as they are; the others are folded into ResponseReceived.
_FORWARD: Final = frozenset({TextDelta, ThinkingDelta, RefusalDelta, Usage})


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """What a dynamic tool provider is asked with, once per invocation."""

    method: str
    user_message: UserMessage
    memory_id: Any


ToolProvider = Callable[[ToolRequest], "Iterable[object] | Awaitable[Iterable[object]]"]
"""Returns extra tools (functions or objects with @tool methods) for one invocation; may be async."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """The typed configuration of one built service, shared by all its invocations."""

    model: ChatModel
    listeners: tuple[Listener, ...] = ()
    system_message: SystemMessageProvider | None = None
    variables: Mapping[str, str] | None = None
    settings: ModelSettings | None = None
    tools: Mapping[str, ToolDefinition] = field(default_factory=dict)
    tool_provider: ToolProvider | None = None
    tool_settings: ToolSettings = field(default_factory=ToolSettings)
    threads: ThreadLimiter = field(default_factory=lambda: ThreadLimiter(ToolSettings().thread_limit))


def _notify(listeners: Sequence[Listener], event: LifecycleEvent) -> None:
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            logger.exception(
                "listener %r raised on %s; the invocation goes on", listener, type(event).__name__
            )


def _final_request(request: ModelRequest) -> ModelRequest:
    """The last request of a stopped tool loop: no tools, and a request for an answer.

    The unanswered tool calls of the last response are not sent: an assistant message with tool calls
    must be followed by their results, and those calls never ran.
    """
    prompt = UserMessage.of(FINAL_ANSWER_PROMPT)
    return replace(request, messages=(*request.messages, prompt), tools=(), tool_choice=None)


def _with_instructions(message: UserMessage, instructions: str) -> UserMessage:
    """The message with `instructions` appended to its last text content."""
    contents = list(message.contents)
    for i in range(len(contents) - 1, -1, -1):
        content = contents[i]
        if isinstance(content, TextContent):
            contents[i] = TextContent(text=f"{content.text}\n{instructions}")
            break
    else:
        contents.append(TextContent(text=instructions))
    return message.model_copy(update={"contents": tuple(contents)})


class Invocation:
    """One call of a service method. Create, then read `events()` once (or await `result()`)."""

    __slots__ = ("_arguments", "_runtime", "_spec", "id")

    def __init__(self, runtime: Runtime, spec: MethodSpec, arguments: dict[str, Any]) -> None:
        self._runtime = runtime
        self._spec = spec
        self._arguments = arguments
        self.id = uuid.uuid4().hex

    async def result(self) -> Result[Any]:
        """Run to the end and return the result: the fold of `events()`."""
        result: Result[Any] | None = None
        events = self.events()
        try:
            async for event in events:
                if type(event) is Completed:
                    result = event.result
        finally:
            await events.aclose()
        assert result is not None, "an invocation ends with Completed or raises"
        return result

    async def events(self) -> AsyncGenerator[Event, None]:
        """The invocation's events, ending with `Completed`; errors are raised, not yielded."""
        runtime, spec, arguments = self._runtime, self._spec, self._arguments
        listeners = runtime.listeners
        memory_id = arguments[spec.memory_param] if spec.memory_param else DEFAULT_MEMORY_ID
        started = Started(self.id, spec.qualname, memory_id)
        if listeners:
            _notify(listeners, started)
        done = False
        try:
            yield started
            # render
            values = spec.template_values(arguments, runtime.variables or {})
            user = spec.render_user(arguments, values)
            system = await self._system_message(values, memory_id)
            # input guardrails, memory, retrieval
            user = await self._input_guardrails(user)
            history = await self._load_memory(memory_id)
            user = await self._augment(user)
            tools = await self._tools(user, memory_id)
            # output format
            capabilities = runtime.model.capabilities
            instructions = spec.parser.instructions(capabilities)
            outgoing = _with_instructions(user, instructions) if instructions else user
            messages: list[ChatMessage] = [SystemMessage(text=system)] if system else []
            messages.extend(history)
            messages.append(outgoing)
            specs = tuple(definition.spec for definition in tools.values())
            choice = runtime.tool_settings.tool_choice
            forced = choice is not None and choice not in ("auto", "none")
            offered = specs if capabilities.tool_choice_auto or forced else ()
            request = ModelRequest(
                messages=tuple(messages),
                tools=offered,
                tool_choice=choice if offered else None,
                response_format=spec.parser.response_format(capabilities),
                settings=runtime.settings,
            )
            # model ⇄ tools
            loop = (
                ToolLoop(tools, runtime.tool_settings, self._tool_context(memory_id), runtime.threads)
                if tools
                else None
            )
            usage = Usage()
            round_ = 0
            final: LoopLimit | None = None  # the limit that made this the last request (no tools)
            immediate: list[ToolExecution] | None = None
            while True:
                round_ += 1
                issued = RequestIssued(self.id, request, round_)
                if listeners:
                    _notify(listeners, issued)
                yield issued
                accumulator = ResponseAccumulator()
                add = accumulator.add
                chunks = runtime.model.stream(request)
                try:
                    async for chunk in chunks:
                        add(chunk)
                        if chunk.__class__ in _FORWARD:
                            yield chunk  # type: ignore[misc]
                finally:
                    with anyio.CancelScope(shield=True):
                        await aclose_iterator(chunks)
                response = accumulator.build(request)
                usage = usage + response.usage
                received = ResponseReceived(self.id, response, round_)
                if listeners:
                    _notify(listeners, received)
                yield received
                calls = response.message.tool_calls
                if loop is None or not calls:
                    break
                if final is not None:
                    if not response.message.text:
                        # Asked for an answer without tools, the model called tools again: a typed
                        # error with the partial result, never a silent empty answer.
                        raise self._limit_error(
                            final, loop, response, usage, request.messages, "the model called tools again"
                        )
                    break  # an answer with stray tool calls: the answer counts, the calls do not
                limit = loop.limit_before(calls)
                if limit is not None:
                    self._on_limit(limit, loop, response, usage, (*request.messages, response.message))
                    request = _final_request(request)
                    final = limit
                    continue
                for call in calls:
                    requested = ToolCallRequested(self.id, call, arguments_hash(call.arguments), round_)
                    if listeners:
                        _notify(listeners, requested)
                    yield requested
                executions = await loop.run_round(calls)
                for execution in executions:
                    executed = ToolExecuted(self.id, execution)
                    if listeners:
                        _notify(listeners, executed)
                    yield executed
                request = replace(
                    request,
                    messages=(
                        *request.messages,
                        response.message,
                        *loop.result_messages(executions),
                    ),
                    # The model chooses from now on; a model that cannot gets no more tools.
                    tools=specs if capabilities.tool_choice_auto else (),
                    tool_choice=None,
                )
                if all(not e.is_error and tools[e.name].immediate for e in executions):
                    immediate = executions
                    break
                limit = loop.limit_after()
                if limit is not None:
                    self._on_limit(limit, loop, response, usage, request.messages)
                    request = _final_request(request)
                    final = limit
            # output guardrails, parse, commit
            message = response.message
            if immediate is not None:
                text = "\n".join(e.result for e in immediate)
                if spec.output_kind == "stream":
                    delta = TextDelta(text)
                    yield delta
                only = immediate[0].value if len(immediate) == 1 else None
                value = only if spec.parser.accepts(only) else spec.parser.parse(text)
            else:
                text = await self._output_guardrails(response)
                if message.refusal and not text:
                    raise ContentRefusedError(message.refusal)
                value = spec.parser.parse(text)
            await self._commit(memory_id, user, response)
            result: Result[Any] = Result(
                value=value,
                text=text,
                usage=usage,
                finish_reason=response.finish_reason,
                thinking=message.thinking,
                tool_executions=tuple(loop.executions) if loop else (),
                model=response.model or runtime.model.name,
                messages=(*request.messages, message) if immediate is None else request.messages,
                invocation_id=self.id,
            )
            completed: Completed[Any] = Completed(self.id, result)
            if listeners:
                _notify(listeners, completed)
            done = True
            yield completed
        except BaseException as exc:
            # A reader that stops at Completed and closes the stream is not a cancellation.
            if listeners and not done:
                cancelled = isinstance(exc, GeneratorExit | anyio.get_cancelled_exc_class())
                _notify(listeners, CancelledEvent(self.id) if cancelled else FailedEvent(self.id, exc))
            raise

    def _on_limit(
        self,
        limit: LoopLimit,
        loop: ToolLoop,
        response: ModelResponse,
        usage: Usage,
        messages: tuple[ChatMessage, ...],
    ) -> None:
        """Raise `ToolLoopLimitError`, unless the settings ask for a final answer instead."""
        if self._runtime.tool_settings.on_limit == "final_answer":
            logger.info("invocation %s: tool loop limit %s; asking for a final answer", self.id, limit)
            return
        raise self._limit_error(limit, loop, response, usage, messages)

    def _limit_error(
        self,
        limit: LoopLimit,
        loop: ToolLoop,
        response: ModelResponse,
        usage: Usage,
        messages: tuple[ChatMessage, ...],
        detail: str = "",
    ) -> ToolLoopLimitError:
        partial: Result[Any] = Result(
            value=None,
            text=response.message.text or "",
            usage=usage,
            finish_reason=response.finish_reason,
            thinking=response.message.thinking,
            tool_executions=tuple(loop.executions),
            model=response.model or self._runtime.model.name,
            messages=messages,
            invocation_id=self.id,
        )
        return ToolLoopLimitError(
            f"{self._spec.qualname}: the tool loop stopped at its limit {limit.value!r} "
            f"after {loop.rounds} round(s) and {len(loop.executions)} call(s)"
            + (f"; asked for a final answer, {detail}" if detail else ""),
            reason=limit,
            partial=partial,
        )

    def _tool_context(self, memory_id: Any) -> Callable[[ToolCall, int], ToolContext]:
        def context(call: ToolCall, round_: int) -> ToolContext:
            return ToolContext(self.id, self._spec.qualname, memory_id, call.id, round_)

        return context

    async def _tools(self, user: UserMessage, memory_id: Any) -> Mapping[str, ToolDefinition]:
        """The build's tools plus what the dynamic tool provider adds for this invocation."""
        runtime = self._runtime
        provider = runtime.tool_provider
        if provider is None:
            return runtime.tools
        extra = provider(ToolRequest(self._spec.qualname, user, memory_id))
        if inspect.isawaitable(extra):
            extra = await extra
        added = collect_tools(extra, where=f"{self._spec.qualname}: the tool provider")
        clash = set(added) & set(runtime.tools)
        if clash:
            raise ConfigurationError(
                f"{self._spec.qualname}: the tool provider returned {sorted(clash)}, "
                "which the build already has"
            )
        return {**runtime.tools, **added} if added else runtime.tools

    # --- stages ---------------------------------------------------------------------------------

    async def _system_message(self, values: Mapping[str, Any], memory_id: Any) -> str | None:
        """Method template > class template > the build's provider (whose text is literal)."""
        template = self._spec.system_template
        if template is not None:
            return template.render(values)
        provider = self._runtime.system_message
        if provider is None:
            return None
        text = provider(memory_id)
        if inspect.isawaitable(text):
            text = await text
        return text or None

    async def _input_guardrails(self, user: UserMessage) -> UserMessage:
        """Seam: input guardrails (may rewrite the user message or stop the invocation)."""
        return user

    async def _load_memory(self, memory_id: Any) -> list[ChatMessage]:
        """Seam: lock the conversation and load its history."""
        return []

    async def _augment(self, user: UserMessage) -> UserMessage:
        """Seam: retrieval-augmented generation (the augmented message is not stored)."""
        return user

    async def _output_guardrails(self, response: ModelResponse) -> str:
        """Seam: output guardrails over the final answer (retry and reprompt replay the model)."""
        return response.message.text or ""

    async def _commit(self, memory_id: Any, user: UserMessage, response: ModelResponse) -> None:
        """Seam: write the turn to memory, atomically and only on success."""
