"""What a built service hands every invocation: its typed configuration and the user's callbacks."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._approval import Approvals
from .._budget import Budget
from .._events import LifecycleEvent
from .._messages import UserMessage
from ..guardrails._declare import Guardrail, OutputChain
from ..memory._memory import Memory
from ..memory._store import PendingStore
from ..models._protocol import ChatModel, ModelSettings
from ..moderation._declare import Moderate
from ..output._modes import AnswerTool
from ..rag._augment import Retrieval
from ..tools._declare import ToolDefinition
from ..tools._run import ToolSettings
from ..tools._threads import ThreadLimiter

__all__ = ["Listener", "Runtime", "SystemMessageProvider", "ToolProvider", "ToolRequest", "notify"]

logger = logging.getLogger("agentrt")

Listener = Callable[[LifecycleEvent], None]
"""Receives lifecycle events (not text deltas). Exceptions it raises are logged and ignored."""

SystemMessageProvider = Callable[[Any], "str | Awaitable[str | None] | None"]
"""Gives the system message for a memory id (used when neither method nor class declares one).

Its text is used literally; it is not rendered as a template. It may be async."""


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
    provider: str | None = None
    """Who serves the model, as it declares (`Capabilities.provider`), for `Started.provider`."""
    listeners: tuple[Listener, ...] = ()
    system_message: SystemMessageProvider | None = None
    variables: Mapping[str, str] | None = None
    settings: ModelSettings | None = None
    budget: Budget | None = None
    max_repairs: int = 1
    """How often an answer that does not parse is asked for again (the build's; options override)."""
    tools: Mapping[str, ToolDefinition] = field(default_factory=dict)
    tool_provider: ToolProvider | None = None
    tool_settings: ToolSettings = field(default_factory=ToolSettings)
    threads: ThreadLimiter = field(default_factory=lambda: ThreadLimiter(ToolSettings().thread_limit))
    handles_deadline: bool = False
    """The model stops at `ModelRequest.deadline` itself (`Capabilities.handles_deadline`)."""
    memory: Memory | None = None
    """The service's chat memory, if it keeps conversations."""
    input_guardrails: Mapping[str, tuple[Guardrail, ...]] = field(default_factory=dict)
    """The input guardrail chain of each method that has one (method > class > build), by name."""
    output_guardrails: Mapping[str, OutputChain] = field(default_factory=dict)
    """The output guardrail chain of each method that has one (method > class > build), by name."""
    output_modes: Mapping[str, str] = field(default_factory=dict)
    """How each method with a structured return type asks for it (`schema`, `json`, `instructions`
    or `tool`), by name; the others ask for text."""
    answer_tools: Mapping[str, AnswerTool] = field(default_factory=dict)
    """The `final_answer` tool of each method in tool mode, by name."""
    retrievals: Mapping[str, Retrieval] = field(default_factory=dict)
    """The retrieval of each method that has one (method > class > build), by name."""
    moderations: Mapping[str, Moderate] = field(default_factory=dict)
    """How each moderated method is moderated (with its model resolved), by name."""
    approvals: Mapping[str, Approvals] = field(default_factory=dict)
    """How each method whose tool calls may wait for approval waits (method > class > build), by name."""
    while_pending: Approvals | None = None
    """The build's approvals: what a new turn does on a conversation whose turn waits for approval."""
    gates: bool = False
    """Some method's calls may wait for approval, and the memory's store keeps pending turns: a turn
    that opens a conversation looks for one waiting on it."""
    pending: PendingStore | None = None
    """Where a service without memory keeps its pending turns (in this process)."""


def notify(listeners: Sequence[Listener], event: LifecycleEvent) -> None:
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            logger.exception(
                "listener %r raised on %s; the invocation goes on", listener, type(event).__name__
            )
