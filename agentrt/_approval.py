"""Human approval before a tool runs: what a build declares, and what a human decides.

    @tool(needs_approval=lambda args, ctx: args["amount"] > 100)
    async def refund(order: str, amount: float) -> str: ...

A response that asks for calls needing approval runs the round's other calls, then stops the turn:
the stream ends with `ApprovalRequested` (an awaited method raises `ApprovalRequired`, a `Result[T]`
method returns a `Result` with `approval` set), the turn is stored with its conversation, and nothing
is in the conversation's history yet. `agentrt.resume(service, run_id, decisions, memory_id=...)`
goes on from there with one decision per pending call: `Approve()`, `Approve(arguments={...})` (an
edit, validated against the tool's schema) or `Deny(reason)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from ._errors import ConfigurationError
from .tools._declare import NeedsApproval, check_needs_approval

__all__ = ["APPROVALS_ATTR", "Approvals", "Approve", "Decision", "Deny"]

APPROVALS_ATTR: Final = "__agentrt_approvals__"

_T = TypeVar("_T", bound=Callable[..., Any] | type)


@dataclass(frozen=True, slots=True)
class Approve:
    """Run the pending call; with `arguments`, run it with these instead (an edit: validated against
    the tool's schema, by parameter name; an invalid edit is refused and nothing runs)."""

    arguments: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Deny:
    """Do not run the pending call; the model is told it was denied, with `reason` if given."""

    reason: str | None = None


Decision = Approve | Deny
"""A human's decision on one pending call."""


@dataclass(frozen=True, slots=True)
class Approvals:
    """How a service's tool calls wait for approval. Pass to `build(..., approvals=...)`, or use as a
    decorator on a method or a class (the method's wins over the class's, which wins over the
    build's).

    - `needs_approval`: by tool name, `True`, `False` or a predicate `(arguments, context) -> bool`:
      for tools a user did not write (a tool provider's) or to override a tool's own
      `@tool(needs_approval=...)`.
    - `expires_after`: seconds a pending approval waits (`None`: no end). After that its calls
      count as denied, with a reason the model sees, when the turn is resumed or the conversation
      goes on.
    - `while_pending`: what a new turn on a conversation whose turn waits for approval does:
      `"refuse"` (`ApprovalPendingError`, the default) or `"deny"` (the pending calls are denied, the
      waiting turn's exchange is stored with the denials, and the new turn goes on after it).
    """

    needs_approval: Mapping[str, NeedsApproval] = field(default_factory=dict)
    expires_after: float | None = 3600.0
    while_pending: Literal["refuse", "deny"] = "refuse"

    def __post_init__(self) -> None:
        if not isinstance(self.needs_approval, Mapping):
            raise ConfigurationError(
                f"Approvals: needs_approval must map tool names to True, False or a predicate, "
                f"got {self.needs_approval!r}"
            )
        for name, value in self.needs_approval.items():
            if not isinstance(name, str):
                raise ConfigurationError(f"Approvals: needs_approval keys are tool names, got {name!r}")
            check_needs_approval(value, f"Approvals: tool {name!r}")
        expires = self.expires_after
        if expires is not None and (
            isinstance(expires, bool)
            or not isinstance(expires, int | float)
            or not (expires > 0 and math.isfinite(expires))
        ):
            raise ConfigurationError(
                f"Approvals: expires_after must be positive seconds or None, got {expires!r}"
            )
        if self.while_pending not in ("refuse", "deny"):
            raise ConfigurationError(
                f"Approvals: while_pending must be 'refuse' or 'deny', got {self.while_pending!r}"
            )

    def __call__(self, target: _T) -> _T:
        """Declare these approvals on a method or a class."""
        setattr(target, APPROVALS_ATTR, self)
        return target
