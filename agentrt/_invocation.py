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
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from ._errors import ContentRefusedError
from ._events import (
    Cancelled,
    Completed,
    Event,
    Failed,
    LifecycleEvent,
    ModelResponse,
    RefusalDelta,
    RequestIssued,
    ResponseReceived,
    Result,
    Started,
    TextDelta,
    ThinkingDelta,
    Usage,
)
from ._messages import ChatMessage, SystemMessage, TextContent, UserMessage
from .models._protocol import (
    ChatModel,
    ModelRequest,
    ModelSettings,
    ResponseAccumulator,
    aclose_iterator,
)

if TYPE_CHECKING:
    from ._spec import MethodSpec

__all__ = ["Invocation", "Listener", "Runtime", "SystemMessageProvider"]

logger = logging.getLogger("agentrt")

Listener = Callable[[LifecycleEvent], None]
"""Receives lifecycle events (not text deltas). Exceptions it raises are logged and ignored."""

SystemMessageProvider = Callable[[Any], "str | None"]
"""Gives the system message for a memory id (used when neither method nor class declares one).

Its text is used literally; it is not rendered as a template. It may be async."""

DEFAULT_MEMORY_ID: Final = "default"

# Chunks the pipeline forwards to readers as they are; the others are folded into ResponseReceived.
_FORWARD: Final = frozenset({TextDelta, ThinkingDelta, RefusalDelta, Usage})


@dataclass(frozen=True, slots=True)
class Runtime:
    """The typed configuration of one built service, shared by all its invocations."""

    model: ChatModel
    listeners: tuple[Listener, ...] = ()
    system_message: SystemMessageProvider | None = None
    variables: Mapping[str, str] | None = None
    settings: ModelSettings | None = None


def _notify(listeners: Sequence[Listener], event: LifecycleEvent) -> None:
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            logger.exception(
                "listener %r raised on %s; the invocation goes on", listener, type(event).__name__
            )


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
            # output format
            capabilities = runtime.model.capabilities
            instructions = spec.parser.instructions(capabilities)
            outgoing = _with_instructions(user, instructions) if instructions else user
            messages: list[ChatMessage] = [SystemMessage(text=system)] if system else []
            messages.extend(history)
            messages.append(outgoing)
            request = ModelRequest(
                messages=tuple(messages),
                response_format=spec.parser.response_format(capabilities),
                settings=runtime.settings,
            )
            # model ⇄ tools
            usage = Usage()
            round_ = 0
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
                next_request = await self._tool_round(request, response)
                if next_request is None:
                    break
                request = next_request
            # output guardrails, parse, commit
            text = await self._output_guardrails(response)
            message = response.message
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
                model=response.model or runtime.model.name,
                messages=(*request.messages, message),
                invocation_id=self.id,
            )
            completed: Completed[Any] = Completed(self.id, result)
            if listeners:
                _notify(listeners, completed)
            yield completed
        except BaseException as exc:
            if listeners:
                cancelled = isinstance(exc, GeneratorExit | anyio.get_cancelled_exc_class())
                _notify(listeners, Cancelled(self.id) if cancelled else Failed(self.id, exc))
            raise

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

    async def _tool_round(self, request: ModelRequest, response: ModelResponse) -> ModelRequest | None:
        """Seam: run the tool calls of `response`; return the next request, or None when final."""
        return None

    async def _output_guardrails(self, response: ModelResponse) -> str:
        """Seam: output guardrails over the final answer (retry and reprompt replay the model)."""
        return response.message.text or ""

    async def _commit(self, memory_id: Any, user: UserMessage, response: ModelResponse) -> None:
        """Seam: write the turn to memory, atomically and only on success."""
