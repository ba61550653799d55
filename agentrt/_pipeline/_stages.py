"""The stages before the model is asked: render, memory, input guardrails, retrieval, tools, output
format. Each is a small function over the `Turn`; `prepare` runs them in order and leaves the first
request in `turn.request`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Final

from .._errors import ConfigurationError
from .._events import Retrieved, Started
from .._messages import ChatMessage, SystemMessage, TextContent, UserMessage
from ..guardrails._run import run_input
from ..models._protocol import ModelRequest, ToolSpec
from ..output._modes import ANSWER_TOOL
from ..rag._augment import augmented
from ..rag._augment import run as run_retrieval
from ..rag._types import Query
from ..tools._declare import ToolContext, ToolDefinition, collect_tools
from ..tools._loop import ToolLoop
from . import _approve
from ._runtime import ToolRequest, notify
from ._turn import Phase

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._events import GuardrailVerdict
    from .._messages import ToolCall
    from ..guardrails._declare import Guardrail
    from ..rag._augment import Retrieval
    from ._turn import Turn

__all__ = ["may_wait", "prepare", "reopen", "started"]

_REQUEST: Final = Phase.REQUEST  # (read once: on 3.11 enum members go through `EnumType.__getattr__`)


def started(turn: Turn) -> Started:
    """The event a run of the turn starts with (listeners have it)."""
    runtime = turn.runtime
    event = Started(turn.id, turn.spec.qualname, turn.memory_id, runtime.model.name, runtime.provider)
    if runtime.listeners:
        notify(runtime.listeners, event)
    return event


async def prepare(turn: Turn) -> None:
    """Run the stages before the model ⇄ tools loop; leaves the first request in `turn.request`.

    Stages with nothing configured that could wait are plain calls: an await of an empty coroutine
    costs as much as the rest of a stage.
    """
    runtime = turn.runtime
    render(turn)
    if turn.system is None and runtime.system_message is not None:
        await provided_system_message(turn)
    history = await load_memory(turn) if runtime.memory is not None else []
    if runtime.gates:  # a turn of this conversation may wait for approval: refuse, or deny it
        await _approve.pending_on_open(turn)
        assert turn.conversation is not None
        history = turn.conversation.history()
    turn.history = tuple(history)
    chain = turn.plan.input_chain
    if chain is not None and not getattr(chain, "parallel", False):  # (a parallel one races the model)
        await input_guardrails(turn, chain, history)
    retrieval = turn.plan.retrieval
    if retrieval is not None:
        await retrieve(turn, retrieval)
    else:
        turn.outgoing = turn.user
    if runtime.tool_provider is not None:
        await provided_tools(turn)
    else:
        select_tools(turn, runtime.tools)
    turn.request = first_request(turn, history)
    # Judged while the model answers the first request: moderation of the user's message, and a
    # parallel input chain.
    plan = turn.plan
    turn.moderating = plan.moderation is not None and bool(turn.user is not None and turn.user.text)
    turn.checking = chain is not None and getattr(chain, "parallel", False)
    turn.phase = _REQUEST


async def reopen(turn: Turn) -> None:
    """Re-attach a restored turn's live parts: its conversation, locked again (the history the turn
    had is in its requests), and its tools (the tool provider asked again) with the tool loop's
    state as it was saved."""
    runtime = turn.runtime
    if runtime.memory is not None and turn.conversation is None:  # (a resumed approval holds it)
        await load_memory(turn)
    if runtime.tool_provider is not None:
        await provided_tools(turn)
    else:
        select_tools(turn, runtime.tools)
    saved = turn.restoring
    turn.restoring = None
    if saved is not None and turn.loop is not None:
        turn.loop.restore(*saved)


def may_wait(turn: Turn) -> bool:
    """Whether `prepare` may wait (on a user's provider, a conversation's lock or its store, a
    retriever)."""
    runtime = turn.runtime
    plan = turn.plan
    return (
        runtime.system_message is not None
        or runtime.tool_provider is not None
        or runtime.memory is not None
        or plan.input_chain is not None
        or plan.retrieval is not None
    )


def render(turn: Turn) -> None:
    """The user message from the template (or the one parameter) and contents; the system message
    from the method's or the class's template."""
    spec = turn.spec
    values = spec.template_values(turn.arguments, turn.runtime.variables or {})
    turn.user = spec.render_user(turn.arguments, values)
    template = spec.system_template
    if template is not None:
        turn.system = template.render(values)


async def provided_system_message(turn: Turn) -> None:
    """The build's system message provider, when no template declares one (its text is literal)."""
    provider = turn.runtime.system_message
    assert provider is not None
    text = provider(turn.memory_id)
    if inspect.isawaitable(text):
        text = await text
    turn.system = text or None


async def input_guardrails(turn: Turn, chain: tuple[Guardrail, ...], history: list[ChatMessage]) -> None:
    """The input chain over the user message: it may rewrite `turn.user` (what the model sees and
    memory stores) or stop the invocation with `InputGuardrailError`, before any model request.

    It runs after the memory stage, so that guardrails can read the conversation so far; a turn it
    stops has its conversation released and stores nothing."""
    assert turn.user is not None
    listeners = turn.runtime.listeners

    def report(verdict: GuardrailVerdict) -> None:
        turn.verdicts.append(verdict)
        if listeners:
            notify(listeners, verdict)

    turn.user = await run_input(
        chain,
        turn.user,
        invocation_id=turn.id,
        method=turn.spec.qualname,
        memory_id=turn.memory_id,
        history=turn.history,
        report=report,
    )


async def load_memory(turn: Turn) -> list[ChatMessage]:
    """Lock the conversation (waiting for a turn that holds it) and load the window of its history.
    The invocation releases the lock however it ends."""
    memory = turn.runtime.memory
    assert memory is not None
    turn.opening = True
    turn.conversation = conversation = await memory.open(turn.memory_id, turn.spec.qualname)
    turn.opening = False
    return conversation.history()


async def retrieve(turn: Turn, retrieval: Retrieval) -> None:
    """Retrieval-augmented generation: contents found for the user's message are injected into
    `turn.outgoing`, the message the model sees; memory stores `turn.user`, the user's own. The
    contents become the result's `sources` and a `Retrieved` event."""
    user = turn.user
    assert user is not None
    where = turn.spec.qualname
    query = Query(user.text, turn.history, turn.memory_id, where)
    found = await run_retrieval(retrieval, query, where)
    if found is None:  # `when` said no
        turn.outgoing = user
        return
    queries, contents, skipped = found
    turn.outgoing = augmented(retrieval, user, contents, where)
    turn.sources = tuple(contents)
    event = turn.retrieved = Retrieved(turn.id, tuple(q.text for q in queries), turn.sources, tuple(skipped))
    listeners = turn.runtime.listeners
    if listeners:
        notify(listeners, event)


async def provided_tools(turn: Turn) -> None:
    """The build's tools plus what the dynamic tool provider adds for this invocation."""
    runtime, spec = turn.runtime, turn.spec
    provider = runtime.tool_provider
    assert provider is not None
    assert turn.user is not None
    extra = provider(ToolRequest(spec.qualname, turn.user, turn.memory_id))
    if inspect.isawaitable(extra):
        extra = await extra
    added = collect_tools(extra, where=f"{spec.qualname}: the tool provider")
    if turn.answer is not None and ANSWER_TOOL in added:
        raise ConfigurationError(
            f"{spec.qualname}: the tool provider returned a tool named {ANSWER_TOOL!r}, the name of "
            "the answer tool in output_mode 'tool'"
        )
    clash = set(added) & set(runtime.tools)
    if clash:
        raise ConfigurationError(
            f"{spec.qualname}: the tool provider returned {sorted(clash)}, which the build already has"
        )
    select_tools(turn, {**runtime.tools, **added} if added else runtime.tools)


def select_tools(turn: Turn, tools: Mapping[str, ToolDefinition]) -> None:
    """The tools of this invocation, and the tool loop that runs them."""
    turn.tools = tools
    if tools:
        runtime = turn.runtime
        turn.loop = ToolLoop(tools, runtime.tool_settings, _tool_context(turn), runtime.threads)


def first_request(turn: Turn, history: list[ChatMessage]) -> ModelRequest:
    """The output format (a JSON schema, format instructions on the outgoing message, or the answer
    tool) and the first request: system message, history, the outgoing user message, the tools on
    offer."""
    runtime, spec = turn.runtime, turn.spec
    capabilities = runtime.model.capabilities
    outgoing = turn.outgoing
    assert outgoing is not None
    mode = turn.plan.output_mode
    offered: tuple[ToolSpec, ...] = ()
    choice = runtime.tool_settings.tool_choice
    if turn.tools:
        specs = tuple(definition.spec for definition in turn.tools.values())
        forced = choice is not None and choice not in ("auto", "none")
        offered = specs if capabilities.tool_choice_auto or forced else ()
    answer = turn.answer
    if answer is not None:
        # Tool mode: the answer tool beside the others, forced unless the build forces another.
        if choice is None or choice == "auto":
            choice = answer.choice if offered else answer.alone
        offered = (*offered, answer.spec)
        instructions = answer.instructions(choice)
    else:
        instructions = spec.parser.instructions(mode)
    if instructions:
        outgoing = turn.outgoing = _with_instructions(outgoing, instructions)
    messages: list[ChatMessage] = [SystemMessage(text=turn.system)] if turn.system else []
    messages.extend(history)
    messages.append(outgoing)
    return ModelRequest(
        messages=tuple(messages),
        tools=offered,
        tool_choice=choice if offered else None,
        response_format=spec.parser.response_format(mode),
        settings=turn.settings,
        deadline=turn.deadline,
    )


def _with_instructions(message: UserMessage, instructions: str) -> UserMessage:
    """The message with `instructions` appended to its last text content."""
    contents = list(message.contents)
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        if isinstance(content, TextContent):
            contents[index] = TextContent(text=f"{content.text}\n{instructions}")
            break
    else:
        contents.append(TextContent(text=instructions))
    return message.model_copy(update={"contents": tuple(contents)})


def _tool_context(turn: Turn) -> Callable[[ToolCall, int], ToolContext]:
    invocation_id, method, memory_id = turn.id, turn.spec.qualname, turn.memory_id

    def context(call: ToolCall, round_: int) -> ToolContext:
        return ToolContext(invocation_id, method, memory_id, call.id, round_)

    return context
