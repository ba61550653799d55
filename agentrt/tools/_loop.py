"""Running tools: one round of calls in a task group, failure policies, and the loop's limits.

A round's calls run concurrently; their results go back to the model in the model's order. A failing
tool never cancels its siblings (its failure becomes a tool-result message, or a typed error once the
round is over when its policy is "raise"); cancellation always propagates. The task group is opened and
closed inside `ToolLoop.run_round`, never across a yield of the pipeline.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson
from pydantic import ValidationError

from .._errors import (
    ToolArgumentsError,
    ToolError,
    ToolExecutionError,
    ToolTimeoutError,
    UnknownToolError,
)
from .._events import ToolExecution, ToolOutcome
from .._messages import ImageContent, ToolCall, ToolResultMessage
from ._declare import ToolContext, ToolDefinition, _Injected
from ._run import (
    JOURNAL,
    OUTCOME_UNKNOWN,
    LoopLimit,
    OutcomeUnknownError,
    ToolFailure,
    ToolReturn,
    ToolSettings,
    arguments_hash,
    result_text,
    safe_again,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._threads import ThreadLimiter

__all__ = ["ToolLoop"]

logger = logging.getLogger("agentrt.tools")


def _images(returned: ToolReturn) -> tuple[ImageContent, ...]:
    images = tuple(returned.images)
    for image in images:
        if not isinstance(image, ImageContent):
            raise TypeError(f"ToolReturn.images holds ImageContent only, not {type(image).__name__}")
    return images


def _canonical(arguments: str) -> str:
    try:
        return orjson.dumps(orjson.loads(arguments or "{}"), option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        return arguments


def _describe(error: BaseException) -> str:
    """An error's message; for validation errors without the offending values (they may be data)."""
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
            for e in error.errors(include_url=False, include_input=False)
        )
    return str(error)


def _report(failure: ToolFailure, detail: bool) -> str:
    error = failure.error
    kind = type(error).__name__ if error is not None else None
    described = _describe(error) if detail and error is not None else ""
    message = f": {described}" if described else ""
    if failure.outcome is ToolOutcome.UNKNOWN_TOOL:
        return f"Error: there is no tool named {failure.tool!r}."
    if failure.outcome is ToolOutcome.INVALID_ARGUMENTS:
        return f"Error: tool {failure.tool!r} was called with invalid arguments ({kind}){message}."
    if failure.outcome is ToolOutcome.TIMEOUT:
        return f"Error: tool {failure.tool!r} timed out after {failure.timeout:g} s."
    return f"Error: tool {failure.tool!r} failed ({kind}){message}."


_ERRORS: Final[Mapping[ToolOutcome, type[ToolError]]] = {
    ToolOutcome.INVALID_ARGUMENTS: ToolArgumentsError,
    ToolOutcome.UNKNOWN_TOOL: UnknownToolError,
    ToolOutcome.TIMEOUT: ToolTimeoutError,
    ToolOutcome.ERROR: ToolExecutionError,
}


class ToolLoop:
    """The tool state of one invocation: its tools, its settings, and what has run so far."""

    __slots__ = (
        "_calls",
        "_failed_rounds",
        "_identical",
        "_keyed",
        "context",
        "executions",
        "rounds",
        "settings",
        "threads",
        "tools",
    )

    def __init__(
        self,
        tools: Mapping[str, ToolDefinition],
        settings: ToolSettings,
        context: Callable[[ToolCall, int], ToolContext],
        threads: ThreadLimiter,
    ) -> None:
        self.tools = tools
        self.settings = settings
        self.context = context
        self.threads = threads
        self.executions: list[ToolExecution] = []
        self.rounds = 0
        self._calls = 0
        self._failed_rounds = 0
        self._identical: Counter[tuple[str, str]] = Counter()
        self._keyed: tuple[tuple[ToolCall, ...], list[tuple[str, str]]] | None = None

    def _keys(self, calls: Sequence[ToolCall]) -> list[tuple[str, str]]:
        """(name, canonical arguments) of each call; `limit_before` and `run_round` of one round
        share them when the round's calls are the same (immutable) tuple."""
        keyed = self._keyed
        if keyed is not None and keyed[0] is calls:
            return keyed[1]
        keys = [(call.name, _canonical(call.arguments)) for call in calls]
        if type(calls) is tuple:
            self._keyed = (calls, keys)
        return keys

    def limit_before(self, calls: Sequence[ToolCall]) -> LoopLimit | None:
        """The limit that running `calls` as the next round would break, if any."""
        settings = self.settings
        if self.rounds >= settings.max_rounds:
            return LoopLimit.MAX_ROUNDS
        if self._calls + len(calls) > settings.max_calls:
            return LoopLimit.MAX_CALLS
        identical, most = self._identical, settings.max_identical_calls
        seen: dict[tuple[str, str], int] = {}
        for key in self._keys(calls):
            count = seen[key] = seen.get(key, identical[key]) + 1
            if count > most:
                return LoopLimit.REPEATED_CALL
        return None

    def snapshot(self) -> dict[str, Any]:
        """What has run so far, as data (a turn's checkpoint; executions are saved with the turn)."""
        return {
            "rounds": self.rounds,
            "calls": self._calls,
            "failed_rounds": self._failed_rounds,
            "identical": [[name, arguments, count] for (name, arguments), count in self._identical.items()],
        }

    def restore(self, state: Mapping[str, Any], executions: Sequence[ToolExecution]) -> None:
        """Continue from a `snapshot` and the executions saved with it."""
        self.rounds = state["rounds"]
        self._calls = state["calls"]
        self._failed_rounds = state["failed_rounds"]
        self._identical = Counter({(name, arguments): count for name, arguments, count in state["identical"]})
        self.executions = list(executions)

    def limit_after(self) -> LoopLimit | None:
        """The limit the round that just ran broke, if any."""
        if self._failed_rounds >= self.settings.max_failed_rounds:
            return LoopLimit.FAILED_ROUNDS
        return None

    async def run_round(self, calls: Sequence[ToolCall]) -> list[ToolExecution]:
        """Run one round of calls concurrently; returns their executions in the model's order.

        Raises the first typed `ToolError` (in the model's order) of a failure whose policy is "raise",
        after every call of the round has finished. A round cut short (cancelled, or at a deadline)
        still records the executions of the calls that finished in `executions`.
        """
        self.begin_round(calls)
        executions = await self.run_calls(calls)
        self.end_round(executions)
        return executions

    def begin_round(self, calls: Sequence[ToolCall]) -> None:
        """Count a round of `calls` (all of them, also those that will wait for approval)."""
        self.rounds += 1
        self._calls += len(calls)
        identical = self._identical
        for key in self._keys(calls):
            identical[key] += 1
        self._keyed = None

    def end_round(self, executions: Sequence[ToolExecution]) -> None:
        """The round is over: count it as failed when every call of it failed (a denied call is
        a human's decision, not a failure)."""
        if executions and all(e.is_error and e.outcome is not ToolOutcome.DENIED for e in executions):
            self._failed_rounds += 1
        else:
            self._failed_rounds = 0

    async def run_calls(self, calls: Sequence[ToolCall]) -> list[ToolExecution]:
        """Run `calls` of the current round concurrently (see `run_round`); records their executions."""
        if not calls:
            return []
        journal = JOURNAL.get()
        if journal is not None:
            unsafe = [(self._key(call), call) for call in calls if not self._safe_again(call)]
            if unsafe:
                await journal.settle(unsafe)
        if len(calls) == 1:
            # One call needs neither a task group nor a concurrency limiter (it is always within it).
            done = [await self._execute(calls[0])]
        else:
            results: list[tuple[ToolExecution, ToolError | None] | None] = [None] * len(calls)
            limit = self.settings.max_concurrency
            limiter = anyio.CapacityLimiter(limit) if limit else None

            async def run(index: int, call: ToolCall) -> None:
                if limiter is None:
                    results[index] = await self._execute(call)
                else:
                    async with limiter:
                        results[index] = await self._execute(call)

            try:
                async with anyio.create_task_group() as group:
                    for index, call in enumerate(calls):
                        group.start_soon(run, index, call)
            except BaseException:
                self.executions.extend(r[0] for r in results if r is not None)
                raise
            done = [r for r in results if r is not None]

        executions = [execution for execution, _ in done]
        self.executions.extend(executions)
        for _, error in done:
            if error is not None:
                raise error
        return executions

    def not_run(
        self, call: ToolCall, outcome: ToolOutcome, text: str, error_kind: str | None = None
    ) -> ToolExecution:
        """The execution of a call that was never run (denied, or refused by its approval check),
        recorded with the others: what the model is told about it."""
        execution = ToolExecution(
            name=call.name,
            call_id=call.id,
            arguments_hash=arguments_hash(call.arguments),
            result=text,
            outcome=outcome,
            error_kind=error_kind,
            round=self.rounds,
        )
        self.executions.append(execution)
        return execution

    def result_messages(self, executions: Sequence[ToolExecution]) -> list[ToolResultMessage]:
        return [
            ToolResultMessage(
                tool_call_id=e.call_id, tool_name=e.name, text=e.result, is_error=e.is_error, images=e.images
            )
            for e in executions
        ]

    async def _execute(self, call: ToolCall) -> tuple[ToolExecution, ToolError | None]:
        digest = arguments_hash(call.arguments)
        started = time.perf_counter()
        definition = self.tools.get(call.name)
        timeout: float | None = None
        outcome = ToolOutcome.SUCCESS
        error: BaseException | None = None
        value: Any = None
        journal = JOURNAL.get()
        key: str | None = None
        unknown = False
        if definition is not None and (journal is not None or OUTCOME_UNKNOWN.get()):
            if not safe_again(definition.annotations):
                if journal is None:
                    unknown = True
                else:
                    key = self._key(call, digest)
                    known = await journal.before(key)
                    if isinstance(known, dict):  # finished before: its outcome, not run again
                        return self._recorded(call, digest, known), None
                    unknown = known
        if definition is None:
            outcome = ToolOutcome.UNKNOWN_TOOL
        elif unknown:
            outcome = ToolOutcome.ERROR
            error = OutcomeUnknownError(
                f"the outcome of this call of {call.name} is unknown: it started in a worker that stopped "
                "before it finished, and it was not run again"
            )
        else:
            timeout = definition.timeout if definition.timeout is not None else self.settings.timeout
            try:
                arguments = definition.arguments.model_validate_json(call.arguments or "{}")
            except ValidationError as exc:
                outcome, error = ToolOutcome.INVALID_ARGUMENTS, exc
            else:
                kwargs: dict[str, Any]
                if definition.raw:  # declared by a JSON schema: the arguments as sent, one dict
                    kwargs = {"arguments": arguments.model_dump(mode="json")}
                else:
                    kwargs = {param: getattr(arguments, field) for field, param in definition.fields}
                if definition.injected:
                    context = self.context(call, self.rounds)
                    for name, kind in definition.injected.items():
                        kwargs[name] = context.memory_id if kind == _Injected.MEMORY_ID else context
                try:
                    if timeout is None:
                        value = await self._call(definition, kwargs)
                    else:
                        with anyio.move_on_after(timeout) as scope:
                            value = await self._call(definition, kwargs)
                        if scope.cancelled_caught:
                            outcome = ToolOutcome.TIMEOUT
                except Exception as exc:
                    outcome, error = ToolOutcome.ERROR, exc
        duration = time.perf_counter() - started
        raised: ToolError | None = None
        text = ""
        images: tuple[ImageContent, ...] = ()
        if outcome is ToolOutcome.SUCCESS:
            try:
                while isinstance(value, ToolReturn):  # (one in another: a wrapper added images)
                    images += _images(value)
                    value = value.value
                text = result_text(value)
            except Exception as exc:  # e.g. a return value JSON cannot carry
                outcome, error, images = ToolOutcome.ERROR, exc, ()
        if outcome is not ToolOutcome.SUCCESS:
            text, raised = await self._failure_text(ToolFailure(outcome, call.name, call, error, timeout))
        logger.debug(
            "tool %s call %s arguments #%s: %s in %.3f s",
            call.name,
            call.id,
            digest,
            outcome,
            duration,
        )
        execution = ToolExecution(
            name=call.name,
            call_id=call.id,
            arguments_hash=digest,
            result=text,
            outcome=outcome,
            error_kind=type(error).__name__ if error is not None else None,
            round=self.rounds,
            duration=duration,
            value=value,
            images=images,
        )
        if key is not None:
            assert journal is not None
            await journal.after(
                key,
                {
                    "result": text,
                    "outcome": outcome.value,
                    "error_kind": execution.error_kind,
                    "images": [image.model_dump(mode="json") for image in images],
                },
            )
        return execution, raised

    def _key(self, call: ToolCall, digest: str | None = None) -> str:
        """A call's key in a durable turn's journal (`CallJournal`): unique in the turn."""
        return f"{self.rounds}:{call.id}:{call.name}:{digest or arguments_hash(call.arguments)}"

    def _safe_again(self, call: ToolCall) -> bool:
        """An unknown tool (never run) or one safe to run again (see `safe_again`)."""
        definition = self.tools.get(call.name)
        return definition is None or safe_again(definition.annotations)

    def _recorded(self, call: ToolCall, digest: str, known: dict[str, Any]) -> ToolExecution:
        """The execution of a call that finished in a worker that died later (`CallJournal`): its
        text and outcome as recorded; its Python value is not kept (the text stands for it)."""
        return ToolExecution(
            name=call.name,
            call_id=call.id,
            arguments_hash=digest,
            result=str(known["result"]),
            outcome=ToolOutcome(known["outcome"]),
            error_kind=known["error_kind"],
            round=self.rounds,
            duration=0.0,
            value=known["result"],
            images=tuple(ImageContent.model_validate(image) for image in known["images"]),
        )

    async def _failure_text(self, failure: ToolFailure) -> tuple[str, ToolError | None]:
        """The text the model gets for a failure, and the error to raise when the policy says so."""
        policy = self.settings.policy(failure.outcome)
        if policy == "raise":
            error = _ERRORS[failure.outcome](
                _report(failure, detail=True), tool=failure.tool, call_id=failure.call.id
            )
            error.__cause__ = failure.error
            return _report(failure, self.settings.error_detail), error
        if policy == "report":
            return _report(failure, self.settings.error_detail), None
        try:
            text = policy(failure)
            if inspect.isawaitable(text):
                text = await text
        except Exception:
            # A broken handler must not take the other calls of the round down with it.
            logger.exception("the tool failure handler raised; the model gets the default text")
            return _report(failure, self.settings.error_detail), None
        return str(text), None

    async def _call(self, definition: ToolDefinition, kwargs: dict[str, Any]) -> Any:
        if definition.is_async:
            value = await definition.function(**kwargs)
        else:
            # Sync tools run in worker threads under the service's own limit, not anyio's default
            # limiter (a thread that hangs past its timeout is abandoned, not killed, and must not
            # starve the rest of the program); context variables reach them.
            value = await self.threads.run(functools.partial(definition.function, **kwargs))
        if inspect.isawaitable(value):  # a sync callable that returned a coroutine
            value = await value
        return value
