"""`build()`: turn a class of `async def` stubs into a service whose methods run the pipeline."""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from ._approval import APPROVALS_ATTR, Approvals
from ._budget import Budget
from ._errors import ConfigurationError
from ._methods import implement
from ._options import check_mode, check_repairs
from ._pipeline import Listener, Runtime, SystemMessageProvider, ToolProvider
from ._spec import MethodSpec, OutputKind, ServiceSpec, service_spec
from .guardrails._declare import INPUT_ATTR, OUTPUT_ATTR, OutputChain, guardrail_chain, output_chain
from .memory._inmemory import InMemoryStore
from .memory._memory import ChatMemory, Memory
from .memory._store import ChatMemoryStore, PendingStore
from .models._protocol import ModelSettings, check_declared_settings
from .moderation._declare import MODERATE_ATTR, Moderate
from .output._modes import ANSWER_TOOL, AnswerTool, answer_tool, resolve_mode
from .output._parsers import TypeParser
from .rag._augment import RETRIEVAL_ATTR, Retrieval
from .tools._declare import ToolDefinition, ToolSource, collect_tools
from .tools._run import ToolSettings
from .tools._threads import ThreadLimiter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._pipeline import ToolRequest
    from .models._protocol import Capabilities, ChatModel
    from .moderation._types import ModerationModel
    from .output._modes import OutputMode

__all__ = ["build", "runtime_of"]

# The runtime of each built service class (for `agentrt.memory.access`), without an attribute on it
# that could clash with the user's own.
_RUNTIMES: weakref.WeakKeyDictionary[type, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(service: object) -> Runtime | None:
    """The runtime of a built service; `None` for any other object."""
    return _RUNTIMES.get(type(service))


S = TypeVar("S")
_D = TypeVar("_D")


def _output_modes(
    spec: ServiceSpec, requested: str, capabilities: Capabilities, tools: Mapping[str, object]
) -> tuple[dict[str, str], dict[str, AnswerTool]]:
    """How each method with a structured return type asks for it (the method's `output_mode` over
    the build's, made concrete for the model), and the answer tool of those in tool mode."""
    modes: dict[str, str] = {}
    answer_tools: dict[str, AnswerTool] = {}
    for name, method in spec.methods.items():
        own = method.options.output_mode if method.options is not None else None
        parser = method.parser
        if not isinstance(parser, TypeParser):
            if own not in (None, "auto"):
                raise ConfigurationError(
                    f"{method.qualname}: output_mode {own!r} is for structured return types; this "
                    f"method returns {parser.target}"
                )
            continue
        try:
            mode = resolve_mode(own or requested, capabilities)
        except ValueError as exc:
            raise ConfigurationError(f"{method.qualname}: {exc}") from None
        modes[name] = mode
        if mode == "tool":
            if ANSWER_TOOL in tools:
                raise ConfigurationError(
                    f"{method.qualname}: a tool is named {ANSWER_TOOL!r}, the name of the answer tool "
                    "in output_mode 'tool'; rename it"
                )
            answer_tools[name] = answer_tool(parser, capabilities)
    return modes, answer_tools


def _check_settings(spec: ServiceSpec, capabilities: Capabilities, settings: ModelSettings | None) -> None:
    """Settings the model declares it refuses on every request (`Capabilities.min_max_tokens`,
    `fixed_temperature`) are build errors: the build's, and each method's own (laid over the build's)."""
    if settings is not None:
        check_declared_settings(capabilities, settings, spec.cls.__name__)
    for method in spec.methods.values():
        own = method.options.settings if method.options is not None else None
        if own is not None:
            merged = settings.merge(own) if settings is not None else own
            check_declared_settings(capabilities, merged, method.qualname)


def _check_model(model: object) -> None:
    missing = [name for name in ("name", "capabilities", "stream") if not hasattr(model, name)]
    if missing:
        raise ConfigurationError(f"model {model!r} is not a ChatModel: it lacks {', '.join(missing)}")
    _refuse_moved(model)


def _refuse_moved(model: object) -> None:
    """A model that declares as attributes of its own what moved into its `Capabilities` (as
    agentrt once read them: `handles_deadline = True`, `provider = "..."`, a `check_settings`
    method) is refused: agentrt no longer reads them, and ignoring them would silently change
    deadlines, traces and build checks. Looked up statically (no property or `__getattr__` runs);
    values of another type than the old declaration's are the model's own business and pass."""
    moved = []
    if isinstance(inspect.getattr_static(model, "handles_deadline", None), bool):
        moved.append("handles_deadline (now Capabilities.handles_deadline)")
    if isinstance(inspect.getattr_static(model, "provider", None), str):
        moved.append("provider (now Capabilities.provider)")
    if callable(inspect.getattr_static(model, "check_settings", None)):
        moved.append(
            "check_settings (declare the settings it refuses instead: Capabilities.min_max_tokens, "
            "Capabilities.fixed_temperature)"
        )
    if moved:
        raise ConfigurationError(
            f"model {model!r} declares {'; '.join(moved)} as its own attributes, which agentrt no "
            "longer reads: declare them in the Capabilities its `capabilities` returns "
            "(dataclasses.replace(capabilities, ...))"
        )


def _check_tool_choice(
    owner: str,
    model: ChatModel,
    settings: ToolSettings | None,
    definitions: Mapping[str, object],
    provider: ToolProvider | None,
) -> None:
    """Tool choices the model cannot honour are build errors, not failures of every call."""
    if not definitions and provider is None:
        return
    capabilities = model.capabilities
    choice = settings.tool_choice if settings else None
    named = choice not in (None, "auto", "none", "required")
    if choice == "required" and not capabilities.tool_choice_required:
        raise ConfigurationError(
            f"{owner}: tool_choice 'required', but model {model.name!r} does not declare "
            "Capabilities.tool_choice_required"
        )
    if named and not capabilities.tool_choice_named:
        raise ConfigurationError(
            f"{owner}: tool_choice {choice!r} forces a tool, but model {model.name!r} does not "
            "declare Capabilities.tool_choice_named"
        )
    if named and provider is None and choice not in definitions:
        raise ConfigurationError(f"{owner}: tool_choice {choice!r} names no configured tool")
    if not capabilities.tool_choice_auto and not named and choice != "none":
        raise ConfigurationError(
            f"{owner}: model {model.name!r} cannot choose tools itself "
            "(Capabilities.tool_choice_auto is false), so its tools would never be offered: "
            "force one with ToolSettings(tool_choice='<tool name>')"
        )


def _with_sources(sources: Sequence[ToolSource], provider: ToolProvider | None) -> ToolProvider:
    """A tool provider that asks each source (and the build's own provider) at every invocation."""

    async def provide(request: ToolRequest) -> list[object]:
        found: list[object] = []
        for source in sources:
            found.extend(await source(request))
        if provider is not None:
            extra = provider(request)
            if inspect.isawaitable(extra):
                extra = await extra
            found.extend(extra)
        return found

    return provide


def _declared(spec: ServiceSpec, attr: str, at_build: _D) -> dict[str, _D]:
    """What each method declares under `attr` (a decorator's value): the method's own, else its
    class's, else the build's; methods whose value is empty are left out."""
    on_class = getattr(spec.cls, attr, None)
    declared = {}
    for name, method_spec in spec.methods.items():
        value = getattr(method_spec.function, attr, None)
        if value is None:
            value = on_class if on_class is not None else at_build
        if value:
            declared[name] = value
    return declared


_PROCESS_PENDING: Final = InMemoryStore()
"""Where services without memory keep their turns that wait for approval: one store per process, so
that any build of the class (one per request, say) resumes them; keyed by run id (random, 128 bits)."""


def _approvals(
    spec: ServiceSpec,
    approvals: Approvals | None,
    tools: Mapping[str, ToolDefinition],
    tool_provider: ToolProvider | None,
    memory: ChatMemory | None,
) -> tuple[dict[str, Approvals], bool, PendingStore | None]:
    """The approvals of each method whose tool calls may wait for a human (declared ones, or the
    defaults where a tool, or the tool provider's, may ask for approval); whether a turn must look
    for a pending one on its conversation; and the in-process store of a service without memory.

    A store that keeps no pending turns is refused when approvals are declared; with only a tool
    provider (which may return tools that need approval) a turn whose call needs one fails then."""
    declared = _declared(spec, APPROVALS_ATTR, cast("Approvals", approvals))
    own = any(definition.needs_approval is not False for definition in tools.values())
    resolved: dict[str, Approvals] = {}
    for name in spec.methods:
        found = declared.get(name)
        if found is None and (own or tool_provider is not None):
            found = approvals or Approvals()
        if found is not None:
            resolved[name] = found
    if not resolved:
        return resolved, False, None
    if memory is None:
        return resolved, False, _PROCESS_PENDING
    store = memory.store
    keeps = isinstance(store, PendingStore)
    if not keeps and (own or declared):
        raise ConfigurationError(
            f"{spec.cls.__name__}: tool calls may wait for approval, but memory store {store!r} keeps no "
            "pending turns (save_pending, load_pending, take_pending: see agentrt.memory.PendingStore)"
        )
    return resolved, keeps, None


def _check_release(method: MethodSpec, chain: OutputChain) -> None:
    """A release policy other than `buffer` is for streaming methods (declared on a class, it leaves
    the others alone), and `chunked` needs guardrails that can judge part of an answer."""
    if chain.release == "buffer":
        return
    if method.output_kind not in (OutputKind.STREAM, OutputKind.PARTIAL):
        if getattr(method.function, OUTPUT_ATTR, None) is chain:
            raise ConfigurationError(
                f"{method.qualname}: release {chain.release!r} is for methods that stream; this one "
                "returns the whole answer, which its guardrails check before it returns"
            )
        return
    if chain.release == "chunked":
        whole = [guardrail.name for guardrail in chain.guardrails if not guardrail.partial]
        if whole:
            raise ConfigurationError(
                f"{method.qualname}: release 'chunked' checks each chunk of the answer, but "
                f"{', '.join(whole)} cannot judge part of one (it does not declare partial_text); mark "
                "it @partial_text (an object: partial_text = True) if it can, or use 'buffer' or "
                "'optimistic'"
            )


def _moderations(
    spec: ServiceSpec, model: ModerationModel | None, chains: Mapping[str, OutputChain]
) -> dict[str, Moderate]:
    """How each `@moderate` method is moderated, with its model resolved; a moderated answer must be
    held until it passed, which `chunked` and `optimistic` releases do not do."""
    if model is not None and (isinstance(model, type) or not callable(getattr(model, "moderate", None))):
        kind = "a class (pass an instance)" if isinstance(model, type) else "not a ModerationModel"
        raise ConfigurationError(
            f"{spec.cls.__name__}: moderation_model {model!r} is {kind}: it needs a moderate(texts) method"
        )
    resolved: dict[str, Moderate] = {}
    for name, declared in _declared(spec, MODERATE_ATTR, cast("Moderate", None)).items():
        method = spec.methods[name]
        if declared.model is None:
            if model is None:
                raise ConfigurationError(
                    f"{method.qualname}: @moderate names no model and build() has no moderation_model"
                )
            declared = dataclasses.replace(declared, model=model)
        chain = chains.get(name)
        if declared.answer and chain is not None and chain.release != "buffer":
            if method.output_kind in (OutputKind.STREAM, OutputKind.PARTIAL):
                raise ConfigurationError(
                    f"{method.qualname}: @moderate(answer=True) holds the answer until it passed, but its "
                    f"output guardrails release text before that (release {chain.release!r}); use 'buffer'"
                )
        resolved[name] = declared
    return resolved


def build(
    cls: type[S],
    /,
    *,
    model: ChatModel,
    system_message: SystemMessageProvider | None = None,
    variables: Mapping[str, str] | None = None,
    listeners: Sequence[Listener] = (),
    settings: ModelSettings | None = None,
    tools: Sequence[object] = (),
    tool_provider: ToolProvider | None = None,
    tool_settings: ToolSettings | None = None,
    budget: Budget | None = None,
    max_repairs: int = 1,
    output_mode: OutputMode = "auto",
    memory: ChatMemory | ChatMemoryStore | None = None,
    input_guardrails: Sequence[object] = (),
    output_guardrails: Sequence[object] = (),
    retrieval: Retrieval | None = None,
    moderation_model: ModerationModel | None = None,
    approvals: Approvals | None = None,
) -> S:
    """Build a service: an instance of `cls` whose stub methods call `model`.

    - `system_message`: the system message for a memory id, used where neither the method nor the
      class declares one (its text is used literally).
    - `variables`: fixed template values (e.g. `{"shop": "Acme"}`) visible to every template.
    - `listeners`: receive lifecycle events of every invocation; a raising listener is logged.
    - `settings`: request parameters (temperature, max_tokens, ...) for every request.
    - `tools`: functions and objects with `@tool` methods the model may call, and tool sources
      whose tools are known when a call runs (`agentrt.mcp.MCPTools`), asked at each invocation.
    - `tool_provider`: called once per invocation with a `ToolRequest`; returns extra tools.
    - `tool_settings`: timeouts, concurrency, loop limits and failure policies (`ToolSettings`).
    - `budget`: what one call may spend (`Budget`: seconds, tokens, model requests, tool calls);
      `@method_options` and the call's own options override it field by field.
    - `max_repairs`: how often an answer that does not parse into the return type is asked for
      again, with what was wrong (default 1); `@method_options` and `call_options` override it.
    - `output_mode`: how methods with a structured return type ask for it: `"schema"` (a JSON-schema
      response format), `"json"` (JSON mode and the schema in the instructions), `"instructions"`
      (format instructions only), `"tool"` (a forced `final_answer` tool whose parameters are the
      schema), or `"auto"` (the default: schema, else tool where the model declares
      `Capabilities.tool_output`, else JSON mode, else instructions, as the model allows).
      `@method_options(output_mode=...)` overrides it for one method.
    - `input_guardrails`: checks on the user message of every method that declares none itself (nor
      its class), run in order before any model request (see `agentrt.guardrails`).
    - `output_guardrails`: checks on the answers of every method that declares none itself (nor its
      class), with the defaults of `@output_guardrails` (`max_retries=2`, `release="buffer"`).
    - `memory`: chat memory (`agentrt.memory.window(...)`, a `ChatMemory`, or a bare store, which
      keeps whole conversations): turns on one memory id see the turns before them.
    - `retrieval`: what every method that declares none itself (`@retrieval`, nor its class)
      retrieves before the model is asked (`agentrt.rag.Retrieval`).
    - `moderation_model`: the model of every `@moderate` declaration that names none.
    - `approvals`: how tool calls wait for a human's approval (`Approvals`: which tools, how long a
      pending approval lasts, what a new message does meanwhile) for every method that declares none
      itself (`@Approvals(...)`, nor its class). Tools declare their own with
      `@tool(needs_approval=...)`; see `agentrt.resume`.

    Raises `ConfigurationError`, naming `Class.method` and the parameter, for every declaration
    mistake; nothing is deferred to the first call.
    """
    spec = service_spec(cls)
    _check_model(model)
    static = dict(variables or {})
    for key, value in static.items():
        if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, str):
            raise ConfigurationError(
                f"{cls.__name__}: variables must map identifiers to strings, got {key!r}: {value!r}"
            )
    for listener in listeners:
        if not callable(listener):
            raise ConfigurationError(f"{cls.__name__}: listener {listener!r} is not callable")
    if system_message is not None and not callable(system_message):
        raise ConfigurationError(f"{cls.__name__}: system_message must be a callable of memory id")
    capabilities = model.capabilities
    for method_spec in spec.methods.values():
        method_spec.check(static, capabilities, model.name)
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise ConfigurationError(f"{cls.__name__}: tools must be a list of functions or objects")
    if tool_provider is not None and not callable(tool_provider):
        raise ConfigurationError(f"{cls.__name__}: tool_provider must be callable")
    sources = [item for item in tools if isinstance(item, ToolSource)]
    if sources:  # their tools are known at each invocation: asked as a tool provider is
        tools = [item for item in tools if not isinstance(item, ToolSource)]
        tool_provider = _with_sources(sources, tool_provider)
    definitions = collect_tools(tools, where=cls.__name__)
    if (definitions or tool_provider is not None) and not capabilities.tools:
        raise ConfigurationError(
            f"{cls.__name__}: tools are configured but model {model.name!r} does not declare "
            "Capabilities.tools"
        )
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigurationError(f"{cls.__name__}: budget must be an agentrt.Budget, got {budget!r}")
    check_repairs(cls.__name__, max_repairs)
    check_mode(cls.__name__, output_mode)
    if settings is not None and not isinstance(settings, ModelSettings):
        raise ConfigurationError(
            f"{cls.__name__}: settings must be an agentrt.ModelSettings, got {settings!r}"
        )
    _check_settings(spec, capabilities, settings)
    if memory is not None and not isinstance(memory, ChatMemory):
        if not isinstance(memory, ChatMemoryStore):
            raise ConfigurationError(
                f"{cls.__name__}: memory must be an agentrt.memory.ChatMemory or a ChatMemoryStore, "
                f"got {memory!r}"
            )
        memory = ChatMemory(store=memory)
    input_chains = _declared(
        spec, INPUT_ATTR, guardrail_chain(input_guardrails, f"{cls.__name__}: input_guardrails")
    )
    output_chains = _declared(
        spec, OUTPUT_ATTR, output_chain(output_guardrails, 2, "buffer", f"{cls.__name__}: output_guardrails")
    )
    output_chains = {name: chain for name, chain in output_chains.items() if chain.guardrails}
    for name, chain in output_chains.items():
        _check_release(spec.methods[name], chain)
    if retrieval is not None and not isinstance(retrieval, Retrieval):
        raise ConfigurationError(
            f"{cls.__name__}: retrieval must be an agentrt.rag.Retrieval, got {retrieval!r}"
        )
    # (`_declared` leaves out methods whose value is empty: None, or `()` for `@retrieval(None)`)
    retrievals = _declared(spec, RETRIEVAL_ATTR, cast("Retrieval", retrieval))
    moderations = _moderations(spec, moderation_model, output_chains)
    tool_settings = tool_settings or ToolSettings()
    _check_tool_choice(cls.__name__, model, tool_settings, definitions, tool_provider)
    modes, answer_tools = _output_modes(spec, output_mode, capabilities, definitions)

    if approvals is not None and not isinstance(approvals, Approvals):
        raise ConfigurationError(f"{cls.__name__}: approvals must be an agentrt.Approvals, got {approvals!r}")
    method_approvals, gates, pending = _approvals(spec, approvals, definitions, tool_provider, memory)

    runtime = Runtime(
        model=model,
        provider=capabilities.provider or None,
        listeners=tuple(listeners),
        system_message=system_message,
        variables=MappingProxyType(static),
        settings=settings,
        tools=MappingProxyType(definitions),
        tool_provider=tool_provider,
        tool_settings=tool_settings,
        threads=ThreadLimiter(tool_settings.thread_limit),
        budget=budget,
        max_repairs=max_repairs,
        handles_deadline=capabilities.handles_deadline,
        memory=Memory(memory, f"{cls.__module__}.{cls.__qualname__}") if memory is not None else None,
        input_guardrails=MappingProxyType(input_chains),
        output_guardrails=MappingProxyType(output_chains),
        output_modes=MappingProxyType(modes),
        answer_tools=MappingProxyType(answer_tools),
        retrievals=MappingProxyType(retrievals),
        moderations=MappingProxyType(moderations),
        approvals=MappingProxyType(method_approvals),
        while_pending=approvals,
        gates=gates,
        pending=pending,
    )
    namespace: dict[str, Any] = {
        name: implement(method_spec, runtime) for name, method_spec in spec.methods.items()
    }
    namespace["__module__"] = cls.__module__
    namespace["__qualname__"] = cls.__qualname__
    namespace["__repr__"] = lambda self: f"<{cls.__qualname__} service on {model.name!r}>"
    service_class = type(cls.__name__, (cls,), namespace)
    _RUNTIMES[service_class] = runtime
    instance: S = object.__new__(service_class)
    return instance
