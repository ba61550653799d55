"""The method each stub of a built service becomes (`build`): it binds the call's arguments, lays
the call's options over the method's and the build's, starts an `Invocation`, and gives what the
stub's return type says: the value, the `Result`, or a stream started up to the model's first chunk."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, cast

from ._errors import ApprovalRequired
from ._options import CURRENT_OPTIONS, CallOptions
from ._pipeline import READY, Invocation
from ._pipeline._plan import plan
from ._spec import MethodSpec, OutputKind
from ._stream import PartialStream, TokenStream
from .output._parsers import TypeParser
from .output._partial import Snapshots

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable, Callable

    from ._events import Event, Result
    from ._pipeline import Runtime


def starter(spec: MethodSpec, runtime: Runtime) -> Callable[[Any], Invocation]:
    """What starts an invocation of `spec` from its bound arguments, the call's options laid over
    the method's and the build's (the built method's way; `agentrt.durable` starts turns with it)."""
    # Options that do not depend on the call, laid over the build's once.
    base = CallOptions(runtime.budget, runtime.settings, runtime.max_repairs)
    if spec.options is not None:
        base = spec.options.over(base)
    fixed = not spec.option_params
    method_plan = plan(runtime, spec)

    def start(arguments: Any) -> Invocation:
        options = base
        ambient = CURRENT_OPTIONS.get()
        if ambient is not None:
            options = ambient.over(options)
        if not fixed:
            own = spec.call_options(arguments)
            if own is not None:
                options = own.over(options)
        return Invocation(
            runtime,
            spec,
            arguments,
            settings=options.settings,
            budget=options.final_budget(),
            max_repairs=options.max_repairs,
            method_plan=method_plan,
        )

    return start


def implement(spec: MethodSpec, runtime: Runtime) -> Callable[..., Any]:
    bind = spec.bind
    start = starter(spec, runtime)

    def invocation(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Invocation:
        return start(bind(args, kwargs))

    view = _view(spec)
    method: Callable[..., Any]
    if spec.output_kind == OutputKind.RESULT:

        async def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await invocation(args, kwargs).result()

    elif spec.output_kind == OutputKind.VALUE:
        where = spec.qualname

        async def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            result = await invocation(args, kwargs).result()
            if result.approval is not None:
                raise _approval_required(where, result)
            return result.value

    else:

        async def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await view(invocation(args, kwargs))

    functools.update_wrapper(method, spec.function)
    # Show the stub's signature (with `self`), not the wrapper's *args/**kwargs, and drop the
    # markers copied from the stub so the built method is not mistaken for a stub.
    vars(method).pop("__wrapped__", None)
    vars(method).pop("__isabstractmethod__", None)  # an ABC's @abstractmethod stub is implemented
    method.__dict__.pop("__agentrt_user_message__", None)
    method.__dict__.pop("__agentrt_system_message__", None)
    vars(method)["__signature__"] = inspect.signature(spec.function)
    vars(method)["__agentrt_spec__"] = spec  # for agentrt.sse.endpoint(service.method)
    vars(method)["__agentrt_view__"] = view  # for agentrt.resume: the same view of a resumed turn
    return method


def _view(spec: MethodSpec) -> Callable[[Invocation], Awaitable[Any]]:
    """What awaiting the method gives for an invocation: a stream (started up to the model's first
    chunk), the `Result`, or the value (`ApprovalRequired` for a turn that stopped for approval)."""
    # A stream names its method when it warns that it was collected unclosed, and carries its
    # turn's conversation, which follows the task that reads the stream (see `_stream`).
    where = spec.qualname
    if spec.output_kind == OutputKind.STREAM:

        async def stream(started: Invocation) -> TokenStream:
            events, before = await _primed(started)
            return TokenStream(events, where=where, conversation=started._turn.conversation, before=before)

        return stream
    if spec.output_kind == OutputKind.PARTIAL:
        parser = spec.parser
        assert isinstance(parser, TypeParser)

        async def partial(started: Invocation) -> PartialStream[Any]:
            events, before = await _primed(started)
            conversation = started._turn.conversation
            return PartialStream(
                events, Snapshots(parser), where=where, conversation=conversation, before=before
            )

        return partial
    if spec.output_kind == OutputKind.RESULT:
        return Invocation.result

    async def value(started: Invocation) -> Any:
        result = await started.result()
        if result.approval is not None:
            raise _approval_required(where, result)
        return result.value

    return value


def _approval_required(where: str, result: Result[Any]) -> ApprovalRequired:
    approval = result.approval
    assert approval is not None
    names = ", ".join(f"{call.tool} ({call.id})" for call in approval.calls)
    return ApprovalRequired(
        f"{where}: tool call(s) {names} wait for approval (run {approval.run_id!r}); resume with "
        "agentrt.resume(service, run_id, decisions, memory_id=...)",
        approval=approval,
        partial=result,
    )


async def _primed(invocation: Invocation) -> tuple[AsyncGenerator[Event, None], list[Event]]:
    """A stream's events, read up to the model's acceptance of the first request, so that errors
    before it (a connection error, 401, 429, an exceeded context) are raised by the method's await;
    and the events read on the way (`Started`, `RequestIssued`, ...), which the stream gives first."""
    events = invocation.events(prime=True)
    before: list[Event] = []
    try:
        while True:
            event = await events.__anext__()
            if event is cast("object", READY):
                return events, before
            before.append(event)
    except BaseException:
        await events.aclose()
        raise
