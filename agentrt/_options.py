"""Options of a call: its `Budget`, `ModelSettings` and `max_repairs`, set per build, per method and
per call; and a method's `output_mode`, set per build and per method.

Per build: `build(..., budget=..., settings=...)`. Per method: `@method_options(...)`. Per call,
without changing the stub's signature for other callers: `with call_options(...):` around the call,
or a stub parameter typed `Budget` or `ModelSettings` (optional, e.g. `budget: Budget | None = None`),
which is an option of the call, never part of the prompt. The call's values win over the method's,
which win over the build's, field by field.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ._budget import Budget
from ._errors import ConfigurationError
from .models._protocol import ModelSettings
from .output._modes import MODES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .output._modes import OutputMode

__all__ = [
    "CURRENT_OPTIONS",
    "CallOptions",
    "call_options",
    "check_mode",
    "check_repairs",
    "method_options",
]

_T = TypeVar("_T")

OPTIONS_ATTR: Final = "__agentrt_options__"


@dataclass(frozen=True, slots=True)
class CallOptions:
    """A budget, model settings and how often an answer that does not parse is repaired; `None`
    fields inherit from the level below."""

    budget: Budget | None = None
    settings: ModelSettings | None = None
    max_repairs: int | None = None
    output_mode: str | None = None
    """How a structured answer is asked for (`agentrt.output.OutputMode`); per method only."""
    budget_cap: Budget | None = None
    """Limits the call's budget cannot pass, whatever the levels above set (`call_options` only)."""

    def over(self, below: CallOptions) -> CallOptions:
        """These options laid over `below`, field by field (caps: the stricter limit)."""
        budget = below.budget.merge(self.budget) if below.budget is not None else self.budget
        settings = below.settings.merge(self.settings) if below.settings is not None else self.settings
        repairs = self.max_repairs if self.max_repairs is not None else below.max_repairs
        mode = self.output_mode if self.output_mode is not None else below.output_mode
        cap = below.budget_cap.tighter(self.budget_cap) if below.budget_cap is not None else self.budget_cap
        return CallOptions(budget, settings, repairs, mode, cap)

    def final_budget(self) -> Budget | None:
        """The budget a call runs with: its own, held within the cap."""
        cap = self.budget_cap
        if cap is None:
            return self.budget
        return cap.tighter(self.budget) if self.budget is not None else cap


CURRENT_OPTIONS: ContextVar[CallOptions | None] = ContextVar("agentrt_call_options", default=None)


def check_repairs(where: str, max_repairs: object) -> None:
    if max_repairs is not None and (
        isinstance(max_repairs, bool) or not isinstance(max_repairs, int) or max_repairs < 0
    ):
        raise ConfigurationError(f"{where}: max_repairs must be an int >= 0, got {max_repairs!r}")


def check_mode(where: str, output_mode: object) -> None:
    if output_mode not in MODES:
        raise ConfigurationError(
            f"{where}: output_mode must be one of {', '.join(map(repr, MODES))}, got {output_mode!r}"
        )


def _checked(where: str, budget: object, settings: object, max_repairs: object = None) -> CallOptions:
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigurationError(f"{where}: budget must be an agentrt.Budget, got {budget!r}")
    if settings is not None and not isinstance(settings, ModelSettings):
        raise ConfigurationError(f"{where}: settings must be an agentrt.ModelSettings, got {settings!r}")
    check_repairs(where, max_repairs)
    return CallOptions(budget, settings, max_repairs)  # type: ignore[arg-type]


def method_options(
    *,
    budget: Budget | None = None,
    settings: ModelSettings | None = None,
    max_repairs: int | None = None,
    output_mode: OutputMode | None = None,
) -> Callable[[_T], _T]:
    """The budget, model settings and `max_repairs` of one service method (over the build's, under
    the call's), and how it asks for a structured answer (`output_mode`, over the build's: `"auto"`,
    `"schema"`, `"json"`, `"instructions"` or `"tool"`; see `agentrt.build`)."""
    options = _checked("@method_options", budget, settings, max_repairs)
    if output_mode is not None:
        check_mode("@method_options", output_mode)
        options = dataclasses.replace(options, output_mode=output_mode)

    def decorate(target: _T) -> _T:
        if not inspect.isfunction(target):
            raise ConfigurationError("@method_options applies to an `async def` service method")
        setattr(target, OPTIONS_ATTR, options)
        return target

    return decorate


@contextlib.contextmanager
def call_options(
    *,
    budget: Budget | None = None,
    settings: ModelSettings | None = None,
    max_repairs: int | None = None,
    budget_cap: Budget | None = None,
) -> Iterator[None]:
    """Options for the service calls made inside the block (nested blocks lay theirs over the outer).

    `budget` replaces the method's limits, field by field (looser or stricter); `budget_cap` is a
    ceiling: no call inside the block runs with a limit looser than it, whatever its build, method,
    block or own `Budget` parameter say (nested caps: the stricter of each limit). A server that runs
    calls for clients caps them so.

    A call takes the options in force when it is made: for a stream, when `await service.stream(...)`
    is evaluated, not while it is read.
    """
    options = _checked("call_options", budget, settings, max_repairs)
    if budget_cap is not None:
        if not isinstance(budget_cap, Budget):
            raise ConfigurationError(
                f"call_options: budget_cap must be an agentrt.Budget, got {budget_cap!r}"
            )
        options = dataclasses.replace(options, budget_cap=budget_cap)
    outer = CURRENT_OPTIONS.get()
    token = CURRENT_OPTIONS.set(options.over(outer) if outer is not None else options)
    try:
        yield
    finally:
        CURRENT_OPTIONS.reset(token)


def method_options_of(function: Callable[..., Any]) -> CallOptions | None:
    options: CallOptions | None = getattr(function, OPTIONS_ATTR, None)
    return options
