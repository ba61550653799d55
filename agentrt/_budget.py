"""Per-request budgets: what one invocation may spend, and the account that tracks it.

A `Budget` is set per build, per method (`@method_options`) and per call (a parameter typed `Budget`,
or `with call_options(...)`); the call's wins over the method's, which wins over the build's, field by
field. The pipeline keeps one `BudgetAccount` per invocation and checks it before every model request
and tool round, and while a response streams.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final, Literal

from ._backend import now as now  # the pipeline's clock, re-exported
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._events import Usage

__all__ = ["Budget", "BudgetAccount", "BudgetLimit", "Spent"]

BudgetLimit = Literal[
    "seconds", "input_tokens", "output_tokens", "total_tokens", "model_requests", "tool_calls"
]
"""The name of a `Budget` field: which limit was reached."""

_CHARS_PER_TOKEN: Final = 4


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits on what one invocation may spend. `None` means "no limit" (or "inherit", when merged).

    - `seconds`: wall-clock time from the call until the answer is complete; a silent model stream or
      a slow tool is cut at the deadline.
    - `input_tokens`, `output_tokens`, `total_tokens`: tokens over every request of the invocation,
      from the provider's usage, estimated mid-stream (about four characters a token) and where a server
      reports none.
    - `model_requests`: requests to the model, every tool round (and later retry, re-ask and repair)
      included.
    - `tool_calls`: tool calls the model may make.

    Invalid values raise `ConfigurationError`.
    """

    seconds: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    model_requests: int | None = None
    tool_calls: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"Budget.{f.name} must be a number or None, got {value!r}")
            if f.name != "seconds" and not isinstance(value, int):
                raise ConfigurationError(f"Budget.{f.name} must be a whole number, got {value!r}")
            try:
                finite = math.isfinite(value)
            except OverflowError:
                finite = False
            if not value > 0 or (f.name == "seconds" and not finite):
                raise ConfigurationError(f"Budget.{f.name} must be positive and finite, got {value!r}")

    def merge(self, other: Budget | None) -> Budget:
        """This budget with every limit `other` sets replacing this one's."""
        if other is None:
            return self
        changes = {
            f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None
        }
        return dataclasses.replace(self, **changes) if changes else self

    def tighter(self, other: Budget | None) -> Budget:
        """The stricter of the two budgets, limit by limit (a limit either sets applies)."""
        if other is None or other is self:
            return self
        changes = {}
        for f in fields(other):
            theirs = getattr(other, f.name)
            if theirs is not None:
                mine = getattr(self, f.name)
                if mine is None or theirs < mine:
                    changes[f.name] = theirs
        return dataclasses.replace(self, **changes) if changes else self


@dataclass(slots=True)
class Spent:
    """What an invocation spent, against each limit of its budget (`Result.spent`).

    `estimated` is true when some token count was estimated because the server reported none. Made
    once per call (so not frozen, which costs a setattr a field); treat it as immutable all the same.
    """

    seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    model_requests: int = 0
    tool_calls: int = 0
    estimated: bool = False


class BudgetAccount:
    """The running account of one invocation against its `Budget` (not shared between invocations).

    Times are on the async backend's clock (`anyio.current_time()`), so virtual clocks apply.
    """

    __slots__ = (
        "budget",
        "deadline",
        "estimated",
        "input_tokens",
        "model_requests",
        "output_tokens",
        "started",
        "tool_calls",
    )

    def __init__(self, budget: Budget, now: float) -> None:
        self.budget = budget
        self.started = now
        self.deadline = now + budget.seconds if budget.seconds is not None else None
        self.input_tokens = 0
        self.output_tokens = 0
        self.model_requests = 0
        self.tool_calls = 0
        self.estimated = False

    def record(self, usage: Usage) -> BudgetLimit | None:
        """Count the usage of one response; the token limit it took the account past, if any."""
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        if usage.estimated:
            self.estimated = True
        budget = self.budget
        if budget.input_tokens is not None and self.input_tokens > budget.input_tokens:
            return "input_tokens"
        if budget.output_tokens is not None and self.output_tokens > budget.output_tokens:
            return "output_tokens"
        if budget.total_tokens is not None and self.input_tokens + self.output_tokens > budget.total_tokens:
            return "total_tokens"
        return None

    def before_request(self, input_chars: Callable[[], int]) -> BudgetLimit | tuple[int, BudgetLimit] | None:
        """Whether another model request may be sent, and what its response may stream.

        Returns the limit (other than time, which the deadline enforces) that forbids the request;
        else the output tokens its response may stream before a token limit is passed, and which
        limit that is; else `None` (no token limit binds output). `input_chars` gives the request's
        input size, asked only for an input- or total-token limit: its input tokens are estimated
        before the provider reports them, and a request whose input alone would pass either limit is
        not sent (nor paid for).
        """
        budget = self.budget
        if budget.model_requests is not None and self.model_requests >= budget.model_requests:
            return "model_requests"
        spent_in, spent_out = self.input_tokens, self.output_tokens
        estimate = 0
        if budget.input_tokens is not None or budget.total_tokens is not None:
            estimate = -(-input_chars() // _CHARS_PER_TOKEN)
        if budget.input_tokens is not None and spent_in + max(estimate, 1) > budget.input_tokens:
            return "input_tokens"
        allowance: tuple[int, BudgetLimit] | None = None
        if budget.output_tokens is not None:
            allowance = (budget.output_tokens - spent_out, "output_tokens")
        if budget.total_tokens is not None:
            left = budget.total_tokens - spent_in - estimate - spent_out
            if allowance is None or left < allowance[0]:
                allowance = (left, "total_tokens")
        if allowance is not None and allowance[0] <= 0:
            return allowance[1]
        return allowance

    def before_tools(self, calls: int, now: float) -> BudgetLimit | None:
        """The limit that forbids running `calls` more tool calls, if any."""
        if self.deadline is not None and now >= self.deadline:
            return "seconds"
        limit = self.budget.tool_calls
        if limit is not None and self.tool_calls + calls > limit:
            return "tool_calls"
        return None

    def spent(self, now: float) -> Spent:
        return Spent(
            seconds=max(0.0, now - self.started),
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            total_tokens=self.input_tokens + self.output_tokens,
            model_requests=self.model_requests,
            tool_calls=self.tool_calls,
            estimated=self.estimated,
        )


def chars_for_tokens(tokens: int) -> int:
    """The characters that about `tokens` tokens take (the inverse of the usage estimate)."""
    return tokens * _CHARS_PER_TOKEN
